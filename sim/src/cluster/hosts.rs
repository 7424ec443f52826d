//! The hosts' lives: the fault phase's plan, starts, crashes (kills,
//! power cuts, freezes), stops on SIGTERM, a disk lost for good and the
//! host's join under a new id, and how each way a host stops is judged.

use super::{identity, Event, Raft};
use crate::checker::invariant;
use crate::plugins::SimOffsets;
use crate::rng::Die;
use crate::world::{self, World};
use skippr_core::cluster::decode_file;
use skippr_core::format::scan;
use skippr_core::*;

/// The share of crashes that are a SIGTERM instead.
const SIGTERM: f64 = 0.25;

impl World<Raft> {
    /// Crashes (kills, power cuts, freezes), partitions, the end of the
    /// fault phase, and every host's first start.
    pub(super) fn plan_faults(&mut self) {
        let end = self.scenario.fault_phase_end.as_micros();
        for i in 0..self.scenario.faults.crashes * 2 {
            let at = Instant::from_micros(self.faults_rng.range(0, end));
            if i < self.scenario.crashes_kept * 2 {
                let power = self.faults_rng.chance(0.5);
                self.at(at, world::Event::Topo(Event::Crash { power }));
            }
        }
        for _ in 0..self.scenario.cluster.partitions {
            let at = Instant::from_micros(self.faults_rng.range(0, end));
            self.at(at, world::Event::Topo(Event::Partition));
        }
        if self.scenario.cluster.wipe {
            let at = Instant::from_micros(self.faults_rng.range(end / 10, end * 6 / 10));
            self.at(at, world::Event::Topo(Event::Wipe));
        } else if self.scenario.faults.rot {
            // One host's disk at a time: a wiped host and a rotten one
            // together could be two of three copies.
            let at = Instant::from_micros(self.faults_rng.range(end / 2, end));
            self.at(at, world::Event::Topo(Event::Rot));
        }
        self.at(Instant::from_micros(end), world::Event::EndFaultPhase);
        for node in 0..self.procs.len() {
            self.at(Instant::ZERO, world::Event::Start { slot: node });
        }
    }

    pub(super) fn start(&mut self, node: usize) {
        if self.procs[node].host.is_some() || self.topo.members[node].left_out {
            return;
        }
        if self.topo.members[node].starts > 0 && self.topo.members[node].wiped_from.is_none() {
            let id = self.topo.members[node].id;
            let alone = self.scenario.cluster_host_config(self.opts.mutations, node + 1, id, u64::MAX);
            self.check_recovery_idempotent(alone.clone(), node, self.store(node));
            // A rotten disk: a scan finds the flipped bit at once, a start
            // from a stop record when it reads the group back (for a sink
            // or a lagging follower), as a single writer's does.
            if !self.topo.members[node].rotten {
                self.check_stop_record(alone, node, self.store(node));
            }
        }
        self.stats.restarts += 1;
        let m = &mut self.topo.members[node];
        m.starts += 1;
        m.leader = false;
        m.finished = false;
        m.terminating = false;
        let cfg = self.scenario.cluster_host_config(self.opts.mutations, node + 1, m.id, m.starts);
        let host = Host::new(cfg, self.now()).expect("the scenario's configuration is valid");
        self.trace.note(self.now(), &format!("h{} starts", node + 1));
        self.begin(node, host);
    }

    /// A crash hits a host drawn at random (a leader more often): it is
    /// killed, loses power, freezes and wakes later, or is sent a SIGTERM
    /// (it stops by itself, leaving a stop record, and starts again).
    pub(super) fn crash(&mut self, power: bool) {
        let alive: Vec<usize> = (0..self.procs.len()).filter(|&i| self.procs[i].host.is_some()).collect();
        let leaders: Vec<usize> = alive.iter().copied().filter(|&i| self.topo.members[i].leader).collect();
        let r = self.dice.roll(Die::ClusterFault);
        let pick = if !leaders.is_empty() && r.chance(0.6) { &leaders } else { &alive };
        let Some(&node) = pick.get(r.range(0, pick.len().max(1) as u64 - 1) as usize) else { return };
        if self.fault(Die::ClusterFault, self.scenario.cluster.freeze) {
            let span = 20 * self.scenario.cluster.ticks[node].as_micros();
            let wake = self.now() + Duration::from_micros(self.dice.roll(Die::ClusterFault).range(span / 2, span * 2));
            self.stats.freezes += 1;
            self.trace.note(self.now(), &format!("h{} freezes", node + 1));
            self.procs[node].frozen_until = Some(wake);
            return;
        }
        if self.dice.roll(Die::ClusterFault).chance(SIGTERM) && !self.topo.members[node].terminating {
            self.stats.sigterms += 1;
            self.topo.members[node].terminating = true;
            self.trace.note(self.now(), &format!("h{} sent a SIGTERM", node + 1));
            return self.feed(node, Input::Shutdown);
        }
        self.stats.crashes += 1;
        self.kill(node);
        if power {
            self.stats.power_cuts += 1;
            let lost = self.scenario.faults.lost_dir_entry;
            self.wals[node].power_cut(lost);
        }
        self.rescan(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, world::Event::Start { slot: node });
    }

    /// A host's disk is lost for good (the checker still counts what it
    /// held toward the majorities it was part of). It restarts on the empty
    /// disk and must refuse to take part until it has joined again.
    pub(super) fn wipe(&mut self) {
        let alive: Vec<usize> =
            (0..self.procs.len()).filter(|&i| self.procs[i].host.is_some() && !self.topo.members[i].leader).collect();
        let r = self.dice.roll(Die::ClusterFault);
        let longest = self.topo.model.longest().filter(|h| alive.contains(h));
        let node = match longest {
            Some(h) if r.chance(0.5) => h,
            _ => match alive.get(r.range(0, alive.len().max(1) as u64 - 1) as usize) {
                Some(&h) => h,
                None => return,
            },
        };
        self.stats.wipes += 1;
        self.lose_disk(node);
        // Sometimes the leader goes down too, for a few election timeouts:
        // the lost disk was one of the majority that holds the newest
        // commits, and the hosts left must not elect a log without them.
        let leader = (0..self.procs.len()).find(|&i| self.topo.members[i].leader && self.procs[i].host.is_some());
        if let Some(leader) = leader.filter(|_| self.dice.roll(Die::ClusterFault).chance(0.5)) {
            self.stats.crashes += 1;
            self.kill(leader);
            let span = 30 * self.scenario.cluster.ticks[leader].as_micros();
            self.after(Die::Restart, (span, span * 2), world::Event::Start { slot: leader });
        }
    }

    /// Host `node`'s data is gone (a disk lost, or replaced after it
    /// rotted): it restarts on an empty disk, and must refuse to take part
    /// until it has joined again.
    fn lose_disk(&mut self, node: usize) {
        self.kill(node);
        self.trace.note(self.now(), &format!("h{} wiped", node + 1));
        self.wals[node].wipe();
        if !self.scenario.cluster.shared_offsets {
            self.stores[node] = SimOffsets::new(false);
        }
        let m = &mut self.topo.members[node];
        (m.wiped_from, m.rotten) = (Some(m.id), false);
        self.topo.model.wipe(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, world::Event::Start { slot: node });
    }

    /// Flips a bit in one host's segment that a later durable group
    /// follows. The host finds it when it next reads the segment (at its
    /// next start, or reading groups back), stops naming it, and the
    /// operator replaces the disk: the host joins again under a new id.
    pub(super) fn rot(&mut self, node: usize) {
        let rng = &mut self.faults_rng;
        if self.wals[node].disk_mut().is_some_and(|d| d.rot(|hi| rng.range(0, hi))) {
            self.topo.members[node].rotten = true;
            self.trace.note(self.now(), &format!("h{} rot", node + 1));
        }
    }

    /// The operator brings a wiped host back: `cluster join` writes its new
    /// identity (a new id, the cluster's first voters as its starting
    /// configuration), it starts as a learner, and the leader is asked to
    /// let it in.
    pub(super) fn join(&mut self, node: usize, old: u64) {
        let id = self.topo.next_id;
        self.topo.next_id += 1;
        let file = identity(self.scenario.seed, id, &self.scenario, self.procs.len());
        self.wals[node].init_hard_state(file);
        let m = &mut self.topo.members[node];
        self.topo.slot_of.remove(&m.id);
        m.id = id;
        m.wiped_from = None;
        m.joining = Some(old);
        self.topo.slot_of.insert(id, node);
        self.stats.joins += 1;
        self.trace.note(self.now(), &format!("h{} joins as node {id} in place of {old}", node + 1));
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, world::Event::Start { slot: node });
        self.after_topo(Die::ClusterFault, restart, Event::AskJoin { node });
    }

    /// Asks the host that leads (as far as the operator can tell) to let
    /// the joining host in, until the joining host's own saved
    /// configuration has it as a voter.
    pub(super) fn ask_join(&mut self, node: usize) {
        let Some(old) = self.topo.members[node].joining else { return };
        let id = self.topo.members[node].id;
        let promoted = self.wals[node]
            .hard_state()
            .and_then(|f| decode_file(f).ok().flatten())
            .is_some_and(|s| s.conf.voters.contains(&id) && s.conf.voters_outgoing.is_empty());
        if promoted {
            self.topo.members[node].joining = None;
            self.stats.promotions += 1;
            self.trace.note(self.now(), &format!("node {id} is a voter"));
            return;
        }
        if let Some(leader) =
            (0..self.procs.len()).find(|&i| self.topo.members[i].leader && self.procs[i].host.is_some())
        {
            self.feed(leader, Input::Join { node: id, replaces: old });
        }
        let span = 10 * self.scenario.cluster.ticks[0].as_micros();
        self.after_topo(Die::ClusterFault, (span / 2, span), Event::AskJoin { node });
    }

    /// `--once`: the run finished, so a join the leader never let in (the
    /// host is not in its own saved configuration) is given up: the host
    /// has nothing to catch up with, and nobody is left to let it in.
    pub(super) fn abandon_joins(&mut self) {
        for node in 0..self.procs.len() {
            let n = &self.topo.members[node];
            let admitted = self.wals[node]
                .hard_state()
                .and_then(|f| decode_file(f).ok().flatten())
                .is_some_and(|s| s.conf.voters.contains(&n.id) || s.conf.learners.contains(&n.id));
            if n.joining.is_none() || admitted {
                continue;
            }
            self.kill(node);
            let m = &mut self.topo.members[node];
            (m.finished, m.left_out, m.joining) = (true, true, None);
            self.trace.note(self.now(), &format!("h{} stays out: the run finished before it was let in", node + 1));
        }
    }

    pub(super) fn kill(&mut self, node: usize) {
        self.retire(node);
        self.procs[node].frozen_until = None;
        self.topo.members[node].leader = false;
        self.trace.note(self.now(), &format!("h{} killed", node + 1));
    }

    /// What the host's disk holds durably now, for the model.
    pub(super) fn rescan(&mut self, node: usize) {
        let segments = self.wals[node].segments_durable();
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        match scan(&refs, false) {
            Ok(scanned) => self.topo.model.rescanned(node, &scanned),
            // The host's own start will find the flipped bit.
            Err(_) if self.topo.members[node].rotten => {}
            Err(c) => self.checker.fail(invariant::CORE_ASSERTION, format!("host {} disk: {c:?}", node + 1)),
        }
    }

    /// A stop is judged: losing leadership, a failed write or read is an
    /// engine doing its job (it restarts); anything else is a failure.
    pub(super) fn on_stopped(&mut self, node: usize, reason: StopReason) {
        if self.topo.members[node].terminating && matches!(reason, StopReason::Clean | StopReason::DrainTimedOut) {
            // Stopped on the SIGTERM, as asked: the operator starts it again.
            self.stats.sigterm_stops += 1;
            self.retire(node);
            self.procs[node].frozen_until = None;
            self.topo.members[node].leader = false;
            self.trace.note(self.now(), &format!("h{} stopped on its SIGTERM", node + 1));
            let restart = self.scenario.latencies.restart;
            return self.after(Die::Restart, restart, world::Event::Start { slot: node });
        }
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
                self.retire(node);
                self.procs[node].frozen_until = None;
                let m = &mut self.topo.members[node];
                (m.leader, m.finished, m.ended) = (false, true, true);
                self.trace.note(self.now(), &format!("h{} finished", node + 1));
                return self.abandon_joins();
            }
            StopReason::Deposed { .. } => self.stats.deposed += 1,
            StopReason::WalWriteFailed { .. } | StopReason::WalReadFailed { .. } => {}
            StopReason::SnapshotInstalled { .. } => {}
            // Its disk rotted, and it stopped naming what it found: the
            // operator replaces the disk.
            StopReason::Corrupt(_) | StopReason::ClusterLog { .. } if self.topo.members[node].rotten => {
                self.stats.disks_replaced += 1;
                return self.lose_disk(node);
            }
            // `--once`: a majority finished the run and stopped, so no
            // peer will answer this host again; it gives up after the stall
            // limit (exit 15), and the operator leaves it out. With a
            // majority of hosts still up that never finished, no leader
            // for that long is a liveness failure (a restart would only
            // hide it).
            StopReason::Stalled { .. } if self.scenario.stop_when_exhausted && !self.majority_running() => {
                self.stats.stalled_out += 1;
                self.kill(node);
                (self.topo.members[node].finished, self.topo.members[node].left_out) = (true, true);
                self.trace.note(self.now(), &format!("h{} stays out: no majority is left to answer it", node + 1));
                return;
            }
            StopReason::NotMember { .. }
                if self.topo.members[node].wiped_from.is_some() && self.topo.members.iter().any(|m| m.finished) =>
            {
                // `--once`: the run finished; nothing is left to join, and
                // the operator leaves the lost host out.
                self.kill(node);
                self.topo.members[node].finished = true;
                self.topo.members[node].left_out = true;
                self.trace.note(self.now(), &format!("h{} stays out: the run finished", node + 1));
                return;
            }
            StopReason::NotMember { .. } if self.topo.members[node].wiped_from.is_some() => {
                // An empty DATA_DIR refused, as it must be: the operator runs
                // `cluster join`.
                let old = self.topo.members[node].wiped_from.expect("checked");
                self.kill(node);
                return self.join(node, old);
            }
            StopReason::Stalled { what, for_ } => {
                let detail = format!(
                    "host {} knew no leader with a majority for {} s ({what}) while a majority of the hosts that \
                     never finished ran",
                    node + 1,
                    for_.as_micros() / 1_000_000
                );
                return self.checker.fail(invariant::STALLED, detail);
            }
            other => {
                let detail = format!("host {} stopped: {other:?}", node + 1);
                return self.checker.fail(invariant::UNEXPECTED_STOP, detail);
            }
        }
        self.kill(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, world::Event::Start { slot: node });
    }
}
