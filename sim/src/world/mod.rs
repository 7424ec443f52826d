//! One simulated run, whatever the topology: a seeded world of WAL devices,
//! offsets stores, sources and sinks around the engines, one scheduler that
//! orders every event in simulated time, a fault phase, and a quiet phase
//! that must converge. Everything runs on one thread and draws from the
//! seed only.
//!
//! The harness owns what every topology shares: the schedule
//! (`schedule`), the process slots and how an engine is fed and drained
//! (`process`), the run loop and the report (here), and what a plugin
//! request does (`plugins`). A topology (`Topology`) says how many
//! processes run against which devices and what happens between them: one
//! writer with an optional frozen twin sharing its device
//! (`crate::writer`: disk and S3), or raft hosts with their own devices
//! and a network (`crate::cluster`).

mod idempotence;
mod plugins;
mod process;
mod schedule;
#[cfg(test)]
mod tests;

pub(crate) use plugins::Faults;
pub(crate) use process::Proc;
pub(crate) use schedule::{Event, Schedule};

use crate::checker::{invariant, Checker, Violation};
use crate::device::SimWal;
use crate::plugins::{SimOffsets, SimSink};
use crate::rng::{Dice, Die, Rng, Stream};
use crate::scenario::{Overrides, Scenario, WalMode};
use crate::trace::Trace;
use skippr_core::{BatchSkipRequest, CompactionSeq, Records, SinkApply, SinkId, StreamId};
use skippr_core::{Duration, Host, Input, Instant, IoError, IoId, IoOp, IoReply, Mutations, Output, RarePaths};
use std::collections::BTreeMap;

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
    /// Batches a sink refused records of (dead letters on).
    pub sink_refusals: u64,
    /// Batches a sink answered `fatal` for a poisoned record, and those
    /// the operator gave up (`run --skip-batch`).
    pub sink_poisoned: u64,
    /// Dead letters of poisoned records, which the engine found by
    /// splitting the batches their sink answered `fatal` for.
    pub split_letters: u64,
    pub intake_letters: u64,
    pub batch_skips: u64,
    /// Starts that replay dead letters, and replayed records that reached
    /// the sink or the dead letters.
    pub replays: u64,
    pub replayed: u64,
    pub offsets_ambiguous: u64,
    pub source_failures: u64,
    /// A Singer-like tap's starts (each voids an open window and may send
    /// rows again), and the windows it closed.
    pub tap_starts: u64,
    pub tap_windows: u64,
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
    pub splits: u64,
    pub held_before_split: u64,
    /// Groups read back from the WAL for a sink, reads of them that failed,
    /// and how often the WAL reached its size limit.
    pub read_backs: u64,
    pub read_fails: u64,
    pub wal_full: u64,
    /// Windows recovery read from the WAL, and those that failed (the read
    /// fault's rate; on S3 the throttle's).
    pub recovery_reads: u64,
    pub recovery_read_fails: u64,
    /// Stop records written, found by a start, used by one, set aside by
    /// one (they did not match the WAL).
    pub stop_records_written: u64,
    pub stop_records_found: u64,
    pub stop_records_used: u64,
    pub stop_records_stale: u64,
    /// Clustered mode: terms with a leader, times a host became leader,
    /// leaders that stopped on losing it, partitions, freezes, truncated
    /// tails, raft messages lost and duplicated.
    pub terms: u64,
    pub elections: u64,
    pub deposed: u64,
    pub partitions: u64,
    pub freezes: u64,
    /// Clustered mode: hosts sent a SIGTERM, and those that stopped on it.
    pub sigterms: u64,
    pub sigterm_stops: u64,
    pub truncations: u64,
    /// Clustered mode: hosts wiped, disks replaced after they rotted,
    /// hosts rejoined under a new id, promoted to voter, and joins a host
    /// refused (not the leader, a change under way).
    pub wipes: u64,
    pub disks_replaced: u64,
    pub joins: u64,
    pub promotions: u64,
    pub joins_refused: u64,
    /// Under `--once`: hosts that gave up on a stall once a majority had
    /// finished the run (no peer would answer them again).
    pub stalled_out: u64,
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

/// Runs one seed in the topology its WAL mode names.
pub fn run(seed: u64, opts: &RunOptions) -> RunReport {
    match opts.wal {
        WalMode::Clustered => crate::cluster::world(seed, opts.clone()).run(),
        WalMode::Disk | WalMode::S3 => crate::writer::world(seed, opts.clone()).run(),
    }
}

/// What differs between topologies: how the run is planned, what their own
/// events do, what a request does at their devices, which outputs beyond
/// requests their engines give and how a stop is judged, and when the run
/// has converged. Each is a function of the whole world, so a topology's
/// state lives in `World::topo` and the shared parts stay in the world.
pub(crate) trait Topology: Sized {
    type Event;
    /// How long the quiet phase may take to converge, in simulated time.
    const QUIET_BUDGET: Duration;
    /// A run that takes more steps than this has stalled.
    const STEPS_MAX: u64;

    /// The fault phase's schedule and the first starts.
    fn plan(w: &mut World<Self>);
    /// The quiet phase's deadline.
    fn quiet_deadline(w: &World<Self>) -> Instant {
        w.scenario.fault_phase_end + Self::QUIET_BUDGET
    }
    /// The slot a topology event reaches, if it reaches one: it waits
    /// while that process is frozen.
    fn addressee(w: &World<Self>, event: &Self::Event) -> Option<usize>;
    fn fire(w: &mut World<Self>, event: Self::Event);
    /// Marks in the trace which process the next input goes to.
    fn note_feed(w: &mut World<Self>, slot: usize);
    /// Starts an engine in slot `slot` (with `World::begin`), if one is to run.
    fn start(w: &mut World<Self>, slot: usize);
    fn end_fault_phase(w: &mut World<Self>);
    /// A request leaves slot `slot`'s engine.
    fn submit(w: &mut World<Self>, slot: usize, id: IoId, op: IoOp);
    /// A request of the engine in `slot` is performed at its completion:
    /// its answer, or `None` if the answer comes later.
    fn complete(w: &mut World<Self>, slot: usize, gen: u64, id: IoId, op: IoOp) -> Option<Result<IoReply, IoError>>;
    /// A request whose engine no longer runs completes: what the service
    /// still does with it (nobody hears the answer).
    fn in_flight(w: &mut World<Self>, slot: usize, gen: u64, op: IoOp);
    /// Whether a sink applies a batch an engine of generation `gen` sent
    /// (false: the topology found the run failed).
    fn may_apply(_: &mut World<Self>, _gen: u64, _apply: &SinkApply) -> bool {
        true
    }
    /// An output other than a request or a count; false stops the drain.
    fn on_output(w: &mut World<Self>, slot: usize, output: Output) -> bool;
    /// After every step: whether the run has converged.
    fn after_step(w: &mut World<Self>);
    /// Nothing is left to happen, or the quiet phase ran out.
    fn stalled(w: &mut World<Self>, why: &str);
    /// A violation found by a checker of the topology's own.
    fn violation(w: &World<Self>) -> Option<&Violation>;
    /// The run ended without a panic: the topology's final checks.
    fn judge_end(w: &mut World<Self>);
    /// The run is over: the topology's statistics.
    fn wrap_up(w: &mut World<Self>);
}

pub(crate) struct World<T: Topology> {
    pub scenario: Scenario,
    pub opts: RunOptions,
    pub schedule: Schedule<Event<T::Event>>,
    pub dice: Dice,
    pub faults_rng: Rng,
    /// The engines' process slots (the topology says what each is for).
    pub procs: Vec<Proc>,
    /// The WAL devices and the offsets stores.
    pub wals: Vec<SimWal>,
    pub stores: Vec<SimOffsets>,
    pub sinks: Vec<SimSink>,
    /// The dead-letter destination, per sink.
    pub letters: Vec<SimSink>,
    /// What the first sink's dead letters hold, per stream, in their order:
    /// each letter's record (what a replay reads).
    pub letter_log: Vec<Vec<Vec<u8>>>,
    /// The batches a sink answered `fatal` for a poisoned record, with
    /// their records (what the operator names when giving one up).
    pub poisoned: BTreeMap<(SinkId, StreamId, CompactionSeq), Records>,
    /// The operator's `--skip-batch` options, kept for every later start.
    pub batch_skips: Vec<BatchSkipRequest>,
    pub checker: Checker,
    pub trace: Trace,
    pub stats: RunStats,
    /// The last generation given to an engine.
    pub next_gen: u64,
    pub faulting: bool,
    pub done: bool,
    /// The run ended in a correct refusal (committed data lost or rotten,
    /// and named).
    pub fail_closed: Option<String>,
    pub topo: T,
}

impl<T: Topology> World<T> {
    /// A world of `procs` over `wals` and `stores`, with one sink per
    /// scenario sink.
    pub fn new(
        scenario: Scenario,
        opts: RunOptions,
        procs: Vec<Proc>,
        wals: Vec<SimWal>,
        stores: Vec<SimOffsets>,
        topo: T,
    ) -> World<T> {
        let seed = scenario.seed;
        World {
            sinks: (0..scenario.sinks).map(|_| SimSink::default()).collect(),
            letters: (0..scenario.sinks).map(|_| SimSink::default()).collect(),
            letter_log: vec![Vec::new(); scenario.streams as usize],
            poisoned: BTreeMap::new(),
            batch_skips: Vec::new(),
            checker: Checker::new(&scenario),
            trace: Trace::new(opts.trace),
            dice: Dice::new(seed),
            faults_rng: Rng::new(seed, Stream::Crashes),
            schedule: Schedule::default(),
            procs,
            wals,
            stores,
            next_gen: 0,
            faulting: true,
            done: false,
            fail_closed: None,
            stats: RunStats::default(),
            scenario,
            opts,
            topo,
        }
    }

    pub fn run(mut self) -> RunReport {
        self.stats.source_records = self.scenario.total_records();
        T::plan(&mut self);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.main_loop()));
        let outcome = match result {
            Err(panic) => Outcome::panicked(panic),
            Ok(()) => {
                if self.checker.violation.is_none() && T::violation(&self).is_none() {
                    T::judge_end(&mut self);
                }
                match (&self.checker.violation, T::violation(&self), &self.fail_closed) {
                    (Some(v), _, _) | (None, Some(v), _) => Outcome::Fail(v.clone()),
                    (None, None, Some(why)) => Outcome::FailClosed(why.clone()),
                    (None, None, None) => Outcome::Pass,
                }
            }
        };
        T::wrap_up(&mut self);
        for slot in 0..self.procs.len() {
            self.retire(slot);
        }
        for wal in &mut self.wals {
            let d = wal.disk_stats();
            self.stats.torn_writes += d.torn_writes;
            self.stats.lost_writes += d.lost_writes;
            self.stats.lost_dir_entries += d.lost_dir_entries;
            self.stats.fsync_failures += d.fsync_failures;
            self.stats.rot += d.rot;
            self.stats.s3_conflicts += wal.s3_mut().map_or(0, |s| s.conflicts());
        }
        self.stats.compactions = self.checker.compactions() as u64;
        self.stats.replayed = self.checker.replayed();
        self.stats.split_letters = self.checker.split_letters();
        self.stats.intake_letters = self.checker.intake_letters();
        self.stats.sim_micros = self.schedule.now.as_micros();
        RunReport {
            seed: self.scenario.seed,
            outcome,
            trace_hash: self.trace.hash(),
            stats: self.stats,
            trace: std::mem::take(&mut self.trace.lines),
        }
    }

    fn main_loop(&mut self) {
        let quiet_deadline = T::quiet_deadline(self);
        loop {
            let failed = self.checker.violation.is_some() || T::violation(self).is_some();
            if self.done || failed || self.fail_closed.is_some() {
                return;
            }
            self.stats.steps += 1;
            let next_event = self.schedule.next_at();
            let timer = self.next_timer();
            let Some(next) = [next_event, timer.map(|t| t.0)].into_iter().flatten().min() else {
                return T::stalled(self, "nothing left to happen");
            };
            if next > quiet_deadline || self.stats.steps > T::STEPS_MAX {
                return T::stalled(self, "the quiet phase did not converge");
            }
            self.schedule.now = self.schedule.now.max(next);
            // An engine's deadline goes before an event due at the same time.
            match timer {
                Some((t, slot)) if t == next => {
                    self.procs[slot].frozen_until = None;
                    self.feed(slot, Input::Timeout);
                }
                _ => {
                    let event = self.schedule.pop().expect("an event is due");
                    self.fire(event);
                }
            }
            T::after_step(self);
        }
    }

    /// The earliest engine deadline, and whose: a frozen process's waits
    /// until it wakes.
    fn next_timer(&self) -> Option<(Instant, usize)> {
        self.procs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let t = p.timer?;
                Some((p.frozen_until.map_or(t, |w| t.max(w)), i))
            })
            .min()
    }

    pub fn now(&self) -> Instant {
        self.schedule.now
    }

    pub fn at(&mut self, at: Instant, event: Event<T::Event>) {
        self.schedule.at(at, event);
    }

    /// Schedules `event` after a delay in `lo..=hi` microseconds drawn from `die`.
    pub fn after(&mut self, die: Die, (lo, hi): (u64, u64), event: Event<T::Event>) {
        let delay = self.dice.roll(die).range(lo, hi.max(lo));
        self.schedule.at(self.now() + Duration::from_micros(delay), event);
    }

    /// Schedules a topology event after a delay drawn from `die`.
    pub fn after_topo(&mut self, die: Die, range: (u64, u64), event: T::Event) {
        self.after(die, range, Event::Topo(event));
    }

    fn fire(&mut self, event: Event<T::Event>) {
        match event {
            Event::Complete { slot, gen, id, op } => match self.owner(gen) {
                Some(owner) => {
                    if let Some(wake) = self.stuck(owner) {
                        return self.hold(wake, Event::Complete { slot, gen, id, op });
                    }
                    if let Some(result) = T::complete(self, owner, gen, id, op) {
                        self.reply(gen, Input::IoDone { id, result });
                    }
                }
                None => T::in_flight(self, slot, gen, op),
            },
            Event::SinkEffect { gen, id, apply, letters } => {
                if let Some(wake) = self.owner(gen).and_then(|owner| self.stuck(owner)) {
                    return self.hold(wake, Event::SinkEffect { gen, id, apply, letters });
                }
                if T::may_apply(self, gen, &apply) {
                    let (delay, result) = if letters { self.letters_effect(&apply) } else { self.sink_effect(&apply) };
                    let input = Input::IoDone { id, result };
                    self.at(self.now() + delay, Event::Reply { gen, input });
                }
            }
            Event::Reply { gen, input } => self.reply(gen, input),
            Event::Start { slot } => T::start(self, slot),
            Event::EndFaultPhase => T::end_fault_phase(self),
            Event::Topo(event) => match T::addressee(self, &event).and_then(|slot| self.wake_of(slot)) {
                Some(wake) => self.hold(wake, Event::Topo(event)),
                None => T::fire(self, event),
            },
        }
    }

    /// `input` reaches the engine of generation `gen`: now, when it wakes
    /// if it is frozen, or never if it no longer runs.
    pub fn reply(&mut self, gen: u64, input: Input) {
        let Some(slot) = self.owner(gen) else { return };
        match self.wake_of(slot) {
            Some(wake) => self.hold(wake, Event::Reply { gen, input }),
            None => self.feed(slot, input),
        }
    }

    /// A request of a frozen process is due: it left before the freeze
    /// and is performed on time, or it is stuck in the paused machine (a
    /// VM's network and disk stop with it) and is performed when it wakes,
    /// at the seed's rate. Returns the wake time if it is stuck.
    fn stuck(&mut self, slot: usize) -> Option<Instant> {
        let wake = self.wake_of(slot)?;
        let rate = self.scenario.faults.stuck_when_frozen;
        (rate > 0.0 && self.dice.roll(Die::Frozen).chance(rate)).then_some(wake)
    }

    /// What reaches a frozen process waits until a little after it wakes.
    fn hold(&mut self, wake: Instant, event: Event<T::Event>) {
        let delay = Duration::from_micros(self.dice.roll(Die::Frozen).range(0, 1_000));
        self.at(wake + delay, event);
    }

    /// The slot whose running engine has generation `gen`.
    pub fn owner(&self, gen: u64) -> Option<usize> {
        self.procs.iter().position(|p| p.gen == gen && p.host.is_some())
    }

    /// When slot `slot`'s process wakes, if it is frozen now.
    pub fn wake_of(&self, slot: usize) -> Option<Instant> {
        self.procs[slot].frozen_until.filter(|w| *w > self.now())
    }

    /// Starts `host` in slot `slot` under a new generation, and drains it.
    pub fn begin(&mut self, slot: usize, host: Host) {
        self.next_gen += 1;
        let p = &mut self.procs[slot];
        (p.host, p.gen, p.frozen_until) = (Some(host), self.next_gen, None);
        self.drain(slot);
    }

    /// A fault of kind `die` at `rate` strikes this request.
    pub fn fault(&mut self, die: Die, rate: f64) -> bool {
        Faults { dice: &mut self.dice, on: self.faulting }.strike(die, rate)
    }

    /// Hands `input` to slot `slot`'s engine, if it runs, and drains it.
    pub fn feed(&mut self, slot: usize, input: Input) {
        if self.procs[slot].host.is_none() {
            return;
        }
        let now = self.now();
        T::note_feed(self, slot);
        self.trace.input(now, &input);
        self.procs[slot].host.as_mut().expect("checked").handle(now, input);
        self.drain(slot);
    }

    /// Drains slot `slot`'s engine's outputs completely (the drain
    /// contract), then notes its next deadline.
    pub fn drain(&mut self, slot: usize) {
        while let Some(output) = self.procs[slot].host.as_mut().and_then(|h| h.poll_output()) {
            self.trace.output(self.now(), &output);
            let more = match output {
                Output::Io { id, op } => {
                    T::submit(self, slot, id, op);
                    true
                }
                Output::Recovered(s) => {
                    self.stats.recoveries += 1;
                    match s.stop_record {
                        skippr_core::StopRecordUse::Absent => {}
                        skippr_core::StopRecordUse::Used => self.stats.stop_records_used += 1,
                        skippr_core::StopRecordUse::Stale(_) => self.stats.stop_records_stale += 1,
                    }
                    true
                }
                Output::WalFull { .. } => {
                    self.stats.wal_full += 1;
                    true
                }
                Output::WalRoom { .. } => true,
                Output::Skip { .. } => unreachable!("the simulator's runs skip no input"),
                // The operator's batch skips: the checker accounts for them
                // as they are asked for.
                Output::BatchSkip { .. } => true,
                // Counted where the sink refuses; the checker judges what
                // reaches the dead letters.
                Output::Refused { .. } | Output::Split { .. } => true,
                Output::TailCut { .. } => true,
                Output::Stalled { .. } | Output::Unstalled => unreachable!("the simulator's engines watch no stalls"),
                output => T::on_output(self, slot, output),
            };
            if !more {
                break;
            }
        }
        let p = &mut self.procs[slot];
        p.timer = p.host.as_ref().and_then(|h| h.poll_timeout()).map(|t| t.0);
    }

    /// Slot `slot`'s engine is gone (a crash, an exit, the end of the run):
    /// its rare paths join the run's statistics.
    pub fn retire(&mut self, slot: usize) {
        let p = &mut self.procs[slot];
        p.timer = None;
        if let Some(host) = p.host.take() {
            self.count_paths(host.rare_paths());
        }
    }

    fn count_paths(&mut self, p: RarePaths) {
        self.stats.late_commits_verified += p.late_commits_verified;
        self.stats.seals_ahead += p.seals_ahead;
        self.stats.seals_no_room += p.seals_no_room;
        self.stats.splits += p.splits;
        self.stats.held_before_split += p.held_before_split;
    }
}
