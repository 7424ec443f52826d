//! Recovery's own progress: which segments were listed and read, the
//! leftovers of interrupted deletions below the WAL (object stores), the junk
//! found past the WAL's end, the highest writer generation seen, whether the
//! junk deletion or the fence is under way, a stop held in doubt until the
//! lease is read again, and the sinks whose progress answer is awaited. The
//! steps themselves are sequenced by the coordinator (`recover.rs`); this
//! part only remembers where they stand. Talks only to [`Effects`].

use super::effects::{Effects, Pending, Retry};
use crate::ids::*;
use crate::io::{IoOp, StopReason, WalListing};
use crate::io::{PluginOp, WalOp};
use crate::time::Instant;
use crate::wal::split_leftovers;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub(super) struct Startup {
    listed: Vec<SegmentId>,
    /// Listed below the oldest segment that still counts: deleted with the
    /// junk, under the same authority check, before the fence.
    leftovers: Vec<SegmentId>,
    read: BTreeMap<SegmentId, Vec<u8>>,
    junk: Vec<SegmentId>,
    /// The highest writer generation in the WAL.
    wal_generation: u64,
    /// Junk after the WAL's end is being deleted; the fence follows.
    deleting_junk: bool,
    /// The fence group is pending or in flight: recovery finishes once it
    /// commits.
    fencing: bool,
    /// A stop recovery found, held until the lease is read again: if
    /// another writer took over, losing the lease is the real story.
    doubt: Option<(StopReason, Instant)>,
    /// Sinks asked for their progress and not answered yet.
    progress_pending: BTreeSet<SinkId>,
}

/// Where a stop held in doubt stands after a lease read that shows the
/// row is still ours.
pub(super) enum Doubt {
    None,
    /// The read was sent after the doubt arose: the stop stands.
    Confirmed(StopReason),
    /// The read is older than the doubt: read again.
    Early,
}

impl Startup {
    /// The listing came back: read every segment of the WAL, and set the
    /// leftovers of an object store's interrupted deletions aside. True when
    /// there is nothing to read.
    pub(super) fn on_listed(&mut self, fx: &mut Effects, listing: WalListing) -> bool {
        fx.succeeded(Retry::WalList);
        let mut ids = match listing {
            WalListing::Files(ids) => ids,
            WalListing::Objects(objects) => {
                let (leftovers, kept) = split_leftovers(&objects);
                self.leftovers = leftovers;
                kept
            }
        };
        ids.sort_unstable();
        ids.dedup();
        self.listed = ids.clone();
        for &segment in &ids {
            fx.io(Pending::WalRead(segment), IoOp::Wal(WalOp::Read { segment }));
        }
        ids.is_empty()
    }

    /// True when every listed segment has been read.
    pub(super) fn on_read(&mut self, fx: &mut Effects, segment: SegmentId, bytes: Vec<u8>) -> bool {
        fx.succeeded(Retry::WalRead(segment));
        self.read.insert(segment, bytes);
        self.read.len() == self.listed.len()
    }

    pub(super) fn take_read(&mut self) -> BTreeMap<SegmentId, Vec<u8>> {
        std::mem::take(&mut self.read)
    }

    pub(super) fn found(&mut self, junk: Vec<SegmentId>, wal_generation: u64) {
        self.junk = junk;
        self.wal_generation = wal_generation;
    }

    pub(super) fn wal_generation(&self) -> u64 {
        self.wal_generation
    }

    /// Everything to delete before the fence, oldest first: the leftovers
    /// below the WAL, then the junk past its end.
    pub(super) fn take_junk(&mut self) -> Vec<SegmentId> {
        let mut all = self.leftovers.clone();
        all.append(&mut self.junk);
        all
    }

    pub(super) fn leftovers(&self) -> usize {
        self.leftovers.len()
    }

    pub(super) fn set_deleting_junk(&mut self, deleting: bool) {
        self.deleting_junk = deleting;
    }

    pub(super) fn deleting_junk(&self) -> bool {
        self.deleting_junk
    }

    pub(super) fn set_fencing(&mut self, fencing: bool) {
        self.fencing = fencing;
    }

    pub(super) fn fencing(&self) -> bool {
        self.fencing
    }

    pub(super) fn doubt(&mut self, stop: StopReason, now: Instant) {
        self.doubt = Some((stop, now));
    }

    pub(super) fn in_doubt(&self) -> bool {
        self.doubt.is_some()
    }

    /// A lease read sent at `sent_at` shows the row is ours.
    pub(super) fn resolve_doubt(&mut self, sent_at: Instant) -> Doubt {
        match self.doubt.take() {
            None => Doubt::None,
            Some((stop, since)) if sent_at >= since => Doubt::Confirmed(stop),
            Some(doubt) => {
                self.doubt = Some(doubt);
                Doubt::Early
            }
        }
    }

    /// Asks every sink for its progress; true when there are none to ask.
    pub(super) fn ask_progress(&mut self, fx: &mut Effects, sinks: u16) -> bool {
        self.progress_pending = (0..sinks).map(SinkId).collect();
        for sink in (0..sinks).map(SinkId) {
            fx.io(Pending::SinkProgress(sink), IoOp::Plugin(PluginOp::SinkProgress { sink }));
        }
        self.progress_pending.is_empty()
    }

    /// True when that was the last answer awaited.
    pub(super) fn progress_answered(&mut self, sink: SinkId) -> bool {
        assert!(self.progress_pending.remove(&sink), "one progress answer per sink");
        self.progress_pending.is_empty()
    }
}
