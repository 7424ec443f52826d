//! The coordinator's pump: after every input, start whatever work the
//! current state allows, asking each part in a fixed order (sources,
//! compaction, the WAL writer, offsets, acks, deletions) and the writer
//! authority before anything that writes. Owns no state.

use super::*;
use crate::wal::Frame;

impl Host {
    /// Starts whatever work the current state allows. Bounded: each step
    /// issues at most one request per source, slot or queue.
    pub(super) fn pump(&mut self) {
        if self.holds_still() {
            return self.seal_step();
        }
        if self.phase == Phase::Recovering && self.startup.fencing() {
            self.ensure_spare();
            self.start_commit();
        }
        if self.phase == Phase::Recovering {
            self.materialize_offsets();
            self.stop_if_finished();
        }
        if matches!(self.phase, Phase::Recovering | Phase::Stopped) {
            return;
        }
        if self.closing.is_some() {
            // The lease's release may wait for a renewal in flight.
            return self.close_when_done();
        }
        if self.recorded == drain::Recorded::Writing {
            // Nothing changes the WAL the stop record describes.
            return;
        }
        self.read_sources();
        self.plan_compactions();
        self.ensure_spare();
        self.start_commit();
        // Like acks: a writer that may have lost its authority
        // materializes nothing more.
        if self.may_write() {
            self.offsets.write(&mut self.fx, &self.committed);
            self.sources.send_acks(&mut self.fx);
        }
        self.delete_next();
        // The planted bug `finish-before-drained`: the terminal entry goes
        // as soon as the sources are exhausted.
        let early = self.cfg.mutations.has(Mutation::FinishBeforeDrained) && self.finishes_cluster();
        if self.phase == Phase::Draining && (early || self.drained()) {
            if self.finishes_cluster() {
                self.propose_finish();
            } else if self.hands_over() {
                // Waiting to be deposed by the handover.
            } else if self.record_stop(true) && self.release_authority() {
                self.stop(StopReason::Clean);
            }
        }
        self.stop_if_finished();
    }

    fn ensure_spare(&mut self) {
        let may_write = self.may_write();
        self.wal.ensure_spare(&mut self.fx, &self.cfg.limits, may_write);
    }

    fn start_commit(&mut self) {
        if !self.may_write() {
            return;
        }
        self.propose_next();
        let snap = SnapshotSource {
            committed: &self.committed,
            names: &self.names,
            drop_frontier: self.cfg.mutations.has(Mutation::SnapshotDropsFrontier),
        };
        match self.wal.start_commit(&mut self.fx, &self.cfg.limits, snap) {
            Ok(true) if self.cfg.mutations.has(Mutation::DispatchBeforePlanCommit) => {
                for (sink, stream) in self.wal.plans_in_flight() {
                    self.compaction.assume_committed(sink, stream);
                    self.dispatch(sink, stream);
                }
            }
            Ok(_) => {}
            Err(stop) => self.stop(stop),
        }
        self.send_proposal();
    }

    /// Clustered mode: every host deletes its own segments, each once
    /// raft's log starts after it (not while a snapshot's transfer or a
    /// lagging follower's read needs it).
    pub(super) fn delete_next(&mut self) {
        let may_delete = match (self.authority.raft(), self.wal.next_delete()) {
            (Some(r), Some((segment, justified_at))) => {
                r.compact_to(&mut self.fx, SegmentId(segment.0 + 1), justified_at)
            }
            (Some(_), None) => false,
            (None, _) => self.may_write(),
        };
        self.wal.delete_next(&mut self.fx, may_delete);
    }

    fn read_sources(&mut self) {
        if self.phase != Phase::Running {
            return;
        }
        let l = &self.cfg.limits;
        let (full, changed) = self.wal.check_full(l);
        if changed {
            let bytes = self.wal.size_bytes(l);
            self.fx.emit(if full {
                Output::WalFull { bytes, limit: l.wal_bytes_max }
            } else {
                Output::WalRoom { bytes }
            });
            if full {
                // Later acknowledgements ask for a snapshot themselves.
                self.wal.make_room(&self.committed.acked, self.cfg.sinks.len() as u16);
            }
        }
        // An open window holding the oldest segment pins the WAL: nothing
        // goes until it closes, so its source alone is read on (section
        // 22), up to half the limit in the window.
        let pinned = full.then(|| self.wal.oldest_holds_window(&self.committed)).flatten();
        if let Some(source) = pinned {
            if self.windows.open_bytes(source) > l.wal_bytes_max / 2 {
                return self.stop(StopReason::WindowTooLarge { source, limit: l.wal_bytes_max });
            }
        }
        if Sources::backpressured(l, self.wal.pending_bytes(), full && pinned.is_none()) {
            return;
        }
        let schemas = &self.schemas;
        let held = |source| schemas.holds(source) || pinned.is_some_and(|p| p != source);
        self.sources.read(&mut self.fx, l.source_read_records_max, held);
    }

    fn plan_compactions(&mut self) {
        for plan in self.compaction.plan_idle(&self.cfg, &self.committed, &self.records) {
            self.wal.push(Frame::CompactionPlanned(plan));
        }
    }

    /// A plan done: its frame goes into the WAL, with the count of records
    /// the sink holds only where dead letters are on (the breaker counts
    /// it; other WALs keep their bytes).
    pub(super) fn done(&mut self, mut done: crate::wal::CompactionDone) {
        if self.cfg.dead_letters.is_none() {
            done.records = None;
        }
        self.wal.push(crate::wal::Frame::CompactionDone(done));
    }

    /// The planted bugs of dead letters that are on.
    pub(super) fn letter_bugs(&self) -> compact::LetterBugs {
        let m = &self.cfg.mutations;
        compact::LetterBugs {
            before_decision: m.has(Mutation::LettersBeforeDecision),
            decide_again: m.has(Mutation::ReplayDecidesAgain),
            renumbered: m.has(Mutation::LettersRenumbered),
            split_loses_rest: m.has(Mutation::SplitLosesRest),
            quarantine_sent: m.has(Mutation::QuarantineSent),
        }
    }

    pub(super) fn dispatch(&mut self, sink: SinkId, stream: StreamId) {
        let unstable = self.cfg.mutations.has(Mutation::UnstableCompactionId).then(|| self.wal.epoch());
        let chain = compact::Chain::of(&self.committed, (sink, stream));
        let bugs = (unstable, self.letter_bugs());
        let fx = (&mut self.fx, &self.cfg);
        match self.compaction.dispatch(fx, &self.records, (sink, stream), chain, bugs) {
            Ok(None) => {}
            Ok(Some(done)) => self.done(done),
            Err(stop) => self.stop(stop),
        }
    }
}
