//! A writer that freezes (a stopped VM, a long pause, a network partition)
//! instead of dying. It keeps its state, its requests in flight and its own
//! source processes; a replacement starts while it sleeps, and it wakes to
//! carry on as if nothing happened. It must find itself fenced out, or its
//! lease lost, before it does any harm.

use super::{Writer, LIVE, TWIN};
use crate::checker::invariant;
use crate::rng::Die;
use crate::world::{self, World};
use skippr_core::{Duration, StopReason};

impl World<Writer> {
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
        self.topo.append_in_flight = false;
        self.after(Die::Restart, self.scenario.latencies.restart, world::Event::Start { slot: LIVE });
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
            // It sent a batch the sink cannot take before it froze: the live
            // writer meets it too, and its operator gives it up.
            StopReason::SinkFatal { sink, stream, seq, .. } if self.poisoned.contains_key(&(sink, stream, seq)) => {
                self.trace.note(self.now(), "zombie stopped");
                self.retire(TWIN);
            }
            other => self.checker.fail(invariant::UNEXPECTED_STOP, format!("woken writer: {other:?}")),
        }
    }
}
