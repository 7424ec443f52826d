//! Simulated time and the events waiting in it, in the order they happen:
//! by time, then by the order they were scheduled. One queue for every
//! topology: the events of a process's requests are the harness's, the
//! faults and the network the topology's.

use skippr_core::{Input, Instant, IoId, IoOp, SinkApply};
use std::collections::BTreeMap;

pub(crate) enum Event<E> {
    /// A request of the engine of generation `gen`, sent from slot `slot`,
    /// finishes and is performed now (whether or not that engine still
    /// runs, or is frozen: the request has left it).
    Complete {
        slot: usize,
        gen: u64,
        id: IoId,
        op: IoOp,
    },
    /// A sink applies a batch (or, `letters`, the dead-letter destination
    /// a batch of dead letters); its reply follows.
    SinkEffect {
        gen: u64,
        id: IoId,
        apply: SinkApply,
        letters: bool,
    },
    /// What comes back to the engine of generation `gen` (a request's
    /// answer, a transfer's end): it waits while that engine is frozen,
    /// and is lost if it no longer runs.
    Reply {
        gen: u64,
        input: Input,
    },
    /// The process of slot `slot` is started.
    Start {
        slot: usize,
    },
    EndFaultPhase,
    Topo(E),
}

pub(crate) struct Schedule<E> {
    /// Simulated time: the time of the event or timer being handled.
    pub now: Instant,
    seq: u64,
    /// Boxed: an event is large (a request inside), and the map moves its
    /// entries as it splits and merges nodes.
    events: BTreeMap<(Instant, u64), Box<E>>,
}

impl<E> Default for Schedule<E> {
    fn default() -> Schedule<E> {
        Schedule { now: Instant::ZERO, seq: 0, events: BTreeMap::new() }
    }
}

impl<E> Schedule<E> {
    pub fn at(&mut self, at: Instant, event: E) {
        self.seq += 1;
        self.events.insert((at, self.seq), Box::new(event));
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Option<Instant> {
        self.events.keys().next().map(|k| k.0)
    }

    pub fn pop(&mut self) -> Option<E> {
        self.events.pop_first().map(|(_, event)| *event)
    }
}
