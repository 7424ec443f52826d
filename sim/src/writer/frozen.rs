//! A writer that freezes (a stopped VM, a long pause, a network partition)
//! instead of dying. It keeps its state, its requests in flight and its own
//! source processes; a replacement starts while it sleeps, and it wakes to
//! carry on as if nothing happened. It must find itself fenced out, or its
//! lease lost, before it does any harm.

use super::{Event, Writer, LIVE, TWIN};
use crate::checker::invariant;
use crate::rng::Die;
use crate::world::World;
use skippr_core::{Duration, Instant, StopReason};
use skippr_core::{IoOp, WalOp};

impl World<Writer> {
    /// The engine a request of generation `gen` belongs to, if it is alive.
    pub(super) fn owner(&self, gen: u64) -> Option<usize> {
        [LIVE, TWIN].into_iter().find(|&slot| self.procs[slot].gen == gen && self.procs[slot].host.is_some())
    }

    /// A frozen engine notices nothing until it wakes: its events wait.
    pub(super) fn frozen_until(&self, slot: usize) -> Option<Instant> {
        self.procs[slot].frozen_until.filter(|w| *w > self.now())
    }

    /// The services act on what a frozen process sent; only what comes back
    /// waits for it to wake. Returns the event if it is to be handled now.
    pub(super) fn hold_for_frozen(&mut self, slot: usize, wake: Instant, event: Event) -> Option<Event> {
        let delay = Duration::from_micros(self.dice.roll(Die::Frozen).range(0, 1_000));
        match event {
            Event::Complete { gen, id, op } if !matches!(op, IoOp::Wal(WalOp::Delete { .. })) => {
                let result = self.complete(slot, gen, op);
                self.at(wake + delay, Event::Reply { gen, id, result });
                None
            }
            event @ Event::Complete { .. } => Some(event),
            event => {
                self.at(wake + delay, event);
                None
            }
        }
    }

    /// The live writer freezes until a draw from the crash stream; a
    /// replacement starts after the usual restart delay.
    pub(super) fn freeze(&mut self) {
        self.stats.pauses += 1;
        let steal = self.scenario.lease.steal_after.as_micros();
        let wake = self.now() + Duration::from_micros(self.faults_rng.range(steal / 2, steal * 4));
        self.trace.note(self.now(), "crash: process frozen");
        let live = &mut self.procs[LIVE];
        let host = live.host.take().expect("a live writer to freeze");
        let (gen, timer, sources) = (live.gen, live.timer.take(), live.sources.clone());
        let twin = &mut self.procs[TWIN];
        (twin.host, twin.gen, twin.timer, twin.sources, twin.frozen_until) =
            (Some(host), gen, timer, sources, Some(wake));
        self.procs[LIVE].gen += 1;
        self.topo.append_in_flight = false;
        self.after(Die::Restart, self.scenario.latencies.restart, Event::Restart);
    }

    /// A woken writer must find itself fenced out (or lose the lease) before
    /// it does any harm; any other stop is as unexpected as for the live one.
    pub(super) fn on_twin_stopped(&mut self, reason: StopReason) {
        match reason {
            StopReason::Fenced { .. } | StopReason::LeaseLost { .. } => {
                self.stats.fenced += 1;
                self.trace.note(self.now(), "zombie stopped");
                self.retire(TWIN);
            }
            // It was draining when it froze, and had nothing left to commit.
            StopReason::Clean | StopReason::DrainTimedOut => {
                self.trace.note(self.now(), "zombie stopped");
                self.retire(TWIN);
            }
            // Reading records back for its sinks, it found a segment its
            // successor had deleted once they were delivered: nothing it
            // could still send was needed.
            StopReason::WalReadFailed { .. } => {
                self.trace.note(self.now(), "zombie stopped");
                self.retire(TWIN);
            }
            // A writer frozen before an operator deleted a segment wakes to
            // a WAL that is not whole: stopping there is right.
            StopReason::WalIncomplete(_)
            | StopReason::Corrupt(_)
            | StopReason::OffsetsAheadOfWal { .. }
            | StopReason::SinkAheadOfWal { .. }
                if self.topo.lost.is_some() =>
            {
                self.trace.note(self.now(), "zombie stopped");
                self.retire(TWIN);
                self.fail_closed = Some(format!("a woken writer stopped after a segment was lost: {reason:?}"));
            }
            other => self.checker.fail(invariant::UNEXPECTED_STOP, format!("woken writer: {other:?}")),
        }
    }
}
