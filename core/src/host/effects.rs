//! Effects: the only way a part reaches the driver. Owns the engine's clock
//! reading (`now`), the output queue, the table of outstanding requests
//! (what each `IoId` is for) and the backoff timers with their jitter.
//! Every part is handed `&mut Effects` to send a request or schedule a
//! retry; the coordinator routes each completion by the `Pending` kept here.

use super::lease::Intent;
use crate::config::Limits;
use crate::ids::*;
use crate::io::{IoOp, LeaseRow, Output};
use crate::time::{Duration, Instant};
use std::collections::{BTreeMap, VecDeque};

/// What an outstanding request is for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pending {
    WalSync,
    WalList,
    WalRead(SegmentId),
    /// The read of the stop record's check at this index.
    WalCheck(u32),
    StopRecordRead,
    StopRecordWrite,
    WalCreate(SegmentId),
    WalAppend,
    WalDelete(SegmentId),
    OffsetsRead,
    OffsetsWrite,
    /// A write issued by the planted bug `offsets-before-commit`.
    OffsetsWriteEarly,
    SourceOpen(SourceId),
    SourceRead(SourceId),
    SourceAck(SourceId),
    SinkApply(SinkId, StreamId),
    /// The dead letters of (sink, stream)'s open plan.
    DeadLetters(SinkId, StreamId),
    /// A group read back from the WAL for the dispatch of (sink, stream).
    WalReadBack(SinkId, StreamId),
    SinkProgress(SinkId),
    SchemaDecide(StreamId),
    /// With the time it was sent.
    LeaseRead(Instant),
    /// With the time it was sent.
    LeaseWrite(Intent, LeaseRow, Instant),
    /// Clustered mode: the raft hard-state file read at start.
    HardStateRead,
    /// Clustered mode: `Ready`s' groups and hard state (the segment of the
    /// first group).
    WalReplicate(SegmentId),
    /// Clustered mode: old groups read back for a lagging follower.
    RaftFetch,
}

impl Pending {
    /// Which side of the stall watch a completion feeds: `Some(false)` for
    /// the WAL, `Some(true)` for the lease, `None` for neither.
    pub(super) fn stall_side(&self) -> Option<bool> {
        match self {
            Pending::WalSync
            | Pending::WalList
            | Pending::WalRead(_)
            | Pending::WalCheck(_)
            | Pending::StopRecordRead
            | Pending::StopRecordWrite
            | Pending::WalCreate(_)
            | Pending::WalAppend
            | Pending::WalDelete(_)
            | Pending::WalReadBack(..)
            | Pending::HardStateRead
            | Pending::WalReplicate(..)
            | Pending::RaftFetch => Some(false),
            Pending::LeaseRead(_) | Pending::LeaseWrite(..) => Some(true),
            _ => None,
        }
    }
}

/// Work waiting for a backoff (or a poll interval) to pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Retry {
    WalSync,
    WalList,
    WalRead(SegmentId),
    WalCheck(u32),
    OffsetsRead,
    Commit,
    Create,
    Delete,
    OffsetsWrite,
    SourceOpen(SourceId),
    SourceRead(SourceId),
    SourceAck(SourceId),
    SinkApply(SinkId, StreamId),
    ReadBack(SinkId, StreamId),
    SchemaDecide(StreamId),
    LeaseRead,
    LeaseRenew,
    HardStateRead,
    RaftFetch,
}

pub(super) struct Effects {
    /// The time of the input being handled.
    pub(super) now: Instant,
    out: VecDeque<Output>,
    next_io: u64,
    ios: BTreeMap<IoId, Pending>,
    retries: BTreeMap<(Instant, u64), Retry>,
    retry_seq: u64,
    attempts: BTreeMap<Retry, u32>,
    jitter: u64,
    retry_min: Duration,
    retry_max: Duration,
    /// The planted bug `nondeterministic-retry`.
    nondeterministic: bool,
}

impl Effects {
    pub(super) fn new(seed: u64, limits: &Limits, nondeterministic: bool, now: Instant) -> Effects {
        Effects {
            now,
            out: VecDeque::new(),
            next_io: 0,
            ios: BTreeMap::new(),
            retries: BTreeMap::new(),
            retry_seq: 0,
            attempts: BTreeMap::new(),
            jitter: seed ^ 0x9e37_79b9_7f4a_7c15,
            retry_min: limits.retry_min,
            retry_max: limits.retry_max,
            nondeterministic,
        }
    }

    /// Sends a request; its completion comes back with the returned id.
    pub(super) fn io(&mut self, pending: Pending, op: IoOp) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        self.ios.insert(id, pending);
        self.out.push_back(Output::Io { id, op });
        id
    }

    pub(super) fn emit(&mut self, output: Output) {
        self.out.push_back(output);
    }

    pub(super) fn pop_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    pub(super) fn drained(&self) -> bool {
        self.out.is_empty()
    }

    /// What the completed request `id` was for.
    pub(super) fn complete(&mut self, id: IoId) -> Pending {
        self.ios.remove(&id).expect("IoDone answers an outstanding request")
    }

    /// Schedules `what` after an exponential, jittered backoff.
    pub(super) fn retry_later(&mut self, what: Retry) {
        let attempt = self.attempts.entry(what).or_insert(0);
        *attempt = (*attempt + 1).min(20);
        let base = self.retry_min.saturating_mul(1 << (*attempt - 1).min(16));
        let base = base.min(self.retry_max);
        let delay = Duration::from_micros(base.as_micros() / 2 + self.next_jitter() % (base.as_micros() / 2 + 1));
        self.schedule(self.now + delay, what);
    }

    pub(super) fn schedule(&mut self, at: Instant, what: Retry) {
        self.retry_seq += 1;
        self.retries.insert((at, self.retry_seq), what);
    }

    /// `what` succeeded: its next failure starts the backoff from the minimum.
    pub(super) fn succeeded(&mut self, what: Retry) {
        self.attempts.remove(&what);
    }

    /// Failed attempts of `what` since its last success.
    pub(super) fn attempts(&self, what: Retry) -> u32 {
        self.attempts.get(&what).copied().unwrap_or(0)
    }

    pub(super) fn is_scheduled(&self, what: Retry) -> bool {
        self.retries.values().any(|r| *r == what)
    }

    /// The earliest scheduled retry.
    pub(super) fn next_retry(&self) -> Option<(Instant, Retry)> {
        self.retries.iter().next().map(|(&(at, _), &what)| (at, what))
    }

    /// Removes and returns the earliest retry that is due.
    pub(super) fn pop_due(&mut self) -> Option<Retry> {
        let entry = self.retries.first_entry()?;
        if entry.key().0 > self.now {
            return None;
        }
        Some(entry.remove())
    }

    pub(super) fn cancel_retries(&mut self) {
        self.retries.clear();
    }

    fn next_jitter(&mut self) -> u64 {
        if self.nondeterministic {
            // The planted bug: a value that differs between two runs of the
            // same seed, as a `HashMap`'s iteration order would.
            use std::hash::BuildHasher;
            self.jitter ^= std::collections::hash_map::RandomState::new().hash_one(self.jitter);
        }
        // splitmix64: deterministic from the configured seed.
        self.jitter = self.jitter.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.jitter;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
