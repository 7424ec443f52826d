//! One simulated run: a seeded world of a WAL device, offsets store, sources
//! and sinks around one engine, a scheduler that orders every event in
//! simulated time, a fault phase with crashes, and a quiet phase that must
//! converge. Everything runs on one thread and draws from the seed only.
//!
//! The parts: `schedule` (the event queue and simulated time), this module
//! (the main loop, feeding the engine and draining its outputs),
//! `requests` (what each request does at the device, the stores and the
//! plugins), `faults` (the fault models: what goes wrong with a request,
//! and what a dead process's requests still do), `frozen` (a writer that
//! freezes and wakes next to its replacement), `lifecycle` (crashes,
//! restarts, how each stop is judged) and `idempotence` (recovering twice on
//! a copy gives what recovering once gives). The WAL device is
//! `crate::device`, one per backend.

mod faults;
mod frozen;
mod idempotence;
mod lifecycle;
mod requests;
mod schedule;
#[cfg(test)]
mod tests;

use crate::checker::{invariant, Checker, Violation};
use crate::device::SimWal;
use crate::operator::LostSegment;
use crate::plugins::{SimOffsets, SimSink, SimSource};
use crate::rng::{Dice, Die, Rng, Stream};
use crate::s3::SimLease;
use crate::scenario::{Overrides, Scenario, WalMode};
use crate::trace::Trace;
use frozen::{Who, Zombie};
use schedule::{Event, Schedule};
use skippr_core::*;

/// How long the quiet phase may take to converge, in simulated time.
const QUIET_BUDGET: Duration = Duration::from_secs(600);
/// A run that takes more steps than this has stalled.
const STEPS_MAX: u64 = 2_000_000;

#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub mutations: Mutations,
    pub wal: WalMode,
    /// Clustered mode: how many hosts (0: the scenario's three).
    pub hosts: usize,
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

impl Outcome {
    /// A run whose engine panicked: the assertion's message is the finding.
    pub fn panicked(panic: Box<dyn std::any::Any + Send>) -> Outcome {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into());
        Outcome::Fail(Violation { invariant: invariant::CORE_ASSERTION, detail: msg })
    }
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
    pub s3_ambiguous: u64,
    pub s3_landed_late: u64,
    pub s3_throttled: u64,
    pub s3_conflicts: u64,
    pub pauses: u64,
    pub lost_segments: u64,
    pub fenced: u64,
    pub lease_waits: u64,
    /// Rare paths of the engine (`skippr_core::RarePaths`).
    pub late_commits_verified: u64,
    pub seals_ahead: u64,
    pub seals_no_room: u64,
    /// Groups read back from the WAL for a sink, reads of them that failed,
    /// and how often the WAL reached its size limit.
    pub read_backs: u64,
    pub read_fails: u64,
    pub wal_full: u64,
    /// Clustered mode: terms with a leader, times a host became leader,
    /// leaders that stopped on losing it, partitions, freezes, truncated
    /// tails, raft messages lost and duplicated.
    pub terms: u64,
    pub elections: u64,
    pub deposed: u64,
    pub partitions: u64,
    pub freezes: u64,
    pub truncations: u64,
    /// Clustered mode: hosts wiped, rejoined under a new id, promoted to
    /// voter, and joins a host refused (not the leader, a change under way).
    pub wipes: u64,
    pub joins: u64,
    pub promotions: u64,
    pub joins_refused: u64,
    /// Messages from removed ids answered with `TellRemoved`.
    pub removed_told: u64,
    /// Clustered mode: snapshots installed, and transfers that failed (the
    /// sender gone, or its segments no longer the manifest's).
    pub snapshots: u64,
    pub snapshot_failures: u64,
    /// Clustered mode: hosts that died in the middle of a truncation.
    pub truncations_interrupted: u64,
    pub messages_lost: u64,
    pub messages_duplicated: u64,
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

pub struct World {
    scenario: Scenario,
    opts: RunOptions,
    schedule: Schedule,
    dice: Dice,
    faults_rng: Rng,
    operator_rng: Rng,
    lost: Option<LostSegment>,
    host: Option<Host>,
    gen: u64,
    incarnation: u64,
    faulting: bool,
    final_shutdown: bool,
    /// The live engine was asked to shut down (so a clean stop is not its
    /// own, by exhausted sources).
    shutdown_fed: bool,
    done: bool,
    fail_closed: Option<String>,
    wal: SimWal,
    lease: SimLease,
    zombie: Option<Zombie>,
    offsets: SimOffsets,
    sources: Vec<SimSource>,
    sinks: Vec<SimSink>,
    checker: Checker,
    trace: Trace,
    stats: RunStats,
    append_in_flight: bool,
}

pub fn run(seed: u64, opts: &RunOptions) -> RunReport {
    if opts.wal == WalMode::Clustered {
        return crate::cluster::run(seed, opts);
    }
    World::new(seed, opts.clone()).run()
}

impl World {
    pub fn new(seed: u64, opts: RunOptions) -> World {
        let scenario = Scenario::from_seed(seed).with_wal(opts.wal).with_overrides(&opts.overrides);
        let switch = Instant::from_micros(scenario.fault_phase_end.as_micros() / 2);
        let sources = scenario
            .sources
            .iter()
            .enumerate()
            .map(|(i, spec)| SimSource::new(seed, i as u16, spec.clone(), scenario.streams, switch))
            .collect();
        let wal = match scenario.wal {
            WalMode::Disk | WalMode::Clustered => SimWal::disk(seed),
            WalMode::S3 => SimWal::s3(opts.mutations.has(Mutation::S3OverwriteOnAmbiguous)),
        };
        World {
            sinks: (0..scenario.sinks).map(|_| SimSink::default()).collect(),
            checker: Checker::new(&scenario),
            trace: Trace::new(opts.trace),
            dice: Dice::new(seed),
            faults_rng: Rng::new(seed, Stream::Crashes),
            // The scenario draws whether the fault is on from this stream's
            // first value; the world's draws come from a sibling seed so the
            // two never repeat each other.
            operator_rng: Rng::new(seed ^ 0x6f70_6572_6174_6f72, Stream::Operator),
            lost: None,
            wal,
            lease: SimLease::default(),
            zombie: None,
            offsets: SimOffsets::new(opts.mutations.has(Mutation::OffsetsRegress)),
            sources,
            scenario,
            opts,
            schedule: Schedule::default(),
            host: None,
            gen: 0,
            incarnation: 0,
            faulting: true,
            final_shutdown: false,
            shutdown_fed: false,
            done: false,
            fail_closed: None,
            stats: RunStats::default(),
            append_in_flight: false,
        }
    }

    pub fn run(mut self) -> RunReport {
        self.stats.source_records = self.scenario.total_records();
        self.plan_faults();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.main_loop()));
        let outcome = match result {
            Err(panic) => Outcome::panicked(panic),
            Ok(()) => match (&self.checker.violation, &self.fail_closed) {
                (Some(v), _) => Outcome::Fail(v.clone()),
                (None, Some(why)) => Outcome::FailClosed(why.clone()),
                (None, None) => Outcome::Pass,
            },
        };
        self.retire_live();
        self.retire_zombie();
        let d = self.wal.disk_stats();
        self.stats.torn_writes = d.torn_writes;
        self.stats.lost_writes = d.lost_writes;
        self.stats.lost_dir_entries = d.lost_dir_entries;
        self.stats.fsync_failures = d.fsync_failures;
        self.stats.rot = d.rot;
        self.stats.s3_conflicts = self.wal.s3_mut().map_or(0, |s| s.conflicts());
        self.stats.compactions = self.checker.compactions() as u64;
        self.stats.sim_micros = self.schedule.now.as_micros();
        RunReport {
            seed: self.scenario.seed,
            outcome,
            trace_hash: self.trace.hash(),
            stats: self.stats,
            trace: std::mem::take(&mut self.trace.lines),
        }
    }

    /// The fault phase's schedule: crashes, bit rot, a shutdown mid-run, its
    /// end, and the first start.
    fn plan_faults(&mut self) {
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
    }

    fn main_loop(&mut self) {
        let quiet_deadline = self.scenario.fault_phase_end + QUIET_BUDGET;
        loop {
            if self.done || self.checker.violation.is_some() || self.fail_closed.is_some() {
                return;
            }
            self.stats.steps += 1;
            let next_event = self.schedule.next_at();
            let timer = self.host.as_ref().and_then(|h| h.poll_timeout()).map(|(t, _)| t);
            let zombie_timer = self.zombie.as_ref().and_then(|z| z.host.poll_timeout().map(|(t, _)| t.max(z.wake)));
            let Some(next) = [next_event, timer, zombie_timer].into_iter().flatten().min() else {
                return self.stalled("nothing left to happen");
            };
            if next > quiet_deadline || self.stats.steps > STEPS_MAX {
                return self.stalled("the quiet phase did not converge");
            }
            self.schedule.now = self.schedule.now.max(next);
            if next_event.is_some_and(|e| e == next) && timer.is_none_or(|t| t > next) {
                let event = self.schedule.pop().expect("an event is due");
                self.fire(event);
            } else if timer.is_some_and(|t| t <= next) {
                self.feed(Input::Timeout);
            } else {
                self.feed_to(Who::Zombie, Input::Timeout);
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
        if let Some(lost) = self.lost.filter(|l| l.needed) {
            let detail = format!("segment {} was deleted while a sink still needed it: {detail}", lost.segment.0);
            return self.checker.fail(invariant::LOST_SEGMENT_UNNOTICED, detail);
        }
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

    /// The live engine is gone (a crash, an exit, a final stop): its rare
    /// paths join the run's statistics.
    fn retire_live(&mut self) {
        if let Some(host) = self.host.take() {
            self.count_paths(host.rare_paths());
        }
    }

    fn retire_zombie(&mut self) {
        if let Some(zombie) = self.zombie.take() {
            self.count_paths(zombie.host.rare_paths());
        }
    }

    fn count_paths(&mut self, p: RarePaths) {
        self.stats.late_commits_verified += p.late_commits_verified;
        self.stats.seals_ahead += p.seals_ahead;
        self.stats.seals_no_room += p.seals_no_room;
    }

    fn now(&self) -> Instant {
        self.schedule.now
    }

    fn at(&mut self, at: Instant, event: Event) {
        self.schedule.at(at, event);
    }

    /// Schedules `event` after a delay in `lo..=hi` microseconds drawn from `die`.
    fn after(&mut self, die: Die, (lo, hi): (u64, u64), event: Event) {
        let delay = self.dice.roll(die).range(lo, hi.max(lo));
        self.schedule.at(self.now() + Duration::from_micros(delay), event);
    }

    fn fire(&mut self, event: Event) {
        let owner = match &event {
            Event::Complete { gen, .. } | Event::Reply { gen, .. } | Event::S3DeleteRest { gen, .. } => {
                self.owner(*gen)
            }
            _ => None,
        };
        let event = match owner.and_then(|who| self.frozen_until(who).map(|wake| (who, wake))) {
            Some((who, wake)) => match self.hold_for_frozen(who, wake, event) {
                Some(event) => event,
                None => return,
            },
            None => event,
        };
        match event {
            Event::Complete { gen, id, op } => self.on_complete(owner, gen, id, op),
            Event::S3DeleteRest { gen, id, segment } => {
                if let Some(who) = owner {
                    let result = self.wal.perform(gen, WalOp::Delete { segment }, false);
                    self.stats.segments_deleted += 1;
                    self.feed_to(who, Input::IoDone { id, result });
                }
            }
            Event::SinkEffect { gen, id, apply } => self.sink_effect(gen, id, apply),
            Event::Reply { id, result, .. } => {
                if let Some(who) = owner {
                    self.feed_to(who, Input::IoDone { id, result });
                }
            }
            Event::S3Land { conditional, segment, offset, bytes } => {
                self.stats.s3_landed_late += 1;
                let _ = self.wal.s3_mut().expect("S3 mode").put(conditional, segment, offset, &bytes);
            }
            Event::LeaseLand { expected, row } => {
                let _ = self.lease.write(expected, row);
            }
            Event::OffsetsLand { entries } => self.write_offsets(&entries),
            Event::Crash => self.crash(false),
            Event::Freeze => self.crash(true),
            Event::Restart => self.restart(),
            Event::Shutdown => self.shutdown(),
            Event::Rot => self.rot(),
            Event::EndFaultPhase => self.end_fault_phase(),
        }
    }

    /// A request's completion: performed for the engine that sent it, or,
    /// if that engine is gone, whatever the request still does on its way.
    fn on_complete(&mut self, owner: Option<Who>, gen: u64, id: IoId, op: IoOp) {
        match (op, owner) {
            (IoOp::Wal(WalOp::Delete { segment }), owner) if self.scenario.wal == WalMode::S3 => {
                if owner.is_some() {
                    self.wal.s3_mut().expect("S3 mode").begin_delete(segment);
                    self.after(Die::S3Latency, self.scenario.latencies.s3, Event::S3DeleteRest { gen, id, segment });
                }
            }
            (op, Some(who)) => {
                let result = self.complete(who, gen, op);
                self.feed_to(who, Input::IoDone { id, result });
            }
            (op, None) => self.in_flight_effect(gen, op),
        }
    }

    fn shutdown(&mut self) {
        if self.host.is_some() {
            self.stats.shutdowns += 1;
            self.shutdown_fed = true;
            self.feed(Input::Shutdown);
        }
    }

    fn end_fault_phase(&mut self) {
        self.faulting = false;
        // A frozen writer that never woke is killed for good, so the quiet
        // phase has one writer to converge with.
        if self.zombie.is_some() {
            self.retire_zombie();
            self.trace.note(self.now(), "zombie killed");
        }
    }

    // ---- driving the engine ----

    fn feed(&mut self, input: Input) {
        self.feed_to(Who::Live, input);
    }

    fn feed_to(&mut self, who: Who, input: Input) {
        let now = self.now();
        let host = match who {
            Who::Live => self.host.as_mut(),
            Who::Zombie => self.zombie.as_mut().map(|z| &mut z.host),
        };
        let Some(host) = host else { return };
        if who == Who::Zombie {
            self.trace.note(now, "zombie:");
        }
        self.trace.input(now, &input);
        host.handle(now, input);
        self.feed_outputs_of(who);
    }

    /// Drains the engine's outputs completely (the drain contract).
    fn feed_outputs_of(&mut self, who: Who) {
        loop {
            let output = match who {
                Who::Live => self.host.as_mut().and_then(|h| h.poll_output()),
                Who::Zombie => self.zombie.as_mut().and_then(|z| z.host.poll_output()),
            };
            let Some(output) = output else { break };
            self.trace.output(self.now(), &output);
            match output {
                Output::Io { id, op } => self.submit(who, id, op),
                Output::Recovered(_) => self.stats.recoveries += 1,
                Output::LeaseWait { .. } => self.stats.lease_waits += 1,
                Output::Stalled { .. } | Output::Unstalled => unreachable!("the simulator's engines watch no stalls"),
                Output::WalFull { .. } => self.stats.wal_full += 1,
                Output::WalRoom { .. } => {}
                Output::Skip { .. } => unreachable!("the simulator's runs skip nothing"),
                Output::Send(_) | Output::TellRemoved { .. } | Output::Role { .. } | Output::JoinRefused { .. } => {
                    unreachable!("this world runs one host, not a cluster")
                }
                Output::Stopped(reason) if who == Who::Zombie => self.on_zombie_stopped(reason),
                Output::Stopped(reason) => self.on_stopped(reason),
            }
        }
    }
}
