//! `Host`: the engine. Every event comes in through `handle`, every effect
//! goes out through `poll_output`, and `poll_timeout` names the next deadline.
//!
//! The drain contract: after each `handle`, the driver calls `poll_output`
//! until it returns `None`. `handle` asserts the queue is empty when it starts.
//!
//! Ordering rules kept here (see docs/ARCHITECTURE.md):
//! - a source is acked, offsets are written and a compaction is dispatched
//!   only after the commit group that carries them is durable and visible;
//! - records below a partition's accepted position (the next to read) are
//!   dropped before
//!   they reach the WAL;
//! - planned ranges never overlap; one compaction per (sink, stream) is open;
//! - a segment is deleted only when every record in it is below every sink's
//!   acknowledged compacted-through position and a later committed snapshot
//!   carries that position; segments are deleted oldest first, one at a time.

use crate::compaction::{compaction_id, NamedRanges};
use crate::config::{ConfigError, HostConfig, LeaseConfig, SEAL_RESERVE};
use crate::ids::*;
use crate::io::*;
use crate::mutation::Mutation;
use crate::offsets::OffsetValue;
use crate::recovery::{recover, SegmentSummary, WalDamage};
use crate::state::{CommittedState, RecordStore};
use crate::time::{Duration, Instant};
use crate::wal::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// Reading a segment during recovery is tried this many times before the
/// engine stops: a segment that cannot be read cannot be trusted or skipped.
const WAL_READ_ATTEMPTS: u32 = 8;

pub struct Host {
    cfg: HostConfig,
    now: Instant,
    phase: Phase,
    shutdown_requested: bool,
    drain_deadline: Option<Instant>,
    out: VecDeque<Output>,
    next_io: u64,
    ios: BTreeMap<IoId, Pending>,
    retries: BTreeMap<(Instant, u64), Retry>,
    retry_seq: u64,
    attempts: BTreeMap<Retry, u32>,
    jitter: u64,
    recovery: Recovery,
    committed: CommittedState,
    records: RecordStore,
    wal: Wal,
    pending: VecDeque<Frame>,
    pending_bytes: u64,
    accepted: BTreeMap<PartitionKey, Position>,
    sources: Vec<SourceSlot>,
    slots: BTreeMap<(SinkId, StreamId), Slot>,
    planned: BTreeMap<(SinkId, PartitionKey), Position>,
    next_seq: BTreeMap<(SinkId, StreamId), CompactionSeq>,
    offsets_dirty: BTreeSet<PartitionKey>,
    offsets_io: Option<IoId>,
    /// Only for the planted bug `offsets-stale-value`.
    offsets_stale: BTreeMap<PartitionKey, OffsetValue>,
    /// The schema each stream's records are accepted under: committed, or
    /// decided and waiting in the pending group.
    schema_live: BTreeMap<StreamId, u64>,
    /// A schema decision asked for and not yet answered, and the batches
    /// (of any source) of that stream waiting for it.
    schema_waits: BTreeMap<StreamId, SchemaWait>,
    /// This configuration's names, written into every snapshot.
    names: Names,
    lease: lease::LeaseState,
    stall: stall::StallWatch,
}

struct SchemaWait {
    fingerprint: u64,
    schema: Arc<[u8]>,
    batches: VecDeque<(SourceId, SourceBatchIn)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Recovering,
    Running,
    Draining,
    Stopped,
}

/// What an outstanding I/O is for.
#[derive(Clone, Copy, Debug)]
enum Pending {
    WalSync,
    WalList,
    WalRead(SegmentId),
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
    SinkProgress(SinkId),
    SchemaDecide(StreamId),
    /// With the time it was sent.
    LeaseRead(Instant),
    /// With the time it was sent.
    LeaseWrite(lease::LeaseIntent, LeaseRow, Instant),
}

/// Work waiting for a backoff to pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Retry {
    WalSync,
    WalList,
    WalRead(SegmentId),
    OffsetsRead,
    Commit,
    Create,
    Delete,
    OffsetsWrite,
    SourceOpen(SourceId),
    SourceRead(SourceId),
    SourceAck(SourceId),
    SinkApply(SinkId, StreamId),
    SchemaDecide(StreamId),
    LeaseRead,
    LeaseRenew,
}

#[derive(Default)]
struct Recovery {
    listed: Vec<SegmentId>,
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

struct Wal {
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
    /// Sealed segments became deletable since the last snapshot: the next
    /// group carries a snapshot so they can go.
    snapshot_wanted: bool,
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
    snapshot_acked: Option<BTreeMap<(SinkId, PartitionKey), Position>>,
}

#[derive(Default)]
struct SourceSlot {
    opened: bool,
    read: Option<IoId>,
    waiting: bool,
    exhausted: bool,
    acks: BTreeMap<u32, Position>,
    ack_io: Option<IoId>,
    /// The acks in flight, put back if their request fails.
    acks_sent: Vec<(u32, Position)>,
}

enum Slot {
    Idle,
    /// Planned; `committed` once its frame is durable. `io` while a sink
    /// apply is outstanding.
    Planned {
        plan: CompactionPlan,
        committed: bool,
        io: Option<IoId>,
        dispatched: bool,
    },
}

impl Host {
    /// Starts in recovery: the first output lists the WAL's segments.
    pub fn new(config: HostConfig, now: Instant) -> Result<Host, ConfigError> {
        config.validate()?;
        let mut host = Host {
            jitter: config.seed ^ 0x9e37_79b9_7f4a_7c15,
            stall: stall::StallWatch::new(config.limits.stall_report_after, config.limits.stall_stop_after),
            sources: (0..config.sources.len()).map(|_| SourceSlot::default()).collect(),
            cfg: config,
            now,
            phase: Phase::Recovering,
            shutdown_requested: false,
            drain_deadline: None,
            out: VecDeque::new(),
            next_io: 0,
            ios: BTreeMap::new(),
            retries: BTreeMap::new(),
            retry_seq: 0,
            attempts: BTreeMap::new(),
            recovery: Recovery::default(),
            committed: CommittedState::default(),
            records: RecordStore::default(),
            wal: Wal {
                epoch: Epoch(0),
                next_lsn: Lsn(0),
                active: None,
                spares: VecDeque::new(),
                next_segment: SegmentId(0),
                creating: false,
                segments: VecDeque::new(),
                commit: None,
                deletes: VecDeque::new(),
                deleting: false,
                snapshot_wanted: false,
            },
            pending: VecDeque::new(),
            pending_bytes: 0,
            accepted: BTreeMap::new(),
            slots: BTreeMap::new(),
            planned: BTreeMap::new(),
            next_seq: BTreeMap::new(),
            offsets_dirty: BTreeSet::new(),
            offsets_io: None,
            offsets_stale: BTreeMap::new(),
            schema_live: BTreeMap::new(),
            schema_waits: BTreeMap::new(),
            names: Names::default(),
            lease: lease::LeaseState::default(),
        };
        host.names = Names {
            sources: host.cfg.sources.clone(),
            sinks: host.cfg.sinks.clone(),
            streams: host.cfg.streams.clone(),
        };
        if host.cfg.lease.is_some() {
            host.lease_read();
        } else {
            host.io(Pending::WalSync, IoOp::WalSync);
        }
        Ok(host)
    }

    /// Feeds one event in. Drain `poll_output` completely afterwards.
    pub fn handle(&mut self, now: Instant, input: Input) {
        assert!(self.out.is_empty(), "poll_output was not drained after the last handle");
        assert!(now >= self.now, "time does not go backwards");
        self.now = now;
        if self.phase == Phase::Stopped {
            return;
        }
        match input {
            Input::IoDone { id, result } => {
                let pending = self.ios.remove(&id).expect("IoDone answers an outstanding request");
                self.on_io(id, pending, result);
            }
            Input::Timeout => self.on_timeout(),
            Input::Shutdown => self.on_shutdown(),
        }
        if self.phase != Phase::Stopped {
            self.pump();
        }
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The next deadline and its reason.
    pub fn poll_timeout(&self) -> Option<(Instant, Timer)> {
        if self.phase == Phase::Stopped {
            return None;
        }
        let mut next: Option<(Instant, Timer)> = None;
        let mut consider = |at: Instant, timer: Timer| {
            if next.is_none_or(|(t, _)| at < t) {
                next = Some((at, timer));
            }
        };
        if let Some((&(at, _), what)) = self.retries.iter().next() {
            let lease = matches!(what, Retry::LeaseRead | Retry::LeaseRenew);
            consider(at, if lease { Timer::Lease } else { Timer::Retry });
        }
        if let Some(at) = self.segment_age_deadline() {
            consider(at, Timer::SegmentAge);
        }
        if let Some(at) = self.drain_deadline {
            consider(at, Timer::Drain);
        }
        if let Some(at) = self.stall.deadline() {
            consider(at, Timer::Stall);
        }
        next
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

    /// Records held for sinks that have not acknowledged them: (count, bytes).
    pub fn records_held(&self) -> (usize, u64) {
        (self.records.len(), self.records.bytes())
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

    /// Where the next commit group goes: (LSN, segment, offset).
    pub fn wal_head(&self) -> (Lsn, Option<(SegmentId, u64)>) {
        (self.wal.next_lsn, self.wal.active.as_ref().map(|a| (a.id, a.offset)))
    }

    // ---- I/O plumbing ----

    fn io(&mut self, pending: Pending, op: IoOp) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        self.ios.insert(id, pending);
        self.out.push_back(Output::Io { id, op });
        id
    }

    fn stop(&mut self, reason: StopReason) {
        if self.phase == Phase::Stopped {
            return;
        }
        self.phase = Phase::Stopped;
        self.retries.clear();
        self.drain_deadline = None;
        self.out.push_back(Output::Stopped(reason));
    }

    /// WAL and lease completions feed the stall watch.
    fn watch_stall(&mut self, pending: &Pending, ok: bool) {
        let lease = match pending {
            Pending::WalSync
            | Pending::WalList
            | Pending::WalRead(_)
            | Pending::WalCreate(_)
            | Pending::WalAppend
            | Pending::WalDelete(_) => false,
            Pending::LeaseRead(_) | Pending::LeaseWrite(..) => true,
            _ => return,
        };
        if self.stall.on_done(self.now, lease, ok) {
            self.out.push_back(Output::Unstalled);
        }
    }

    /// Schedules `what` after an exponential, jittered backoff.
    fn retry_later(&mut self, what: Retry) {
        let attempt = self.attempts.entry(what).or_insert(0);
        *attempt = (*attempt + 1).min(20);
        let base = self.cfg.limits.retry_min.saturating_mul(1 << (*attempt - 1).min(16));
        let base = base.min(self.cfg.limits.retry_max);
        let delay = Duration::from_micros(base.as_micros() / 2 + self.next_jitter() % (base.as_micros() / 2 + 1));
        self.schedule(self.now + delay, what);
    }

    fn schedule(&mut self, at: Instant, what: Retry) {
        self.retry_seq += 1;
        self.retries.insert((at, self.retry_seq), what);
    }

    fn succeeded(&mut self, what: Retry) {
        self.attempts.remove(&what);
    }

    fn next_jitter(&mut self) -> u64 {
        if self.cfg.mutations.has(Mutation::NondeterministicRetry) {
            static SHARED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            self.jitter ^= SHARED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // splitmix64: deterministic from the configured seed.
        self.jitter = self.jitter.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.jitter;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn on_timeout(&mut self) {
        while let Some(entry) = self.retries.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let what = entry.remove();
            self.fire(what);
        }
        if self.segment_age_deadline().is_some_and(|at| at <= self.now) {
            self.wal.active.as_mut().expect("deadline implies active").seal_requested = true;
        }
        if self.drain_deadline.is_some_and(|at| at <= self.now) {
            self.stop(StopReason::DrainTimedOut);
        }
        match self.stall.on_timeout(self.now) {
            stall::StallAction::None => {}
            stall::StallAction::Report { what, for_ } => self.out.push_back(Output::Stalled { what, for_ }),
            stall::StallAction::Stop { what, for_ } => self.stop(StopReason::Stalled { what, for_ }),
        }
    }

    fn fire(&mut self, what: Retry) {
        match what {
            Retry::WalSync => {
                self.io(Pending::WalSync, IoOp::WalSync);
            }
            Retry::WalList => {
                self.io(Pending::WalList, IoOp::WalList);
            }
            Retry::WalRead(segment) => {
                self.io(Pending::WalRead(segment), IoOp::WalRead { segment });
            }
            Retry::OffsetsRead => {
                self.io(Pending::OffsetsRead, IoOp::OffsetsRead);
            }
            Retry::Commit => self.send_commit(),
            Retry::Create => self.wal.creating = false,
            Retry::Delete => {
                self.wal.deleting = false;
                if self.recovery.deleting_junk {
                    self.delete_next();
                }
            }
            Retry::OffsetsWrite => self.offsets_io = None,
            Retry::SourceOpen(source) => self.open_source(source),
            Retry::SourceRead(source) => self.sources[source.0 as usize].waiting = false,
            Retry::SourceAck(source) => self.sources[source.0 as usize].ack_io = None,
            Retry::SinkApply(sink, stream) => self.dispatch(sink, stream),
            Retry::SchemaDecide(stream) => self.ask_schema(stream),
            Retry::LeaseRead => self.lease_read(),
            Retry::LeaseRenew => self.renew_lease(),
        }
    }

    fn on_shutdown(&mut self) {
        self.shutdown_requested = true;
        if self.phase == Phase::Recovering && self.cfg.lease.is_some() && self.lease.held.is_none() {
            // Still waiting for another writer's lease: nothing to drain.
            return self.stop(StopReason::Clean);
        }
        if self.phase == Phase::Running {
            self.phase = Phase::Draining;
            self.drain_deadline = Some(self.now + self.cfg.limits.drain_timeout);
        }
    }

    fn on_io(&mut self, id: IoId, pending: Pending, result: Result<IoReply, IoError>) {
        self.watch_stall(&pending, result.is_ok());
        match pending {
            Pending::WalSync => match result {
                Ok(_) => {
                    self.succeeded(Retry::WalSync);
                    self.io(Pending::WalList, IoOp::WalList);
                }
                Err(_) => self.retry_later(Retry::WalSync),
            },
            Pending::WalList => match result {
                Ok(IoReply::Segments(ids)) => self.on_listed(ids),
                Ok(other) => panic!("WalList answered with {other:?}"),
                Err(_) => self.retry_later(Retry::WalList),
            },
            Pending::WalRead(segment) => match result {
                Ok(IoReply::SegmentBytes(bytes)) => self.on_segment_read(segment, bytes),
                Ok(other) => panic!("WalRead answered with {other:?}"),
                Err(_)
                    if self.attempts.get(&Retry::WalRead(segment)).copied().unwrap_or(0) + 1 >= WAL_READ_ATTEMPTS =>
                {
                    self.stop(StopReason::WalReadFailed { segment })
                }
                Err(_) => self.retry_later(Retry::WalRead(segment)),
            },
            Pending::OffsetsRead => match result {
                Ok(IoReply::Offsets(entries)) => self.on_offsets_read(entries),
                Ok(other) => panic!("OffsetsRead answered with {other:?}"),
                Err(_) => self.retry_later(Retry::OffsetsRead),
            },
            Pending::WalCreate(segment) => match result {
                Ok(_) => {
                    self.succeeded(Retry::Create);
                    self.wal.creating = false;
                    self.wal.spares.push_back(segment);
                    self.wal.next_segment = SegmentId(segment.0 + 1);
                }
                Err(IoError::Conflict) => self.stop(StopReason::Fenced { segment, offset: 0 }),
                Err(_) => self.retry_later(Retry::Create),
            },
            Pending::WalAppend => self.on_append(id, result),
            Pending::SinkProgress(sink) => match result {
                Ok(IoReply::SinkProgress(applied)) => self.on_sink_progress(sink, applied),
                Ok(other) => panic!("SinkProgress answered with {other:?}"),
                Err(_) => self.on_sink_progress(sink, Vec::new()),
            },
            Pending::WalDelete(segment) => match result {
                Ok(_) => {
                    self.succeeded(Retry::Delete);
                    assert_eq!(self.wal.deletes.pop_front(), Some(segment), "deletes go in order");
                    self.wal.deleting = false;
                    if self.recovery.deleting_junk {
                        self.delete_junk();
                    }
                }
                Err(_) => self.retry_later(Retry::Delete),
            },
            Pending::OffsetsWrite => {
                self.offsets_io = None;
                if result.is_err() {
                    // Offsets are a cache of the WAL: rewrite everything later.
                    let keys: Vec<_> = self.committed.partitions.keys().copied().collect();
                    self.offsets_dirty.extend(keys);
                    self.offsets_io = Some(id);
                    self.retry_later(Retry::OffsetsWrite);
                } else {
                    self.succeeded(Retry::OffsetsWrite);
                }
            }
            Pending::OffsetsWriteEarly => {}
            Pending::SourceOpen(source) => match result {
                Ok(_) => {
                    self.succeeded(Retry::SourceOpen(source));
                    self.sources[source.0 as usize].opened = true;
                }
                Err(_) => self.retry_later(Retry::SourceOpen(source)),
            },
            Pending::SourceRead(source) => self.on_source_read(source, result),
            Pending::SourceAck(source) => {
                let slot = &mut self.sources[source.0 as usize];
                slot.ack_io = None;
                if result.is_err() {
                    // Send the failed positions again unless newer ones wait.
                    for (partition, position) in std::mem::take(&mut slot.acks_sent) {
                        let ack = slot.acks.entry(partition).or_insert(position);
                        *ack = (*ack).max(position);
                    }
                    slot.ack_io = Some(id);
                    self.retry_later(Retry::SourceAck(source));
                } else {
                    self.succeeded(Retry::SourceAck(source));
                }
            }
            Pending::SinkApply(sink, stream) => self.on_sink_reply(id, sink, stream, result),
            Pending::SchemaDecide(stream) => self.on_schema_decided(stream, result),
            Pending::LeaseRead(sent_at) => self.on_lease_read(sent_at, result),
            Pending::LeaseWrite(intent, row, sent_at) => self.on_lease_written(intent, row, sent_at, result),
        }
    }

    // ---- the running engine ----

    /// Starts whatever work the current state allows. Bounded: each step
    /// issues at most one request per source, slot or queue.
    fn pump(&mut self) {
        if self.phase == Phase::Recovering && self.recovery.fencing {
            self.ensure_spare();
            self.start_commit();
        }
        if matches!(self.phase, Phase::Recovering | Phase::Stopped) {
            return;
        }
        self.read_sources();
        self.plan_compactions();
        self.ensure_spare();
        self.start_commit();
        self.write_offsets();
        self.send_acks();
        self.delete_next();
        if self.phase == Phase::Draining && self.drained() && self.release_lease() {
            self.stop(StopReason::Clean);
        }
    }

    // ---- shutdown ----

    /// Everything read is committed, compacted, acknowledged by every sink,
    /// recorded as done, and materialized in the offsets store.
    fn drained(&self) -> bool {
        let sources_idle = self.sources.iter().all(|s| s.read.is_none() && s.ack_io.is_none() && s.acks.is_empty());
        let wal_idle = self.pending.is_empty() && self.wal.commit.is_none();
        let slots_idle = self.slots.values().all(|s| matches!(s, Slot::Idle)) && self.committed.open.is_empty();
        let sinks = self.cfg.sinks.len() as u16;
        let compacted = self
            .committed
            .partitions
            .iter()
            .all(|(key, p)| (0..sinks).all(|s| self.committed.acked(SinkId(s), *key) >= p.position));
        let offsets_idle = self.offsets_dirty.is_empty() && self.offsets_io.is_none();
        let schemas_idle = self.schema_waits.is_empty();
        sources_idle && wal_idle && slots_idle && compacted && offsets_idle && schemas_idle
    }
}

mod commit;
mod compact;
mod lease;
mod recover;
mod sources;
mod stall;

#[cfg(test)]
mod tests;
