//! `Host`: the engine's coordinator. Every event comes in through `handle`,
//! every effect goes out through `poll_output`, and `poll_timeout` names the
//! next deadline. The host owns the parts and the facts they share (the
//! committed state and the records held for the sinks) and routes each
//! completion to the part that asked; the parts own their state:
//!
//! | part                       | owns                                                   |
//! |----------------------------|--------------------------------------------------------|
//! | `effects::Effects`         | outputs, outstanding requests, backoff timers, `now`    |
//! | `lease::Authority`         | who may write: directory lock, or the lease machine    |
//! | `startup::Startup`         | where recovery stands                                  |
//! | `wal_writer::WalWriter`    | pending frames, the group in flight, segments, deletes |
//! | `compact::Compaction`      | slots, planned-through positions, sequence numbers     |
//! | `sources::Sources`         | source slots, accepted positions, acks                 |
//! | `offsets_writer::OffsetsWriter` | values the offsets store lacks, its write in flight |
//! | `schema::Schemas`          | live schemas, batches held for a decision              |
//! | `replication::Replication` | clustered mode: the raft node, its role, hard-state saves |
//! | `stall::StallWatch`        | how long the WAL or lease has been failing             |
//!
//! The coordinator's own code is here (inputs, outputs, deadlines), in
//! `route.rs` (each completion, timer and lease answer routed to its part),
//! `pump.rs`, `drain.rs`, in `recover.rs` (the recovery sequence) and in `commit.rs`
//! (what a landed group means for each part).
//!
//! The drain contract: after each `handle`, the driver calls `poll_output`
//! until it returns `None`. `handle` asserts the queue is empty when it starts.
//!
//! Ordering rules kept here (see docs/ARCHITECTURE.md):
//! - a source is acked, offsets are written and a compaction is dispatched
//!   only after the commit group that carries them is durable and visible;
//! - records below a partition's accepted position (the next to read) are
//!   dropped before they reach the WAL;
//! - planned ranges never overlap; one compaction per (sink, stream) is open;
//! - a segment is deleted only when every record in it is below every sink's
//!   acknowledged compacted-through position and a later committed snapshot
//!   carries that position; segments are deleted oldest first, one at a time.

use crate::config::{ConfigError, HostConfig};
use crate::ids::*;
use crate::io::*;
use crate::io::{OffsetsOp, WalOp};
use crate::mutation::Mutation;
use crate::records::RecordStore;
use crate::state::CommittedState;
use crate::time::Instant;
use crate::wal::Names;
use authority::Authority;
use compact::{Compaction, ReadNews, SinkNews};
use effects::{Effects, Pending, Retry};
use lease::{Bump, Lease, LeaseNews};
use offsets_writer::OffsetsWriter;
use schema::Schemas;
use sources::Sources;
use stall::{StallAction, StallWatch};
use startup::{Doubt, Startup};
use std::collections::BTreeMap;
use wal_writer::{SnapshotSource, WalWriter};
use windows::Windows;

/// Reading a segment during recovery is tried this many times before the
/// engine stops: a segment that cannot be read cannot be trusted or skipped.
const WAL_READ_ATTEMPTS: u32 = 8;

pub struct Host {
    cfg: HostConfig,
    phase: Phase,
    shutdown_requested: bool,
    drain_deadline: Option<Instant>,
    /// Clustered `--once`: this leader pushed the terminal entry, and the
    /// entry saying every member learnt of it.
    finish_proposed: bool,
    all_finished_proposed: bool,
    /// Clustered mode, at a SIGTERM: leadership is being handed over.
    handing_over: bool,
    /// `Input::Shutdown` arrived (not only `--once`'s end of the sources).
    asked_to_stop: bool,
    /// Where the stop record of this run's stop stands, and the stop that
    /// waits for it to be written.
    recorded: drain::Recorded,
    closing: Option<StopReason>,
    /// This configuration's names, written into every snapshot.
    names: Names,
    committed: CommittedState,
    records: RecordStore,
    fx: Effects,
    authority: Authority,
    startup: Startup,
    wal: WalWriter,
    compaction: Compaction,
    sources: Sources,
    windows: Windows,
    offsets: OffsetsWriter,
    schemas: Schemas,
    stall: StallWatch,
}

/// The earliest of the deadlines; on a tie, the one listed first.
fn earliest<const N: usize>(deadlines: [Option<(Instant, Timer)>; N]) -> Option<(Instant, Timer)> {
    let mut next: Option<(Instant, Timer)> = None;
    for (at, timer) in deadlines.into_iter().flatten() {
        if next.is_none_or(|(t, _)| at < t) {
            next = Some((at, timer));
        }
    }
    next
}

/// Counts of an engine's rare paths, so a simulator sweep can show it
/// reaches them (`skipprd sim --stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RarePaths {
    /// A commit landed while the lease may have lapsed and waited for a
    /// lease read before its effects applied.
    pub late_commits_verified: u64,
    /// A group sealed its segment because the next group of the largest
    /// size would not fit after it.
    pub seals_ahead: u64,
    /// A group sealed its segment because the snapshot or the next frame
    /// did not fit in what was left.
    pub seals_no_room: u64,
    /// A plan was split (its sink answered `fatal` for every version), and
    /// a probe found its sink holding a version from before a split.
    pub splits: u64,
    pub held_before_split: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Recovering,
    Running,
    Draining,
    Stopped,
}

impl Host {
    /// Starts in recovery: the first output lists the WAL's segments (after
    /// the lease is read, in S3 mode).
    pub fn new(config: HostConfig, now: Instant) -> Result<Host, ConfigError> {
        config.validate()?;
        let nondeterministic = config.mutations.has(Mutation::NondeterministicRetry);
        let authority = match (&config.lease, &config.cluster) {
            (Some(lease), _) => Authority::Lease(Lease::new(lease.clone(), config.seed)),
            (None, Some(cluster)) => {
                let r =
                    replication::Replication::new(cluster.clone(), &config.limits, config.seed, config.mutations, now);
                Authority::Raft(Box::new(r))
            }
            (None, None) => Authority::DirectoryLock,
        };
        let mut host = Host {
            fx: Effects::new(config.seed, &config.limits, nondeterministic, now),
            stall: StallWatch::new(config.limits.stall_report_after, config.limits.stall_stop_after),
            sources: Sources::new(config.sources.len()),
            names: Names {
                sources: config.sources.clone(),
                sinks: config.sinks.clone(),
                streams: config.streams.clone(),
            },
            cfg: config,
            phase: Phase::Recovering,
            shutdown_requested: false,
            drain_deadline: None,
            finish_proposed: false,
            all_finished_proposed: false,
            handing_over: false,
            asked_to_stop: false,
            recorded: drain::Recorded::No,
            closing: None,
            committed: CommittedState::default(),
            records: RecordStore::default(),
            authority,
            startup: Startup::default(),
            wal: WalWriter::default(),
            compaction: Compaction::default(),
            offsets: OffsetsWriter::default(),
            schemas: Schemas::default(),
            windows: Windows::default(),
        };
        match host.authority.lease() {
            Some(lease) => lease.read(&mut host.fx),
            None => {
                host.fx.io(Pending::WalSync, IoOp::Wal(WalOp::Sync));
            }
        }
        Ok(host)
    }

    /// Feeds one event in. Drain `poll_output` completely afterwards.
    pub fn handle(&mut self, now: Instant, input: Input) {
        assert!(self.fx.drained(), "poll_output was not drained after the last handle");
        assert!(now >= self.fx.now, "time does not go backwards");
        self.fx.now = now;
        if self.phase == Phase::Stopped {
            return;
        }
        if self.holds_still() && matches!(input, Input::Peer(_) | Input::Join { .. } | Input::Removed { .. }) {
            // Stopping: the raft node hears nothing more (a lost message
            // to its peers), so that its log stops changing.
            return;
        }
        if !self.holds_still() {
            if let Some(r) = self.authority.raft() {
                r.catch_up(now);
            }
        }
        match input {
            Input::IoDone { id, result } => {
                let pending = self.fx.complete(id);
                self.on_io(id, pending, result);
            }
            Input::Timeout => self.on_timeout(),
            Input::Shutdown => {
                self.asked_to_stop = true;
                self.on_shutdown()
            }
            Input::Peer(m) => {
                let news = match self.authority.raft() {
                    Some(r) => r.step(&mut self.fx, *m),
                    None => Vec::new(), // not clustered: nobody to hear it
                };
                self.on_raft_news(news);
            }
            Input::Join { node, replaces } => self.on_join(node, replaces),
            Input::Removed { by, node } => {
                let news = match self.authority.raft() {
                    Some(r) => r.told_removed(by, node),
                    None => Vec::new(),
                };
                self.on_raft_news(news);
            }
            Input::SnapshotServed { to, ok } => {
                let news = match self.authority.raft() {
                    Some(r) => r.snapshot_served(&mut self.fx, to, ok),
                    None => Vec::new(),
                };
                self.on_raft_news(news);
            }
        }
        if self.phase != Phase::Stopped {
            self.pump();
        }
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.fx.pop_output()
    }

    /// The next deadline and its reason.
    pub fn poll_timeout(&self) -> Option<(Instant, Timer)> {
        if self.phase == Phase::Stopped {
            return None;
        }
        let retry = self.fx.next_retry().map(|(at, what)| {
            let lease = matches!(what, Retry::LeaseRead | Retry::LeaseRenew);
            (at, if lease { Timer::Lease } else { Timer::Retry })
        });
        earliest([
            retry,
            self.wal.segment_age_deadline(&self.cfg.limits).map(|at| (at, Timer::SegmentAge)),
            self.drain_deadline.map(|at| (at, Timer::Drain)),
            self.stall.deadline().map(|at| (at, Timer::Stall)),
            // Held still while it stops: no tick.
            self.authority
                .raft_ref()
                .filter(|_| !self.holds_still())
                .and_then(|r| r.deadline())
                .map(|at| (at, Timer::Raft)),
        ])
    }

    pub fn is_recovering(&self) -> bool {
        self.phase == Phase::Recovering
    }

    pub fn is_draining(&self) -> bool {
        self.phase == Phase::Draining
    }

    /// The committed state, for recovery-idempotence checks and tools.
    pub fn committed(&self) -> &CommittedState {
        &self.committed
    }

    /// How often this engine took paths that most runs rarely take.
    pub fn rare_paths(&self) -> RarePaths {
        let (seals_ahead, seals_no_room) = self.wal.seal_counts();
        let (splits, held_before_split) = self.compaction.split_counts();
        let late_commits_verified = self.authority.late_commits();
        RarePaths { late_commits_verified, seals_ahead, seals_no_room, splits, held_before_split }
    }

    /// Records held for sinks that have not acknowledged them, in memory or
    /// only in the WAL: (count, bytes).
    pub fn records_held(&self) -> (usize, u64) {
        (self.records.len(), self.records.bytes())
    }

    /// Partitions with records held that some sink has not acknowledged:
    /// how many, and the sum of the newest position held for each. What a
    /// start must hold, whichever way it came: a scan trims what every sink
    /// acknowledged at each segment's end, a running host as
    /// acknowledgements commit, and each folds into runs what its cache
    /// left out, so each may keep some the other does not, or more of a
    /// batch's front, in other runs.
    pub fn records_unacked(&self) -> (usize, u64) {
        let sinks = self.cfg.sinks.len() as u16;
        let floor = |key| (0..sinks).map(|s| self.committed.acked(SinkId(s), key)).min().unwrap_or_default();
        let mut newest = BTreeMap::new();
        for h in self.records.held().iter().filter(|h| h.last >= floor(h.key)) {
            newest.insert(h.key, h.last.0);
        }
        (newest.len(), newest.values().sum())
    }

    /// Record bytes held for sinks: (in memory, in all).
    pub fn record_bytes(&self) -> (u64, u64) {
        (self.records.cached_bytes(), self.records.bytes())
    }

    /// Per (sink, stream): committed positions not yet acknowledged by that
    /// sink, summed over the stream's partitions (records, for sources whose
    /// positions count records).
    pub fn compaction_lag(&self) -> Vec<(SinkId, StreamId, u64)> {
        let mut lag = BTreeMap::new();
        for sink in (0..self.cfg.sinks.len() as u16).map(SinkId) {
            for stream in (0..self.cfg.streams.len() as u16).map(StreamId) {
                lag.insert((sink, stream), 0u64);
            }
            for (key, p) in &self.committed.partitions {
                let behind = p.position.0.saturating_sub(self.committed.acked(sink, *key).0);
                *lag.entry((sink, p.stream)).or_default() += behind;
            }
        }
        lag.into_iter().map(|((sink, stream), n)| (sink, stream, n)).collect()
    }

    /// Clustered mode: term, leader, commit index and, leading, each other
    /// member's match index (`None` until the raft log is restored).
    pub fn raft_status(&self) -> Option<crate::consensus::replica::RaftStatus> {
        self.authority.raft_ref()?.status()
    }

    /// Clustered mode, once raft runs: its log as restored (the hard
    /// state's term, vote and commit index; what a stop record keeps of
    /// the log; the bytes of the entries held past the commit index), for
    /// the simulator's stop-record check.
    pub fn raft_log(&self) -> Option<((u64, u64, u64), crate::consensus::log::LogRecord, u64)> {
        self.authority.raft_ref()?.log_view()
    }

    /// Where the next commit group goes: (LSN, segment, offset).
    pub fn wal_head(&self) -> (Lsn, Option<(SegmentId, u64)>) {
        self.wal.head()
    }

    // ---- routing ----

    fn may_write(&self) -> bool {
        self.authority.may_write(self.fx.now)
    }

    fn stop(&mut self, reason: StopReason) {
        if self.phase == Phase::Stopped {
            return;
        }
        self.phase = Phase::Stopped;
        self.fx.cancel_retries();
        self.drain_deadline = None;
        self.fx.emit(Output::Stopped(reason));
    }
}

mod authority;
mod cluster;
mod commit;
mod compact;
mod drain;
mod effects;
mod intake;
mod lease;
mod offsets_writer;
mod pump;
mod recover;
mod replication;
mod route;
mod schema;
mod sources;
mod stall;
mod startup;
mod wal_writer;
mod windows;

#[cfg(test)]
mod tests;
