//! The coordinator's clean shutdown: stop reading, drain what was read
//! through the WAL, the sinks and the offsets store, give the writer
//! authority up, stop. Owns no state beyond the host's phase.

use super::*;

impl Host {
    pub(super) fn on_shutdown(&mut self) {
        self.shutdown_requested = true;
        if self.phase == Phase::Recovering && self.authority.waiting() {
            // Still waiting for another writer's lease: nothing to drain.
            return self.stop(StopReason::Clean);
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
