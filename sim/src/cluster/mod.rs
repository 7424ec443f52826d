//! The raft topology (clustered mode): several hosts, each an engine in a
//! process slot of its own with its own simulated disk, offsets store and
//! connections to the sources, one set of shared sinks, and a network
//! between the hosts that delays, reorders, loses and duplicates raft
//! messages and is partitioned now and then. Hosts are killed, lose power,
//! or freeze and wake next to a successor; their tick rates differ a
//! little. After the fault phase everything heals and the run must deliver
//! every record to every sink exactly once.
//!
//! Two checkers judge it: the exactly-once checker of every topology (fed
//! only by sources, sinks and offsets stores), and `model`, which knows
//! what each disk holds durably and so what a majority holds, and asserts
//! that no ack, offsets write or dispatch acts on anything less, that no
//! term has two leaders, and that the hosts' committed prefixes agree.
//!
//! The parts: this module (the topology's events and state, the outputs its
//! engines give), `hosts` (starts, crashes, freezes, wipes, joins, how each
//! stop is judged), `network` (messages and partitions), `requests` (what
//! each request does at a host's disk, its offsets store and the plugins:
//! truncations and snapshot installs included) and `model`.

mod hosts;
mod model;
mod network;
mod requests;

use crate::checker::{invariant, Violation};
use crate::device::SimWal;
use crate::plugins::{SimOffsets, SimSource};
use crate::rng::Die;
use crate::scenario::Scenario;
use crate::world::{Proc, RunOptions, Topology, World};
use model::Model;
use skippr_core::cluster::{decode_file, first_file, Members};
use skippr_core::*;
use std::collections::{BTreeMap, BTreeSet};

pub(crate) enum Event {
    Deliver(Box<PeerMessage>),
    /// Node `by`'s word that node `to` was removed (`Output::TellRemoved`).
    TellRemoved {
        by: u64,
        to: u64,
    },
    Crash {
        power: bool,
    },
    Partition,
    Heal,
    /// One host's data is lost for good.
    Wipe,
    /// A bit flips on one host's disk.
    Rot,
    /// The operator asks the leader again to let the joining host in.
    AskJoin {
        node: usize,
    },
}

/// What the topology knows of a host beyond its process slot.
struct Member {
    /// Its raft node id: its slot number, until it joins again under a new one.
    id: u64,
    /// After a wipe: the id it had, until it has joined under a new one.
    wiped_from: Option<u64>,
    /// Joined under a new id in place of this one, not yet promoted.
    joining: Option<u64>,
    starts: u64,
    /// The term and role it last reported.
    term: u64,
    leader: bool,
    /// Under `--once`: it stopped by itself, having applied the terminal
    /// entry (until it is started again).
    finished: bool,
    /// Under `--once`: it has finished at least once, so whenever it starts
    /// again it stops at once, answering no peer.
    ended: bool,
    /// Its disk was lost after the run finished: it is not brought back.
    left_out: bool,
    /// A bit flipped on its disk since it was last replaced.
    rotten: bool,
    /// Sent a SIGTERM, not stopped yet.
    terminating: bool,
}

pub(crate) struct Raft {
    members: Vec<Member>,
    model: Model,
    /// Links (from, to) between slots (1-based) that drop everything.
    blocked: BTreeSet<(u64, u64)>,
    /// Raft node id → the slot running it.
    slot_of: BTreeMap<u64, usize>,
    next_id: u64,
}

pub(crate) fn world(seed: u64, opts: RunOptions) -> World<Raft> {
    let mut scenario = Scenario::from_seed(seed).with_wal(opts.wal).with_overrides(&opts.overrides);
    if opts.hosts > 0 && opts.hosts != scenario.cluster.hosts {
        scenario.draw_cluster(opts.hosts);
    }
    let hosts = scenario.cluster.hosts;
    let switch = Instant::from_micros(scenario.fault_phase_end.as_micros() / 2);
    let procs = (0..hosts)
        .map(|_| {
            let sources = scenario
                .sources
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    SimSource::new(seed, i as u16, spec.clone(), scenario.streams, switch)
                        .with_broken(scenario.letters.broken_permille())
                })
                .collect();
            Proc::new(sources)
        })
        .collect();
    let wals = (0..hosts)
        .map(|h| {
            let mut wal = SimWal::disk(seed ^ (h as u64 + 1) << 48);
            // `cluster init` on every host: the cluster's id and the host's.
            wal.init_hard_state(identity(seed, h as u64 + 1, &scenario, hosts));
            wal
        })
        .collect();
    let stores = (0..hosts).map(|_| SimOffsets::new(false)).collect();
    let members = (0..hosts)
        .map(|h| Member {
            id: h as u64 + 1,
            wiped_from: None,
            joining: None,
            starts: 0,
            term: 0,
            leader: false,
            finished: false,
            ended: false,
            left_out: false,
            rotten: false,
            terminating: false,
        })
        .collect();
    let raft = Raft {
        members,
        model: Model::new(hosts),
        blocked: BTreeSet::new(),
        slot_of: (0..hosts).map(|h| (h as u64 + 1, h)).collect(),
        next_id: hosts as u64 + 1,
    };
    World::new(scenario, opts, procs, wals, stores, raft)
}

impl Topology for Raft {
    type Event = Event;
    /// Shorter than the single writer's, since every simulated second of a
    /// cluster costs thousands of ticks and heartbeats (passing runs take
    /// well under one second in all).
    const QUIET_BUDGET: Duration = Duration::from_secs(20);
    const STEPS_MAX: u64 = 1_000_000;

    fn plan(w: &mut World<Raft>) {
        w.plan_faults()
    }

    /// Under `--once`, a host that learnt of the terminal entry but not
    /// that every member did, left alone, stops after the drain timeout.
    fn quiet_deadline(w: &World<Raft>) -> Instant {
        let s = &w.scenario;
        let once = if s.stop_when_exhausted { s.limits.drain_timeout } else { Duration::ZERO };
        s.fault_phase_end + Self::QUIET_BUDGET + once
    }

    fn addressee(w: &World<Raft>, event: &Event) -> Option<usize> {
        match event {
            Event::Deliver(m) => w.topo.slot_of.get(&m.to).copied(),
            Event::TellRemoved { to, .. } => w.topo.slot_of.get(to).copied(),
            _ => None,
        }
    }

    fn fire(w: &mut World<Raft>, event: Event) {
        match event {
            Event::Deliver(m) => w.deliver(m),
            Event::TellRemoved { by, to } => w.deliver_removed(by, to),
            Event::Wipe => w.wipe(),
            Event::Rot => {
                let node = w.faults_rng.range(0, w.procs.len() as u64 - 1) as usize;
                w.rot(node)
            }
            Event::AskJoin { node } => w.ask_join(node),
            Event::Crash { power } => w.crash(power),
            Event::Partition => w.partition(),
            Event::Heal => w.topo.blocked.clear(),
        }
    }

    fn start(w: &mut World<Raft>, node: usize) {
        w.start(node)
    }

    /// Everything heals: the network, frozen hosts, and every host is up.
    fn end_fault_phase(w: &mut World<Raft>) {
        w.faulting = false;
        w.topo.blocked.clear();
        for node in 0..w.procs.len() {
            w.procs[node].frozen_until = None;
            if w.procs[node].host.is_none() {
                w.start(node);
            }
        }
    }

    fn complete(w: &mut World<Raft>, node: usize, _: u64, _: IoId, op: IoOp) -> Option<Result<IoReply, IoError>> {
        Some(w.complete(node, op))
    }

    /// A dead host's offsets write may still land (half of the time); its
    /// disk requests died with it.
    fn in_flight(w: &mut World<Raft>, node: usize, _: u64, op: IoOp) {
        if let IoOp::Offsets(OffsetsOp::Write { entries }) = op {
            if w.dice.roll(Die::InFlight).chance(0.5) {
                w.write_offsets(node, &entries);
            }
        }
    }

    fn note_feed(w: &mut World<Raft>, slot: usize) {
        let now = w.now();
        w.trace.host(now, slot);
    }

    fn submit(w: &mut World<Raft>, slot: usize, id: IoId, op: IoOp) {
        w.submit(slot, id, op)
    }

    fn on_output(w: &mut World<Raft>, node: usize, output: Output) -> bool {
        match output {
            Output::Send(m) => w.send(m),
            Output::TellRemoved { to } => w.tell_removed(node, to),
            Output::Role { term, is_leader, .. } => {
                let m = &mut w.topo.members[node];
                m.term = term;
                m.leader = is_leader;
                w.stats.elections += is_leader as u64;
            }
            Output::JoinRefused { .. } => w.stats.joins_refused += 1,
            Output::LogRestored(r) => match r.stop_record {
                StopRecordUse::Absent => {}
                StopRecordUse::Used => w.stats.stop_records_used += 1,
                StopRecordUse::Stale(_) => w.stats.stop_records_stale += 1,
            },
            Output::Stopped(reason) => {
                w.on_stopped(node, reason);
                return false;
            }
            _ => unreachable!("clustered engines take no lease"),
        }
        true
    }

    fn after_step(w: &mut World<Raft>) {
        if !w.faulting && w.checker.complete() && w.all_finished() {
            w.done = true;
        }
    }

    fn stalled(w: &mut World<Raft>, why: &str) {
        if w.checker.complete() && !w.all_finished() {
            let running: Vec<usize> =
                (0..w.procs.len()).filter(|&i| !w.topo.members[i].finished).map(|i| i + 1).collect();
            let detail = format!("{why}: every record is delivered, but hosts {running:?} did not stop under --once");
            return w.checker.fail(invariant::STALLED, detail);
        }
        if w.checker.complete() {
            w.done = true;
            return;
        }
        let missing = w.checker.missing().unwrap_or_else(|| "all records delivered".into());
        let detail = format!("{why}: {missing} (delivered {})", w.checker.delivered());
        w.checker.fail(invariant::STALLED, detail);
    }

    fn violation(w: &World<Raft>) -> Option<&Violation> {
        w.topo.model.violation.as_ref()
    }

    /// The hosts' committed prefixes agree; under `--once`, where every
    /// host stopped by itself having applied everything, each host's
    /// offsets store holds every record (as a single writer's does after
    /// its clean stop).
    fn judge_end(w: &mut World<Raft>) {
        let commits: Vec<u64> = w.wals.iter().map(saved_commit).collect();
        w.topo.model.check_prefixes(&commits);
        if w.scenario.stop_when_exhausted && w.all_finished() {
            let stores: BTreeSet<usize> =
                (0..w.procs.len()).filter(|&n| !w.topo.members[n].left_out).map(|n| w.store(n)).collect();
            for store in stores {
                let store = &w.stores[store];
                w.checker.check_materialized(|key| store.position(key));
            }
        }
    }

    fn wrap_up(w: &mut World<Raft>) {
        w.stats.terms = w.topo.model.terms() as u64;
    }
}

impl World<Raft> {
    /// Under `--once`, every host must stop by itself in the end.
    /// Under `--once`: whether the hosts that may still answer a peer
    /// (never finished, disk not lost) are a majority of them all.
    fn majority_running(&self) -> bool {
        let running = self.topo.members.iter().filter(|m| !m.ended && !m.left_out).count();
        2 * running > self.topo.members.len()
    }

    fn all_finished(&self) -> bool {
        !self.scenario.stop_when_exhausted || self.topo.members.iter().all(|m| m.finished)
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
