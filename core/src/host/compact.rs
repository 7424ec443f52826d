//! Compaction: planning destination batches with stable ids and dense
//! sequence numbers, dispatching them once their plan is committed, and
//! recording them done after the sink's answer.

use super::*;

impl Host {
    pub(super) fn plan_compactions(&mut self) {
        let idle: Vec<(SinkId, StreamId)> =
            self.slots.iter().filter(|(_, s)| matches!(s, Slot::Idle)).map(|(k, _)| *k).collect();
        for (sink, stream) in idle {
            self.plan(sink, stream);
        }
    }

    /// Plans the next destination batch of (sink, stream) from committed
    /// records past the planned-through positions.
    pub(super) fn plan(&mut self, sink: SinkId, stream: StreamId) {
        let mut budget = self.cfg.limits.compaction_records_max as usize;
        let mut ranges = Vec::new();
        for (&key, p) in &self.committed.partitions {
            if p.stream != stream || budget == 0 {
                continue;
            }
            let from = self.planned.get(&(sink, key)).copied().unwrap_or_default();
            if p.position <= from {
                continue;
            }
            let mut in_range = self.records.range(key, from, p.position);
            let mut to = p.position;
            let mut n = 0;
            for r in in_range.by_ref() {
                if n == budget {
                    to = r.position;
                    break;
                }
                n += 1;
            }
            if n == 0 {
                continue;
            }
            budget -= n;
            ranges.push(Range { key, from, to });
        }
        if ranges.is_empty() {
            return;
        }
        let seq = self.next_seq.get(&(sink, stream)).copied().unwrap_or_default();
        let schema = self.committed.schemas.get(&stream).copied().unwrap_or_default();
        let names = NamedRanges { sources: &self.cfg.sources, ranges: &ranges };
        let id = compaction_id(&self.cfg.sinks[sink.0 as usize], &self.cfg.streams[stream.0 as usize], schema, names);
        for r in &ranges {
            self.planned.insert((sink, r.key), r.to);
        }
        self.next_seq.insert((sink, stream), CompactionSeq(seq.0 + 1));
        let plan = CompactionPlan { sink, stream, id, seq, schema, ranges };
        self.push_frame(Frame::CompactionPlanned(plan.clone()));
        self.slots.insert((sink, stream), Slot::Planned { plan, committed: false, io: None, dispatched: false });
    }

    /// The planted bug `dispatch-before-plan-commit`: sends every plan in the
    /// group that was just sent, before it is durable.
    pub(super) fn dispatch_planned_in_flight(&mut self) {
        let keys: Vec<(SinkId, StreamId)> = self
            .wal
            .commit
            .as_ref()
            .map(|c| {
                c.frames
                    .iter()
                    .filter_map(|f| match f {
                        Frame::CompactionPlanned(p) => Some((p.sink, p.stream)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (sink, stream) in keys {
            if let Some(Slot::Planned { committed, .. }) = self.slots.get_mut(&(sink, stream)) {
                *committed = true;
            }
            self.dispatch(sink, stream);
        }
    }

    /// Sends the open compaction of (sink, stream) to its sink, with its
    /// original id and number; replays are harmless because the sink dedupes.
    pub(super) fn dispatch(&mut self, sink: SinkId, stream: StreamId) {
        let unstable = self.cfg.mutations.has(Mutation::UnstableCompactionId);
        let epoch = self.wal.epoch;
        let Some(Slot::Planned { plan, committed, io, dispatched }) = self.slots.get_mut(&(sink, stream)) else {
            return;
        };
        if io.is_some() {
            return;
        }
        if !*committed {
            return;
        }
        if *dispatched && self.cfg.mutations.has(Mutation::DispatchBeforePlanCommit) {
            // Already sent early; the commit does not send it again.
            if self.ios.values().any(|p| matches!(p, Pending::SinkApply(s, t) if *s == sink && *t == stream)) {
                return;
            }
        }
        *dispatched = true;
        let mut records = Vec::new();
        for r in &plan.ranges {
            records.extend(self.records.range(r.key, r.from, r.to).map(|rec| rec.bytes.clone()));
        }
        let id = if unstable { CompactionId(plan.id.0 ^ epoch.0.wrapping_mul(0x9e37_79b9)) } else { plan.id };
        let op = IoOp::SinkApply(SinkApply { sink, stream, id, seq: plan.seq, records });
        let io_id = self.io(Pending::SinkApply(sink, stream), op);
        if let Some(Slot::Planned { io, .. }) = self.slots.get_mut(&(sink, stream)) {
            *io = Some(io_id);
        }
    }

    pub(super) fn on_sink_reply(&mut self, id: IoId, sink: SinkId, stream: StreamId, result: Result<IoReply, IoError>) {
        let Some(Slot::Planned { plan, io, .. }) = self.slots.get_mut(&(sink, stream)) else {
            return; // a stale reply from an early dispatch
        };
        if *io != Some(id) {
            return;
        }
        *io = None;
        let plan_id = plan.id;
        let seq = plan.seq;
        match result {
            Ok(IoReply::Sink { outcome: SinkOutcome::Applied | SinkOutcome::AlreadyApplied, .. }) => {
                self.succeeded(Retry::SinkApply(sink, stream));
                self.slots.insert((sink, stream), Slot::Idle);
                self.push_frame(Frame::CompactionDone(CompactionDone { sink, stream, id: plan_id, seq }));
            }
            Ok(IoReply::Sink { outcome: SinkOutcome::Fatal, .. }) => {
                self.stop(StopReason::SinkFatal { sink, stream, id: plan_id });
            }
            Ok(IoReply::Sink { outcome: SinkOutcome::Retryable, .. }) | Err(_) => {
                self.retry_later(Retry::SinkApply(sink, stream));
            }
            Ok(other) => panic!("SinkApply answered with {other:?}"),
        }
    }
}
