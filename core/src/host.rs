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
//! | `stall::StallWatch`        | how long the WAL or lease has been failing             |
//!
//! The coordinator's own code is here (inputs, routing, the pump, the
//! drain), in `recover.rs` (the recovery sequence) and in `commit.rs`
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
                let r = replication::Replication::new(cluster.clone(), config.seed, config.mutations, now);
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
            committed: CommittedState::default(),
            records: RecordStore::default(),
            authority,
            startup: Startup::default(),
            wal: WalWriter::default(),
            compaction: Compaction::default(),
            offsets: OffsetsWriter::default(),
            schemas: Schemas::default(),
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
        if let Some(r) = self.authority.raft() {
            r.catch_up(now);
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
            self.authority
                .raft_ref()
                .and_then(|r| r.deadline(self.cfg.limits.stall_report_after))
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
        RarePaths { late_commits_verified: self.authority.late_commits(), seals_ahead, seals_no_room }
    }

    /// Records held for sinks that have not acknowledged them, in memory or
    /// only in the WAL: (count, bytes).
    pub fn records_held(&self) -> (usize, u64) {
        (self.records.len(), self.records.bytes())
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

    fn on_timeout(&mut self) {
        while let Some(what) = self.fx.pop_due() {
            self.fire(what);
        }
        if self.wal.segment_age_deadline(&self.cfg.limits).is_some_and(|at| at <= self.fx.now) {
            self.wal.request_seal();
        }
        if self.drain_deadline.is_some_and(|at| at <= self.fx.now) {
            let stop = match self.handing_over {
                // Drained already; the handover did not happen in time.
                true => StopReason::Clean,
                false => self.finish_timed_out().unwrap_or(StopReason::DrainTimedOut),
            };
            self.stop(stop);
        }
        match self.stall.on_timeout(self.fx.now) {
            StallAction::None => {}
            StallAction::Report { what, for_ } => self.fx.emit(Output::Stalled { what, for_ }),
            StallAction::Stop { what, for_ } => self.stop(StopReason::Stalled { what, for_ }),
        }
        if let Some(r) = self.authority.raft() {
            let news = r.on_timeout(&mut self.fx, self.cfg.limits.stall_report_after);
            self.on_raft_news(news);
            self.plan_membership();
        }
    }

    fn fire(&mut self, what: Retry) {
        let fx = &mut self.fx;
        match what {
            Retry::WalSync => {
                fx.io(Pending::WalSync, IoOp::Wal(WalOp::Sync));
            }
            Retry::WalList => {
                fx.io(Pending::WalList, IoOp::Wal(WalOp::List));
            }
            Retry::WalRead(segment) => {
                fx.io(Pending::WalRead(segment), IoOp::Wal(WalOp::Read { segment }));
            }
            Retry::OffsetsRead => {
                fx.io(Pending::OffsetsRead, IoOp::Offsets(OffsetsOp::Read));
            }
            Retry::Commit => self.wal.send_commit(fx),
            Retry::Create => self.wal.retry_create(),
            Retry::Delete => {
                self.wal.retry_delete();
                if self.startup.deleting_junk() {
                    self.delete_next();
                }
            }
            Retry::OffsetsWrite => self.offsets.retry(),
            Retry::SourceOpen(source) => self.sources.open(fx, &self.committed, source),
            Retry::SourceRead(source) => self.sources.retry_read(source),
            Retry::SourceAck(source) => self.sources.retry_ack(source),
            Retry::SinkApply(sink, stream) | Retry::ReadBack(sink, stream) => self.dispatch(sink, stream),
            Retry::SchemaDecide(stream) => self.schemas.ask(fx, stream),
            Retry::LeaseRead => self.authority.held_lease().read(&mut self.fx),
            Retry::LeaseRenew => self.authority.held_lease().renew(&mut self.fx),
            Retry::HardStateRead => {
                fx.io(Pending::HardStateRead, IoOp::Wal(WalOp::ReadHardState));
            }
            Retry::RaftFetch => self.authority.held_raft().retry_fetch(&mut self.fx),
        }
    }

    fn on_io(&mut self, id: IoId, pending: Pending, result: Result<IoReply, IoError>) {
        if let Some(lease) = pending.stall_side() {
            if self.stall.on_done(self.fx.now, lease, result.is_ok()) {
                self.fx.emit(Output::Unstalled);
            }
        }
        // Each completion is checked against its request here, once: the
        // parts get the typed answer they asked for.
        macro_rules! answer {
            ($pat:pat => $value:expr) => {
                result.map(|reply| match reply {
                    $pat => $value,
                    other => panic!("{pending:?} answered with {other:?}"),
                })
            };
        }
        let done = |result: Result<IoReply, IoError>| result.map(drop);
        match pending {
            Pending::WalSync => self.on_synced(done(result)),
            Pending::WalList => self.on_listed(answer!(IoReply::Segments(listing) => listing)),
            Pending::WalRead(segment) => self.on_segment_read(segment, answer!(IoReply::SegmentBytes(b) => b)),
            Pending::OffsetsRead => self.on_offsets_read(answer!(IoReply::Offsets(entries) => entries)),
            Pending::SinkProgress(sink) => {
                // A sink that cannot answer cannot tell: nothing to check.
                let applied = answer!(IoReply::SinkProgress(applied) => applied).unwrap_or_default();
                self.on_sink_progress(sink, applied)
            }
            Pending::WalCreate(segment) => {
                if let Err(stop) = self.wal.on_created(&mut self.fx, segment, done(result)) {
                    self.stop(stop);
                }
            }
            Pending::WalAppend => self.on_append(id, done(result)),
            Pending::WalDelete(segment) => {
                let deleted = self.wal.on_deleted(&mut self.fx, segment, result.is_ok());
                if deleted && self.startup.deleting_junk() {
                    self.delete_junk();
                } else if deleted && self.phase == Phase::Running && !self.wal.deletes_queued() && self.wal.is_full() {
                    // Reaching the size limit asked for no snapshot while
                    // deletions were queued; none is left to ask later.
                    self.wal.make_room(&self.committed.acked, self.cfg.sinks.len() as u16);
                }
            }
            Pending::OffsetsWrite => self.offsets.on_written(&mut self.fx, id, result.is_ok(), &self.committed),
            Pending::OffsetsWriteEarly => {}
            Pending::SourceOpen(source) => self.sources.on_opened(&mut self.fx, source, result.is_ok()),
            Pending::SourceRead(source) => {
                if let Ok(IoReply::SourceRefused { why }) = result {
                    return self.stop(StopReason::SourceRefused { source, why });
                }
                let read = answer!(IoReply::Batches { batches, exhausted } => (batches, exhausted));
                self.on_source_read(source, read)
            }
            Pending::SourceAck(source) => self.sources.on_acked(&mut self.fx, id, source, result.is_ok()),
            Pending::SinkApply(sink, stream) => {
                let outcome = answer!(IoReply::Sink { outcome, .. } => outcome);
                match self.compaction.on_reply(&mut self.fx, id, sink, stream, outcome) {
                    SinkNews::Quiet => {}
                    SinkNews::Done(done) => self.wal.push(crate::wal::Frame::CompactionDone(done)),
                    SinkNews::Fatal(stop) => self.stop(stop),
                }
            }
            Pending::WalReadBack(sink, stream) => {
                let bytes = answer!(IoReply::Groups(groups) => groups);
                let by_source = self.cfg.mutations.has(Mutation::ReadBackWrongPartition);
                match self.compaction.on_read_back(&mut self.fx, (id, sink, stream), bytes, by_source) {
                    ReadNews::Quiet => {}
                    ReadNews::Next => self.dispatch(sink, stream),
                    ReadNews::Stop(stop) => self.stop(stop),
                }
            }
            Pending::SchemaDecide(stream) => {
                self.on_schema_decided(stream, answer!(IoReply::Schema { accept, reason } => (accept, reason)))
            }
            Pending::LeaseRead(sent_at) => {
                let row = answer!(IoReply::Lease(row) => row);
                let news = self.authority.held_lease().on_read(&mut self.fx, sent_at, row);
                self.on_lease_news(news);
            }
            Pending::HardStateRead => self.on_hard_state_read(answer!(IoReply::HardState(b) => b)),
            Pending::WalReplicate(segment) => match done(result) {
                Ok(()) => {
                    let news = self.authority.held_raft().persisted(&mut self.fx);
                    self.on_raft_news(news);
                }
                // What reached the disk is for the next start's scan to
                // judge; raft must not hear of it as durable.
                Err(error) => self.stop(StopReason::WalWriteFailed { segment, error }),
            },
            Pending::RaftFetch => match answer!(IoReply::Groups(groups) => groups) {
                Ok(groups) => {
                    let news = self.authority.held_raft().fetched(&mut self.fx, groups);
                    self.on_raft_news(news);
                }
                Err(_) => self.authority.held_raft().fetch_failed(&mut self.fx),
            },
            Pending::LeaseWrite(intent, row, sent_at) => {
                let news = self.authority.held_lease().on_written(&mut self.fx, intent, row, sent_at, done(result));
                self.on_lease_news(news);
            }
        }
    }

    /// What a lease answer means for the other parts.
    fn on_lease_news(&mut self, news: LeaseNews) {
        match news {
            LeaseNews::Quiet | LeaseNews::Released => {}
            LeaseNews::Lost(stop) => self.stop(stop),
            LeaseNews::Acquired { renew_now, wait } => {
                match wait {
                    // Recovery starts once what the last holder sent has
                    // landed or failed.
                    Some(wait) => self.fx.schedule(self.fx.now + wait, Retry::WalSync),
                    None => {
                        self.fx.io(Pending::WalSync, IoOp::Wal(WalOp::Sync));
                    }
                }
                if renew_now {
                    self.authority.held_lease().renew(&mut self.fx);
                }
            }
            LeaseNews::Ours { sent_at, commit_verified } => {
                if commit_verified {
                    self.commit_landed();
                }
                match self.startup.resolve_doubt(sent_at) {
                    Doubt::Confirmed(stop) => return self.stop(stop),
                    Doubt::Early => return self.authority.held_lease().read(&mut self.fx),
                    Doubt::None => {}
                }
                self.lease_settled();
            }
            LeaseNews::Renewed => self.lease_settled(),
        }
    }

    /// A renewal or bump is confirmed, or the row read back is ours: carry
    /// on with what waited for it.
    fn lease_settled(&mut self) {
        let bump = self.authority.held_lease().settle(&mut self.fx);
        // Deleting junk during recovery waits for a valid lease.
        if self.startup.deleting_junk() {
            self.delete_next();
        }
        match bump {
            Bump::None => {}
            Bump::Reached => self.after_rebuild(),
            Bump::Pending => self.authority.held_lease().try_bump(&mut self.fx),
        }
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
mod schema;
mod sources;
mod stall;
mod startup;
mod wal_writer;

#[cfg(test)]
mod tests;
