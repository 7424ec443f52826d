//! Simulated time and the events waiting in it, in the order they happen:
//! by time, then by the order they were scheduled. One queue for every
//! topology; the events are the topology's.

use skippr_core::Instant;
use std::collections::BTreeMap;

pub(crate) struct Schedule<E> {
    /// Simulated time: the time of the event or timer being handled.
    pub now: Instant,
    seq: u64,
    events: BTreeMap<(Instant, u64), E>,
}

impl<E> Default for Schedule<E> {
    fn default() -> Schedule<E> {
        Schedule { now: Instant::ZERO, seq: 0, events: BTreeMap::new() }
    }
}

impl<E> Schedule<E> {
    pub fn at(&mut self, at: Instant, event: E) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Option<Instant> {
        self.events.keys().next().map(|k| k.0)
    }

    pub fn pop(&mut self) -> Option<E> {
        self.events.pop_first().map(|(_, event)| event)
    }
}
