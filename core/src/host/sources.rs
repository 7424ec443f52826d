//! Sources: one slot per source (open, reading, polling, exhausted, acks
//! waiting and in flight) and the accepted position of every partition (the
//! next to read). It reads under backpressure, drops re-sent records,
//! splits batches into frames that fit a commit group, and acks positions
//! once the coordinator says their group committed. It talks only to
//! [`Effects`]; the frames it makes go to the WAL writer through the
//! coordinator.

use super::effects::{Effects, Pending, Retry};
use super::windows::Windows;
use crate::config::{HostConfig, Limits, SkipRequest, SEAL_RESERVE};
use crate::ids::*;
use crate::io::PluginOp;
use crate::io::{IoError, IoOp, ResumePoint, SourceBatchIn, StopReason, Window};
use crate::state::CommittedState;
use crate::wal::{Frame, Record, Skipped, SourceBatch, FRAME_HEADER_BYTES};
use std::collections::BTreeMap;

pub(super) struct Sources {
    slots: Vec<Slot>,
    accepted: BTreeMap<PartitionKey, Position>,
}

#[derive(Default)]
struct Slot {
    opened: bool,
    read: Option<IoId>,
    waiting: bool,
    exhausted: bool,
    acks: BTreeMap<u32, Position>,
    ack_io: Option<IoId>,
    /// The acks in flight, put back if their request fails.
    acks_sent: Vec<(u32, Position)>,
    /// Input an operator gave up this run.
    skips: Vec<SkipRequest>,
}

/// A source batch taken in, as frames for the next group.
pub(super) struct Admitted {
    pub(super) key: PartitionKey,
    pub(super) frames: Vec<Frame>,
    pub(super) end: Position,
    pub(super) records: u64,
    pub(super) checkpoint: Option<Vec<u8>>,
    /// Of a window: nothing is acknowledged or materialized before its
    /// `Window` frame commits.
    pub(super) windowed: bool,
}

impl Sources {
    pub(super) fn new(count: usize) -> Sources {
        Sources { slots: (0..count).map(|_| Slot::default()).collect(), accepted: BTreeMap::new() }
    }

    /// Sources are read no further while this many bytes wait for a commit,
    /// or while the WAL is at its size limit.
    pub(super) fn backpressured(limits: &Limits, pending_bytes: u64, wal_full: bool) -> bool {
        pending_bytes >= limits.pending_bytes_max || wal_full
    }

    /// At the end of recovery: every partition resumes after what the WAL holds.
    /// Partitions of an open window resume past it (recovery voids it).
    pub(super) fn restore(&mut self, committed: &CommittedState) {
        for key in committed.partitions.keys() {
            self.accepted.insert(*key, committed.resume_position(*key));
        }
        for (source, parts) in &committed.windows {
            for partition in parts.keys() {
                let key = PartitionKey { source: *source, partition: *partition };
                self.accepted.insert(key, committed.resume_position(key));
            }
        }
    }

    pub(super) fn open(&mut self, fx: &mut Effects, committed: &CommittedState, source: SourceId) {
        let mut resume: Vec<ResumePoint> = committed
            .partitions
            .iter()
            .filter(|(key, _)| key.source == source)
            .map(|(key, p)| ResumePoint {
                partition: key.partition,
                position: committed.resume_position(*key),
                checkpoint: p.checkpoint.clone(),
            })
            .collect();
        // A partition only an open window holds resumes past it too.
        for (&partition, part) in committed.windows.get(&source).into_iter().flatten() {
            if !resume.iter().any(|r| r.partition == partition) {
                resume.push(ResumePoint { partition, position: part.to, checkpoint: None });
            }
        }
        resume.sort_by_key(|r| r.partition);
        let skips = self.slots[source.0 as usize].skips.iter().map(|k| (k.key.partition, k.at, k.next)).collect();
        fx.io(Pending::SourceOpen(source), IoOp::Plugin(PluginOp::SourceOpen { source, resume, skips }));
    }

    /// An operator's skip, before the source opens: its records are dropped
    /// where they arrive; a partition at its start moves on past it now.
    pub(super) fn skip(&mut self, skip: &SkipRequest) {
        self.slots[skip.key.source.0 as usize].skips.push(skip.clone());
        let accepted = self.accepted.entry(skip.key).or_default();
        if *accepted == skip.at {
            *accepted = skip.next;
        }
    }

    pub(super) fn on_opened(&mut self, fx: &mut Effects, source: SourceId, ok: bool) {
        if ok {
            fx.succeeded(Retry::SourceOpen(source));
            self.slots[source.0 as usize].opened = true;
        } else {
            fx.retry_later(Retry::SourceOpen(source));
        }
    }

    /// Asks every source that may be read for its next records; `held`
    /// says whether a source may not be read now (its earlier batches wait
    /// for a schema decision, or only another may be read).
    pub(super) fn read(&mut self, fx: &mut Effects, records_max: u32, held: impl Fn(SourceId) -> bool) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            let source = SourceId(i as u16);
            if s.opened && s.read.is_none() && !s.waiting && !s.exhausted && !held(source) {
                s.read = Some(
                    fx.io(Pending::SourceRead(source), IoOp::Plugin(PluginOp::SourceRead { source, records_max })),
                );
            }
        }
    }

    /// A read finished: the batches it brought and whether the source is
    /// exhausted, or `None` when it failed (retried after a backoff).
    pub(super) fn on_read(
        &mut self,
        fx: &mut Effects,
        source: SourceId,
        result: Result<(Vec<SourceBatchIn>, bool), IoError>,
    ) -> Option<(Vec<SourceBatchIn>, bool)> {
        let slot = &mut self.slots[source.0 as usize];
        slot.read = None;
        match result {
            Ok((batches, exhausted)) => {
                fx.succeeded(Retry::SourceRead(source));
                slot.exhausted = exhausted;
                Some((batches, exhausted))
            }
            Err(_) => {
                slot.waiting = true;
                fx.retry_later(Retry::SourceRead(source));
                None
            }
        }
    }

    /// The source had nothing new: ask again after `poll`.
    pub(super) fn poll_later(&mut self, fx: &mut Effects, source: SourceId, poll: crate::time::Duration) {
        self.slots[source.0 as usize].waiting = true;
        fx.schedule(fx.now + poll, Retry::SourceRead(source));
    }

    pub(super) fn retry_read(&mut self, source: SourceId) {
        self.slots[source.0 as usize].waiting = false;
    }

    pub(super) fn all_exhausted(&self) -> bool {
        self.slots.iter().all(|s| s.exhausted)
    }

    /// Takes a batch in as frames, dropping records at or below what the
    /// partition already holds; `None` when nothing new is left.
    /// `accept_resent` is the planted bug `accept-resent-records`. A
    /// windowed batch (section 22) goes through `windows`: its records
    /// are committed provisional, the bookmark rule drops some, and a
    /// closing or restarting batch ends the window.
    pub(super) fn admit(
        &mut self,
        cfg: &HostConfig,
        committed: &CommittedState,
        windows: &mut Windows,
        source: SourceId,
        batch: SourceBatchIn,
        accept_resent: bool,
    ) -> Result<Option<Admitted>, StopReason> {
        let key = PartitionKey { source, partition: batch.partition };
        let protocol = |what| StopReason::SourceProtocol { source, partition: batch.partition, what };
        if !batch.records.windows(2).all(|w| w[0].position < w[1].position)
            || batch.records.last().is_some_and(|r| r.position >= batch.end)
        {
            return Err(protocol("record positions must increase and stay below the batch end"));
        }
        if committed.partitions.get(&key).is_some_and(|p| p.stream != batch.stream) {
            return Err(protocol("a partition cannot change stream"));
        }
        let window = batch.window;
        match window {
            Window::None if windows.is_open(source) => {
                return Err(protocol("a source with an open window sent a batch outside it"));
            }
            Window::Open if batch.checkpoint.is_some() => {
                return Err(protocol("a batch of an open window carries no checkpoint"));
            }
            Window::Restart => {
                let arm = !cfg.mutations.has(crate::Mutation::BookmarkDuplicatePassed);
                let frames = windows.restart(source, arm).into_iter().collect();
                return Ok(Some(Admitted {
                    key,
                    frames,
                    end: batch.end,
                    records: 0,
                    checkpoint: None,
                    windowed: true,
                }));
            }
            _ => {}
        }
        if !batch.keys.is_empty() && batch.keys.len() != batch.records.len() {
            return Err(protocol("a batch names a resume key for some of its records only"));
        }
        let floor = self.accepted.get(&key).copied().unwrap_or_default();
        let mut records = batch.records;
        if !accept_resent {
            records.retain(|r| r.position >= floor);
        }
        // An operator's skips name positions of sources without windows
        // only: a window's are counted anew when a tap sends again.
        let skips = &self.slots[source.0 as usize].skips;
        if window == Window::None {
            records.retain(|r| !skips.iter().any(|k| k.key == key && k.at <= r.position && r.position < k.next));
        }
        if window != Window::None {
            if windows.stream_of(key).is_some_and(|s| s != batch.stream) {
                return Err(protocol("a partition cannot change stream"));
            }
            let mut keys = batch.keys.into_iter();
            let keyed = records.into_iter().map(|r| (r, keys.next().flatten())).collect();
            records = windows.take(key, keyed);
            let mut frames = Vec::new();
            if !records.is_empty() {
                self.accepted.insert(key, batch.end);
                let count = records.len() as u64;
                let bytes = records.iter().map(|r| 12 + r.bytes.len() as u64).sum();
                windows.admitted(key, batch.stream, (floor, batch.end), count, bytes);
                frames = split(cfg, key, batch.stream, records, batch.end, &None, true).map_err(protocol)?;
            }
            if window == Window::Close {
                frames.extend(windows.close(source, batch.checkpoint, group_room(cfg)).map_err(protocol)?);
            }
            if frames.is_empty() {
                return Ok(None);
            }
            return Ok(Some(Admitted { key, frames, end: batch.end, records: 0, checkpoint: None, windowed: true }));
        }
        if records.is_empty() {
            // Nothing but skipped input, from where the partition stands:
            // the skip, committed again there, moves it on.
            let Some(k) = skips.iter().find(|k| k.key == key && k.at == floor && k.next <= batch.end) else {
                return Ok(None);
            };
            let frame =
                Frame::Skipped(Skipped { key, stream: batch.stream, at: k.at, next: k.next, reason: k.reason.clone() });
            self.accepted.insert(key, k.next);
            let checkpoint = None;
            return Ok(Some(Admitted {
                key,
                frames: vec![frame],
                end: k.next,
                records: 0,
                checkpoint,
                windowed: false,
            }));
        }
        let end = batch.end;
        if !accept_resent {
            assert!(end > floor, "a batch with new records ends past the floor");
        }
        self.accepted.insert(key, end);
        let total = records.len() as u64;
        let frames = split(cfg, key, batch.stream, records, end, &batch.checkpoint, false).map_err(protocol)?;
        Ok(Some(Admitted { key, frames, end, records: total, checkpoint: batch.checkpoint, windowed: false }))
    }

    /// Everything below `end` of this partition is committed: ack it.
    pub(super) fn committed(&mut self, key: PartitionKey, end: Position) {
        self.slots[key.source.0 as usize].acks.insert(key.partition, end);
    }

    pub(super) fn send_acks(&mut self, fx: &mut Effects) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.ack_io.is_some() || s.acks.is_empty() || !s.opened {
                continue;
            }
            let acks: Vec<(u32, Position)> = std::mem::take(&mut s.acks).into_iter().collect();
            s.acks_sent.clone_from(&acks);
            let source = SourceId(i as u16);
            s.ack_io = Some(fx.io(Pending::SourceAck(source), IoOp::Plugin(PluginOp::SourceAck { source, acks })));
        }
    }

    pub(super) fn on_acked(&mut self, fx: &mut Effects, id: IoId, source: SourceId, ok: bool) {
        let slot = &mut self.slots[source.0 as usize];
        slot.ack_io = None;
        if ok {
            fx.succeeded(Retry::SourceAck(source));
            return;
        }
        // Send the failed positions again unless newer ones wait.
        for (partition, position) in std::mem::take(&mut slot.acks_sent) {
            let ack = slot.acks.entry(partition).or_insert(position);
            *ack = (*ack).max(position);
        }
        slot.ack_io = Some(id);
        fx.retry_later(Retry::SourceAck(source));
    }

    pub(super) fn retry_ack(&mut self, source: SourceId) {
        self.slots[source.0 as usize].ack_io = None;
    }

    /// No read or ack out and none waiting.
    pub(super) fn idle(&self) -> bool {
        self.slots.iter().all(|s| s.read.is_none() && s.ack_io.is_none() && s.acks.is_empty())
    }
}

/// Bytes a frame may take in a commit group of its own, less a margin.
fn group_room(cfg: &HostConfig) -> usize {
    (cfg.limits.group_bytes_max - SEAL_RESERVE) as usize - FRAME_HEADER_BYTES - 64
}

/// Splits a batch's records into source-batch frames that each fit a commit
/// group; every chunk leaves room for the checkpoint the last one carries. A
/// record too large for a group's usual size goes in a frame of its own,
/// which the WAL writer commits in a group of its own (the intake limit,
/// at most half a segment, keeps it within one).
fn split(
    cfg: &HostConfig,
    key: PartitionKey,
    stream: StreamId,
    records: Vec<Record>,
    end: Position,
    checkpoint: &Option<Vec<u8>>,
    provisional: bool,
) -> Result<Vec<Frame>, &'static str> {
    let checkpoint_bytes = checkpoint.as_ref().map_or(0, |c| 4 + c.len());
    let Some(frame_budget) = group_room(cfg).checked_sub(checkpoint_bytes).filter(|b| *b >= 64) else {
        return Err("a checkpoint is larger than a commit group allows");
    };
    let frame = |records, end, checkpoint| {
        Frame::SourceBatch(SourceBatch { key, stream, end, checkpoint, records, counted: None, provisional })
    };
    let mut frames = Vec::new();
    let mut chunk: Vec<Record> = Vec::new();
    let mut chunk_bytes = 0usize;
    let total = records.len();
    for (n, record) in records.into_iter().enumerate() {
        let len = 12 + record.bytes.len();
        if !chunk.is_empty() && chunk_bytes + len > frame_budget {
            let next = record.position;
            frames.push(frame(std::mem::take(&mut chunk), next, None));
            chunk_bytes = 0;
        }
        chunk_bytes += len;
        chunk.push(record);
        if n + 1 == total {
            frames.push(frame(std::mem::take(&mut chunk), end, checkpoint.clone()));
        }
    }
    Ok(frames)
}
