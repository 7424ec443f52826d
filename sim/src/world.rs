//! One simulated run: a seeded world of disk, offsets store, sources and
//! sinks around one engine, a scheduler that orders every event in simulated
//! time, a fault phase with crashes, and a quiet phase that must converge.
//! Everything runs on one thread and draws from the seed only.

use crate::checker::{invariant, Checker, Violation};
use crate::disk::SimDisk;
use crate::plugins::{SimOffsets, SimSink, SimSource};
use crate::rng::{Rng, Stream};
use crate::scenario::{Overrides, Scenario};
use crate::trace::Trace;
use skippr_core::io::*;
use skippr_core::state::CommittedState;
use skippr_core::*;
use std::collections::BTreeMap;

/// How long the quiet phase may take to converge, in simulated time.
const QUIET_BUDGET: Duration = Duration::from_secs(600);
/// A run that takes more steps than this has stalled.
const STEPS_MAX: u64 = 2_000_000;

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub mutations: Mutations,
    pub trace: bool,
    pub overrides: Overrides,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Committed data was corrupted (bit rot) and the engine stopped naming
    /// it, having delivered nothing wrong: a correct outcome.
    FailClosed(String),
    Fail(Violation),
}

#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub source_records: u64,
    pub crashes: u64,
    pub power_cuts: u64,
    pub crashes_in_recovery: u64,
    pub crashes_in_drain: u64,
    pub crashes_in_commit: u64,
    pub restarts: u64,
    pub recoveries: u64,
    pub compactions: u64,
    pub segments_deleted: u64,
    pub torn_writes: u64,
    pub lost_writes: u64,
    pub lost_dir_entries: u64,
    pub fsync_failures: u64,
    pub no_space: u64,
    pub rot: u64,
    pub sink_retryable: u64,
    pub sink_lost_replies: u64,
    pub offsets_ambiguous: u64,
    pub source_failures: u64,
    pub shutdowns: u64,
    pub clean_stops: u64,
    pub schema_decisions: u64,
    pub steps: u64,
    pub sim_micros: u64,
}

pub struct RunReport {
    pub seed: u64,
    pub outcome: Outcome,
    pub trace_hash: u64,
    pub stats: RunStats,
    pub trace: Vec<String>,
}

enum Event {
    /// An I/O finishes and is performed now (reads, syncs, stores, sources).
    Complete {
        gen: u64,
        id: IoId,
        op: IoOp,
    },
    /// A sink applies a batch; its reply follows.
    SinkEffect {
        gen: u64,
        id: IoId,
        apply: SinkApply,
    },
    Reply {
        gen: u64,
        id: IoId,
        result: Result<IoReply, IoError>,
    },
    Crash,
    Restart,
    Shutdown,
    Rot,
    EndFaultPhase,
}

pub struct World {
    scenario: Scenario,
    opts: RunOptions,
    now: Instant,
    seq: u64,
    events: BTreeMap<(Instant, u64), Event>,
    sched: Rng,
    faults_rng: Rng,
    host: Option<Host>,
    gen: u64,
    incarnation: u64,
    faulting: bool,
    final_shutdown: bool,
    done: bool,
    fail_closed: Option<String>,
    disk: SimDisk,
    offsets: SimOffsets,
    sources: Vec<SimSource>,
    sinks: Vec<SimSink>,
    checker: Checker,
    trace: Trace,
    stats: RunStats,
    /// The end of the last durable append, per segment, and the segment of
    /// the newest one: what the driver knows it made durable.
    durable_ends: BTreeMap<SegmentId, usize>,
    newest_append: Option<SegmentId>,
    append_in_flight: bool,
}

pub fn run(seed: u64, opts: &RunOptions) -> RunReport {
    World::new(seed, opts.clone()).run()
}

impl World {
    pub fn new(seed: u64, opts: RunOptions) -> World {
        let scenario = Scenario::from_seed(seed).with_overrides(&opts.overrides);
        let switch = Instant::from_micros(scenario.fault_phase_end.as_micros() / 2);
        let sources = scenario
            .sources
            .iter()
            .enumerate()
            .map(|(i, spec)| SimSource::new(seed, i as u16, spec.clone(), scenario.streams, switch))
            .collect();
        World {
            sinks: (0..scenario.sinks).map(|_| SimSink::default()).collect(),
            checker: Checker::new(&scenario),
            trace: Trace::new(opts.trace),
            sched: Rng::new(seed, Stream::Scheduler),
            faults_rng: Rng::new(seed, Stream::Crashes),
            disk: SimDisk::new(seed),
            offsets: SimOffsets::default(),
            sources,
            scenario,
            opts,
            now: Instant::ZERO,
            seq: 0,
            events: BTreeMap::new(),
            host: None,
            gen: 0,
            incarnation: 0,
            faulting: true,
            final_shutdown: false,
            done: false,
            fail_closed: None,
            stats: RunStats::default(),
            durable_ends: BTreeMap::new(),
            newest_append: None,
            append_in_flight: false,
        }
    }

    pub fn run(mut self) -> RunReport {
        self.stats.source_records = self.scenario.total_records();
        let end = self.scenario.fault_phase_end;
        let f = self.scenario.faults.clone();
        for i in 0..f.crashes {
            let at = Instant::from_micros(self.faults_rng.range(0, end.as_micros()));
            if i < self.scenario.crashes_kept {
                self.at(at, Event::Crash);
            }
        }
        if f.rot {
            let at = Instant::from_micros(self.faults_rng.range(end.as_micros() / 2, end.as_micros()));
            self.at(at, Event::Rot);
        }
        if f.shutdown_mid_run {
            let at = Instant::from_micros(self.faults_rng.range(0, end.as_micros()));
            self.at(at, Event::Shutdown);
        }
        self.at(end, Event::EndFaultPhase);
        self.at(Instant::ZERO, Event::Restart);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.main_loop()));
        let outcome = match result {
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                Outcome::Fail(Violation { invariant: invariant::CORE_ASSERTION, detail: msg })
            }
            Ok(()) => match (&self.checker.violation, &self.fail_closed) {
                (Some(v), _) => Outcome::Fail(v.clone()),
                (None, Some(why)) => Outcome::FailClosed(why.clone()),
                (None, None) => Outcome::Pass,
            },
        };
        let d = &self.disk.stats;
        self.stats.torn_writes = d.torn_writes;
        self.stats.lost_writes = d.lost_writes;
        self.stats.lost_dir_entries = d.lost_dir_entries;
        self.stats.fsync_failures = d.fsync_failures;
        self.stats.rot = d.rot;
        self.stats.compactions = self.checker.compactions() as u64;
        self.stats.sim_micros = self.now.as_micros();
        RunReport {
            seed: self.scenario.seed,
            outcome,
            trace_hash: self.trace.hash(),
            stats: self.stats,
            trace: std::mem::take(&mut self.trace.lines),
        }
    }

    fn main_loop(&mut self) {
        let quiet_deadline = self.scenario.fault_phase_end + QUIET_BUDGET;
        loop {
            if self.done || self.checker.violation.is_some() || self.fail_closed.is_some() {
                return;
            }
            self.stats.steps += 1;
            let next_event = self.events.keys().next().map(|k| k.0);
            let timer = self.host.as_ref().and_then(|h| h.poll_timeout()).map(|(t, _)| t);
            let next = match (next_event, timer) {
                (None, None) => return self.stalled("nothing left to happen"),
                (Some(e), None) => e,
                (None, Some(t)) => t,
                (Some(e), Some(t)) => e.min(t),
            };
            if next > quiet_deadline || self.stats.steps > STEPS_MAX {
                return self.stalled("the quiet phase did not converge");
            }
            self.now = self.now.max(next);
            if timer.is_some_and(|t| t <= next) && next_event.is_none_or(|e| e >= next) {
                self.feed(Input::Timeout);
            } else {
                let (_, event) = self.events.pop_first().expect("an event is due");
                self.fire(event);
            }
            self.check_converged();
        }
    }

    fn stalled(&mut self, why: &str) {
        if self.checker.complete() && !self.final_shutdown {
            self.done = true;
            return;
        }
        let missing = self.checker.missing().unwrap_or_else(|| "all records delivered".into());
        let detail = format!("{why}: {missing} (delivered {})", self.checker.delivered());
        self.checker.fail(invariant::STALLED, detail);
    }

    fn check_converged(&mut self) {
        if self.faulting || self.final_shutdown || !self.checker.complete() {
            return;
        }
        match &self.host {
            Some(h) if !h.is_recovering() => {}
            _ => return,
        }
        if self.scenario.clean_shutdown {
            self.final_shutdown = true;
            self.stats.shutdowns += 1;
            self.feed(Input::Shutdown);
        } else {
            self.done = true;
        }
    }

    fn at(&mut self, at: Instant, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    fn after(&mut self, (lo, hi): (u64, u64), event: Event) {
        let delay = self.sched.range(lo, hi.max(lo));
        self.at(self.now + Duration::from_micros(delay), event);
    }

    // ---- driving the engine ----

    fn feed(&mut self, input: Input) {
        let Some(host) = self.host.as_mut() else { return };
        self.trace.input(self.now, &input);
        host.handle(self.now, input);
        self.feed_outputs();
    }

    /// What happens when a request is issued: writes reach the page cache,
    /// and the completion is scheduled.
    fn submit(&mut self, id: IoId, op: IoOp) {
        let gen = self.gen;
        let lat = self.scenario.latencies.clone();
        match op {
            IoOp::WalAppend { segment, offset, ref bytes, .. } => {
                self.append_in_flight = true;
                if !self.disk.write(segment, offset as usize, bytes) {
                    panic!("append to segment {} at {offset} outside the file", segment.0);
                }
                self.after(lat.disk_write, Event::Complete { gen, id, op });
            }
            IoOp::WalCreate { segment, ref header } => {
                if self.faulting && self.sched.chance(self.scenario.faults.no_space) {
                    self.stats.no_space += 1;
                    return self.after(lat.disk_other, Event::Reply { gen, id, result: Err(IoError::NoSpace) });
                }
                self.disk.create(segment, header, self.scenario.limits.segment_bytes as usize);
                self.after(lat.disk_other, Event::Complete { gen, id, op });
            }
            IoOp::SinkApply(apply) => self.after(lat.sink, Event::SinkEffect { gen, id, apply }),
            IoOp::OffsetsRead | IoOp::OffsetsWrite { .. } => self.after(lat.offsets, Event::Complete { gen, id, op }),
            IoOp::SourceOpen { .. } | IoOp::SourceRead { .. } | IoOp::SourceAck { .. } | IoOp::SchemaDecide { .. } => {
                self.after(lat.source, Event::Complete { gen, id, op })
            }
            IoOp::WalSync | IoOp::WalList | IoOp::WalRead { .. } | IoOp::WalDelete { .. } => {
                self.after(lat.disk_other, Event::Complete { gen, id, op })
            }
        }
    }

    fn fire(&mut self, event: Event) {
        match event {
            Event::Complete { gen, id, op } if gen == self.gen => {
                let result = self.complete(op);
                self.feed(Input::IoDone { id, result });
            }
            Event::Complete { op: IoOp::OffsetsWrite { entries }, .. } => {
                // The database got the write before the host died, or not.
                if self.sched.chance(0.5) {
                    self.write_offsets(&entries);
                }
            }
            Event::Complete { .. } => {}
            Event::SinkEffect { gen, id, apply } => self.sink_effect(gen, id, apply),
            Event::Reply { gen, id, result } if gen == self.gen => self.feed(Input::IoDone { id, result }),
            Event::Reply { .. } => {}
            Event::Crash => self.crash(),
            Event::Restart => self.restart(),
            Event::Shutdown => {
                if self.host.is_some() {
                    self.stats.shutdowns += 1;
                    self.feed(Input::Shutdown);
                }
            }
            Event::Rot => self.rot(),
            Event::EndFaultPhase => self.faulting = false,
        }
    }

    /// Performs a request at its completion time and returns its result.
    fn complete(&mut self, op: IoOp) -> Result<IoReply, IoError> {
        let f = &self.scenario.faults;
        match op {
            IoOp::WalSync => {
                let fail = self.faulting && self.sched.chance(f.fsync_fail);
                if self.disk.sync_all(fail) {
                    Ok(IoReply::Done)
                } else {
                    Err(IoError::Failed)
                }
            }
            IoOp::WalList => Ok(IoReply::Segments(self.disk.list())),
            IoOp::WalRead { segment } => self.disk.read(segment).map(IoReply::SegmentBytes).ok_or(IoError::Failed),
            IoOp::WalCreate { segment, .. } => {
                let fail = self.faulting && self.sched.chance(f.fsync_fail);
                if self.disk.sync(segment, true, fail) {
                    Ok(IoReply::Done)
                } else {
                    Err(IoError::Failed)
                }
            }
            IoOp::WalAppend { segment, offset, bytes, .. } => {
                self.append_in_flight = false;
                let fail = self.faulting && self.sched.chance(f.fsync_fail);
                if self.disk.sync(segment, false, fail) {
                    self.durable_ends.insert(segment, offset as usize + bytes.len());
                    self.newest_append = Some(segment);
                    Ok(IoReply::Done)
                } else {
                    Err(IoError::Failed)
                }
            }
            IoOp::WalDelete { segment } => {
                self.disk.delete(segment);
                self.durable_ends.remove(&segment);
                self.stats.segments_deleted += 1;
                Ok(IoReply::Done)
            }
            IoOp::OffsetsRead => Ok(IoReply::Offsets(self.offsets.read())),
            IoOp::OffsetsWrite { entries } => {
                if self.faulting && self.sched.chance(f.offsets_ambiguous) {
                    self.stats.offsets_ambiguous += 1;
                    if self.sched.chance(0.5) {
                        self.write_offsets(&entries);
                    }
                    return Err(IoError::Ambiguous);
                }
                self.write_offsets(&entries);
                Ok(IoReply::Done)
            }
            IoOp::SourceOpen { source, resume } => {
                let offsets = &self.offsets;
                self.checker.on_resume(source, &resume, |key| offsets.position(key));
                self.sources[source.0 as usize].open(&resume);
                Ok(IoReply::Done)
            }
            IoOp::SourceRead { source, records_max } => {
                if self.faulting && self.sched.chance(f.source_fail) {
                    self.stats.source_failures += 1;
                    return Err(IoError::Failed);
                }
                let (batches, exhausted) = self.sources[source.0 as usize].read(records_max, self.now);
                Ok(IoReply::Batches { batches, exhausted })
            }
            IoOp::SourceAck { source, acks } => {
                if self.faulting && self.sched.chance(f.source_fail) {
                    self.stats.source_failures += 1;
                    return Err(IoError::Failed);
                }
                let src = &self.sources[source.0 as usize];
                self.checker.on_ack(source, &acks, |p| src.sent(p));
                self.sources[source.0 as usize].ack(&acks);
                Ok(IoReply::Done)
            }
            IoOp::SchemaDecide { .. } => {
                if self.faulting && self.sched.chance(f.source_fail) {
                    self.stats.source_failures += 1;
                    return Err(IoError::Failed);
                }
                self.stats.schema_decisions += 1;
                Ok(IoReply::Schema { accept: true, reason: String::new() })
            }
            IoOp::SinkApply(_) => unreachable!("sink applies go through SinkEffect"),
        }
    }

    fn write_offsets(&mut self, entries: &[OffsetEntry]) {
        for (key, old, new) in self.offsets.write(entries) {
            self.checker.on_offsets_changed(key, old, new);
        }
    }

    /// The sink process applies the batch, whether or not the host that sent
    /// it is still alive; the reply reaches only the host that sent it.
    fn sink_effect(&mut self, gen: u64, id: IoId, apply: SinkApply) {
        let f = self.scenario.faults.clone();
        let lat = self.scenario.latencies.sink;
        if self.faulting && self.sched.chance(f.sink_retryable) {
            self.stats.sink_retryable += 1;
            let result = Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, rows: 0 });
            return self.after((lat.0 / 2, lat.0), Event::Reply { gen, id, result });
        }
        let took_effect = self.sinks[apply.sink.0 as usize].apply(apply.id);
        self.checker.on_apply(&apply, took_effect);
        let outcome = if took_effect { SinkOutcome::Applied } else { SinkOutcome::AlreadyApplied };
        let result = if self.faulting && self.sched.chance(f.sink_lost_reply) {
            self.stats.sink_lost_replies += 1;
            Err(IoError::Ambiguous)
        } else {
            Ok(IoReply::Sink { outcome, rows: apply.records.len() as u64 })
        };
        self.after((lat.0 / 2, lat.0), Event::Reply { gen, id, result });
    }

    // ---- crashes, restarts, stops ----

    fn crash(&mut self) {
        if self.host.is_none() || !self.faulting {
            return;
        }
        self.stats.crashes += 1;
        let host = self.host.as_ref().expect("checked above");
        self.stats.crashes_in_recovery += host.is_recovering() as u64;
        self.stats.crashes_in_drain += host.is_draining() as u64;
        self.stats.crashes_in_commit += self.append_in_flight as u64;
        // Half the crashes are a SIGKILL, which leaves the page cache to the
        // next process; the other half cut the power, which does not.
        let power_cut = self.faults_rng.chance(0.5);
        self.stats.power_cuts += power_cut as u64;
        self.trace.note(self.now, if power_cut { "crash: power cut" } else { "crash: process killed" });
        self.host = None;
        self.gen += 1;
        self.append_in_flight = false;
        if power_cut {
            self.disk.crash(self.scenario.faults.lost_dir_entry);
        }
        self.after(self.scenario.latencies.restart, Event::Restart);
    }

    /// The process exits by itself (a fatal stop); the machine keeps its page
    /// cache, and a supervisor starts it again.
    fn exit_and_restart(&mut self) {
        self.append_in_flight = false;
        self.host = None;
        self.gen += 1;
        self.after(self.scenario.latencies.restart, Event::Restart);
    }

    fn restart(&mut self) {
        if self.host.is_some() {
            return;
        }
        if self.incarnation > 0 {
            self.check_recovery_idempotent();
        }
        self.stats.restarts += 1;
        let config = self.scenario.host_config(self.opts.mutations, self.incarnation);
        self.incarnation += 1;
        self.trace.note(self.now, "start");
        self.host = Some(Host::new(config, self.now).expect("scenario configs are valid"));
        self.feed_outputs();
    }

    /// Drains the engine's outputs completely (the drain contract).
    fn feed_outputs(&mut self) {
        while let Some(output) = self.host.as_mut().and_then(|h| h.poll_output()) {
            self.trace.output(self.now, &output);
            match output {
                Output::Io { id, op } => self.submit(id, op),
                Output::Recovered(_) => self.stats.recoveries += 1,
                Output::Stopped(reason) => self.on_stopped(reason),
            }
        }
    }

    fn on_stopped(&mut self, reason: StopReason) {
        match reason {
            StopReason::Clean if self.final_shutdown => {
                self.stats.clean_stops += 1;
                let offsets = &self.offsets;
                self.checker.check_materialized(|key| offsets.position(key));
                self.host = None;
                self.done = true;
            }
            StopReason::Clean | StopReason::DrainTimedOut if !self.final_shutdown => {
                self.stats.clean_stops += (reason == StopReason::Clean) as u64;
                self.exit_and_restart();
            }
            StopReason::WalWriteFailed { .. } => self.exit_and_restart(),
            StopReason::Corrupt(c) if self.stats.rot > 0 || self.disk.stats.rot > 0 => {
                self.fail_closed =
                    Some(format!("stopped on corrupt segment {} at byte {}: {}", c.segment.0, c.offset, c.what));
                self.host = None;
            }
            StopReason::OffsetsAheadOfWal { key, store, wal } => {
                let detail = format!("{key}: the engine found offsets at {} ahead of the WAL at {}", store.0, wal.0);
                self.checker.fail(invariant::OFFSETS_LEAD_WAL, detail);
            }
            StopReason::DrainTimedOut => {
                self.checker.fail(invariant::CLEAN_SHUTDOWN, "the final drain timed out".into());
            }
            other => self.checker.fail(invariant::UNEXPECTED_STOP, format!("{other:?}")),
        }
    }

    /// Flips a bit in a segment that a later durable commit follows.
    fn rot(&mut self) {
        let newest = self.newest_append;
        let candidates: Vec<(SegmentId, usize)> =
            self.durable_ends.iter().filter(|(id, _)| Some(**id) != newest).map(|(id, end)| (*id, *end)).collect();
        if candidates.is_empty() {
            return;
        }
        let (segment, end) = candidates[self.faults_rng.range(0, candidates.len() as u64 - 1) as usize];
        if self.disk.rot(segment, end) {
            self.trace.note(self.now, "rot");
        }
    }

    /// Recovery is idempotent: on a copy of the disk and offsets store,
    /// recovering twice gives the same state as recovering once.
    fn check_recovery_idempotent(&mut self) {
        let config = self.scenario.host_config(self.opts.mutations, u64::MAX);
        let mut disk = self.disk.clone();
        let mut offsets = self.offsets.clone();
        let first = recover_alone(config.clone(), &mut disk, &mut offsets);
        let second = recover_alone(config, &mut disk, &mut offsets);
        if first != second {
            let detail = format!("first recovery {:?}, second {:?}", summary(&first), summary(&second));
            self.checker.fail(invariant::RECOVERY_NOT_IDEMPOTENT, detail);
        }
    }
}

/// What a recovery found: committed state, the WAL head, and the records
/// held for sinks (count, bytes).
type Recovered = Result<(CommittedState, (Lsn, Option<(SegmentId, u64)>), (usize, u64)), StopReason>;

fn summary(r: &Recovered) -> String {
    match r {
        Ok((state, (lsn, head), held)) => {
            format!("lsn {} head {head:?} partitions {} records held {held:?}", lsn.0, state.partitions.len())
        }
        Err(e) => format!("{e:?}"),
    }
}

/// Runs one recovery to the point where sources would resume, performing
/// its WAL and offsets requests at once and without faults.
fn recover_alone(config: HostConfig, disk: &mut SimDisk, offsets: &mut SimOffsets) -> Recovered {
    let mut host = Host::new(config, Instant::ZERO).expect("valid config");
    let mut queue = std::collections::VecDeque::new();
    loop {
        while let Some(output) = host.poll_output() {
            match output {
                Output::Io { id, op } => queue.push_back((id, op)),
                Output::Recovered(_) => {
                    return Ok((host.committed().clone(), host.wal_head(), host.records_held()));
                }
                Output::Stopped(reason) => return Err(reason),
            }
        }
        let Some((id, op)) = queue.pop_front() else {
            panic!("recovery waits on nothing");
        };
        let result = match op {
            IoOp::WalSync => {
                disk.sync_all(false);
                Ok(IoReply::Done)
            }
            IoOp::WalDelete { segment } => {
                disk.delete(segment);
                Ok(IoReply::Done)
            }
            IoOp::WalList => Ok(IoReply::Segments(disk.list())),
            IoOp::WalRead { segment } => disk.read(segment).map(IoReply::SegmentBytes).ok_or(IoError::Failed),
            IoOp::OffsetsRead => Ok(IoReply::Offsets(offsets.read())),
            IoOp::OffsetsWrite { entries } => {
                offsets.write(&entries);
                Ok(IoReply::Done)
            }
            _ => continue,
        };
        host.handle(Instant::ZERO, Input::IoDone { id, result });
    }
}
