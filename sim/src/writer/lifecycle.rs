//! Crashes and restarts, what an operator does while no daemon runs, bit
//! rot, and how each way an engine stops is judged.

use super::{Writer, LIVE, TWIN};
use crate::checker::invariant;
use crate::operator::{self, LostSegment};
use crate::plugins::SimSource;
use crate::rng::Die;
use crate::scenario::WalMode;
use crate::world::{self, World};
use skippr_core::{BatchSkipRequest, CompactionSeq, Host, Instant, SinkId, StopReason, StreamId};

impl World<Writer> {
    pub(super) fn crash(&mut self, freeze: bool) {
        if self.procs[LIVE].host.is_none() || !self.faulting || (freeze && self.procs[TWIN].host.is_some()) {
            return;
        }
        self.stats.crashes += 1;
        let host = self.procs[LIVE].host.as_ref().expect("checked above");
        self.stats.crashes_in_recovery += host.is_recovering() as u64;
        self.stats.crashes_in_drain += host.is_draining() as u64;
        self.stats.crashes_in_commit += self.topo.append_in_flight as u64;
        // Half the crashes are a SIGKILL, which leaves the page cache to the
        // next process; the other half cut the power, which does not.
        let power_cut = self.faults_rng.chance(0.5);
        let s3 = self.scenario.wal == WalMode::S3;
        if freeze || (s3 && self.procs[TWIN].host.is_none() && self.faults_rng.chance(self.scenario.faults.pause)) {
            // Frozen, not dead: a replacement starts while it sleeps.
            return self.freeze();
        }
        self.stats.power_cuts += power_cut as u64;
        self.trace.note(self.now(), if power_cut { "crash: power cut" } else { "crash: process killed" });
        if s3 && self.scenario.faults.lease_wipe && self.procs[TWIN].host.is_none() && self.topo.lease.row.is_some() {
            // With no daemon running, the lease table is recreated: the next
            // writer's generation starts below the WAL's.
            self.trace.note(self.now(), "lease row deleted");
            self.topo.lease.row = None;
        }
        self.retire(LIVE);
        self.topo.append_in_flight = false;
        if power_cut {
            self.wals[0].power_cut(self.scenario.faults.lost_dir_entry);
        }
        if self.scenario.faults.lost_segment && self.topo.lost.is_none() && self.procs[TWIN].host.is_none() {
            self.lose_segment();
        }
        self.after(Die::Restart, self.scenario.latencies.restart, world::Event::Start { slot: LIVE });
    }

    /// With no daemon running, the operator deletes a segment (at half the
    /// crashes, until one is gone).
    fn lose_segment(&mut self) {
        if !self.topo.operator_rng.chance(0.5) {
            return;
        }
        let segments = self.wals[0].segments_on_device();
        let draw = self.topo.operator_rng.u64();
        let Some((segment, needed)) = operator::pick(&segments, draw, &self.checker) else { return };
        self.wals[0].remove(segment);
        self.trace.note(self.now(), &format!("operator deleted segment {} (needed: {needed})", segment.0));
        self.stats.lost_segments += 1;
        self.topo.lost = Some(LostSegment { segment, gen: self.next_gen + 1, needed });
    }

    /// Flips a bit in a segment that a later durable commit follows.
    pub(super) fn rot(&mut self) {
        let Some(disk) = self.wals[0].disk_mut() else { return };
        let rng = &mut self.faults_rng;
        if disk.rot(|hi| rng.range(0, hi)) {
            self.trace.note(self.schedule.now, "rot");
        }
    }

    /// The process exits by itself (a fatal stop); the machine keeps its page
    /// cache, and a supervisor starts it again.
    fn exit_and_restart(&mut self) {
        self.topo.append_in_flight = false;
        self.retire(LIVE);
        self.after(Die::Restart, self.scenario.latencies.restart, world::Event::Start { slot: LIVE });
    }

    pub(super) fn restart(&mut self) {
        if self.procs[LIVE].host.is_some() {
            return;
        }
        // One generation is given per start: the writer's starts so far.
        let starts = self.next_gen;
        if starts > 0 {
            let mut alone = self.scenario.host_config(self.opts.mutations, u64::MAX);
            alone.lease = None;
            self.check_recovery_idempotent(alone.clone(), 0, 0);
            self.check_stop_record(alone, 0, 0);
        }
        self.stats.restarts += 1;
        if let (Some(id), true) = (self.scenario.replay_source(), starts > 0) {
            // The operator replays the dead letters the destination holds
            // now (again after a crash: those already sent are passed over).
            let switch = Instant::from_micros(self.scenario.fault_phase_end.as_micros() / 2);
            self.procs[LIVE].sources[id as usize] = SimSource::replay(id, &self.letter_log, switch);
            self.checker.on_replay(id);
            self.stats.replays += 1;
        }
        let mut config = self.scenario.host_config(self.opts.mutations, starts);
        config.batch_skips.clone_from(&self.batch_skips);
        self.trace.note(self.now(), "start");
        self.topo.shutdown_fed = false;
        let host = Host::new(config, self.now()).expect("scenario configs are valid");
        self.begin(LIVE, host);
    }

    pub(super) fn on_stopped(&mut self, reason: StopReason) {
        match reason {
            StopReason::Fenced { .. } | StopReason::LeaseLost { .. } if self.scenario.wal == WalMode::S3 => {
                // Raced by a frozen writer's late request: start again, and
                // ask the next engine for the final shutdown too.
                self.stats.fenced += 1;
                self.topo.final_shutdown = false;
                self.exit_and_restart();
            }
            // Stopped by itself once the sources were exhausted and all was
            // delivered (`--once`): as final as the shutdown at the end.
            StopReason::Clean
                if self.topo.final_shutdown
                    || (self.scenario.stop_when_exhausted && !self.topo.shutdown_fed && self.checker.complete()) =>
            {
                self.stopped_for_good();
            }
            StopReason::Clean | StopReason::DrainTimedOut if !self.topo.final_shutdown => {
                self.stats.clean_stops += (reason == StopReason::Clean) as u64;
                self.exit_and_restart();
            }
            // Exit 8 on a batch the sink cannot take: the operator gives
            // it up by the number the message names, and starts again.
            StopReason::SinkFatal { sink, stream, seq, .. } if self.poisoned.contains_key(&(sink, stream, seq)) => {
                self.give_up(sink, stream, seq);
                self.exit_and_restart();
            }
            // Exit 7; a supervisor starts it again.
            StopReason::WalWriteFailed { .. } | StopReason::WalReadFailed { .. } => self.exit_and_restart(),
            // After an operator lost a segment, recovery stops on what it finds
            // missing: the WAL's own checks, the offsets store or a sink ahead
            // of it, or part of the segment brought back by a dead writer's
            // late put.
            reason @ (StopReason::WalIncomplete(_)
            | StopReason::Corrupt(_)
            | StopReason::SinkAheadOfWal { .. }
            | StopReason::OffsetsAheadOfWal { .. })
                if self.topo.lost.is_some() =>
            {
                self.fail_closed = Some(format!("stopped after a segment was lost: {reason:?}"));
                self.retire(LIVE);
            }
            StopReason::Corrupt(c) if self.wals[0].disk_stats().rot > 0 => {
                self.fail_closed =
                    Some(format!("stopped on corrupt segment {} at byte {}: {}", c.segment.0, c.offset, c.what));
                self.retire(LIVE);
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

    /// The operator's `--skip-batch` for batch `seq` of (sink, stream),
    /// kept for every later start; the checker accounts its records as
    /// given up, by name (those the sink was sent under that number).
    pub(super) fn give_up(&mut self, sink: SinkId, stream: StreamId, seq: CompactionSeq) {
        let request = BatchSkipRequest { sink, stream, seq, reason: "poison".into() };
        if self.batch_skips.contains(&request) {
            let detail = format!("sink {sink} stream {stream} batch {} was sent again after it was given up", seq.0);
            return self.checker.fail(invariant::SKIPPED_DELIVERED, detail);
        }
        self.stats.batch_skips += 1;
        self.trace.note(self.now(), &format!("operator: --skip-batch {}:{}", stream.0, seq.0));
        let records = self.poisoned[&(sink, stream, seq)].clone();
        self.checker.on_batch_skip(sink, stream, seq, &records);
        self.batch_skips.push(request);
    }

    /// The final stop: the offsets store must hold what was delivered, and
    /// a clean stop releases the lease.
    fn stopped_for_good(&mut self) {
        self.stats.clean_stops += 1;
        let offsets = &self.stores[0];
        self.checker.check_materialized(|key| offsets.position(key));
        if self.scenario.wal == WalMode::S3 && self.topo.lease.row.is_some_and(|r| r.holder != 0) {
            let detail = format!("a clean stop left the lease held: {:?}", self.topo.lease.row);
            self.checker.fail(invariant::CLEAN_SHUTDOWN, detail);
        }
        self.retire(LIVE);
        self.done = true;
    }
}
