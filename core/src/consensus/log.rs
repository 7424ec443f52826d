//! Part `Log`: raft-rs's `Storage` over the WAL. raft-rs asks its storage
//! synchronously for terms and entries, while the entries live in WAL
//! segments. The log keeps in memory what raft-rs must have at once: every
//! index's term (`TermRuns`), where the log ends after each index
//! (`LogEnd`, for placing the next group and for truncation), and the
//! entries from `held_from` on (the unapplied tail: committed entries for a
//! `Ready` and conf-change checks are served from it). Older entries, which
//! only a lagging follower needs, are read back: `entries` answers
//! "temporarily unavailable" for a send, the replica asks for a WAL read
//! (`wanted`), and `fetched` hands the entries in before raft-rs resumes.
//!
//! The log takes a `Ready`'s entries when the `Ready` is handled, before
//! they are durable: it must know where each group goes and which tail a
//! conflicting append truncates. What is durable is raft-rs's business
//! (told by `on_persist_ready`) and the WAL's.

mod record;
mod restore;
mod storage;

pub use record::LogRecord;
pub use restore::{commit_on_disk, LogBuilder};

use super::entry::{decode_entry, encode_entry, membership_change, EntryError, EntryGroup, LogEnd, Opening, Placement};
use super::hard_state::Members;
use super::snapshot::{Manifest, ManifestSegment};
use super::terms::TermRuns;
use crate::ids::*;
use crate::wal::{encode_group, Frame, GroupPlace};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState};
use raft::GetEntriesContext;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};

pub struct Log {
    hard: HardState,
    conf: ConfState,
    /// The index and term just before the first entry raft-rs may ask for:
    /// the first group on this host's disk (genesis, or the first of the
    /// oldest segment left after deletions or a snapshot's install).
    base: (u64, u64),
    base_end: LogEnd,
    terms: TermRuns,
    /// The end of the log after each index past `base`, oldest first.
    ends: VecDeque<LogEnd>,
    /// Entries from `held_from` to the last.
    held: VecDeque<Entry>,
    held_from: u64,
    /// The header epoch of each segment a group of the log opened.
    header_epochs: BTreeMap<SegmentId, Epoch>,
    fetch: RefCell<Fetch>,
    /// The planted bug `no-truncate-on-conflict`: a conflicting tail is
    /// overwritten in place, its leftovers neither removed nor zeroed.
    no_truncate: bool,
    /// Everything up to this index is applied and durable here: a snapshot
    /// may be taken there, and segments deleted below it.
    durable: u64,
    /// The index of the last membership change applied, and the membership
    /// record as of it (a snapshot carries both).
    conf_changed_at: u64,
    members: Members,
}

/// Entries raft-rs asked for that are not in memory.
#[derive(Default)]
struct Fetch {
    /// (first index, one past the last, raft-rs's context to resume).
    wanted: Vec<(u64, u64, GetEntriesContext)>,
    /// Entries read back, from this index on, until every waiting send
    /// has resumed.
    got: Option<(u64, Vec<Entry>)>,
}

/// Why a host's log cannot be restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// The whole-segment restore of the tests met damage (the engine's
    /// recovery scan reports damage itself, before the log is built).
    #[cfg(test)]
    Corrupt(crate::wal::Corruption),
    /// The WAL does not begin with the cluster's genesis group.
    NoGenesis,
    /// The saved commit index is past the last durable group.
    CommitLost { commit: u64, last: u64 },
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(test)]
            RestoreError::Corrupt(c) => write!(f, "segment {} at byte {}: {}", c.segment.0, c.offset, c.what),
            RestoreError::NoGenesis => {
                write!(f, "the WAL does not begin with this cluster's first group (segment 0, LSN 0)")
            }
            RestoreError::CommitLost { commit, last } => write!(
                f,
                "raft's saved commit index is {commit} but the WAL ends at LSN {last}: acknowledged groups are gone \
                 from this host's disk; it will not vote or serve (bring it back under a new id with `cluster join`)"
            ),
        }
    }
}

/// Where the group at `index` lies, given the log's end before it and
/// after it.
fn place_between(index: u64, before: LogEnd, after: LogEnd) -> GroupPlace {
    let offset = if before.segment == after.segment { before.end } else { crate::wal::SEGMENT_HEADER_BYTES as u64 };
    GroupPlace { lsn: Lsn(index), segment: after.segment, offset, len: after.end - offset }
}

/// What making a `Ready`'s entries durable takes, in order: the
/// conflicting tail's segments removed (newest first), its groups in the
/// first kept segment zeroed (newest first, each durable before the next,
/// so a crash leaves a prefix of the old log), then the new groups.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Appended {
    pub remove: Vec<SegmentId>,
    pub zero: Vec<GroupPlace>,
    pub groups: Vec<EntryGroup>,
}

impl Log {
    /// A log that ends just after `base` (index, term), at `end`, holding
    /// nothing after it.
    pub fn new(hard: HardState, conf: ConfState, base: (u64, u64), end: LogEnd) -> Log {
        assert_eq!(end.lsn.0, base.0, "the end is after the base index");
        let mut terms = TermRuns::starting_at(base.0);
        terms.push(base.0, base.1);
        Log {
            hard,
            conf,
            base,
            base_end: end,
            terms,
            ends: VecDeque::new(),
            held: VecDeque::new(),
            held_from: base.0 + 1,
            header_epochs: BTreeMap::new(),
            fetch: RefCell::default(),
            no_truncate: false,
            durable: base.0,
            conf_changed_at: 0,
            members: Members::default(),
        }
    }

    pub fn plant_no_truncate(&mut self) {
        self.no_truncate = true;
    }

    /// Bytes of the entries held in memory (the unapplied tail).
    pub fn held_bytes(&self) -> u64 {
        self.held.iter().map(|e| (e.data.len() + e.context.len()) as u64).sum()
    }

    pub fn last_index(&self) -> u64 {
        self.base.0 + self.ends.len() as u64
    }

    pub fn end(&self) -> LogEnd {
        *self.ends.back().unwrap_or(&self.base_end)
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.conf
    }

    pub fn set_conf_state(&mut self, conf: ConfState) {
        self.conf = conf;
    }

    pub fn set_hard_state(&mut self, hard: HardState) {
        self.hard = hard;
    }

    /// The first index raft-rs may ask for, less one: the first group on
    /// disk.
    #[cfg(test)]
    pub fn base(&self) -> (u64, u64) {
        self.base
    }

    /// Everything up to `index` is applied and durable here.
    pub fn set_durable(&mut self, index: u64) {
        self.durable = index;
    }

    /// A membership change at `index` was applied, leaving `members`.
    pub fn set_members(&mut self, index: u64, members: Members) {
        self.conf_changed_at = index;
        self.members = members;
    }

    /// The segments before `first_kept` are about to be deleted: the log
    /// now starts at the first group of `first_kept`, which must be
    /// applied and durable here (false, and nothing changes, until it is).
    pub fn compact_to(&mut self, first_kept: SegmentId) -> bool {
        if self.base_end.segment >= first_kept {
            return true;
        }
        let Some(k) = self.ends.iter().position(|e| e.segment >= first_kept) else { return false };
        let index = self.base.0 + 1 + k as u64;
        if index > self.durable || index >= self.held_from {
            return false;
        }
        let term = self.term_of(index).expect("within the log");
        self.base_end = self.ends[k];
        self.ends.drain(..=k);
        self.base = (index, term);
        self.terms.compact(index);
        self.header_epochs.retain(|s, _| *s >= first_kept);
        true
    }

    /// The manifest of a snapshot at `index`: the segments from the first
    /// on disk to the one holding `index`, each with the bytes up to its
    /// last group at or before `index`.
    pub fn manifest(&self, index: u64) -> Manifest {
        let mut segments: Vec<ManifestSegment> = Vec::new();
        for i in self.base.0..=index {
            let e = self.end_after(i);
            match segments.last_mut() {
                Some(s) if s.id == e.segment => s.bytes = e.end,
                _ => segments.push(ManifestSegment { id: e.segment, bytes: e.end, size: e.segment_bytes }),
            }
        }
        let term = self.term_of(index).expect("within the log");
        let sealed = self.end_after(index).sealed;
        Manifest { index, term, sealed, segments, members: self.members.clone() }
    }

    /// A snapshot's segments replaced this host's WAL: the log is the
    /// manifest's, ending at its index.
    pub fn installed(&mut self, m: &Manifest) {
        let last = m.segments.last().expect("a manifest names segments");
        let end =
            LogEnd { lsn: Lsn(m.index), segment: last.id, end: last.bytes, sealed: m.sealed, segment_bytes: last.size };
        let mut log = Log::new(self.hard.clone(), self.conf.clone(), (m.index, m.term), end);
        log.no_truncate = self.no_truncate;
        log.conf_changed_at = m.index;
        log.members = self.members.clone();
        *self = log;
    }

    fn end_after(&self, index: u64) -> LogEnd {
        if index == self.base.0 {
            self.base_end
        } else {
            self.ends[(index - self.base.0 - 1) as usize]
        }
    }

    /// Where the group at `index` lies.
    pub fn place(&self, index: u64) -> GroupPlace {
        place_between(index, self.end_after(index - 1), self.end_after(index))
    }

    /// Takes a `Ready`'s entries: truncates a conflicting tail, places each
    /// group after the one before it, and says what the WAL must do.
    pub fn append(&mut self, entries: &[Entry]) -> Result<Appended, EntryError> {
        let mut out = Appended::default();
        let Some(first) = entries.first().map(|e| e.index) else { return Ok(out) };
        assert!(first > self.base.0 && first <= self.last_index() + 1, "raft-rs appends right after its log");
        // Terms never go down in a raft log. An entry of a lower term after
        // the one before it means this host took part in a term its log had
        // already passed: its hard state lost a term and vote it had saved
        // (a disk that did not keep what was synced). It must not go on.
        let mut before = self.terms.term(first - 1).unwrap_or(self.base.1);
        for e in entries {
            if e.term < before {
                let what = "its term is below the term of the entry before it: this host's hard state lost a term \
                            and vote its log had passed (a disk that does not keep what it synced?)";
                return Err(EntryError { index: e.index, what });
            }
            before = e.term;
        }
        if first <= self.last_index() {
            assert!(first > self.hard.commit, "raft-rs never truncates what is committed");
            let kept_end = self.end_after(first - 1);
            for index in (first..=self.last_index()).rev() {
                let place = self.place(index);
                if place.segment != kept_end.segment {
                    if out.remove.last() != Some(&place.segment) {
                        out.remove.push(place.segment);
                    }
                } else {
                    out.zero.push(place);
                }
            }
            if self.no_truncate {
                out.remove.clear();
                out.zero.clear();
            }
            for segment in &out.remove {
                self.header_epochs.remove(segment);
            }
            self.ends.truncate((first - self.base.0 - 1) as usize);
            self.terms.truncate(first);
            self.held.truncate(first.saturating_sub(self.held_from) as usize);
        }
        for e in entries {
            let g = self.end().group_for_entry(e)?;
            self.ends.push_back(self.end().after(&g));
            self.terms.push(e.index, e.term);
            self.held.push_back(e.clone());
            if let Some(o) = g.opens {
                self.header_epochs.insert(g.place.segment, o.epoch);
            }
            out.groups.push(g);
        }
        Ok(out)
    }

    /// Entries up to `index` are applied and durable: memory holds only
    /// what comes after them (older ones are read back when wanted).
    pub fn release_through(&mut self, index: u64) {
        while self.held_from <= index && !self.held.is_empty() {
            self.held.pop_front();
            self.held_from += 1;
        }
    }

    /// One past the last index of `low..high` that a message of
    /// `max_size` bytes takes (at least one entry, as raft-rs's own limit):
    /// what a read for a lagging follower fetches. Fetching the whole rest
    /// of the log, as raft-rs asks, held it all in memory (1.7 GB on a
    /// leader catching up a follower 700 MB behind).
    pub(super) fn fetch_end(&self, low: u64, high: u64, max_size: Option<u64>) -> u64 {
        let Some(max) = max_size else { return high };
        let mut bytes = 0;
        for index in low..high {
            bytes += self.place(index).len;
            if bytes > max && index > low {
                return index;
            }
        }
        high
    }

    /// Ranges raft-rs asked for that must be read back, with their contexts.
    pub fn take_wanted(&mut self) -> Vec<(u64, u64, GetEntriesContext)> {
        std::mem::take(&mut self.fetch.get_mut().wanted)
    }

    /// Entries read back from the WAL, from `from` on, for raft-rs to take
    /// (`None`: every waiting send has resumed, they may go).
    pub fn set_fetched(&mut self, got: Option<(u64, Vec<Entry>)>) {
        self.fetch.get_mut().got = got;
    }

    /// The term of `index`, if the log holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.terms.term(index)
    }

    /// The segment that the group at `index` opens, and how.
    fn opening(&self, index: u64) -> Option<Opening> {
        let (before, after) = (self.end_after(index - 1), self.end_after(index));
        (before.segment != after.segment).then(|| Opening {
            epoch: self.header_epochs.get(&after.segment).copied().unwrap_or(Epoch(self.term_of(index).unwrap_or(0))),
            segment_bytes: after.segment_bytes,
        })
    }

    /// Rebuilds the entry at `index` from its group's bytes read back from
    /// the WAL: the envelope a follower needs, or raft-rs's empty entry
    /// where the group is a lone fence (a follower derives the same bytes
    /// from it at the same place), or a conf-change entry where the group
    /// holds a membership change.
    pub fn entry_read_back(&self, index: u64, bytes: &[u8]) -> Entry {
        let term = self.term_of(index).expect("read back within the log");
        let place = self.place(index);
        let mut e = Entry { index, term, ..Entry::default() };
        let shape = crate::wal::group_shape(place.segment, Lsn(index), bytes);
        if shape.is_some_and(|g| g.lone_fence) {
            return e;
        }
        let placement = Placement { segment: place.segment, offset: place.offset, opens: self.opening(index) };
        let data = bytes::Bytes::from(encode_entry(&placement, bytes));
        if shape.is_some_and(|g| g.membership) {
            let group = EntryGroup {
                place,
                opens: placement.opens,
                sealed: false,
                bytes: data.slice(data.len() - bytes.len()..),
            };
            if let Some(cc) = membership_change(&group) {
                e.set_entry_type(EntryType::EntryConfChangeV2);
                e.data = cc.into();
                e.context = data;
                return e;
            }
        }
        e.data = data;
        e
    }

    /// The committed group of `entry`, for the engine to apply.
    pub fn group_of(&self, entry: &Entry) -> EntryGroup {
        let place = self.place(entry.index);
        let data = match entry.get_entry_type() {
            EntryType::EntryConfChangeV2 => &entry.context,
            _ => &entry.data,
        };
        let bytes = if data.is_empty() {
            bytes::Bytes::from(encode_group(place.segment, Epoch(entry.term), Lsn(entry.index), &[&Frame::Fence]))
        } else {
            let group = decode_entry(data).expect("checked when appended").1;
            data.slice(data.len() - group.len()..)
        };
        let sealed = self.end_after(entry.index).sealed;
        EntryGroup { place, opens: self.opening(entry.index), sealed, bytes }
    }
}
