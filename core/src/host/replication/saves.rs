//! Sub-part `Saves`: what raft asks to be made durable, in order. Each
//! `Ready`'s groups, truncation and hard state go to the disk as one
//! `Replicate` request (or one `InstallSnapshot`), one request in flight at
//! a time: raft needs them durable in order. `Ready`s that queued meanwhile
//! go together with one sync, unless one truncates (its removals and
//! zeroing must come after what the `Ready`s before it wrote). It also
//! numbers the hard-state file's slots and knows which commit index the
//! file holds durably.

use super::super::effects::{Effects, Pending};
use crate::consensus::entry::EntryGroup;
use crate::consensus::hard_state::{encode_slot, slot_offset, HardStateError, Members};
use crate::consensus::replica::Persist;
use crate::consensus::{ConfState, HardState};
use crate::ids::{Lsn, SegmentId};
use crate::io::{Install, IoOp, Replicate, StopReason, WalOp};
use std::collections::{BTreeSet, VecDeque};

/// A hard state to save, with the configuration and membership record as
/// of its commit index.
pub(super) type Saved = (HardState, ConfState, Members);

/// The request in flight, made durable.
pub(super) struct Landed {
    /// The numbers of the `Ready`s it held, for raft to hear of.
    pub(super) numbers: Vec<u64>,
    /// The planted bug `commit-before-quorum`: the groups it held.
    pub(super) groups: Vec<EntryGroup>,
    /// It installed a snapshot ending at this index.
    pub(super) installed: Option<u64>,
}

pub(super) struct Saves {
    /// The sequence number of the next hard-state save.
    next_seq: u64,
    /// `Ready`s waiting for the request in flight.
    queued: VecDeque<Persist>,
    /// The numbers of the `Ready`s in the request in flight.
    in_flight: Option<Vec<u64>>,
    /// The request in flight installs a snapshot ending at this index: once
    /// it is durable, this host restarts to recover from it.
    installing: Option<u64>,
    /// The commit index the hard-state file holds durably, and the one the
    /// request in flight saves.
    saved_commit: u64,
    saving_commit: Option<u64>,
    /// The planted bug `commit-before-quorum`: the groups of the request in
    /// flight, and the LSNs already taken as committed.
    in_flight_groups: Vec<EntryGroup>,
    landed_early: BTreeSet<Lsn>,
}

impl Saves {
    pub(super) fn new() -> Saves {
        Saves {
            next_seq: 1,
            queued: VecDeque::new(),
            in_flight: None,
            installing: None,
            saved_commit: 0,
            saving_commit: None,
            in_flight_groups: Vec::new(),
            landed_early: BTreeSet::new(),
        }
    }

    /// The file read at start held save `seq`, which holds commit index
    /// `commit` once the log is restored.
    pub(super) fn read_at_start(&mut self, seq: u64) {
        self.next_seq = seq + 1;
    }

    pub(super) fn restored(&mut self, commit: u64) {
        self.saved_commit = commit;
    }

    /// Writes the genesis group, as the first request.
    pub(super) fn genesis(&mut self, fx: &mut Effects, group: EntryGroup) {
        let op = Replicate { remove: Vec::new(), zero: Vec::new(), groups: vec![group], hard_state: None };
        self.in_flight = Some(Vec::new());
        self.installing = None;
        fx.io(Pending::WalReplicate(SegmentId(0)), IoOp::Wal(WalOp::Replicate(op)));
    }

    pub(super) fn queue(&mut self, p: Persist) {
        self.queued.push_back(p);
    }

    /// Whether the hard-state file holds a commit index through `at`.
    pub(super) fn saved_through(&self, at: Lsn) -> bool {
        self.saved_commit >= at.0
    }

    /// Whether the hard-state file holds exactly commit index `at`.
    pub(super) fn saved_exactly(&self, at: u64) -> bool {
        self.saved_commit == at
    }

    /// Nothing is in flight or waiting.
    pub(super) fn idle(&self) -> bool {
        self.in_flight.is_none() && self.queued.is_empty()
    }

    /// A request that saves `saved` alone (a commit index is otherwise
    /// saved lazily, with the next `Ready` that carries a hard state).
    pub(super) fn save_alone(&mut self, fx: &mut Effects, saved: Saved) {
        let Ok(hard_state) = self.slot(saved).map(Some) else { return };
        self.in_flight = Some(Vec::new());
        let op = Replicate { remove: Vec::new(), zero: Vec::new(), groups: Vec::new(), hard_state };
        fx.io(Pending::WalReplicate(SegmentId(0)), IoOp::Wal(WalOp::Replicate(op)));
    }

    /// The request in flight is durable.
    pub(super) fn landed(&mut self) -> Landed {
        let numbers = self.in_flight.take().expect("a replicate request was in flight");
        let groups = std::mem::take(&mut self.in_flight_groups);
        let installed = self.installing.take();
        if let Some(commit) = self.saving_commit.take() {
            self.saved_commit = self.saved_commit.max(commit);
        }
        Landed { numbers, groups, installed }
    }

    /// The planted bug `commit-before-quorum`: a group taken as committed
    /// when this leader's own copy landed, and its real commit, skipped.
    pub(super) fn take_early(&mut self, lsn: Lsn) {
        self.landed_early.insert(lsn);
    }

    pub(super) fn committed_early(&mut self, lsn: Lsn) -> bool {
        self.landed_early.remove(&lsn)
    }

    /// The next hard-state save's slot (its offset in the file, its bytes),
    /// for the request about to go, which saves this commit index.
    fn slot(&mut self, (hs, cs, members): Saved) -> Result<(u64, Vec<u8>), HardStateError> {
        let slot = encode_slot(self.next_seq, &hs, &cs, &members)?;
        let at = slot_offset(self.next_seq);
        self.next_seq += 1;
        self.saving_commit = Some(hs.commit);
        Ok((at, slot))
    }

    /// Sends the next request if none is in flight (`keep_groups`: the
    /// planted bug `commit-before-quorum` is on).
    pub(super) fn send(&mut self, fx: &mut Effects, keep_groups: bool) -> Result<(), StopReason> {
        if self.in_flight.is_some() {
            return Ok(());
        }
        let Some(first) = self.queued.pop_front() else { return Ok(()) };
        if let Some(install) = first.install {
            let (from, manifest) = *install;
            let hard_state =
                self.slot(first.hard.expect("an install saves its hard state")).map_err(super::cluster_log)?;
            self.in_flight = Some(vec![first.number]);
            self.installing = Some(manifest.index);
            let segment = manifest.segments[0].id;
            let op = WalOp::InstallSnapshot(Install { from, manifest, hard_state });
            fx.io(Pending::WalReplicate(segment), IoOp::Wal(op));
            return Ok(());
        }
        let mut numbers = vec![first.number];
        let (remove, zero, mut groups, mut hard) =
            (first.appended.remove, first.appended.zero, first.appended.groups, first.hard);
        while self
            .queued
            .front()
            .is_some_and(|p| p.appended.remove.is_empty() && p.appended.zero.is_empty() && p.install.is_none())
        {
            let p = self.queued.pop_front().expect("front exists");
            numbers.push(p.number);
            groups.extend(p.appended.groups);
            hard = p.hard.or(hard);
        }
        let hard_state = hard.map(|saved| self.slot(saved)).transpose().map_err(super::cluster_log)?;
        let segment = groups.first().map_or(SegmentId(0), |g| g.place.segment);
        if keep_groups {
            self.in_flight_groups = groups.clone();
        }
        let op = Replicate { remove, zero, groups, hard_state };
        self.in_flight = Some(numbers);
        fx.io(Pending::WalReplicate(segment), IoOp::Wal(WalOp::Replicate(op)));
        Ok(())
    }
}
