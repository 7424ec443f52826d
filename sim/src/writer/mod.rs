//! The single-writer topology (disk and S3 mode): one writer process over
//! one WAL device, one offsets store and, in S3 mode, one lease row; when
//! the writer freezes instead of dying, it moves to a second slot, its
//! frozen twin, which shares the device and wakes next to its replacement.
//!
//! The parts: this module (the topology's events and state, the outputs
//! its engines give), `requests` (what each request does at the device,
//! the lease and the offsets store), `faults` (what goes wrong with a
//! request, and what a dead process's requests still do), `frozen` (the
//! twin), `lifecycle` (crashes, restarts, an operator's deletion, bit rot,
//! how each stop is judged) and `idempotence` (recovering twice on a copy
//! gives what recovering once gives).

mod faults;
mod frozen;
mod lifecycle;
mod requests;

use crate::checker::{invariant, Violation};
use crate::device::SimWal;
use crate::operator::LostSegment;
use crate::plugins::{SimOffsets, SimSource};
use crate::rng::Die;
use crate::rng::{Rng, Stream};
use crate::s3::SimLease;
use crate::scenario::{Scenario, WalMode};
use crate::world::{self, Proc, RunOptions, Topology, World};
use skippr_core::*;
use std::sync::Arc;

/// The writer's slot, and its frozen twin's.
pub(crate) const LIVE: usize = 0;
pub(crate) const TWIN: usize = 1;

pub(crate) enum Event {
    Crash,
    /// The live writer is cut off (a network partition) and freezes.
    Freeze,
    Shutdown,
    Rot,
    /// A put whose outcome was reported unknown reaches S3 now.
    S3Land {
        conditional: bool,
        segment: SegmentId,
        offset: u64,
        bytes: Arc<Vec<u8>>,
    },
    /// The second half of an S3 segment delete: the groups after the header.
    S3DeleteRest {
        gen: u64,
        id: IoId,
        segment: SegmentId,
    },
    /// A conditional write whose outcome was reported unknown lands now.
    LeaseLand {
        expected: Option<u64>,
        row: LeaseRow,
    },
    OffsetsLand {
        entries: Vec<OffsetEntry>,
    },
}

pub(crate) struct Writer {
    operator_rng: Rng,
    /// The segment an operator deleted, if one was.
    lost: Option<LostSegment>,
    lease: SimLease,
    final_shutdown: bool,
    /// The live engine was asked to shut down (so a clean stop is not its
    /// own, by exhausted sources).
    shutdown_fed: bool,
    append_in_flight: bool,
}

pub(crate) fn world(seed: u64, opts: RunOptions) -> World<Writer> {
    let scenario = Scenario::from_seed(seed).with_wal(opts.wal).with_overrides(&opts.overrides);
    let switch = Instant::from_micros(scenario.fault_phase_end.as_micros() / 2);
    let mut sources: Vec<SimSource> = scenario
        .sources
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            SimSource::new(seed, i as u16, spec.clone(), scenario.streams, switch)
                .with_broken(scenario.letters.broken_permille())
        })
        .collect();
    if let Some(id) = scenario.replay_source() {
        // Nothing to replay before the first restart.
        sources.push(SimSource::replay(id, &vec![Vec::new(); scenario.streams as usize], switch));
    }
    let wal = match scenario.wal {
        WalMode::Disk | WalMode::Clustered => SimWal::disk(seed),
        WalMode::S3 => SimWal::s3(opts.mutations.has(Mutation::S3OverwriteOnAmbiguous)),
    };
    let offsets = SimOffsets::new(opts.mutations.has(Mutation::OffsetsRegress));
    let writer = Writer {
        // The scenario draws whether the fault is on from this stream's
        // first value; the world's draws come from a sibling seed so the
        // two never repeat each other.
        operator_rng: Rng::new(seed ^ 0x6f70_6572_6174_6f72, Stream::Operator),
        lost: None,
        lease: SimLease::default(),
        final_shutdown: false,
        shutdown_fed: false,
        append_in_flight: false,
    };
    let procs = vec![Proc::new(sources), Proc::new(Vec::new())];
    World::new(scenario, opts, procs, vec![wal], vec![offsets], writer)
}

impl Topology for Writer {
    type Event = Event;
    const QUIET_BUDGET: Duration = Duration::from_secs(600);
    const STEPS_MAX: u64 = 2_000_000;

    /// The fault phase's schedule: crashes, bit rot, a shutdown mid-run, its
    /// end, and the first start.
    fn plan(w: &mut World<Writer>) {
        let end = w.scenario.fault_phase_end;
        let f = w.scenario.faults.clone();
        for i in 0..f.crashes {
            let at = Instant::from_micros(w.faults_rng.range(0, end.as_micros()));
            if i < w.scenario.crashes_kept {
                w.at(at, world::Event::Topo(Event::Crash));
            }
        }
        if f.rot {
            let at = Instant::from_micros(w.faults_rng.range(end.as_micros() / 2, end.as_micros()));
            w.at(at, world::Event::Topo(Event::Rot));
        }
        if f.shutdown_mid_run {
            let at = Instant::from_micros(w.faults_rng.range(0, end.as_micros()));
            w.at(at, world::Event::Topo(Event::Shutdown));
        }
        if w.scenario.replay {
            // The operator stops the daemon late in the fault phase, when
            // most dead letters are in, and the start after replays them
            // (drawn from the operator's stream, so no other draw moves).
            let at = end.as_micros() * w.topo.operator_rng.range(60, 95) / 100;
            w.at(Instant::from_micros(at), world::Event::Topo(Event::Shutdown));
        }
        w.at(end, world::Event::EndFaultPhase);
        w.at(Instant::ZERO, world::Event::Start { slot: LIVE });
    }

    fn addressee(w: &World<Writer>, event: &Event) -> Option<usize> {
        match event {
            Event::S3DeleteRest { gen, .. } => w.owner(*gen),
            _ => None,
        }
    }

    fn fire(w: &mut World<Writer>, event: Event) {
        match event {
            Event::S3DeleteRest { gen, id, segment } => {
                if let Some(slot) = w.owner(gen) {
                    let result = w.wals[0].perform(gen, WalOp::Delete { segment }, false);
                    w.stats.segments_deleted += 1;
                    w.feed(slot, Input::IoDone { id, result });
                }
            }
            Event::S3Land { conditional, segment, offset, bytes } => {
                w.stats.s3_landed_late += 1;
                let _ = w.wals[0].s3_mut().expect("S3 mode").put(conditional, segment, offset, &bytes);
            }
            Event::LeaseLand { expected, row } => {
                let _ = w.topo.lease.write(expected, row);
            }
            Event::OffsetsLand { entries } => w.write_offsets(&entries),
            Event::Crash => w.crash(false),
            Event::Freeze => w.crash(true),
            Event::Shutdown => w.shutdown(),
            Event::Rot => w.rot(),
        }
    }

    fn start(w: &mut World<Writer>, _: usize) {
        w.restart()
    }

    fn end_fault_phase(w: &mut World<Writer>) {
        w.faulting = false;
        // A frozen writer that never woke is killed for good, so the quiet
        // phase has one writer to converge with.
        if w.procs[TWIN].host.is_some() {
            w.retire(TWIN);
            w.trace.note(w.now(), "zombie killed");
        }
    }

    /// A segment delete on S3 removes its header first and its groups after.
    fn complete(w: &mut World<Writer>, slot: usize, gen: u64, id: IoId, op: IoOp) -> Option<Result<IoReply, IoError>> {
        match op {
            IoOp::Wal(WalOp::Delete { segment }) if w.scenario.wal == WalMode::S3 => {
                w.wals[0].s3_mut().expect("S3 mode").begin_delete(segment);
                let s3 = w.scenario.latencies.s3;
                w.after_topo(Die::S3Latency, s3, Event::S3DeleteRest { gen, id, segment });
                None
            }
            op => Some(w.complete(slot, gen, op)),
        }
    }

    fn in_flight(w: &mut World<Writer>, _: usize, gen: u64, op: IoOp) {
        w.in_flight_effect(gen, op)
    }

    /// No engine started after a needed segment was lost may deliver.
    fn may_apply(w: &mut World<Writer>, gen: u64, apply: &SinkApply) -> bool {
        let Some(lost) = w.topo.lost.filter(|l| l.needed && gen >= l.gen) else { return true };
        let detail = format!(
            "segment {} was deleted while a sink still needed it, and an engine started after that delivered {} \
             to sink {}",
            lost.segment.0, apply.id, apply.sink
        );
        w.checker.fail(invariant::LOST_SEGMENT_UNNOTICED, detail);
        false
    }

    fn note_feed(w: &mut World<Writer>, slot: usize) {
        if slot == TWIN {
            let now = w.now();
            w.trace.note(now, "zombie:");
        }
    }

    fn submit(w: &mut World<Writer>, slot: usize, id: IoId, op: IoOp) {
        w.submit(slot, id, op)
    }

    fn on_output(w: &mut World<Writer>, slot: usize, output: Output) -> bool {
        match output {
            Output::LeaseWait { .. } => w.stats.lease_waits += 1,
            Output::Stopped(reason) if slot == TWIN => w.on_twin_stopped(reason),
            Output::Stopped(reason) => w.on_stopped(reason),
            _ => unreachable!("one writer runs, not a cluster"),
        }
        true
    }

    fn after_step(w: &mut World<Writer>) {
        w.check_converged()
    }

    fn stalled(w: &mut World<Writer>, why: &str) {
        if w.checker.complete() && !w.topo.final_shutdown {
            w.done = true;
            return;
        }
        let missing = w.checker.missing().unwrap_or_else(|| "all records delivered".into());
        let detail = format!("{why}: {missing} (delivered {})", w.checker.delivered());
        if let Some(lost) = w.topo.lost.filter(|l| l.needed) {
            let detail = format!("segment {} was deleted while a sink still needed it: {detail}", lost.segment.0);
            return w.checker.fail(invariant::LOST_SEGMENT_UNNOTICED, detail);
        }
        w.checker.fail(invariant::STALLED, detail);
    }

    fn violation(_: &World<Writer>) -> Option<&Violation> {
        None
    }

    fn judge_end(_: &mut World<Writer>) {}

    fn wrap_up(_: &mut World<Writer>) {}
}

impl World<Writer> {
    fn check_converged(&mut self) {
        if self.faulting || self.topo.final_shutdown || !self.checker.complete() {
            return;
        }
        match &self.procs[LIVE].host {
            Some(h) if !h.is_recovering() => {}
            _ => return,
        }
        if self.scenario.clean_shutdown {
            self.topo.final_shutdown = true;
            self.stats.shutdowns += 1;
            self.feed(LIVE, Input::Shutdown);
        } else {
            self.done = true;
        }
    }

    fn shutdown(&mut self) {
        if self.procs[LIVE].host.is_some() {
            self.stats.shutdowns += 1;
            self.topo.shutdown_fed = true;
            self.feed(LIVE, Input::Shutdown);
        }
    }
}
