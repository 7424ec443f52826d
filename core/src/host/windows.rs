//! Part `Windows`: sources' windows as admitted (committed or on their
//! way), and the bookmark rule (section 22).
//!
//! A windowed source's batches join its open window until one closes it;
//! this part knows each open window's parts (what the `Window` frame that
//! ends it names) before they commit. It also keeps each partition's *run*:
//! the digests of its last records admitted under one resume key, which a
//! closing frame commits as the partition's tail. When the source starts
//! over (`Window::Restart`), each partition's committed tail is armed: its
//! next records under the tail's key that are byte for byte one of the
//! tail's are dropped (each digest once), until a record under another key
//! comes. That is a tap resuming inclusively from its bookmark, sending the
//! records at the bookmark again.

use crate::ids::*;
use crate::state::CommittedState;
use crate::wal::{Frame, Record, Tail, WindowEnd, WindowPart, TAIL_DIGESTS_MAX};
use std::collections::BTreeMap;

#[derive(Default)]
pub(super) struct Windows {
    open: BTreeMap<SourceId, BTreeMap<u32, WindowPart>>,
    /// Bytes of each open window's records as admitted (with 12 bytes of
    /// framing each): what the WAL holds of it, near enough.
    bytes: BTreeMap<SourceId, u64>,
    /// Each partition's tail as admitted: the committed ones, and those of
    /// closing frames on their way.
    tails: BTreeMap<PartitionKey, Tail>,
    runs: BTreeMap<PartitionKey, Tail>,
    resuming: BTreeMap<PartitionKey, Tail>,
}

/// A record's digest, as tails keep it: of the bytes the source sent (a
/// record quarantined at intake carries the time of that decision, which
/// a record sent again does not share).
pub fn digest(record: &[u8]) -> u64 {
    let sent = crate::dead_letters::quarantined(record).map_or(record, |q| q.record);
    xxhash_rust::xxh3::xxh3_64(sent)
}

impl Windows {
    /// At the end of recovery: no window is open (recovery voids the ones
    /// the WAL holds), and runs are the committed tails.
    pub(super) fn restore(&mut self, committed: &CommittedState) {
        self.open.clear();
        self.bytes.clear();
        self.resuming.clear();
        self.tails = committed.tails.clone();
        self.runs = committed.tails.clone();
    }

    /// The stream of `key`'s part of its source's open window, if any.
    pub(super) fn stream_of(&self, key: PartitionKey) -> Option<StreamId> {
        Some(self.open.get(&key.source)?.get(&key.partition)?.stream)
    }

    pub(super) fn is_open(&self, source: SourceId) -> bool {
        self.open.contains_key(&source)
    }

    /// The records of a windowed batch of `key` to take in: those the
    /// bookmark rule does not drop. Runs follow the records taken.
    pub(super) fn take(&mut self, key: PartitionKey, keyed: Vec<(Record, Option<u64>)>) -> Vec<Record> {
        let mut out = Vec::with_capacity(keyed.len());
        for (record, resume_key) in keyed {
            let d = digest(&record.bytes);
            if let Some(tail) = self.resuming.get_mut(&key) {
                if resume_key == Some(tail.key) {
                    if let Some(i) = tail.digests.iter().position(|x| *x == d) {
                        tail.digests.remove(i);
                        continue;
                    }
                } else {
                    self.resuming.remove(&key);
                }
            }
            match resume_key {
                Some(k) => {
                    let fresh = || Tail { partition: key.partition, key: k, digests: Vec::new(), more: false };
                    let run = self.runs.entry(key).or_insert_with(fresh);
                    if run.key != k {
                        *run = fresh();
                    }
                    match run.digests.len() < TAIL_DIGESTS_MAX {
                        true => run.digests.push(d),
                        false => run.more = true,
                    }
                }
                None => {
                    self.runs.remove(&key);
                }
            }
            out.push(record);
        }
        out
    }

    /// Bytes of `source`'s open window so far.
    pub(super) fn open_bytes(&self, source: SourceId) -> u64 {
        self.bytes.get(&source).copied().unwrap_or(0)
    }

    /// Records of `key` from `from` to `to` (`bytes` of them) joined its
    /// source's window.
    pub(super) fn admitted(
        &mut self,
        key: PartitionKey,
        stream: StreamId,
        (from, to): (Position, Position),
        records: u64,
        bytes: u64,
    ) {
        *self.bytes.entry(key.source).or_default() += bytes;
        let fresh = WindowPart { partition: key.partition, stream, from, to: from, records: 0 };
        let part = self.open.entry(key.source).or_default().entry(key.partition).or_insert(fresh);
        part.to = to;
        part.records += records;
    }

    /// The frame closing `source`'s window with `checkpoint`, if one is
    /// open: its parts, and the tail of each (none where the partition's
    /// last records had no resume key and it had a tail). Tails lose
    /// digests (and say there were more) until the frame takes at most
    /// `room` bytes; `Err` when its parts and checkpoint alone take more.
    pub(super) fn close(
        &mut self,
        source: SourceId,
        checkpoint: Option<Vec<u8>>,
        room: usize,
    ) -> Result<Option<Frame>, &'static str> {
        let Some(parts) = self.open.get(&source) else { return Ok(None) };
        self.bytes.remove(&source);
        let bare = WindowEnd {
            source,
            checkpoint: checkpoint.clone(),
            closed: true,
            parts: parts.values().copied().collect(),
            tails: Vec::new(),
        };
        if Frame::Window(bare).encoded_len() > room {
            return Err("a checkpoint is larger than a commit group allows");
        }
        let parts = self.open.remove(&source).expect("looked up above");
        let mut tails = Vec::new();
        for &partition in parts.keys() {
            let key = PartitionKey { source, partition };
            match self.runs.get(&key) {
                Some(run) => tails.push(run.clone()),
                None if self.tails.remove(&key).is_some() => {
                    tails.push(Tail { partition, key: 0, digests: Vec::new(), more: false })
                }
                None => {}
            }
        }
        let parts = parts.into_values().collect();
        let mut end = WindowEnd { source, checkpoint, closed: true, parts, tails };
        let mut over = Frame::Window(end.clone()).encoded_len().saturating_sub(room);
        while over > 0 {
            let longest = end.tails.iter_mut().max_by_key(|t| t.digests.len()).expect("tails make it too large");
            longest.digests.pop();
            longest.more = true;
            over = over.saturating_sub(8);
        }
        for t in &end.tails {
            let key = PartitionKey { source, partition: t.partition };
            match t.digests.is_empty() {
                true => self.tails.remove(&key),
                false => self.tails.insert(key, t.clone()),
            };
        }
        Ok(Some(Frame::Window(end)))
    }

    /// `source` starts over from its last closed window: the frame voiding
    /// its open window, if any; its runs go back to the tails, which are
    /// armed (`arm` off: the planted bug `bookmark-duplicate-passed`).
    pub(super) fn restart(&mut self, source: SourceId, arm: bool) -> Option<Frame> {
        self.bytes.remove(&source);
        let void = self.open.remove(&source).map(|parts| {
            let parts = parts.into_values().collect();
            Frame::Window(WindowEnd { source, checkpoint: None, closed: false, parts, tails: Vec::new() })
        });
        let of_source = |key: &PartitionKey| key.source == source;
        self.runs.retain(|key, _| !of_source(key));
        self.resuming.retain(|key, _| !of_source(key));
        for (key, tail) in self.tails.iter().filter(|(key, _)| of_source(key)) {
            self.runs.insert(*key, tail.clone());
            if arm {
                self.resuming.insert(*key, tail.clone());
            }
        }
        void
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_keeps_at_most_its_bound_and_says_there_were_more() {
        let mut w = Windows::default();
        let key = PartitionKey { source: SourceId(0), partition: 0 };
        let n = TAIL_DIGESTS_MAX as u64 + 3;
        let keyed = (0..n).map(|p| (Record { position: Position(p), bytes: p.to_le_bytes().to_vec() }, Some(7)));
        assert_eq!(w.take(key, keyed.collect()).len() as u64, n);
        let run = &w.runs[&key];
        assert_eq!((run.key, run.digests.len(), run.more), (7, TAIL_DIGESTS_MAX, true));
        // A record under another key starts the run again; one without a
        // key ends it.
        w.take(key, vec![(Record { position: Position(n), bytes: vec![1] }, Some(8))]);
        assert_eq!((w.runs[&key].key, w.runs[&key].digests.len(), w.runs[&key].more), (8, 1, false));
        w.take(key, vec![(Record { position: Position(n + 1), bytes: vec![2] }, None)]);
        assert!(!w.runs.contains_key(&key));
    }
}
