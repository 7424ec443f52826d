//! `Host`: the engine. Every event comes in through `handle`, every effect
//! goes out through `poll_output`, and `poll_timeout` names the next deadline.
//!
//! The drain contract: after each `handle`, the driver calls `poll_output`
//! until it returns `None`. `handle` asserts the queue is empty when it starts.
//!
//! Ordering rules kept here (see docs/ARCHITECTURE.md):
//! - a source is acked, offsets are written and a compaction is dispatched
//!   only after the commit group that carries them is durable and visible;
//! - records at or below a partition's accepted position are dropped before
//!   they reach the WAL;
//! - planned ranges never overlap; one compaction per (sink, stream) is open;
//! - a segment is deleted only when every record in it is below every sink's
//!   acknowledged compacted-through position and a later committed snapshot
//!   carries that position; segments are deleted oldest first, one at a time.

use crate::compaction::{compaction_id, NamedRanges};
use crate::config::{ConfigError, HostConfig, SEAL_RESERVE};
use crate::ids::*;
use crate::io::*;
use crate::mutation::Mutation;
use crate::offsets::OffsetValue;
use crate::recovery::{rebuild, SegmentSummary};
use crate::state::{CommittedState, RecordStore};
use crate::time::{Duration, Instant};
use crate::wal::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

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
}

#[derive(Default)]
struct Recovery {
    listed: Vec<SegmentId>,
    read: BTreeMap<SegmentId, Vec<u8>>,
    junk: Vec<SegmentId>,
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
        };
        host.io(Pending::WalSync, IoOp::WalSync);
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
        if let Some((&(at, _), _)) = self.retries.iter().next() {
            consider(at, Timer::Retry);
        }
        if let Some(at) = self.segment_age_deadline() {
            consider(at, Timer::SegmentAge);
        }
        if let Some(at) = self.drain_deadline {
            consider(at, Timer::Drain);
        }
        next
    }

    pub fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
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
                if self.phase == Phase::Recovering {
                    self.delete_next();
                }
            }
            Retry::OffsetsWrite => self.offsets_io = None,
            Retry::SourceOpen(source) => self.open_source(source),
            Retry::SourceRead(source) => self.sources[source.0 as usize].waiting = false,
            Retry::SourceAck(source) => self.sources[source.0 as usize].ack_io = None,
            Retry::SinkApply(sink, stream) => self.dispatch(sink, stream),
        }
    }

    fn on_shutdown(&mut self) {
        self.shutdown_requested = true;
        if self.phase == Phase::Running {
            self.phase = Phase::Draining;
            self.drain_deadline = Some(self.now + self.cfg.limits.drain_timeout);
        }
    }

    fn on_io(&mut self, id: IoId, pending: Pending, result: Result<IoReply, IoError>) {
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
                Err(_) => self.retry_later(Retry::Create),
            },
            Pending::WalAppend => self.on_append(id, result),
            Pending::WalDelete(segment) => match result {
                Ok(_) => {
                    self.succeeded(Retry::Delete);
                    assert_eq!(self.wal.deletes.pop_front(), Some(segment), "deletes go in order");
                    self.wal.deleting = false;
                    if self.phase == Phase::Recovering {
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
        }
    }

    // ---- recovery ----

    fn on_listed(&mut self, mut ids: Vec<SegmentId>) {
        self.succeeded(Retry::WalList);
        ids.sort_unstable();
        ids.dedup();
        self.recovery.listed = ids.clone();
        if ids.is_empty() {
            return self.on_all_read();
        }
        for segment in ids {
            self.io(Pending::WalRead(segment), IoOp::WalRead { segment });
        }
    }

    fn on_segment_read(&mut self, segment: SegmentId, bytes: Vec<u8>) {
        self.succeeded(Retry::WalRead(segment));
        self.recovery.read.insert(segment, bytes);
        if self.recovery.read.len() == self.recovery.listed.len() {
            self.on_all_read();
        }
    }

    /// Step one: scan the committed segments and rebuild state from them.
    fn on_all_read(&mut self) {
        let read = std::mem::take(&mut self.recovery.read);
        let segments: Vec<(SegmentId, &[u8])> = read.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        let lenient = self.cfg.mutations.has(Mutation::AdmitTornSegment);
        let rebuilt = scan(&segments, lenient).and_then(rebuild);
        let wal = match rebuilt {
            Ok(wal) => wal,
            Err(corruption) => return self.stop(StopReason::Corrupt(corruption)),
        };
        self.committed = wal.state;
        self.records = wal.records;
        self.wal.segments = wal.segments;
        self.wal.spares = wal.spares;
        self.wal.next_lsn = wal.next_lsn;
        self.wal.epoch = Epoch(wal.epoch_max.0 + 1);
        self.wal.next_segment = wal.next_segment;
        self.wal.active = wal.active.map(|(id, offset)| Active { id, offset, opened: self.now, seal_requested: false });
        self.recovery.junk = wal.junk;
        self.io(Pending::OffsetsRead, IoOp::OffsetsRead);
    }

    /// Step two: the offsets store may lag the WAL, never lead it.
    fn on_offsets_read(&mut self, entries: Vec<(PartitionKey, Vec<u8>, Option<Vec<u8>>)>) {
        self.succeeded(Retry::OffsetsRead);
        let mut stored = BTreeMap::new();
        for (key, bytes, _checkpoint) in entries {
            let value = OffsetValue::decode(&bytes).expect("the offsets store holds 24-byte values");
            stored.insert(key, value);
        }
        for (key, value) in &stored {
            let wal = self.committed.partitions.get(key).map(|p| p.position).unwrap_or_default();
            if value.position > wal {
                return self.stop(StopReason::OffsetsAheadOfWal { key: *key, store: value.position, wal });
            }
        }
        for (key, p) in &self.committed.partitions {
            if stored.get(key).is_none_or(|v| v.lsn < p.lsn || v.position != p.position) {
                self.offsets_dirty.insert(*key);
            }
        }
        self.wal.deletes.extend(std::mem::take(&mut self.recovery.junk));
        if self.cfg.mutations.has(Mutation::DeleteDuringRecovery) {
            if let Some(seg) = self.wal.segments.front().filter(|s| s.sealed) {
                self.wal.deletes.push_front(seg.id);
                self.wal.segments.pop_front();
            }
        }
        self.delete_junk();
    }

    /// Segments after the WAL's end whose creation never completed are
    /// deleted before anything new is written: left in place, a later scan
    /// could not tell them from a data segment whose header rotted.
    fn delete_junk(&mut self) {
        if self.wal.deletes.is_empty() {
            return self.finish_recovery();
        }
        self.delete_next();
    }

    /// Steps three and four: replay open compactions, resume sources.
    fn finish_recovery(&mut self) {
        let sinks = self.cfg.sinks.len() as u16;
        let keys: Vec<PartitionKey> = self.committed.partitions.keys().copied().collect();
        for &key in &keys {
            self.accepted.insert(key, self.committed.partitions[&key].position);
            let mut floor = None::<Position>;
            for sink in (0..sinks).map(SinkId) {
                let through = self.committed.planned_through(sink, key);
                self.planned.insert((sink, key), through);
                let acked = self.committed.acked(sink, key);
                floor = Some(floor.map_or(acked, |f| f.min(acked)));
            }
            self.records.prune(key, floor.unwrap_or_default());
        }
        self.next_seq = self.committed.next_seq.clone();
        for sink in (0..sinks).map(SinkId) {
            for stream in (0..self.cfg.streams.len() as u16).map(StreamId) {
                self.slots.insert((sink, stream), Slot::Idle);
            }
        }
        let replay = !self.cfg.mutations.has(Mutation::SkipCompactionReplay);
        let open: Vec<CompactionPlan> = self.committed.open.values().cloned().collect();
        let open_count = open.len();
        for plan in open {
            let key = (plan.sink, plan.stream);
            if replay {
                let slot = Slot::Planned { plan, committed: true, io: None, dispatched: false };
                self.slots.insert(key, slot);
                self.dispatch(key.0, key.1);
            }
        }
        self.out.push_back(Output::Recovered(RecoverySummary {
            segments: self.wal.segments.len(),
            next_lsn: self.wal.next_lsn,
            partitions: self.committed.partitions.len(),
            open_compactions: open_count,
        }));
        self.phase = Phase::Running;
        if self.shutdown_requested {
            self.on_shutdown();
        }
        for source in (0..self.cfg.sources.len() as u16).map(SourceId) {
            self.open_source(source);
        }
    }

    fn open_source(&mut self, source: SourceId) {
        let resume = self
            .committed
            .partitions
            .iter()
            .filter(|(key, _)| key.source == source)
            .map(|(key, p)| ResumePoint {
                partition: key.partition,
                position: p.position,
                checkpoint: p.checkpoint.clone(),
            })
            .collect();
        self.io(Pending::SourceOpen(source), IoOp::SourceOpen { source, resume });
    }

    // ---- the running engine ----

    /// Starts whatever work the current state allows. Bounded: each step
    /// issues at most one request per source, slot or queue.
    fn pump(&mut self) {
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
        if self.phase == Phase::Draining && self.drained() {
            self.stop(StopReason::Clean);
        }
    }

    fn backpressured(&self) -> bool {
        let l = &self.cfg.limits;
        self.pending_bytes >= l.pending_bytes_max || self.records.bytes() >= l.uncompacted_bytes_max
    }

    fn read_sources(&mut self) {
        if self.phase != Phase::Running {
            return;
        }
        for i in 0..self.sources.len() {
            if self.backpressured() {
                return;
            }
            let s = &self.sources[i];
            if s.opened && s.read.is_none() && !s.waiting && !s.exhausted {
                let source = SourceId(i as u16);
                let records_max = self.cfg.limits.source_read_records_max;
                let id = self.io(Pending::SourceRead(source), IoOp::SourceRead { source, records_max });
                self.sources[i].read = Some(id);
            }
        }
    }

    fn on_source_read(&mut self, source: SourceId, result: Result<IoReply, IoError>) {
        let i = source.0 as usize;
        self.sources[i].read = None;
        match result {
            Ok(IoReply::Batches { batches, exhausted }) => {
                self.succeeded(Retry::SourceRead(source));
                self.sources[i].exhausted = exhausted;
                let mut any = false;
                for batch in batches {
                    any |= !batch.records.is_empty();
                    if let Err(what) = self.accept(source, batch) {
                        return self.stop(what);
                    }
                }
                if !any && !exhausted {
                    self.sources[i].waiting = true;
                    self.schedule(self.now + self.cfg.limits.source_poll, Retry::SourceRead(source));
                }
            }
            Ok(other) => panic!("SourceRead answered with {other:?}"),
            Err(_) => {
                self.sources[i].waiting = true;
                self.retry_later(Retry::SourceRead(source));
            }
        }
    }

    /// Takes a source batch into the pending group, dropping records at or
    /// below what the partition already holds.
    fn accept(&mut self, source: SourceId, batch: SourceBatchIn) -> Result<(), StopReason> {
        let key = PartitionKey { source, partition: batch.partition };
        let protocol = |what| StopReason::SourceProtocol { source, partition: batch.partition, what };
        if !batch.records.windows(2).all(|w| w[0].position < w[1].position)
            || batch.records.last().is_some_and(|r| r.position >= batch.end)
        {
            return Err(protocol("record positions must increase and stay below the batch end"));
        }
        if batch.stream.0 as usize >= self.cfg.streams.len() {
            return Err(protocol("unknown stream"));
        }
        if let Some(p) = self.committed.partitions.get(&key) {
            if p.stream != batch.stream {
                return Err(protocol("a partition cannot change stream"));
            }
        }
        let floor = self.accepted.get(&key).copied().unwrap_or_default();
        let mut records = batch.records;
        if !self.cfg.mutations.has(Mutation::AcceptResentRecords) {
            records.retain(|r| r.position >= floor);
        }
        if records.is_empty() {
            return Ok(());
        }
        let end = batch.end;
        if !self.cfg.mutations.has(Mutation::AcceptResentRecords) {
            assert!(end > floor, "a batch with new records ends past the floor");
        }
        self.accepted.insert(key, end);
        let frame_budget = (self.cfg.limits.group_bytes_max - SEAL_RESERVE) as usize - FRAME_HEADER_BYTES - 64;
        let mut chunk: Vec<Record> = Vec::new();
        let mut chunk_bytes = 0usize;
        let total = records.len();
        for (n, record) in records.into_iter().enumerate() {
            let len = 12 + record.bytes.len();
            if len > frame_budget {
                return Err(protocol("a record is larger than a commit group allows"));
            }
            if chunk_bytes + len > frame_budget {
                let next = record.position;
                self.push_batch(key, batch.stream, std::mem::take(&mut chunk), next, None);
                chunk_bytes = 0;
            }
            chunk_bytes += len;
            chunk.push(record);
            if n + 1 == total {
                self.push_batch(key, batch.stream, std::mem::take(&mut chunk), end, batch.checkpoint.clone());
            }
        }
        if self.cfg.mutations.has(Mutation::AckBeforeCommit) {
            self.sources[source.0 as usize].acks.insert(key.partition, end);
        }
        if self.cfg.mutations.has(Mutation::OffsetsBeforeCommit) {
            let records = self.committed.partitions.get(&key).map_or(0, |p| p.records) + total as u64;
            let value = OffsetValue { position: end, lsn: self.wal.next_lsn, records };
            let entry = OffsetEntry { key, value, checkpoint: batch.checkpoint };
            self.io(Pending::OffsetsWriteEarly, IoOp::OffsetsWrite { entries: vec![entry] });
        }
        Ok(())
    }

    fn push_batch(
        &mut self,
        key: PartitionKey,
        stream: StreamId,
        records: Vec<Record>,
        end: Position,
        checkpoint: Option<Vec<u8>>,
    ) {
        let frame = Frame::SourceBatch(SourceBatch { key, stream, end, checkpoint, records });
        self.push_frame(frame);
    }

    fn push_frame(&mut self, frame: Frame) {
        self.pending_bytes += frame.encoded_len() as u64;
        self.pending.push_back(frame);
    }

    // ---- group commit ----

    fn segment_age_deadline(&self) -> Option<Instant> {
        let a = self.wal.active.as_ref()?;
        if a.seal_requested || a.offset == SEGMENT_HEADER_BYTES as u64 {
            return None;
        }
        Some(a.opened + self.cfg.limits.segment_age_max)
    }

    fn ensure_spare(&mut self) {
        if self.wal.creating || self.wal.spares.len() >= self.cfg.limits.spare_segments as usize {
            return;
        }
        // The id advances only when the creation succeeds: a failed one is
        // retried under the same id, so no half-created segment is ever left
        // behind a newer one.
        let segment = self.wal.next_segment;
        self.wal.creating = true;
        let header = encode_header(segment, self.wal.epoch);
        self.io(Pending::WalCreate(segment), IoOp::WalCreate { segment, header });
    }

    /// Builds the next commit group from the pending frames and sends it.
    /// One group is in flight at a time; frames arriving meanwhile ride the
    /// next one.
    fn start_commit(&mut self) {
        if self.wal.commit.is_some() {
            return;
        }
        let seal_due = self.wal.active.as_ref().is_some_and(|a| a.seal_requested);
        if self.pending.is_empty() && !seal_due && !self.wal.snapshot_wanted {
            return;
        }
        if self.wal.active.is_none() {
            let Some(id) = self.wal.spares.pop_front() else { return };
            let offset = SEGMENT_HEADER_BYTES as u64;
            self.wal.active = Some(Active { id, offset, opened: self.now, seal_requested: false });
        }
        let limits = &self.cfg.limits;
        let active = self.wal.active.as_ref().expect("set above");
        let (segment, offset) = (active.id, active.offset);
        let fresh = offset == SEGMENT_HEADER_BYTES as u64;
        let room = limits.segment_bytes - offset - SEAL_RESERVE;
        let mut frames = Vec::new();
        let mut len = COMMIT_FRAME_BYTES as u64;
        let mut snapshot_acked = None;
        let mut seal_now = false;
        if fresh || self.wal.snapshot_wanted {
            self.wal.snapshot_wanted = false;
            let drop = self.cfg.mutations.has(Mutation::SnapshotDropsFrontier);
            let snapshot = Frame::Snapshot(self.committed.snapshot(drop));
            let snapshot_len = snapshot.encoded_len() as u64;
            if fresh || len + snapshot_len <= room {
                len += snapshot_len;
                frames.push(snapshot);
                snapshot_acked = Some(self.committed.acked.clone());
            } else {
                // No room here: seal, and the next segment opens with one.
                seal_now = true;
            }
        }
        let budget = room.min(limits.group_bytes_max.max(len));
        while let Some(frame) = self.pending.front() {
            let flen = frame.encoded_len() as u64;
            if len + flen > budget {
                break;
            }
            len += flen;
            self.pending_bytes -= flen;
            frames.push(self.pending.pop_front().expect("front exists"));
        }
        if fresh && len > room {
            return self.stop(StopReason::SegmentTooSmall { needed: len + offset + SEAL_RESERVE });
        }
        let full = offset + len + limits.group_bytes_max + SEAL_RESERVE > limits.segment_bytes;
        if seal_due || full || seal_now {
            frames.push(Frame::Seal);
        }
        let lsn = self.wal.next_lsn;
        let refs: Vec<&Frame> = frames.iter().collect();
        let bytes = Arc::new(encode_group(segment, self.wal.epoch, lsn, &refs));
        let dispatch_early = self.cfg.mutations.has(Mutation::DispatchBeforePlanCommit);
        self.wal.commit = Some(InflightCommit { io: None, segment, offset, lsn, bytes, frames, snapshot_acked });
        self.send_commit();
        if dispatch_early {
            self.dispatch_planned_in_flight();
        }
    }

    fn send_commit(&mut self) {
        let c = self.wal.commit.as_ref().expect("a commit is in flight");
        let op = IoOp::WalAppend { segment: c.segment, offset: c.offset, lsn: c.lsn, bytes: c.bytes.clone() };
        let id = self.io(Pending::WalAppend, op);
        self.wal.commit.as_mut().expect("in flight").io = Some(id);
    }

    fn on_append(&mut self, id: IoId, result: Result<IoReply, IoError>) {
        let c = self.wal.commit.as_ref().expect("an append answers the commit in flight");
        assert_eq!(c.io, Some(id), "one append in flight");
        match result {
            Ok(_) => {}
            Err(IoError::Ambiguous) => {
                // The group may or may not be there: send the identical bytes
                // again until the outcome is known.
                self.wal.commit.as_mut().expect("in flight").io = None;
                return self.retry_later(Retry::Commit);
            }
            Err(error) => {
                let segment = c.segment;
                return self.stop(StopReason::WalWriteFailed { segment, error });
            }
        }
        self.succeeded(Retry::Commit);
        let c = self.wal.commit.take().expect("in flight");
        let active = self.wal.active.as_mut().expect("a commit goes to the active segment");
        active.offset += c.bytes.len() as u64;
        if self.wal.segments.back().is_none_or(|s| s.id != c.segment) {
            self.wal.segments.push_back(SegmentSummary::new(c.segment, c.lsn));
        }
        let sealed = matches!(c.frames.last(), Some(Frame::Seal));
        let acks_advanced = c.frames.iter().any(|f| matches!(f, Frame::CompactionDone(_)));
        for frame in c.frames {
            self.committed.apply(c.lsn, &frame);
            self.wal.segments.back_mut().expect("pushed above").note(c.lsn, &frame);
            self.on_committed(frame);
        }
        self.wal.next_lsn = Lsn(c.lsn.0 + 1);
        if sealed {
            self.wal.active = None;
        }
        if let Some(acked) = c.snapshot_acked {
            self.plan_deletions(c.lsn, &acked);
        }
        if acks_advanced && self.oldest_segment_compacted(&self.committed.acked) {
            self.wal.snapshot_wanted = true;
        }
    }

    /// Every record of the oldest sealed segment is below every sink's
    /// acknowledged position in `acked`.
    fn oldest_segment_compacted(&self, acked: &BTreeMap<(SinkId, PartitionKey), Position>) -> bool {
        let sinks = self.cfg.sinks.len() as u16;
        self.wal.segments.front().is_some_and(|seg| {
            seg.sealed
                && seg
                    .ends
                    .iter()
                    .all(|(key, end)| (0..sinks).all(|s| acked.get(&(SinkId(s), *key)).is_some_and(|a| a >= end)))
        })
    }

    /// The live effects of a frame that just became committed.
    fn on_committed(&mut self, frame: Frame) {
        match frame {
            Frame::SourceBatch(b) => {
                self.sources[b.key.source.0 as usize].acks.insert(b.key.partition, b.end);
                self.offsets_dirty.insert(b.key);
                if self.cfg.mutations.has(Mutation::OffsetsStaleValue) {
                    let p = &self.committed.partitions[&b.key];
                    let value = OffsetValue { position: p.position, lsn: p.lsn, records: p.records };
                    self.offsets_stale.entry(b.key).or_insert(value);
                }
                self.records.push(b.key, b.records);
            }
            Frame::CompactionPlanned(plan) => {
                let key = (plan.sink, plan.stream);
                if let Some(Slot::Planned { plan: p, committed, .. }) = self.slots.get_mut(&key) {
                    if p.id == plan.id {
                        *committed = true;
                        self.dispatch(key.0, key.1);
                    }
                }
            }
            Frame::CompactionDone(done) => {
                let sinks = self.cfg.sinks.len() as u16;
                let keys: Vec<PartitionKey> = self
                    .committed
                    .partitions
                    .iter()
                    .filter(|(_, p)| p.stream == done.stream)
                    .map(|(k, _)| *k)
                    .collect();
                for key in keys {
                    let floor = (0..sinks).map(|s| self.committed.acked(SinkId(s), key)).min();
                    self.records.prune(key, floor.unwrap_or_default());
                }
            }
            _ => {}
        }
    }

    /// The deletion rule, evaluated when a snapshot commits at `lsn`.
    fn plan_deletions(&mut self, lsn: Lsn, acked: &BTreeMap<(SinkId, PartitionKey), Position>) {
        let ignore_acks = self.cfg.mutations.has(Mutation::DeleteBeforeCompactionAck);
        while let Some(seg) = self.wal.segments.front() {
            if !seg.sealed || seg.last_lsn >= lsn {
                break;
            }
            if !self.oldest_segment_compacted(acked) && !ignore_acks {
                break;
            }
            let seg = self.wal.segments.pop_front().expect("front exists");
            self.wal.deletes.push_back(seg.id);
        }
    }

    fn delete_next(&mut self) {
        if self.wal.deleting {
            return;
        }
        if let Some(&segment) = self.wal.deletes.front() {
            self.wal.deleting = true;
            self.io(Pending::WalDelete(segment), IoOp::WalDelete { segment });
        }
    }

    // ---- offsets and acks ----

    fn write_offsets(&mut self) {
        if self.offsets_io.is_some() || self.offsets_dirty.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.offsets_dirty)
            .into_iter()
            .map(|key| {
                let p = &self.committed.partitions[&key];
                let value = OffsetValue { position: p.position, lsn: p.lsn, records: p.records };
                let value = self.offsets_stale.remove(&key).unwrap_or(value);
                OffsetEntry { key, value, checkpoint: p.checkpoint.clone() }
            })
            .collect();
        let id = self.io(Pending::OffsetsWrite, IoOp::OffsetsWrite { entries });
        self.offsets_io = Some(id);
    }

    fn send_acks(&mut self) {
        for i in 0..self.sources.len() {
            let s = &mut self.sources[i];
            if s.ack_io.is_some() || s.acks.is_empty() || !s.opened {
                continue;
            }
            let acks: Vec<(u32, Position)> = std::mem::take(&mut s.acks).into_iter().collect();
            s.acks_sent.clone_from(&acks);
            let source = SourceId(i as u16);
            let id = self.io(Pending::SourceAck(source), IoOp::SourceAck { source, acks });
            self.sources[i].ack_io = Some(id);
        }
    }

    // ---- compaction ----

    fn plan_compactions(&mut self) {
        let idle: Vec<(SinkId, StreamId)> =
            self.slots.iter().filter(|(_, s)| matches!(s, Slot::Idle)).map(|(k, _)| *k).collect();
        for (sink, stream) in idle {
            self.plan(sink, stream);
        }
    }

    /// Plans the next destination batch of (sink, stream) from committed
    /// records past the planned-through positions.
    fn plan(&mut self, sink: SinkId, stream: StreamId) {
        let mut budget = self.cfg.limits.compaction_records_max as usize;
        let mut ranges = Vec::new();
        for (&key, p) in &self.committed.partitions {
            if p.stream != stream || budget == 0 {
                continue;
            }
            let from = self.planned.get(&(sink, key)).copied().unwrap_or_default();
            if p.position <= from {
                continue;
            }
            let mut in_range = self.records.range(key, from, p.position);
            let mut to = p.position;
            let mut n = 0;
            for r in in_range.by_ref() {
                if n == budget {
                    to = r.position;
                    break;
                }
                n += 1;
            }
            if n == 0 {
                continue;
            }
            budget -= n;
            ranges.push(Range { key, from, to });
        }
        if ranges.is_empty() {
            return;
        }
        let seq = self.next_seq.get(&(sink, stream)).copied().unwrap_or_default();
        let schema = self.committed.schemas.get(&stream).copied().unwrap_or_default();
        let names = NamedRanges { sources: &self.cfg.sources, ranges: &ranges };
        let id = compaction_id(&self.cfg.sinks[sink.0 as usize], &self.cfg.streams[stream.0 as usize], schema, names);
        for r in &ranges {
            self.planned.insert((sink, r.key), r.to);
        }
        self.next_seq.insert((sink, stream), CompactionSeq(seq.0 + 1));
        let plan = CompactionPlan { sink, stream, id, seq, schema, ranges };
        self.push_frame(Frame::CompactionPlanned(plan.clone()));
        self.slots.insert((sink, stream), Slot::Planned { plan, committed: false, io: None, dispatched: false });
    }

    /// The planted bug `dispatch-before-plan-commit`: sends every plan in the
    /// group that was just sent, before it is durable.
    fn dispatch_planned_in_flight(&mut self) {
        let keys: Vec<(SinkId, StreamId)> = self
            .wal
            .commit
            .as_ref()
            .map(|c| {
                c.frames
                    .iter()
                    .filter_map(|f| match f {
                        Frame::CompactionPlanned(p) => Some((p.sink, p.stream)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (sink, stream) in keys {
            if let Some(Slot::Planned { committed, .. }) = self.slots.get_mut(&(sink, stream)) {
                *committed = true;
            }
            self.dispatch(sink, stream);
        }
    }

    /// Sends the open compaction of (sink, stream) to its sink, with its
    /// original id and number; replays are harmless because the sink dedupes.
    fn dispatch(&mut self, sink: SinkId, stream: StreamId) {
        let unstable = self.cfg.mutations.has(Mutation::UnstableCompactionId);
        let epoch = self.wal.epoch;
        let Some(Slot::Planned { plan, committed, io, dispatched }) = self.slots.get_mut(&(sink, stream)) else {
            return;
        };
        if io.is_some() {
            return;
        }
        if !*committed {
            return;
        }
        if *dispatched && self.cfg.mutations.has(Mutation::DispatchBeforePlanCommit) {
            // Already sent early; the commit does not send it again.
            if self.ios.values().any(|p| matches!(p, Pending::SinkApply(s, t) if *s == sink && *t == stream)) {
                return;
            }
        }
        *dispatched = true;
        let mut records = Vec::new();
        for r in &plan.ranges {
            records.extend(self.records.range(r.key, r.from, r.to).map(|rec| rec.bytes.clone()));
        }
        let id = if unstable { CompactionId(plan.id.0 ^ epoch.0.wrapping_mul(0x9e37_79b9)) } else { plan.id };
        let op = IoOp::SinkApply(SinkApply { sink, stream, id, seq: plan.seq, records });
        let io_id = self.io(Pending::SinkApply(sink, stream), op);
        if let Some(Slot::Planned { io, .. }) = self.slots.get_mut(&(sink, stream)) {
            *io = Some(io_id);
        }
    }

    fn on_sink_reply(&mut self, id: IoId, sink: SinkId, stream: StreamId, result: Result<IoReply, IoError>) {
        let Some(Slot::Planned { plan, io, .. }) = self.slots.get_mut(&(sink, stream)) else {
            return; // a stale reply from an early dispatch
        };
        if *io != Some(id) {
            return;
        }
        *io = None;
        let plan_id = plan.id;
        let seq = plan.seq;
        match result {
            Ok(IoReply::Sink { outcome: SinkOutcome::Applied | SinkOutcome::AlreadyApplied, .. }) => {
                self.succeeded(Retry::SinkApply(sink, stream));
                self.slots.insert((sink, stream), Slot::Idle);
                self.push_frame(Frame::CompactionDone(CompactionDone { sink, stream, id: plan_id, seq }));
            }
            Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, .. }) => {
                self.stop(StopReason::SinkFatal { sink, stream, id: plan_id });
            }
            Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, .. }) | Err(_) => {
                self.retry_later(Retry::SinkApply(sink, stream));
            }
            Ok(other) => panic!("SinkApply answered with {other:?}"),
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
        sources_idle && wal_idle && slots_idle && compacted && offsets_idle
    }
}

#[cfg(test)]
mod tests;
