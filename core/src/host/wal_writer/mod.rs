//! The WAL writer: frames waiting for a commit, one commit group in flight,
//! the active segment and its spares, the committed segments' summaries,
//! and the deletion queue (`deletion.rs`). It owns the WAL's write position
//! (epoch, next LSN, next segment id) and talks only to [`Effects`]; the coordinator
//! tells it whether the writer authority allows a write, hands it the
//! committed state a snapshot is built from, and routes the frames of each
//! group it lands to the parts that react to them.

use super::effects::{Effects, Pending, Retry};
use crate::config::{Limits, SEAL_RESERVE};
use crate::ids::*;
use crate::io::WalOp;
use crate::io::{IoError, IoOp, StopReason};
use crate::records::HeldPlace;
use crate::recovery::stop_record::StopRecord;
use crate::recovery::{RecoveredWal, SegmentSummary};
use crate::state::CommittedState;
use crate::time::Instant;
use crate::wal::*;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// A (sink, partition) → acknowledged position map: the deletion rule's input.
pub(super) type Acked = BTreeMap<(SinkId, PartitionKey), Position>;

#[derive(Default)]
pub(super) struct WalWriter {
    epoch: Epoch,
    next_lsn: Lsn,
    active: Option<Active>,
    spares: VecDeque<SegmentId>,
    next_segment: SegmentId,
    creating: bool,
    segments: VecDeque<SegmentSummary>,
    commit: Option<InflightCommit>,
    deletes: VecDeque<SegmentId>,
    deleting: bool,
    /// The LSN of the snapshot whose commit queued the latest deletions:
    /// clustered mode deletes only once the saved commit index covers it
    /// (recovery must find the acknowledgements that justified them).
    deletes_justified_at: Lsn,
    /// Sealed segments became deletable since the last snapshot: the next
    /// group carries a snapshot so they can go.
    snapshot_wanted: bool,
    /// Frames waiting for the next group, and their encoded size.
    pending: VecDeque<Frame>,
    pending_bytes: u64,
    /// How often a group sealed its segment ahead of time (the next group
    /// of the largest size would not fit after it), and how often because
    /// what came next did not fit at all: paths most runs rarely take.
    seals_ahead: u64,
    seals_no_room: u64,
    /// The WAL was at its size limit when last looked at.
    full: bool,
    /// Clustered mode: groups are proposed to raft, which decides when
    /// they are durable on a majority; no segment is created here (a group
    /// that opens a segment creates it on every host). Every host deletes
    /// its own segments by the deletion rule, once raft's log starts after
    /// them.
    replicated: bool,
    /// Clustered mode: the group in flight waits to be proposed.
    to_propose: bool,
}

struct Active {
    id: SegmentId,
    offset: u64,
    opened: Instant,
    seal_requested: bool,
}

struct InflightCommit {
    io: Option<IoId>,
    segment: SegmentId,
    offset: u64,
    lsn: Lsn,
    bytes: Arc<Vec<u8>>,
    frames: Vec<Frame>,
    /// The true acknowledged frontier when the snapshot in this group was
    /// built; the deletion rule uses it once the group commits.
    snapshot_acked: Option<Acked>,
}

/// A group that is durable and visible, handed back for its effects.
pub(super) struct Landed {
    pub(super) place: GroupPlace,
    pub(super) frames: Vec<Frame>,
    pub(super) snapshot_acked: Option<Acked>,
}

/// How an append ended.
pub(super) enum Appended {
    /// Durable and visible; the group waits in flight for `land`.
    Durable,
    /// The outcome is unknown: the identical bytes go again after a backoff.
    Again,
    Failed(StopReason),
}

mod deletion;
mod group;
pub(super) use group::SnapshotSource;

/// Clustered mode: a group to propose (segment, offset, bytes, the
/// membership change among its frames).
pub(super) type Proposal = (SegmentId, u64, Arc<Vec<u8>>, Option<Vec<u8>>);

impl WalWriter {
    /// Takes over the write position recovery found.
    pub(super) fn restore(&mut self, wal: &mut RecoveredWal, now: Instant) {
        self.segments = std::mem::take(&mut wal.segments);
        self.spares = std::mem::take(&mut wal.spares);
        self.next_lsn = wal.next_lsn;
        self.next_segment = wal.next_segment;
        self.active = wal.active.map(|(id, offset)| Active { id, offset, opened: now, seal_requested: false });
    }

    /// The stop record of the WAL as it stands, the configuration's names,
    /// committed state and held batches given: only while nothing is in flight.
    pub(super) fn describe(&self, config: Names, state: CommittedState, held: Vec<HeldPlace>) -> StopRecord {
        assert!(self.idle_but_proposed(), "a stop record describes a WAL with nothing in flight");
        StopRecord {
            config,
            state,
            epoch: self.epoch,
            next_lsn: self.next_lsn,
            next_segment: self.next_segment,
            active: self.active.as_ref().map(|a| (a.id, a.offset)),
            spares: self.spares.iter().copied().collect(),
            segments: self.segments.iter().cloned().collect(),
            held,
            raft: None,
        }
    }

    pub(super) fn set_replicated(&mut self) {
        self.replicated = true;
    }

    /// Clustered mode: the next group goes where raft's log ends (a
    /// segment the last group sealed is followed by the next id, which the
    /// group opens). Nothing changes while a group is in flight.
    pub(super) fn follow_log(&mut self, end: &crate::consensus::entry::LogEnd, now: Instant) {
        if self.commit.is_some() {
            return;
        }
        self.next_lsn = Lsn(end.lsn.0 + 1);
        if end.sealed {
            self.active = None;
            self.spares = VecDeque::from([SegmentId(end.segment.0 + 1)]);
        } else {
            match &mut self.active {
                Some(a) if a.id == end.segment => a.offset = end.end,
                _ => {
                    self.active = Some(Active { id: end.segment, offset: end.end, opened: now, seal_requested: false })
                }
            }
            self.spares.clear();
        }
    }

    /// Clustered mode: the group built to go next, to propose: (segment,
    /// offset, bytes, the membership change among its frames, if any).
    pub(super) fn take_proposal(&mut self) -> Option<Proposal> {
        if !std::mem::take(&mut self.to_propose) {
            return None;
        }
        let c = self.commit.as_ref().expect("a proposal is the group in flight");
        let change = c.frames.iter().find_map(|f| match f {
            Frame::Membership(cc) => Some(cc.clone()),
            _ => None,
        });
        Some((c.segment, c.offset, c.bytes.clone(), change))
    }

    /// Clustered mode: a group not of this writer (another leader's, or
    /// raft's own fence) was applied: the summaries follow it as `land`
    /// makes them follow the writer's own.
    pub(super) fn note_replicated(&mut self, place: GroupPlace, frames: &[Frame]) {
        if self.segments.back().is_none_or(|s| s.id != place.segment) {
            self.segments.push_back(SegmentSummary::new(place));
        }
        let summary = self.segments.back_mut().expect("pushed above");
        for frame in frames {
            summary.note(place, frame);
        }
    }

    /// Clustered mode: the segment the next group goes to holds only raft's
    /// lone fences so far, so that group opens it with a snapshot.
    pub(super) fn head_open(&self, segment: SegmentId) -> bool {
        self.replicated
            && self.segments.back().is_some_and(|s| {
                s.id == segment && matches!(s.head, crate::recovery::Head::Empty | crate::recovery::Head::Fences { .. })
            })
    }

    /// Clustered mode: raft committed the group at `lsn`. True when it is
    /// the one in flight (it lands next).
    pub(super) fn replicated_commit(&mut self, lsn: Lsn) -> bool {
        self.commit.as_ref().is_some_and(|c| c.lsn == lsn)
    }

    pub(super) fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }

    pub(super) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// (seals ahead of time, seals because the next frame did not fit).
    pub(super) fn seal_counts(&self) -> (u64, u64) {
        (self.seals_ahead, self.seals_no_room)
    }

    pub(super) fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    /// Where the next group goes: (LSN, segment, offset).
    pub(super) fn head(&self) -> (Lsn, Option<(SegmentId, u64)>) {
        (self.next_lsn, self.active.as_ref().map(|a| (a.id, a.offset)))
    }

    pub(super) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The bytes the WAL takes: every segment that holds committed groups,
    /// at the segment size.
    pub(super) fn size_bytes(&self, limits: &Limits) -> u64 {
        self.segments.len() as u64 * limits.segment_bytes
    }

    /// Whether the WAL is at its size limit, and whether that changed since
    /// the last look.
    pub(super) fn check_full(&mut self, limits: &Limits) -> (bool, bool) {
        let full = self.size_bytes(limits) >= limits.wal_bytes_max;
        let changed = full != self.full;
        self.full = full;
        (full, changed)
    }

    /// The WAL was at its size limit when last looked at.
    pub(super) fn is_full(&self) -> bool {
        self.full
    }

    pub(super) fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Nothing waits for a commit and none is in flight.
    pub(super) fn committed_all(&self) -> bool {
        self.pending.is_empty() && self.commit.is_none()
    }

    /// No deletion or creation in flight, nor a commit but (clustered
    /// mode) a group proposed to raft, which raft's log holds.
    pub(super) fn idle_but_proposed(&self) -> bool {
        (self.commit.is_none() || self.replicated) && !self.deleting && !self.creating
    }

    /// No commit, deletion or creation in flight.
    pub(super) fn idle(&self) -> bool {
        self.commit.is_none() && !self.deleting && !self.creating
    }

    pub(super) fn push(&mut self, frame: Frame) {
        self.pending_bytes += frame.encoded_len() as u64;
        self.pending.push_back(frame);
    }

    /// The fence goes ahead of anything else waiting.
    pub(super) fn push_front(&mut self, frame: Frame) {
        self.pending_bytes += frame.encoded_len() as u64;
        self.pending.push_front(frame);
    }

    pub(super) fn segment_age_deadline(&self, limits: &Limits) -> Option<Instant> {
        let a = self.active.as_ref()?;
        if a.seal_requested || a.offset == SEGMENT_HEADER_BYTES as u64 {
            return None;
        }
        Some(a.opened + limits.segment_age_max)
    }

    pub(super) fn request_seal(&mut self) {
        self.active.as_mut().expect("a segment-age deadline implies an active segment").seal_requested = true;
    }

    pub(super) fn ensure_spare(&mut self, fx: &mut Effects, limits: &Limits, may_write: bool) {
        let enough = self.spares.len() >= limits.spare_segments as usize;
        if self.creating || enough || !may_write || self.replicated {
            return;
        }
        // The id advances only when the creation succeeds: a failed one is
        // retried under the same id, so no half-created segment is ever left
        // behind a newer one.
        let segment = self.next_segment;
        self.creating = true;
        let header = encode_header(segment, self.epoch);
        fx.io(Pending::WalCreate(segment), IoOp::Wal(WalOp::Create { segment, header, size: limits.segment_bytes }));
    }

    /// A creation finished; a failure is tried again after a backoff.
    pub(super) fn on_created(
        &mut self,
        fx: &mut Effects,
        segment: SegmentId,
        result: Result<(), IoError>,
    ) -> Result<(), StopReason> {
        match result {
            Ok(_) => {
                fx.succeeded(Retry::Create);
                self.creating = false;
                self.spares.push_back(segment);
                self.next_segment = SegmentId(segment.0 + 1);
            }
            Err(IoError::Conflict) => return Err(StopReason::Fenced { segment, offset: 0 }),
            Err(_) => fx.retry_later(Retry::Create),
        }
        Ok(())
    }

    pub(super) fn retry_create(&mut self) {
        self.creating = false;
    }

    pub(super) fn send_commit(&mut self, fx: &mut Effects) {
        if self.replicated {
            self.to_propose = true;
            return;
        }
        let c = self.commit.as_mut().expect("a commit is in flight");
        let op = IoOp::Wal(WalOp::Append { segment: c.segment, offset: c.offset, lsn: c.lsn, bytes: c.bytes.clone() });
        c.io = Some(fx.io(Pending::WalAppend, op));
    }

    /// The plans in the group just sent (the planted bug
    /// `dispatch-before-plan-commit` dispatches them early).
    pub(super) fn plans_in_flight(&self) -> Vec<(SinkId, StreamId)> {
        let Some(c) = &self.commit else { return Vec::new() };
        c.frames
            .iter()
            .filter_map(|f| match f {
                Frame::CompactionPlanned(p) => Some((p.sink, p.stream)),
                _ => None,
            })
            .collect()
    }

    /// `stale_commits` is the planted bug `stale-writer-commits`.
    pub(super) fn on_append(
        &mut self,
        fx: &mut Effects,
        id: IoId,
        result: Result<(), IoError>,
        stale_commits: bool,
    ) -> Appended {
        let c = self.commit.as_mut().expect("an append answers the commit in flight");
        assert_eq!(c.io, Some(id), "one append in flight");
        match result {
            Ok(_) => {}
            Err(IoError::Ambiguous) => {
                // The group may or may not be there: send the identical bytes
                // again until the outcome is known.
                c.io = None;
                fx.retry_later(Retry::Commit);
                return Appended::Again;
            }
            Err(IoError::Conflict) if stale_commits => {}
            Err(IoError::Conflict) => {
                return Appended::Failed(StopReason::Fenced { segment: c.segment, offset: c.offset });
            }
            Err(error) => return Appended::Failed(StopReason::WalWriteFailed { segment: c.segment, error }),
        }
        c.io = None;
        Appended::Durable
    }

    /// The group in flight is durable and visible: advance past it and hand
    /// its frames back.
    pub(super) fn land(&mut self, fx: &mut Effects) -> Landed {
        fx.succeeded(Retry::Commit);
        let c = self.commit.take().expect("in flight");
        let active = self.active.as_mut().expect("a commit goes to the active segment");
        active.offset += c.bytes.len() as u64;
        let place = GroupPlace { lsn: c.lsn, segment: c.segment, offset: c.offset, len: c.bytes.len() as u64 };
        if self.segments.back().is_none_or(|s| s.id != c.segment) {
            self.segments.push_back(SegmentSummary::new(place));
        }
        let summary = self.segments.back_mut().expect("pushed above");
        for frame in &c.frames {
            summary.note(place, frame);
        }
        self.next_lsn = Lsn(c.lsn.0 + 1);
        if matches!(c.frames.last(), Some(Frame::Seal)) {
            self.active = None;
        }
        Landed { place, frames: c.frames, snapshot_acked: c.snapshot_acked }
    }

    pub(super) fn want_snapshot(&mut self) {
        self.snapshot_wanted = true;
    }
}
