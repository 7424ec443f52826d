//! Clustered mode's world: several hosts, each an engine with its own
//! simulated disk, offsets store and connections to the sources, one set of
//! shared sinks, and a network between the hosts that delays, reorders,
//! loses and duplicates raft messages and is partitioned now and then.
//! Hosts are killed, lose power, or freeze and wake next to a successor;
//! their tick rates differ a little. After the fault phase everything heals
//! and the run must deliver every record to every sink exactly once.
//!
//! Two checkers judge it: the exactly-once checker of every mode (fed only
//! by sources, sinks and offsets stores), and `model`, which knows what each
//! disk holds durably and so what a majority holds, and asserts that no ack,
//! offsets write or dispatch acts on anything less, that no term has two
//! leaders, and that the hosts' committed prefixes agree.

mod model;

use crate::checker::{invariant, Checker};
use crate::device::SimWal;
use crate::plugin_effects::{self, Faults};
use crate::plugins::{SimOffsets, SimSink, SimSource};
use crate::rng::{Dice, Die, Rng, Stream};
use crate::scenario::Scenario;
use crate::trace::Trace;
use crate::world::{Outcome, RunOptions, RunReport, RunStats};
use model::Model;
use skippr_core::cluster::check_install;
use skippr_core::cluster::{decode_file, first_file, Members};
use skippr_core::format::scan;
use skippr_core::*;
use skippr_core::{OffsetsOp, PluginOp, WalOp};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// How long the quiet phase may take to converge, in simulated time:
/// shorter than the single-host world's, since every simulated second of a
/// cluster costs thousands of ticks and heartbeats (passing runs take well
/// under one second in all).
const QUIET_BUDGET: Duration = Duration::from_secs(20);
/// A run that takes more steps than this has stalled.
const STEPS_MAX: u64 = 1_000_000;
/// How often, while faults are on, a host dies in the middle of a truncation.
const TRUNCATION_CRASH: f64 = 0.3;

enum Event {
    Complete {
        node: usize,
        gen: u64,
        id: IoId,
        op: IoOp,
    },
    SinkEffect {
        node: usize,
        gen: u64,
        id: IoId,
        apply: SinkApply,
    },
    Reply {
        node: usize,
        gen: u64,
        id: IoId,
        result: Result<IoReply, IoError>,
    },
    Deliver(Box<PeerMessage>),
    /// Node `by`'s word that node `to` was removed (`Output::TellRemoved`).
    TellRemoved {
        by: u64,
        to: u64,
    },
    Crash {
        power: bool,
    },
    Restart {
        node: usize,
    },
    Partition,
    Heal,
    EndFaultPhase,
    /// One host's data is lost for good.
    Wipe,
    /// The operator asks the leader again to let the joining host in.
    AskJoin {
        node: usize,
    },
    /// A host's transfer of a snapshot to node `to` ended.
    Served {
        node: usize,
        gen: u64,
        to: u64,
        ok: bool,
    },
}

struct Node {
    /// Its raft node id: its slot number, until it joins again under a new one.
    id: u64,
    /// After a wipe: the id it had, until it has joined under a new one.
    wiped_from: Option<u64>,
    /// Joined under a new id in place of this one, not yet promoted.
    joining: Option<u64>,
    host: Option<Host>,
    /// The live engine's generation (unique in the run); 0 while down.
    gen: u64,
    starts: u64,
    wal: SimWal,
    offsets: SimOffsets,
    /// This host's connections to the sources: a cursor of its own.
    sources: Vec<SimSource>,
    /// Frozen until then: nothing reaches it, its timers wait.
    frozen_until: Option<Instant>,
    /// The term and role it last reported.
    term: u64,
    leader: bool,
    /// Its engine's next deadline, as of its last input.
    timer: Option<Instant>,
    /// Under `--once`: it stopped by itself, having applied the terminal
    /// entry (until it is started again).
    finished: bool,
    /// Its disk was lost after the run finished: it is not brought back.
    left_out: bool,
}

/// A scheduled event. The heap's greatest is the earliest, and of events
/// at one time the first scheduled: (time, seq) is unique, so the order is
/// total and the same on every run.
struct Queued {
    at: Instant,
    seq: u64,
    event: Box<Event>,
}

impl Ord for Queued {
    fn cmp(&self, other: &Queued) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Queued) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Queued) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Queued {}

pub struct ClusterWorld {
    scenario: Scenario,
    opts: RunOptions,
    /// Events by (time, order of scheduling); boxed, as the heap moves
    /// its entries and a raft message or a request is large.
    queue: BinaryHeap<Queued>,
    seq: u64,
    now: Instant,
    dice: Dice,
    faults_rng: Rng,
    nodes: Vec<Node>,
    next_gen: u64,
    sinks: Vec<SimSink>,
    checker: Checker,
    model: Model,
    /// Links (from, to) between slots (1-based) that drop everything.
    blocked: BTreeSet<(u64, u64)>,
    /// Raft node id → the slot running it.
    slot_of: BTreeMap<u64, usize>,
    next_id: u64,
    faulting: bool,
    done: bool,
    trace: Trace,
    stats: RunStats,
}

pub fn run(seed: u64, opts: &RunOptions) -> RunReport {
    ClusterWorld::new(seed, opts.clone()).run()
}

impl ClusterWorld {
    pub fn new(seed: u64, opts: RunOptions) -> ClusterWorld {
        let mut scenario = Scenario::from_seed(seed).with_wal(opts.wal).with_overrides(&opts.overrides);
        if opts.hosts > 0 && opts.hosts != scenario.cluster.hosts {
            scenario.draw_cluster(opts.hosts);
        }
        let hosts = scenario.cluster.hosts;
        let switch = Instant::from_micros(scenario.fault_phase_end.as_micros() / 2);
        let nodes = (0..hosts)
            .map(|h| {
                let sources = scenario
                    .sources
                    .iter()
                    .enumerate()
                    .map(|(i, spec)| SimSource::new(seed, i as u16, spec.clone(), scenario.streams, switch))
                    .collect();
                let mut wal = SimWal::disk(seed ^ (h as u64 + 1) << 48);
                // `cluster init` on every host: the cluster's id and the host's.
                wal.init_hard_state(identity(seed, h as u64 + 1, &scenario, hosts));
                Node {
                    id: h as u64 + 1,
                    wiped_from: None,
                    joining: None,
                    host: None,
                    gen: 0,
                    starts: 0,
                    wal,
                    offsets: SimOffsets::new(false),
                    sources,
                    frozen_until: None,
                    term: 0,
                    leader: false,
                    timer: None,
                    finished: false,
                    left_out: false,
                }
            })
            .collect();
        ClusterWorld {
            sinks: (0..scenario.sinks).map(|_| SimSink::default()).collect(),
            checker: Checker::new(&scenario),
            model: Model::new(hosts),
            trace: Trace::new(opts.trace),
            dice: Dice::new(seed),
            faults_rng: Rng::new(seed, Stream::Crashes),
            queue: BinaryHeap::new(),
            seq: 0,
            now: Instant::ZERO,
            nodes,
            next_gen: 0,
            blocked: BTreeSet::new(),
            slot_of: (0..hosts).map(|h| (h as u64 + 1, h)).collect(),
            next_id: hosts as u64 + 1,
            faulting: true,
            done: false,
            stats: RunStats::default(),
            scenario,
            opts,
        }
    }

    pub fn run(mut self) -> RunReport {
        self.stats.source_records = self.scenario.total_records();
        self.plan_faults();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.main_loop()));
        let outcome = match result {
            Err(panic) => Outcome::panicked(panic),
            Ok(()) => {
                if self.checker.violation.is_none() && self.model.violation.is_none() {
                    let commits: Vec<u64> = self.nodes.iter().map(|n| saved_commit(&n.wal)).collect();
                    self.model.check_prefixes(&commits);
                }
                match (&self.checker.violation, &self.model.violation) {
                    (Some(v), _) | (None, Some(v)) => Outcome::Fail(v.clone()),
                    (None, None) => Outcome::Pass,
                }
            }
        };
        for n in &self.nodes {
            let d = n.wal.disk_stats();
            self.stats.torn_writes += d.torn_writes;
            self.stats.lost_writes += d.lost_writes;
            self.stats.lost_dir_entries += d.lost_dir_entries;
            self.stats.fsync_failures += d.fsync_failures;
        }
        self.stats.compactions = self.checker.compactions() as u64;
        self.stats.sim_micros = self.now.as_micros();
        self.stats.terms = self.model.terms() as u64;
        RunReport {
            seed: self.scenario.seed,
            outcome,
            trace_hash: self.trace.hash(),
            stats: self.stats,
            trace: std::mem::take(&mut self.trace.lines),
        }
    }

    fn at(&mut self, at: Instant, event: Event) {
        self.seq += 1;
        self.queue.push(Queued { at, seq: self.seq, event: Box::new(event) });
    }

    /// Schedules `event` after a delay in `lo..=hi` microseconds drawn from `die`.
    fn after(&mut self, die: Die, (lo, hi): (u64, u64), event: Event) {
        let delay = self.dice.roll(die).range(lo, hi.max(lo));
        self.at(self.now + Duration::from_micros(delay), event);
    }

    fn fault(&mut self, die: Die, rate: f64) -> bool {
        Faults { dice: &mut self.dice, on: self.faulting }.strike(die, rate)
    }

    /// Crashes (kills, power cuts, freezes), partitions, the end of the
    /// fault phase, and every host's first start.
    fn plan_faults(&mut self) {
        let end = self.scenario.fault_phase_end.as_micros();
        for i in 0..self.scenario.faults.crashes * 2 {
            let at = Instant::from_micros(self.faults_rng.range(0, end));
            if i < self.scenario.crashes_kept * 2 {
                let power = self.faults_rng.chance(0.5);
                self.at(at, Event::Crash { power });
            }
        }
        for _ in 0..self.scenario.cluster.partitions {
            let at = Instant::from_micros(self.faults_rng.range(0, end));
            self.at(at, Event::Partition);
        }
        if self.scenario.cluster.wipe {
            let at = Instant::from_micros(self.faults_rng.range(end / 10, end * 6 / 10));
            self.at(at, Event::Wipe);
        }
        self.at(Instant::from_micros(end), Event::EndFaultPhase);
        for node in 0..self.nodes.len() {
            self.at(Instant::ZERO, Event::Restart { node });
        }
    }

    fn main_loop(&mut self) {
        // Under `--once`, a host that learnt of the terminal entry but not
        // that every member did, left alone, stops after the drain timeout.
        let once = if self.scenario.stop_when_exhausted { self.scenario.limits.drain_timeout } else { Duration::ZERO };
        let quiet_deadline = self.scenario.fault_phase_end + QUIET_BUDGET + once;
        loop {
            if self.done || self.checker.violation.is_some() || self.model.violation.is_some() {
                return;
            }
            self.stats.steps += 1;
            let next_event = self.queue.peek().map(|q| q.at);
            let timer = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| {
                    let t = n.timer?;
                    Some((n.frozen_until.map_or(t, |w| t.max(w)), i))
                })
                .min();
            let Some(next) = [next_event, timer.map(|t| t.0)].into_iter().flatten().min() else {
                return self.stalled("nothing left to happen");
            };
            if next > quiet_deadline || self.stats.steps > STEPS_MAX {
                return self.stalled("the quiet phase did not converge");
            }
            self.now = self.now.max(next);
            match timer {
                Some((t, node)) if t <= next => {
                    self.nodes[node].frozen_until = None;
                    self.feed(node, Input::Timeout);
                }
                _ => {
                    let q = self.queue.pop().expect("an event is due");
                    self.fire(*q.event);
                }
            }
            if !self.faulting && self.checker.complete() && self.all_finished() {
                self.done = true;
            }
        }
    }

    /// Under `--once`, every host must stop by itself in the end.
    fn all_finished(&self) -> bool {
        !self.scenario.stop_when_exhausted || self.nodes.iter().all(|n| n.finished)
    }

    fn stalled(&mut self, why: &str) {
        if self.checker.complete() && !self.all_finished() {
            let running: Vec<usize> =
                (0..self.nodes.len()).filter(|&i| !self.nodes[i].finished).map(|i| i + 1).collect();
            let detail = format!("{why}: every record is delivered, but hosts {running:?} did not stop under --once");
            return self.checker.fail(invariant::STALLED, detail);
        }
        if self.checker.complete() {
            self.done = true;
            return;
        }
        let missing = self.checker.missing().unwrap_or_else(|| "all records delivered".into());
        let detail = format!("{why}: {missing} (delivered {})", self.checker.delivered());
        self.checker.fail(invariant::STALLED, detail);
    }

    /// An event that reaches a frozen host waits until it wakes.
    fn frozen(&mut self, node: usize, event: Event) -> Option<Event> {
        match self.nodes[node].frozen_until {
            Some(wake) if wake > self.now => {
                self.at(wake, event);
                None
            }
            _ => Some(event),
        }
    }

    fn fire(&mut self, event: Event) {
        let node = match &event {
            Event::Complete { node, .. }
            | Event::SinkEffect { node, .. }
            | Event::Reply { node, .. }
            | Event::Served { node, .. } => Some(*node),
            Event::Deliver(m) => match self.slot_of.get(&m.to) {
                Some(&slot) => Some(slot),
                None => return, // an id that no host runs (any longer)
            },
            Event::TellRemoved { to, .. } => match self.slot_of.get(to) {
                Some(&slot) => Some(slot),
                None => return,
            },
            _ => None,
        };
        let event = match node {
            Some(n) => match self.frozen(n, event) {
                Some(e) => e,
                None => return,
            },
            None => event,
        };
        match event {
            Event::Complete { node, gen, id, op } => {
                if self.nodes[node].gen == gen {
                    let result = self.complete(node, op);
                    self.feed(node, Input::IoDone { id, result });
                }
            }
            Event::SinkEffect { node, gen, id, apply } => self.sink_effect(node, gen, id, apply),
            Event::Reply { node, gen, id, result } => {
                if self.nodes[node].gen == gen {
                    self.feed(node, Input::IoDone { id, result });
                }
            }
            Event::Deliver(m) => {
                let to = self.slot_of[&m.to];
                let from = self.slot_of.get(&m.from).map_or(0, |&s| s as u64 + 1);
                if !self.blocked.contains(&(from, to as u64 + 1)) && self.nodes[to].host.is_some() {
                    self.feed(to, Input::Peer(m));
                }
            }
            Event::TellRemoved { by, to } => {
                let slot = self.slot_of[&to];
                let from = self.slot_of.get(&by).map_or(0, |&s| s as u64 + 1);
                if !self.blocked.contains(&(from, slot as u64 + 1)) && self.nodes[slot].host.is_some() {
                    self.feed(slot, Input::Removed { by, node: to });
                }
            }
            Event::Served { node, gen, to, ok } => {
                if self.nodes[node].gen == gen {
                    self.feed(node, Input::SnapshotServed { to, ok });
                }
            }
            Event::Wipe => self.wipe(),
            Event::AskJoin { node } => self.ask_join(node),
            Event::Crash { power } => self.crash(power),
            Event::Restart { node } => self.start(node),
            Event::Partition => self.partition(),
            Event::Heal => self.blocked.clear(),
            Event::EndFaultPhase => {
                self.faulting = false;
                self.blocked.clear();
                for node in 0..self.nodes.len() {
                    self.nodes[node].frozen_until = None;
                    if self.nodes[node].host.is_none() {
                        self.start(node);
                    }
                }
            }
        }
    }

    // ---- hosts ----

    fn start(&mut self, node: usize) {
        if self.nodes[node].host.is_some() || self.nodes[node].left_out {
            return;
        }
        self.stats.restarts += 1;
        self.next_gen += 1;
        let n = &mut self.nodes[node];
        n.starts += 1;
        n.gen = self.next_gen;
        n.leader = false;
        n.finished = false;
        let cfg = self.scenario.cluster_host_config(self.opts.mutations, node + 1, n.id, n.starts);
        let host = Host::new(cfg, self.now).expect("the scenario's configuration is valid");
        self.nodes[node].host = Some(host);
        self.trace.note(self.now, &format!("h{} starts", node + 1));
        self.drain(node);
    }

    /// A crash hits a host drawn at random (a leader more often): it is
    /// killed, loses power, or freezes and wakes later.
    fn crash(&mut self, power: bool) {
        let alive: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.nodes[i].host.is_some()).collect();
        let leaders: Vec<usize> = alive.iter().copied().filter(|&i| self.nodes[i].leader).collect();
        let r = self.dice.roll(Die::ClusterFault);
        let pick = if !leaders.is_empty() && r.chance(0.6) { &leaders } else { &alive };
        let Some(&node) = pick.get(r.range(0, pick.len().max(1) as u64 - 1) as usize) else { return };
        if self.fault(Die::ClusterFault, self.scenario.cluster.freeze) {
            let span = 20 * self.scenario.cluster.ticks[node].as_micros();
            let wake = self.now + Duration::from_micros(self.dice.roll(Die::ClusterFault).range(span / 2, span * 2));
            self.stats.freezes += 1;
            self.trace.note(self.now, &format!("h{} freezes", node + 1));
            self.nodes[node].frozen_until = Some(wake);
            return;
        }
        self.stats.crashes += 1;
        self.kill(node);
        if power {
            self.stats.power_cuts += 1;
            let lost = self.scenario.faults.lost_dir_entry;
            self.nodes[node].wal.power_cut(lost);
        }
        self.rescan(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, Event::Restart { node });
    }

    /// A host's disk is lost for good (the checker still counts what it
    /// held toward the majorities it was part of). It restarts on the empty
    /// disk and must refuse to take part until it has joined again.
    fn wipe(&mut self) {
        let alive: Vec<usize> =
            (0..self.nodes.len()).filter(|&i| self.nodes[i].host.is_some() && !self.nodes[i].leader).collect();
        let r = self.dice.roll(Die::ClusterFault);
        let longest = self.model.longest().filter(|h| alive.contains(h));
        let node = match longest {
            Some(h) if r.chance(0.5) => h,
            _ => match alive.get(r.range(0, alive.len().max(1) as u64 - 1) as usize) {
                Some(&h) => h,
                None => return,
            },
        };
        self.stats.wipes += 1;
        self.kill(node);
        self.trace.note(self.now, &format!("h{} wiped", node + 1));
        let n = &mut self.nodes[node];
        n.wal.wipe();
        if !self.scenario.cluster.shared_offsets {
            n.offsets = SimOffsets::new(false);
        }
        n.wiped_from = Some(n.id);
        self.model.wipe(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, Event::Restart { node });
        // Sometimes the leader goes down too, for a few election timeouts:
        // the lost disk was one of the majority that holds the newest
        // commits, and the hosts left must not elect a log without them.
        let leader = (0..self.nodes.len()).find(|&i| self.nodes[i].leader && self.nodes[i].host.is_some());
        if let Some(leader) = leader.filter(|_| self.dice.roll(Die::ClusterFault).chance(0.5)) {
            self.stats.crashes += 1;
            self.kill(leader);
            let span = 30 * self.scenario.cluster.ticks[leader].as_micros();
            self.after(Die::Restart, (span, span * 2), Event::Restart { node: leader });
        }
    }

    /// The operator brings a wiped host back: `cluster join` writes its new
    /// identity (a new id, the cluster's first voters as its starting
    /// configuration), it starts as a learner, and the leader is asked to
    /// let it in.
    fn join(&mut self, node: usize, old: u64) {
        let id = self.next_id;
        self.next_id += 1;
        let file = identity(self.scenario.seed, id, &self.scenario, self.nodes.len());
        let n = &mut self.nodes[node];
        n.wal.init_hard_state(file);
        self.slot_of.remove(&n.id);
        n.id = id;
        n.wiped_from = None;
        n.joining = Some(old);
        self.slot_of.insert(id, node);
        self.stats.joins += 1;
        self.trace.note(self.now, &format!("h{} joins as node {id} in place of {old}", node + 1));
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, Event::Restart { node });
        self.after(Die::ClusterFault, restart, Event::AskJoin { node });
    }

    /// Asks the host that leads (as far as the operator can tell) to let
    /// the joining host in, until the joining host's own saved
    /// configuration has it as a voter.
    fn ask_join(&mut self, node: usize) {
        let Some(old) = self.nodes[node].joining else { return };
        let id = self.nodes[node].id;
        let promoted = self.nodes[node]
            .wal
            .hard_state()
            .and_then(|f| decode_file(f).ok().flatten())
            .is_some_and(|s| s.conf.voters.contains(&id) && s.conf.voters_outgoing.is_empty());
        if promoted {
            self.nodes[node].joining = None;
            self.stats.promotions += 1;
            self.trace.note(self.now, &format!("node {id} is a voter"));
            return;
        }
        if let Some(leader) = (0..self.nodes.len()).find(|&i| self.nodes[i].leader && self.nodes[i].host.is_some()) {
            self.feed(leader, Input::Join { node: id, replaces: old });
        }
        let span = 10 * self.scenario.cluster.ticks[0].as_micros();
        self.after(Die::ClusterFault, (span / 2, span), Event::AskJoin { node });
    }

    /// `--once`: the run finished, so a join the leader never let in (the
    /// host is not in its own saved configuration) is given up: the host
    /// has nothing to catch up with, and nobody is left to let it in.
    fn abandon_joins(&mut self) {
        for node in 0..self.nodes.len() {
            let n = &self.nodes[node];
            let admitted = n
                .wal
                .hard_state()
                .and_then(|f| decode_file(f).ok().flatten())
                .is_some_and(|s| s.conf.voters.contains(&n.id) || s.conf.learners.contains(&n.id));
            if n.joining.is_none() || admitted {
                continue;
            }
            self.kill(node);
            let n = &mut self.nodes[node];
            (n.finished, n.left_out, n.joining) = (true, true, None);
            self.trace.note(self.now, &format!("h{} stays out: the run finished before it was let in", node + 1));
        }
    }

    fn kill(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.host = None;
        n.gen = 0;
        n.leader = false;
        n.frozen_until = None;
        n.timer = None;
        self.trace.note(self.now, &format!("h{} killed", node + 1));
    }

    /// What the host's disk holds durably now, for the model.
    fn rescan(&mut self, node: usize) {
        let segments = self.nodes[node].wal.segments_durable();
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        match scan(&refs, false) {
            Ok(scanned) => self.model.rescanned(node, &scanned),
            Err(c) => self.checker.fail(invariant::CORE_ASSERTION, format!("host {} disk: {c:?}", node + 1)),
        }
    }

    /// A partition for a while: one host cut off from the others, or able
    /// to hear them but not to be heard (asymmetric), or, with five hosts,
    /// the leader cut off together with one other.
    fn partition(&mut self) {
        let hosts = self.nodes.len() as u64;
        let r = self.dice.roll(Die::ClusterFault);
        let kind = r.range(0, 2);
        let leader = (0..self.nodes.len()).find(|&i| self.nodes[i].leader).map(|i| i as u64 + 1);
        let first = leader.filter(|_| r.chance(0.6)).unwrap_or_else(|| r.range(1, hosts));
        let mut side = vec![first];
        if kind == 2 && hosts >= 5 {
            side.push(first % hosts + 1);
        }
        for &a in &side {
            for b in (1..=hosts).filter(|b| !side.contains(b)) {
                if kind != 1 {
                    self.blocked.insert((b, a));
                }
                self.blocked.insert((a, b));
            }
        }
        self.stats.partitions += 1;
        self.trace.note(self.now, &format!("partition {side:?} kind {kind}"));
        let span = 30 * self.scenario.cluster.ticks[0].as_micros();
        self.after(Die::ClusterFault, (span / 2, span * 3), Event::Heal);
    }

    fn feed(&mut self, node: usize, input: Input) {
        let now = self.now;
        let Some(host) = self.nodes[node].host.as_mut() else { return };
        self.trace.host(now, node);
        self.trace.input(now, &input);
        host.handle(now, input);
        self.drain(node);
    }

    fn drain(&mut self, node: usize) {
        loop {
            let Some(output) = self.nodes[node].host.as_mut().and_then(|h| h.poll_output()) else {
                let n = &mut self.nodes[node];
                n.timer = n.host.as_ref().and_then(|h| h.poll_timeout()).map(|t| t.0);
                return;
            };
            self.trace.output(self.now, &output);
            match output {
                Output::Io { id, op } => self.submit(node, id, op),
                Output::Send(m) => self.send(m),
                Output::TellRemoved { to } => {
                    self.stats.removed_told += 1;
                    let by = self.nodes[node].id;
                    let net = self.scenario.cluster.net;
                    self.after(Die::Network, net, Event::TellRemoved { by, to });
                }
                Output::Role { term, is_leader, .. } => {
                    let n = &mut self.nodes[node];
                    n.term = term;
                    n.leader = is_leader;
                    self.stats.elections += is_leader as u64;
                }
                Output::Recovered(_) => self.stats.recoveries += 1,
                Output::WalFull { .. } => self.stats.wal_full += 1,
                Output::WalRoom { .. } => {}
                Output::JoinRefused { .. } => self.stats.joins_refused += 1,
                Output::Stopped(reason) => return self.on_stopped(node, reason),
                Output::LeaseWait { .. } | Output::Stalled { .. } | Output::Unstalled => {
                    unreachable!("clustered engines take no lease and watch no stalls")
                }
                Output::Skip { .. } => unreachable!("the simulator's runs skip nothing"),
            }
        }
    }

    /// A stop is judged: losing leadership, a failed write or read is an
    /// engine doing its job (it restarts); anything else is a failure.
    fn on_stopped(&mut self, node: usize, reason: StopReason) {
        match reason {
            // `--once`: the terminal entry applied, the host stops for good
            // (until the end of the fault phase starts it again, when it
            // must stop at once). The leader commits that entry only once
            // everything is delivered.
            StopReason::Clean | StopReason::FinishedUnconfirmed { .. } if self.scenario.stop_when_exhausted => {
                if !self.checker.complete() {
                    let missing = self.checker.missing().unwrap_or_default();
                    let detail = format!("host {} stopped under --once ({reason:?}) before {missing}", node + 1);
                    return self.checker.fail(invariant::CLEAN_SHUTDOWN, detail);
                }
                self.stats.clean_stops += 1;
                let n = &mut self.nodes[node];
                (n.host, n.gen, n.leader, n.frozen_until, n.timer, n.finished) = (None, 0, false, None, None, true);
                self.trace.note(self.now, &format!("h{} finished", node + 1));
                return self.abandon_joins();
            }
            StopReason::Deposed { .. } => self.stats.deposed += 1,
            StopReason::WalWriteFailed { .. } | StopReason::WalReadFailed { .. } => {}
            StopReason::SnapshotInstalled { .. } => {}
            StopReason::NotMember { .. }
                if self.nodes[node].wiped_from.is_some() && self.nodes.iter().any(|n| n.finished) =>
            {
                // `--once`: the run finished; nothing is left to join, and
                // the operator leaves the lost host out.
                self.kill(node);
                self.nodes[node].finished = true;
                self.nodes[node].left_out = true;
                self.trace.note(self.now, &format!("h{} stays out: the run finished", node + 1));
                return;
            }
            StopReason::NotMember { .. } if self.nodes[node].wiped_from.is_some() => {
                // An empty DATA_DIR refused, as it must be: the operator runs
                // `cluster join`.
                let old = self.nodes[node].wiped_from.expect("checked");
                self.kill(node);
                return self.join(node, old);
            }
            other => {
                let detail = format!("host {} stopped: {other:?}", node + 1);
                return self.checker.fail(invariant::UNEXPECTED_STOP, detail);
            }
        }
        self.kill(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, Event::Restart { node });
    }

    fn send(&mut self, m: Box<PeerMessage>) {
        if m.get_msg_type() == PeerMessageType::MsgAppend {
            self.model.on_append_sent(m.from, m.term);
        }
        let c = &self.scenario.cluster;
        let (loss, dup, net) = (c.net_loss, c.net_duplicate, c.net);
        if self.fault(Die::Network, loss) {
            self.stats.messages_lost += 1;
            return;
        }
        if self.fault(Die::Network, dup) {
            self.stats.messages_duplicated += 1;
            self.after(Die::Network, net, Event::Deliver(m.clone()));
        }
        self.after(Die::Network, net, Event::Deliver(m));
    }

    // ---- requests ----

    fn submit(&mut self, node: usize, id: IoId, op: IoOp) {
        let gen = self.nodes[node].gen;
        let lat = self.scenario.latencies.clone();
        match op {
            IoOp::Wal(op) => {
                let latency = if matches!(op, WalOp::Replicate(_)) { lat.disk_write } else { lat.disk_other };
                self.after(Die::DiskLatency, latency, Event::Complete { node, gen, id, op: IoOp::Wal(op) });
            }
            op @ IoOp::Offsets(_) => {
                self.after(Die::OffsetsLatency, lat.offsets, Event::Complete { node, gen, id, op })
            }
            IoOp::Plugin(PluginOp::SinkApply(apply)) => {
                self.model.on_dispatch(node, &apply.records);
                self.after(Die::SinkLatency, lat.sink, Event::SinkEffect { node, gen, id, apply });
            }
            IoOp::Plugin(PluginOp::SourceAck { source, acks }) => {
                self.model.on_ack(node, source, &acks);
                let op = IoOp::Plugin(PluginOp::SourceAck { source, acks });
                self.after(Die::PluginLatency, lat.source, Event::Complete { node, gen, id, op });
            }
            op @ IoOp::Plugin(_) => self.after(Die::PluginLatency, lat.source, Event::Complete { node, gen, id, op }),
            IoOp::Lease(_) => unreachable!("clustered engines take no lease"),
        }
    }

    fn complete(&mut self, node: usize, op: IoOp) -> Result<IoReply, IoError> {
        match op {
            IoOp::Wal(op) => self.complete_wal(node, op),
            IoOp::Offsets(OffsetsOp::Read) => Ok(IoReply::Offsets(self.nodes[self.store(node)].offsets.read())),
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                for e in &entries {
                    self.model.on_offsets(node, e.key, e.value.position);
                }
                let store = self.store(node);
                for (key, old, new) in self.nodes[store].offsets.write(&entries) {
                    self.checker.on_offsets_changed(key, old, new);
                }
                Ok(IoReply::Done)
            }
            IoOp::Plugin(op) => self.complete_plugin(node, op),
            IoOp::Lease(_) => unreachable!("clustered engines take no lease"),
        }
    }

    /// The host dies after some of a truncation's steps, each durable: its
    /// disk holds a prefix of the old log (newest segments removed first,
    /// newest groups zeroed first), which the next start must take as it is.
    fn crash_in_truncation(&mut self, node: usize, r: &Replicate, steps: usize) -> Result<IoReply, IoError> {
        let done = self.dice.roll(Die::Truncation).range(0, steps as u64 - 1) as usize;
        self.nodes[node].wal.truncate_partly(r, done);
        self.stats.truncations_interrupted += 1;
        self.trace.note(self.now, &format!("h{} dies after {done} of {steps} truncation steps", node + 1));
        self.stats.crashes += 1;
        self.kill(node);
        self.rescan(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, Event::Restart { node });
        Err(IoError::Failed)
    }

    /// A snapshot's install: the segments the manifest names are copied
    /// from the durable disk of the host that sent it (if it still runs,
    /// is not frozen, and still has them as the manifest says), checked,
    /// and swapped in; the sender hears how its transfer ended.
    fn install(&mut self, node: usize, i: Install) -> Result<IoReply, IoError> {
        let sender = self.slot_of.get(&i.from).copied().filter(|&s| {
            let n = &self.nodes[s];
            n.host.is_some() && n.frozen_until.is_none_or(|w| w <= self.now)
        });
        let copied = sender.and_then(|s| {
            let on_disk = self.nodes[s].wal.segments_durable();
            i.manifest.copy_from(|id| on_disk.iter().find(|s| s.0 == id).map(|s| s.1.as_slice()))
        });
        let checked = copied.filter(|c| {
            let refs: Vec<(SegmentId, &[u8])> = c.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            check_install(&i.manifest, &refs).is_ok()
        });
        if let Some(s) = sender {
            let (gen, to, ok) = (self.nodes[s].gen, self.nodes[node].id, checked.is_some());
            self.at(self.now, Event::Served { node: s, gen, to, ok });
        }
        let Some(segments) = checked else {
            self.stats.snapshot_failures += 1;
            return Err(IoError::Failed);
        };
        let fails = self.fault(Die::FsyncFail, self.scenario.faults.fsync_fail);
        if !self.nodes[node].wal.install(&segments, &i.hard_state, fails) {
            return Err(IoError::Failed);
        }
        self.stats.snapshots += 1;
        self.trace.note(self.now, &format!("h{} installed a snapshot at {}", node + 1, i.manifest.index));
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        match scan(&refs, false) {
            Ok(scanned) => self.model.installed(node, &scanned),
            Err(c) => self.checker.fail(invariant::CORE_ASSERTION, format!("host {} install: {c:?}", node + 1)),
        }
        let commit = saved_commit(&self.nodes[node].wal);
        self.model.on_commit_saved(node, commit);
        Ok(IoReply::Done)
    }

    /// The offsets store host `node` writes: its own, or (shared, as
    /// DynamoDB is) the one kept with the first host.
    fn store(&self, node: usize) -> usize {
        if self.scenario.cluster.shared_offsets {
            0
        } else {
            node
        }
    }

    fn complete_wal(&mut self, node: usize, op: WalOp) -> Result<IoReply, IoError> {
        let op = match op {
            WalOp::InstallSnapshot(i) => return self.install(node, i),
            WalOp::Delete { segment } => {
                self.stats.segments_deleted += 1;
                WalOp::Delete { segment }
            }
            op => op,
        };
        if let WalOp::Replicate(r) = &op {
            let steps = r.remove.len() + r.zero.len();
            if steps > 0 && self.fault(Die::Truncation, TRUNCATION_CRASH) {
                return self.crash_in_truncation(node, r, steps);
            }
        }
        let f = &self.scenario.faults;
        let (fsync_fail, read_fail) = (f.fsync_fail, f.read_fail);
        let fails = match &op {
            WalOp::Sync | WalOp::Replicate(_) => self.fault(Die::FsyncFail, fsync_fail),
            WalOp::ReadGroups { .. } => {
                self.stats.read_backs += 1;
                let failed = self.fault(Die::ReadFail, read_fail);
                self.stats.read_fails += failed as u64;
                failed
            }
            _ => false,
        };
        let written = match &op {
            WalOp::Replicate(r) if !fails => Some((r.groups.clone(), r.hard_state.is_some())),
            _ => None,
        };
        let result = self.nodes[node].wal.perform(0, op, fails);
        if let (Some((groups, hard_state)), Ok(_)) = (written, &result) {
            let truncated = self.model.durable_groups(node, &groups);
            if hard_state {
                let commit = saved_commit(&self.nodes[node].wal);
                self.model.on_commit_saved(node, commit);
            }
            if truncated {
                self.stats.truncations += 1;
                let segments = self.nodes[node].wal.segments_durable();
                let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(s, b)| (*s, b.as_slice())).collect();
                self.model.check_truncated(node, &refs, scan(&refs, false).map_err(|c| format!("{c:?}")));
            }
        }
        result
    }

    fn complete_plugin(&mut self, node: usize, op: PluginOp) -> Result<IoReply, IoError> {
        let mut faults = Faults { dice: &mut self.dice, on: self.faulting };
        if plugin_effects::fails(&mut faults, &self.scenario, &mut self.stats, &op) {
            return Err(IoError::Failed);
        }
        // Only the newest leader's resume is judged: a deposed one that has
        // not noticed yet resumes stale, and harmlessly.
        if let PluginOp::SourceOpen { source, resume, .. } = &op {
            let newest = self.nodes.iter().map(|n| n.term).max().unwrap_or(0);
            if self.nodes[node].leader && self.nodes[node].term == newest {
                let offsets = &self.nodes[self.store(node)].offsets;
                self.checker.on_resume(*source, resume, |key| offsets.position(key));
            }
        }
        let sources = &mut self.nodes[node].sources;
        plugin_effects::perform(op, sources, &self.sinks, &mut self.checker, &mut self.stats, self.now)
    }

    /// A sink applies a batch (whether or not its sender still runs: the
    /// request has left it); the reply reaches the sender if it does.
    fn sink_effect(&mut self, node: usize, gen: u64, id: IoId, apply: SinkApply) {
        let mut faults = Faults { dice: &mut self.dice, on: self.faulting };
        let (delay, result) = plugin_effects::sink_effect(
            &mut faults,
            &self.scenario,
            &mut self.stats,
            &mut self.sinks,
            &mut self.checker,
            &apply,
        );
        self.at(self.now + Duration::from_micros(delay), Event::Reply { node, gen, id, result });
    }
}

fn cluster_id(seed: u64) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// What `cluster init` (node ids 1..=hosts) or `cluster join` (a later id)
/// writes: the cluster's id, the node's, the segment size, and the
/// cluster's first voters as the configuration to start from.
fn identity(seed: u64, node: u64, scenario: &Scenario, hosts: usize) -> Vec<u8> {
    let members =
        Members { cluster: cluster_id(seed), node, segment_bytes: scenario.limits.segment_bytes, ..Members::default() };
    let voters: Vec<u64> = (1..=hosts as u64).collect();
    first_file(&members, &voters).expect("a small configuration fits")
}

/// The commit index a host's hard-state file holds durably.
fn saved_commit(wal: &SimWal) -> u64 {
    let file = wal.hard_state().expect("clustered hosts have disks");
    decode_file(file).ok().flatten().map_or(0, |s| s.hard.commit)
}
