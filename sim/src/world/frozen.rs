//! A writer that freezes (a stopped VM, a long pause, a network partition)
//! instead of dying. It keeps its state, its requests in flight and its own
//! source processes; a replacement starts while it sleeps, and it wakes to
//! carry on as if nothing happened. It must find itself fenced out, or its
//! lease lost, before it does any harm.

use super::schedule::Event;
use super::World;
use crate::checker::invariant;
use crate::plugins::SimSource;
use crate::rng::Die;
use skippr_core::{Duration, Host, Instant, StopReason};
use skippr_core::{IoOp, WalOp};

/// Which engine an event belongs to: the live one, or a frozen process that
/// woke up next to its replacement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Who {
    Live,
    Zombie,
}

pub(super) struct Zombie {
    pub host: Host,
    pub gen: u64,
    pub wake: Instant,
    pub sources: Vec<SimSource>,
}

impl World {
    pub(super) fn gen_of(&self, who: Who) -> u64 {
        match who {
            Who::Live => self.gen,
            Who::Zombie => self.zombie.as_ref().map_or(u64::MAX, |z| z.gen),
        }
    }

    /// The engine a request of generation `gen` belongs to, if it is alive.
    pub(super) fn owner(&self, gen: u64) -> Option<Who> {
        if gen == self.gen && self.host.is_some() {
            Some(Who::Live)
        } else if self.zombie.as_ref().is_some_and(|z| z.gen == gen) {
            Some(Who::Zombie)
        } else {
            None
        }
    }

    /// A frozen engine notices nothing until it wakes: its events wait.
    pub(super) fn frozen_until(&self, who: Who) -> Option<Instant> {
        match who {
            Who::Zombie => self.zombie.as_ref().map(|z| z.wake).filter(|w| *w > self.now()),
            Who::Live => None,
        }
    }

    /// The services act on what a frozen process sent; only what comes back
    /// waits for it to wake. Returns the event if it is to be handled now.
    pub(super) fn hold_for_frozen(&mut self, who: Who, wake: Instant, event: Event) -> Option<Event> {
        let delay = Duration::from_micros(self.dice.roll(Die::Frozen).range(0, 1_000));
        match event {
            Event::Complete { gen, id, op } if !matches!(op, IoOp::Wal(WalOp::Delete { .. })) => {
                let result = self.complete(who, gen, op);
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
        let host = self.host.take().expect("a live writer to freeze");
        self.zombie = Some(Zombie { host, gen: self.gen, wake, sources: self.sources.clone() });
        self.gen += 1;
        self.append_in_flight = false;
        self.after(Die::Restart, self.scenario.latencies.restart, Event::Restart);
    }

    /// A woken writer must find itself fenced out (or lose the lease) before
    /// it does any harm; any other stop is as unexpected as for the live one.
    pub(super) fn on_zombie_stopped(&mut self, reason: StopReason) {
        match reason {
            StopReason::Fenced { .. } | StopReason::LeaseLost { .. } => {
                self.stats.fenced += 1;
                self.trace.note(self.now(), "zombie stopped");
                self.retire_zombie();
            }
            // It was draining when it froze, and had nothing left to commit.
            StopReason::Clean | StopReason::DrainTimedOut => {
                self.trace.note(self.now(), "zombie stopped");
                self.retire_zombie();
            }
            // Reading records back for its sinks, it found a segment its
            // successor had deleted once they were delivered: nothing it
            // could still send was needed.
            StopReason::WalReadFailed { .. } => {
                self.trace.note(self.now(), "zombie stopped");
                self.retire_zombie();
            }
            // A writer frozen before an operator deleted a segment wakes to
            // a WAL that is not whole: stopping there is right.
            StopReason::WalIncomplete(_)
            | StopReason::Corrupt(_)
            | StopReason::OffsetsAheadOfWal { .. }
            | StopReason::SinkAheadOfWal { .. }
                if self.lost.is_some() =>
            {
                self.trace.note(self.now(), "zombie stopped");
                self.retire_zombie();
                self.fail_closed = Some(format!("a woken writer stopped after a segment was lost: {reason:?}"));
            }
            other => self.checker.fail(invariant::UNEXPECTED_STOP, format!("woken writer: {other:?}")),
        }
    }
}
