//! What each request of a host does: issued (latency drawn), then
//! performed at its completion against the host's disk (a truncation it
//! may die in the middle of, a snapshot's install from another host's
//! disk), its offsets store, or a plugin.

use super::{saved_commit, Raft};
use crate::checker::invariant;
use crate::rng::Die;
use crate::world::{self, World};
use skippr_core::cluster::check_install;
use skippr_core::format::scan;
use skippr_core::*;
use skippr_core::{OffsetsOp, PluginOp, WalOp};

/// How often, while faults are on, a host dies in the middle of a truncation.
const TRUNCATION_CRASH: f64 = 0.3;

impl World<Raft> {
    pub(super) fn submit(&mut self, node: usize, id: IoId, op: IoOp) {
        let gen = self.procs[node].gen;
        let lat = self.scenario.latencies.clone();
        match op {
            IoOp::Wal(op) => {
                let latency = if matches!(op, WalOp::Replicate(_)) { lat.disk_write } else { lat.disk_other };
                self.after(
                    Die::DiskLatency,
                    latency,
                    world::Event::Complete { slot: node, gen, id, op: IoOp::Wal(op) },
                );
            }
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                // The host acts on the positions as it sends the write.
                for e in &entries {
                    self.topo.model.on_offsets(node, e.key, e.value.position);
                }
                let op = IoOp::Offsets(OffsetsOp::Write { entries });
                self.after(Die::OffsetsLatency, lat.offsets, world::Event::Complete { slot: node, gen, id, op })
            }
            op @ IoOp::Offsets(_) => {
                self.after(Die::OffsetsLatency, lat.offsets, world::Event::Complete { slot: node, gen, id, op })
            }
            IoOp::Plugin(PluginOp::SinkApply(apply)) => {
                self.topo.model.on_dispatch(node, &apply);
                let (die, sink) = self.sink_latency();
                self.after(die, sink, world::Event::SinkEffect { gen, id, apply, letters: false });
            }
            IoOp::Plugin(PluginOp::DeadLetters(apply)) => {
                self.after(Die::SinkLatency, lat.sink, world::Event::SinkEffect { gen, id, apply, letters: true });
            }
            IoOp::Plugin(PluginOp::SourceAck { source, acks }) => {
                self.topo.model.on_ack(node, source, &acks);
                let op = IoOp::Plugin(PluginOp::SourceAck { source, acks });
                self.after(Die::PluginLatency, lat.source, world::Event::Complete { slot: node, gen, id, op });
            }
            op @ IoOp::Plugin(_) => {
                self.after(Die::PluginLatency, lat.source, world::Event::Complete { slot: node, gen, id, op })
            }
            IoOp::Lease(_) => unreachable!("clustered engines take no lease"),
        }
    }

    pub(super) fn complete(&mut self, node: usize, op: IoOp) -> Result<IoReply, IoError> {
        match op {
            IoOp::Wal(op) => self.complete_wal(node, op),
            IoOp::Offsets(OffsetsOp::Read) => Ok(IoReply::Offsets(self.stores[self.store(node)].read())),
            IoOp::Offsets(OffsetsOp::Write { entries }) => {
                self.write_offsets(node, &entries);
                Ok(IoReply::Done)
            }
            IoOp::Plugin(op) => self.complete_plugin_of(node, op),
            IoOp::Lease(_) => unreachable!("clustered engines take no lease"),
        }
    }

    /// The host dies after some of a truncation's steps, each durable: its
    /// disk holds a prefix of the old log (newest segments removed first,
    /// newest groups zeroed first), which the next start must take as it is.
    pub(super) fn crash_in_truncation(&mut self, node: usize, r: &Replicate, steps: usize) -> Result<IoReply, IoError> {
        let done = self.dice.roll(Die::Truncation).range(0, steps as u64 - 1) as usize;
        self.wals[node].truncate_partly(r, done);
        self.stats.truncations_interrupted += 1;
        self.trace.note(self.now(), &format!("h{} dies after {done} of {steps} truncation steps", node + 1));
        self.stats.crashes += 1;
        self.kill(node);
        self.rescan(node);
        let restart = self.scenario.latencies.restart;
        self.after(Die::Restart, restart, world::Event::Start { slot: node });
        Err(IoError::Failed)
    }

    /// A snapshot's install: the segments the manifest names are copied
    /// from the durable disk of the host that sent it (if it still runs,
    /// is not frozen, and still has them as the manifest says), checked,
    /// and swapped in; the sender hears how its transfer ended.
    pub(super) fn install(&mut self, node: usize, i: Install) -> Result<IoReply, IoError> {
        let sender = self.topo.slot_of.get(&i.from).copied().filter(|&s| {
            let p = &self.procs[s];
            p.host.is_some() && p.frozen_until.is_none_or(|w| w <= self.now())
        });
        let copied = sender.and_then(|s| {
            let on_disk = self.wals[s].segments_durable();
            i.manifest.copy_from(|id| on_disk.iter().find(|s| s.0 == id).map(|s| s.1.as_slice()))
        });
        let checked = copied.filter(|c| {
            let refs: Vec<(SegmentId, &[u8])> = c.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            check_install(&i.manifest, &refs).is_ok()
        });
        if let Some(s) = sender {
            let (gen, to, ok) = (self.procs[s].gen, self.topo.members[node].id, checked.is_some());
            self.at(self.now(), world::Event::Reply { gen, input: Input::SnapshotServed { to, ok } });
        }
        let Some(segments) = checked else {
            self.stats.snapshot_failures += 1;
            return Err(IoError::Failed);
        };
        let fails = self.fault(Die::FsyncFail, self.scenario.faults.fsync_fail);
        if !self.wals[node].install(&segments, &i.hard_state, fails) {
            return Err(IoError::Failed);
        }
        self.stats.snapshots += 1;
        self.trace.note(self.now(), &format!("h{} installed a snapshot at {}", node + 1, i.manifest.index));
        let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        match scan(&refs, false) {
            Ok(scanned) => self.topo.model.installed(node, &scanned),
            Err(c) => self.checker.fail(invariant::CORE_ASSERTION, format!("host {} install: {c:?}", node + 1)),
        }
        let commit = saved_commit(&self.wals[node]);
        self.topo.model.on_commit_saved(node, commit);
        Ok(IoReply::Done)
    }

    /// The offsets store host `node` writes: its own, or (shared, as
    /// DynamoDB is) the one kept with the first host.
    pub(super) fn store(&self, node: usize) -> usize {
        if self.scenario.cluster.shared_offsets {
            0
        } else {
            node
        }
    }

    pub(super) fn complete_wal(&mut self, node: usize, op: WalOp) -> Result<IoReply, IoError> {
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
            WalOp::ReadAt { .. } => {
                // At a tenth of a read-back's rate, as in the other modes.
                self.stats.recovery_reads += 1;
                let failed = self.fault(Die::ReadFail, read_fail / 10.0);
                self.stats.recovery_read_fails += failed as u64;
                failed
            }
            WalOp::WriteStopRecord(_) => {
                let failed = self.fault(Die::FsyncFail, fsync_fail);
                self.stats.stop_records_written += !failed as u64;
                failed
            }
            WalOp::ReadStopRecord => self.fault(Die::ReadFail, read_fail / 10.0),
            _ => false,
        };
        let written = match &op {
            WalOp::Replicate(r) if !fails => Some((r.groups.clone(), r.hard_state.is_some())),
            _ => None,
        };
        let result = self.wals[node].perform(0, op, fails);
        if let (Some((groups, hard_state)), Ok(_)) = (written, &result) {
            let truncated = self.topo.model.durable_groups(node, &groups);
            if hard_state {
                let commit = saved_commit(&self.wals[node]);
                self.topo.model.on_commit_saved(node, commit);
            }
            if truncated {
                self.stats.truncations += 1;
            }
            // A rotten disk no longer scans, whatever the truncation did.
            if truncated && !self.topo.members[node].rotten {
                let segments = self.wals[node].segments_durable();
                let refs: Vec<(SegmentId, &[u8])> = segments.iter().map(|(s, b)| (*s, b.as_slice())).collect();
                self.topo.model.check_truncated(node, &refs, scan(&refs, false).map_err(|c| format!("{c:?}")));
            }
        }
        result
    }

    /// Only the newest leader's resume is judged: a deposed one that has
    /// not noticed yet resumes stale, and harmlessly.
    pub(super) fn complete_plugin_of(&mut self, node: usize, op: PluginOp) -> Result<IoReply, IoError> {
        let newest = self.topo.members.iter().map(|m| m.term).max().unwrap_or(0);
        let member = &self.topo.members[node];
        let judged = (member.leader && member.term == newest).then(|| self.store(node));
        self.complete_plugin(node, op, judged)
    }

    /// Host `node`'s offsets store applies a write; the checker hears of
    /// each change.
    pub(super) fn write_offsets(&mut self, node: usize, entries: &[OffsetEntry]) {
        let store = self.store(node);
        for (key, old, new) in self.stores[store].write(entries) {
            self.checker.on_offsets_changed(key, old, new);
        }
    }
}
