//! The coordinator's clean shutdown: stop reading, drain what was read
//! through the WAL, the sinks and the offsets store, give the writer
//! authority up, stop. Owns no state beyond the host's phase.
//!
//! Clustered `--once` ends in two entries. The leader, drained once its
//! sources are exhausted, commits the terminal entry (`Frame::Finished`);
//! once every other member has reported a commit index through it, it
//! commits `Frame::AllFinished`, and stops once every member has learnt
//! that one committed. A host stops once it has applied `AllFinished`,
//! also at a restart. Until then a host that knows of the terminal entry
//! keeps following (its vote may be what a lagging member needs to learn
//! it); one left without a leader for the drain timeout stops too.

use super::*;
use crate::io::WalOp;
use crate::recovery::stop_record::RaftRecord;
use crate::wal::Frame;

/// The stop record of this run's stop: not written (yet), being written,
/// or written (or not to be written at all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Recorded {
    No,
    Writing,
    Done,
}

impl Host {
    pub(super) fn on_shutdown(&mut self) {
        self.shutdown_requested = true;
        if self.phase == Phase::Recovering && self.authority.waiting() {
            // Still waiting for another writer's lease, or following a
            // raft leader: nothing to drain.
            return self.seal(StopReason::Clean);
        }
        if self.phase == Phase::Running {
            self.phase = Phase::Draining;
            self.drain_deadline = Some(self.fx.now + self.cfg.limits.drain_timeout);
        }
    }

    /// Everything read is committed, compacted, acknowledged by every sink,
    /// recorded as done, and materialized in the offsets store.
    pub(super) fn drained(&self) -> bool {
        let sinks = self.cfg.sinks.len() as u16;
        let compacted = self
            .committed
            .partitions
            .iter()
            .all(|(key, p)| (0..sinks).all(|s| self.committed.acked(SinkId(s), *key) >= p.position));
        self.sources.idle()
            && self.wal.committed_all()
            && self.compaction.idle()
            && self.committed.open.is_empty()
            && compacted
            && self.offsets.idle()
            && self.schemas.idle()
    }

    /// The WAL is consistent, so a stop record can describe it: the run
    /// recovered and drains, no group, creation or deletion is in flight,
    /// the writer authority is still this run's. Never in clustered mode
    /// (each host's raft log is restored from its segments).
    fn may_record_stop(&self) -> bool {
        self.phase == Phase::Draining && self.authority.raft_ref().is_none() && self.wal.idle() && self.may_write()
    }

    /// Writes the stop record before a stop on SIGTERM. True once there
    /// is nothing (more) to write. `wait`: the WAL is not consistent yet,
    /// and may become so (a clean drain's last deletion); otherwise no
    /// record is written and the next start scans.
    pub(super) fn record_stop(&mut self, wait: bool) -> bool {
        match self.recorded {
            Recorded::Done => true,
            Recorded::Writing => false,
            Recorded::No if !self.may_record_stop() => {
                if !wait {
                    self.recorded = Recorded::Done;
                }
                !wait
            }
            Recorded::No => {
                let record = self.wal.describe(self.names.clone(), self.committed.clone(), self.records.held());
                let op = IoOp::Wal(WalOp::WriteStopRecord(record.encode()));
                self.fx.io(Pending::StopRecordWrite, op);
                self.recorded = Recorded::Writing;
                false
            }
        }
    }

    /// The drain ran out of time: stop, after the stop record when the
    /// WAL allows one (a lagging sink need not make the next start scan),
    /// and after giving the writer lease up when nothing is in flight to
    /// the WAL (so that the next start need not wait for it to lapse).
    pub(super) fn close(&mut self, stop: StopReason) {
        self.drain_deadline = None;
        if self.authority.raft_ref().is_some() {
            return self.seal(stop);
        }
        self.closing = Some(stop);
        self.close_when_done();
    }

    /// Closing after a drain that ran out of time: stops once the stop
    /// record is written (or none may be) and the lease is given up, or at
    /// once when a write to the WAL is in flight (the lease then lapses, as
    /// after a crash).
    pub(super) fn close_when_done(&mut self) {
        if self.closing.is_none() || self.authority.raft_ref().is_some() || !self.record_stop(false) {
            return;
        }
        if !self.wal.idle() || self.release_authority() {
            let stop = self.closing.take().expect("closing");
            self.stop(stop);
        }
    }

    /// Clustered mode, stopping on SIGTERM (a follower at once, a leader
    /// once its handover is done or timed out): the raft node is held still
    /// (`holds_still`: no message in, no tick), so that its log stops
    /// changing; once what raft asked to make durable has landed and the
    /// hard state holds the commit index applied, a stop record describes
    /// the WAL, raft's log and the committed state, and the host stops.
    /// Within two election timeouts; otherwise it stops without one (the
    /// next start scans). Any other stop, or one before raft runs, is at
    /// once.
    pub(super) fn seal(&mut self, stop: StopReason) {
        let raft_runs = self.authority.raft_ref().is_some_and(|r| r.running());
        if !self.asked_to_stop || !raft_runs {
            return self.stop(stop);
        }
        if self.closing.is_none() {
            let patience = self.authority.raft_ref().expect("checked").hand_over_patience();
            self.drain_deadline = Some(self.fx.now + patience);
            self.closing = Some(stop);
            self.seal_step();
        }
    }

    /// Clustered mode, stopping: the node is held still.
    pub(super) fn holds_still(&self) -> bool {
        self.closing.is_some() && self.authority.raft_ref().is_some()
    }

    /// Writes the stop record once raft's log is settled.
    pub(super) fn seal_step(&mut self) {
        // A group this host proposed and raft has not committed is raft's
        // (an entry past the commit index, in the log the record keeps);
        // a deletion in flight is the writer's.
        if !self.holds_still() || self.recorded != Recorded::No || !self.wal.idle_but_proposed() {
            return;
        }
        if self.wal.deletes_queued() {
            // A segment queued for deletion has left the writer's
            // summaries while raft's log, held still, still holds it: a
            // record would lose it. The next start scans.
            return self.stop_unrecorded();
        }
        let Some((commit, log)) = self.authority.held_raft().settled(&mut self.fx) else { return };
        let mut record = self.wal.describe(self.names.clone(), self.committed.clone(), self.records.held());
        record.raft = Some(RaftRecord { commit, log });
        self.fx.io(Pending::StopRecordWrite, IoOp::Wal(WalOp::WriteStopRecord(record.encode())));
        self.recorded = Recorded::Writing;
    }

    /// Clustered mode: raft's log did not settle in time, or cannot be
    /// described. The host stops without a stop record, unless one is
    /// being written.
    pub(super) fn stop_unrecorded(&mut self) {
        self.drain_deadline = None;
        if self.recorded != Recorded::Writing {
            self.recorded = Recorded::Done;
            let stop = self.closing.take().expect("stopping");
            self.stop(stop);
        }
    }

    /// The stop record is written (or failed to be: the next start scans).
    pub(super) fn on_stop_recorded(&mut self) {
        self.recorded = Recorded::Done;
        if self.authority.raft_ref().is_none() {
            return self.close_when_done();
        }
        if let Some(stop) = self.closing.take() {
            self.stop(stop);
        }
    }

    /// Gives the writer authority up after a clean drain. True when there
    /// is nothing (more) to give up.
    pub(super) fn release_authority(&mut self) -> bool {
        let wal_idle = self.wal.idle();
        match self.authority.lease() {
            Some(lease) => lease.release(&mut self.fx, wal_idle),
            None => true,
        }
    }
}

impl Host {
    /// Clustered mode, drained for a SIGTERM: a leader hands leadership to
    /// its most caught-up voter (so the others need not wait out an
    /// election timeout) and stops once that host leads, or after two
    /// election timeouts if the handover does not happen. True while it
    /// waits.
    pub(super) fn hands_over(&mut self) -> bool {
        let Some(r) = self.authority.raft() else { return false };
        if self.handing_over {
            if !r.leads() && r.leader_known() {
                self.seal(StopReason::Clean);
            }
            return true;
        }
        let patience = r.hand_over_patience();
        let (to, news) = r.hand_over(&mut self.fx);
        if to.is_some() {
            self.handing_over = true;
            self.drain_deadline = Some(self.fx.now + patience);
        }
        self.on_raft_news(news);
        to.is_some()
    }

    /// This drain ends a clustered `--once` run: the sources are exhausted
    /// (not a SIGTERM), so the leader commits the terminal entry.
    pub(super) fn finishes_cluster(&self) -> bool {
        self.cfg.stop_when_exhausted && self.sources.all_exhausted() && self.authority.raft_ref().is_some()
    }

    pub(super) fn propose_finish(&mut self) {
        if !self.finish_proposed && self.committed.finished.is_none() {
            self.finish_proposed = true;
            self.wal.push(Frame::Finished);
        }
    }

    /// Clustered `--once`, after the terminal entry committed: see the
    /// module's text. Nothing stops before this host's offsets store holds
    /// what its log does and its hard state holds a commit index through
    /// what it applied (so that a restart finds it).
    pub(super) fn stop_if_finished(&mut self) {
        let Some(first) = self.committed.finished.filter(|_| self.cfg.stop_when_exhausted) else { return };
        let last = self.committed.all_finished;
        let Some(r) = self.authority.raft() else { return };
        let offsets_done = self.offsets.idle() || (!r.serving() && r.shared_offsets());
        let deadline = self.fx.now + self.cfg.limits.drain_timeout;
        if !offsets_done || !r.commit_saved(&mut self.fx, last.unwrap_or(first)) {
            self.drain_deadline.get_or_insert(deadline);
            return;
        }
        match (r.leads(), last) {
            (true, Some(last)) if !r.unconfirmed(last).is_empty() => {
                self.drain_deadline.get_or_insert(deadline);
            }
            (_, Some(_)) => self.stop(StopReason::Clean),
            (true, None) if r.unconfirmed(first).is_empty() => {
                if !self.all_finished_proposed {
                    self.all_finished_proposed = true;
                    self.wal.push(Frame::AllFinished);
                }
            }
            (true, None) => {
                self.drain_deadline.get_or_insert(deadline);
            }
            (false, None) if r.leader_known() => self.drain_deadline = None,
            (false, None) => {
                self.drain_deadline.get_or_insert(deadline);
            }
        }
    }

    /// The drain timed out after the terminal entry: the run is done; the
    /// members that had not learnt of it are named (none, when this host
    /// follows and lost its leader).
    pub(super) fn finish_timed_out(&self) -> Option<StopReason> {
        let first = self.committed.finished.filter(|_| self.cfg.stop_when_exhausted)?;
        let at = self.committed.all_finished.unwrap_or(first);
        let r = self.authority.raft_ref()?;
        Some(StopReason::FinishedUnconfirmed { index: first.0, nodes: r.unconfirmed(at) })
    }
}
