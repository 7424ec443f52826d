//! Simulated time and the events waiting in it, in the order they happen:
//! by time, then by the order they were scheduled.

use skippr_core::IoOp;
use skippr_core::{Instant, IoError, IoId, IoReply, LeaseRow, OffsetEntry, SegmentId, SinkApply};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) enum Event {
    /// An I/O finishes and is performed now (reads, syncs, stores, sources).
    Complete {
        gen: u64,
        id: IoId,
        op: IoOp,
    },
    /// A sink applies a batch; its reply follows.
    SinkEffect {
        gen: u64,
        id: IoId,
        apply: SinkApply,
    },
    Reply {
        gen: u64,
        id: IoId,
        result: Result<IoReply, IoError>,
    },
    Crash,
    /// The live writer is cut off (a network partition) and freezes.
    Freeze,
    Restart,
    Shutdown,
    Rot,
    EndFaultPhase,
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

#[derive(Default)]
pub(super) struct Schedule {
    /// Simulated time: the time of the event or timer being handled.
    pub now: Instant,
    seq: u64,
    events: BTreeMap<(Instant, u64), Event>,
}

impl Schedule {
    pub fn at(&mut self, at: Instant, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Option<Instant> {
        self.events.keys().next().map(|k| k.0)
    }

    pub fn pop(&mut self) -> Option<Event> {
        self.events.pop_first().map(|(_, event)| event)
    }
}
