//! Compaction: one slot per (sink, stream), the planned-through position per
//! (sink, partition) and the next sequence number per (sink, stream). It
//! plans destination batches with stable ids from committed records, sends
//! each to its sink once its plan is committed, and turns the sink's answer
//! into a `CompactionDone` frame, or, where it refuses records, into a
//! `Refusal` frame, the dead letters that follow from it (`letters.rs`) and
//! the plan sent again without them. It reads the committed state and the
//! record store it is handed and talks only to [`Effects`].

mod letters;

use super::effects::{Effects, Pending, Retry};
use super::WAL_READ_ATTEMPTS;
use crate::compaction::letters_id;
use crate::compaction::{compaction_id, NamedRanges};
use crate::config::HostConfig;
use crate::ids::*;
use crate::io::PluginOp;
use crate::io::{IoError, IoOp, SinkApply, SinkOutcome, StopReason, WalOp};
use crate::records::{Gathered, ReadBack, RecordStore};
use crate::state::CommittedState;
use crate::wal::READ_BACK_INVALID;
use crate::wal::{read_span_back, CompactionDone, CompactionPlan, Corruption, GroupSpan, Range, Refusal};
use std::collections::BTreeMap;

#[derive(Default)]
pub(super) struct Compaction {
    slots: BTreeMap<(SinkId, StreamId), Slot>,
    planned: BTreeMap<(SinkId, PartitionKey), Position>,
    next_seq: BTreeMap<(SinkId, StreamId), CompactionSeq>,
    /// Something an idle slot could plan may have arrived (records
    /// committed, a slot freed) since the idle slots last found nothing.
    fresh: bool,
}

enum Slot {
    Idle,
    /// Planned; `committed` once its frame is durable. `io` while a sink
    /// apply, a dead-letter batch or a read-back is outstanding; `fetch`
    /// once dispatched.
    Planned {
        plan: CompactionPlan,
        committed: bool,
        io: Option<IoId>,
        fetch: Option<Fetch>,
        refused: Refused,
    },
}

/// Where an open plan stands with its refusals in this run.
#[derive(Default)]
struct Refused {
    /// How many of its committed refusals have had their dead letters
    /// delivered (each is sent again after a restart: the destination
    /// dedupes).
    delivered: usize,
    /// A refusal is on its way into the WAL: nothing is sent until it
    /// commits.
    deciding: bool,
    /// Where each record of the attempt last sent is.
    sent: Vec<(PartitionKey, Position)>,
}

/// With dead letters on, what a refusal of a slot's plan needs: the next
/// dead-letter number, and the time.
pub(super) struct Decided {
    pub next_letters: CompactionSeq,
    pub at_ms: u64,
}

/// The groups a dispatch reads back from the WAL (records no longer in
/// memory), as spans of consecutive groups, in requests of at most
/// `READ_BACK_BYTES_MAX`, and what they gave.
struct Fetch {
    places: Vec<GroupSpan>,
    /// Read up to here; the request in flight reads `next..next + sent`.
    next: usize,
    sent: usize,
    read: ReadBack,
}

/// One read-back request asks for at most this many bytes of groups (and
/// at least one span: a run's, at most `RUN_BLOCK_BYTES` and a group).
const READ_BACK_BYTES_MAX: u64 = 4 << 20;

/// What a group read back means.
pub(super) enum ReadNews {
    /// Nothing to do (a retry is scheduled, or the answer was stale).
    Quiet,
    /// Read: go on with the dispatch.
    Next,
    Stop(StopReason),
}

/// What a sink's answer means.
pub(super) enum SinkNews {
    /// Nothing to record (a retry is scheduled, or the answer was stale).
    Quiet,
    /// Applied (or already applied): record it done.
    Done(CompactionDone),
    /// Records refused: record the decision.
    Refused(Refusal),
    /// A dead-letter batch delivered: send what comes next.
    Next,
    Fatal(StopReason),
}

impl Compaction {
    /// At the end of recovery: planned-through positions and sequence
    /// numbers from the committed state, every slot idle, and the open
    /// plans (already committed) back in their slots to be sent again.
    /// Returns the slots to dispatch.
    pub(super) fn restore(
        &mut self,
        cfg: &HostConfig,
        committed: &CommittedState,
        replay: bool,
    ) -> Vec<(SinkId, StreamId)> {
        let sinks = cfg.sinks.len() as u16;
        for &key in committed.partitions.keys() {
            for sink in (0..sinks).map(SinkId) {
                self.planned.insert((sink, key), committed.planned_through(sink, key));
            }
        }
        self.next_seq = committed.next_seq.clone();
        for sink in (0..sinks).map(SinkId) {
            for stream in (0..cfg.streams.len() as u16).map(StreamId) {
                self.slots.insert((sink, stream), Slot::Idle);
            }
        }
        self.fresh = true;
        let mut open = Vec::new();
        for plan in committed.open.values() {
            let key = (plan.sink, plan.stream);
            if replay {
                let refused = Refused::default();
                self.slots
                    .insert(key, Slot::Planned { plan: plan.clone(), committed: true, io: None, fetch: None, refused });
                open.push(key);
            }
        }
        open
    }

    /// Plans every idle slot that has committed records past its planned
    /// position; returns the plans, whose frames go into the next group.
    pub(super) fn plan_idle(
        &mut self,
        cfg: &HostConfig,
        committed: &CommittedState,
        records: &RecordStore,
    ) -> Vec<CompactionPlan> {
        if !std::mem::take(&mut self.fresh) {
            return Vec::new();
        }
        let idle: Vec<(SinkId, StreamId)> =
            self.slots.iter().filter(|(_, s)| matches!(s, Slot::Idle)).map(|(k, _)| *k).collect();
        idle.into_iter().filter_map(|(sink, stream)| self.plan(cfg, committed, records, sink, stream)).collect()
    }

    /// Plans the next destination batch of (sink, stream) from committed
    /// records past the planned-through positions.
    fn plan(
        &mut self,
        cfg: &HostConfig,
        committed: &CommittedState,
        records: &RecordStore,
        sink: SinkId,
        stream: StreamId,
    ) -> Option<CompactionPlan> {
        let ranges = self.ranges(cfg.limits.compaction_records_max as usize, committed, records, sink, stream);
        if ranges.is_empty() {
            return None;
        }
        let seq = self.next_seq.get(&(sink, stream)).copied().unwrap_or_default();
        let schema = committed.schemas.get(&stream).copied().unwrap_or_default();
        let names = NamedRanges { sources: &cfg.sources, ranges: &ranges };
        let id = compaction_id(&cfg.sinks[sink.0 as usize], &cfg.streams[stream.0 as usize], schema, names);
        for r in &ranges {
            self.planned.insert((sink, r.key), r.to);
        }
        self.next_seq.insert((sink, stream), CompactionSeq(seq.0 + 1));
        let plan = CompactionPlan { sink, stream, id, seq, schema, ranges };
        let (refused, fetch) = (Refused::default(), None);
        self.slots
            .insert((sink, stream), Slot::Planned { plan: plan.clone(), committed: false, io: None, fetch, refused });
        Some(plan)
    }

    /// Up to `budget` committed records of `stream` past what `sink` has
    /// planned, as one range per partition.
    fn ranges(
        &self,
        mut budget: usize,
        committed: &CommittedState,
        records: &RecordStore,
        sink: SinkId,
        stream: StreamId,
    ) -> Vec<Range> {
        let mut ranges = Vec::new();
        for (&key, p) in &committed.partitions {
            if p.stream != stream || budget == 0 {
                continue;
            }
            let from = self.planned.get(&(sink, key)).copied().unwrap_or_default();
            if p.position <= from {
                continue;
            }
            let (n, to) = records.take(key, from, p.position, budget);
            if n == 0 {
                continue;
            }
            budget = budget.saturating_sub(n);
            ranges.push(Range { key, from, to });
        }
        ranges
    }

    /// Committed records arrived: the idle slots look again.
    pub(super) fn records_committed(&mut self) {
        self.fresh = true;
    }

    /// The plan's frame committed. True when that is the slot's open plan,
    /// now ready to send.
    pub(super) fn plan_committed(&mut self, plan: &CompactionPlan) -> bool {
        match self.slots.get_mut(&(plan.sink, plan.stream)) {
            Some(Slot::Planned { plan: p, committed, .. }) if p.id == plan.id => {
                *committed = true;
                true
            }
            _ => false,
        }
    }

    /// A refusal of the open plan of (sink, stream) committed: true when
    /// the slot may send again (its dead letters first).
    pub(super) fn refusal_committed(&mut self, sink: SinkId, stream: StreamId) -> bool {
        match self.slots.get_mut(&(sink, stream)) {
            Some(Slot::Planned { refused, .. }) => {
                refused.deciding = false;
                true
            }
            _ => false,
        }
    }

    /// The planted bug `dispatch-before-plan-commit`: counts the plan of
    /// (sink, stream) as committed before it is.
    pub(super) fn assume_committed(&mut self, sink: SinkId, stream: StreamId) {
        if let Some(Slot::Planned { committed, .. }) = self.slots.get_mut(&(sink, stream)) {
            *committed = true;
        }
    }

    /// Sends the open compaction of (sink, stream) to its sink, with its
    /// original id and number; replays are harmless because the sink
    /// dedupes. Records no longer in memory are read back from the WAL
    /// first, one request of groups at a time. Where records of it were
    /// refused, each refusal's dead letters go first, then the attempt
    /// without them. `unstable_id` is the planted bug
    /// `unstable-compaction-id`.
    pub(super) fn dispatch(
        &mut self,
        (fx, cfg): (&mut Effects, &HostConfig),
        records: &RecordStore,
        (sink, stream): (SinkId, StreamId),
        refusals: &[Refusal],
        unstable_id: Option<Epoch>,
    ) -> Result<(), StopReason> {
        let Some(Slot::Planned { plan, committed: true, io: io @ None, fetch, refused }) =
            self.slots.get_mut(&(sink, stream))
        else {
            return Ok(());
        };
        if refused.deciding {
            return Ok(());
        }
        let fetch = fetch.get_or_insert_with(|| Fetch {
            places: records.spans(&plan.ranges),
            next: 0,
            sent: 0,
            read: ReadBack::new(),
        });
        if fetch.next < fetch.places.len() {
            let mut bytes = 0;
            let places: Vec<_> = fetch.places[fetch.next..]
                .iter()
                .take_while(|p| {
                    bytes += p.len;
                    bytes == p.len || bytes <= READ_BACK_BYTES_MAX
                })
                .map(GroupSpan::place)
                .collect();
            fetch.sent = places.len();
            *io = Some(fx.io(Pending::WalReadBack(sink, stream), IoOp::Wal(WalOp::ReadGroups { places })));
            return Ok(());
        }
        let gathered = records.gather(&plan.ranges, &fetch.read).map_err(|span| {
            StopReason::Corrupt(Corruption { segment: span.segment, offset: span.offset, what: READ_BACK_INVALID })
        })?;
        if let Some(r) = refusals.get(refused.delivered) {
            let letters = letters::letters(cfg, r, &gathered);
            let batch = SinkApply { sink, stream, id: letters_id(r.id), seq: r.letters, records: letters };
            *io = Some(fx.io(Pending::DeadLetters(sink, stream), IoOp::Plugin(PluginOp::DeadLetters(batch))));
            return Ok(());
        }
        let Gathered { records: batch, places } = letters::attempt(gathered, refusals);
        refused.sent = places;
        let attempt = refusals.last().map_or(plan.id, |r| r.then);
        let id = match unstable_id {
            Some(epoch) => CompactionId(attempt.0 ^ epoch.0.wrapping_mul(0x9e37_79b9)),
            None => attempt,
        };
        let op = IoOp::Plugin(PluginOp::SinkApply(SinkApply { sink, stream, id, seq: plan.seq, records: batch }));
        *io = Some(fx.io(Pending::SinkApply(sink, stream), op));
        Ok(())
    }

    /// Groups read back for the dispatch of (sink, stream): keep the
    /// records of the plan's ranges. A read that keeps failing stops the
    /// engine like one at recovery; bytes that are not the committed groups
    /// stop it as corruption. `by_source` and `one_group` are the planted
    /// bugs `read-back-wrong-partition` and `read-back-one-group-of-a-run`.
    pub(super) fn on_read_back(
        &mut self,
        fx: &mut Effects,
        (id, sink, stream): (IoId, SinkId, StreamId),
        result: Result<Vec<Vec<u8>>, IoError>,
        (by_source, one_group): (bool, bool),
    ) -> ReadNews {
        let Some(Slot::Planned { plan, io, fetch: Some(fetch), .. }) = self.slots.get_mut(&(sink, stream)) else {
            return ReadNews::Quiet;
        };
        if *io != Some(id) {
            return ReadNews::Quiet;
        }
        *io = None;
        let retry = Retry::ReadBack(sink, stream);
        let groups = match result {
            Ok(groups) => groups,
            Err(_) if fx.attempts(retry) + 1 >= WAL_READ_ATTEMPTS => {
                return ReadNews::Stop(StopReason::WalReadFailed { segment: fetch.places[fetch.next].segment })
            }
            Err(_) => {
                fx.retry_later(retry);
                return ReadNews::Quiet;
            }
        };
        fx.succeeded(retry);
        assert_eq!(groups.len(), fetch.sent, "one answer per span asked for");
        let ranges = &plan.ranges;
        let ours = |r: &Range, key: PartitionKey| r.key == key || (by_source && r.key.source == key.source);
        for (span, bytes) in fetch.places[fetch.next..].iter().zip(groups) {
            let read = &mut fetch.read;
            let visited = read_span_back(
                *span,
                &bytes,
                |key| ranges.iter().any(|r| ours(r, key)),
                |key, origin, position, record| {
                    let r = ranges.iter().find(|r| ours(r, key)).expect("a wanted partition");
                    // Every batch gets its entry, even one with no record in
                    // the range (positions need not be dense).
                    let kept = read.entry((r.key, origin)).or_default();
                    if position >= r.from && position < r.to {
                        kept.push(position, record);
                    }
                },
                one_group,
            );
            if let Err(c) = visited {
                return ReadNews::Stop(StopReason::Corrupt(c));
            }
        }
        fetch.next += fetch.sent;
        ReadNews::Next
    }

    /// A sink's answer to the attempt sent. A refusal, with dead letters
    /// on, becomes a `Refusal` frame to commit (`decided` says what it
    /// needs); off, it stops the engine naming the first record refused.
    pub(super) fn on_reply(
        &mut self,
        fx: &mut Effects,
        (id, sink, stream): (IoId, SinkId, StreamId),
        result: Result<SinkOutcome, IoError>,
        (refusals, decided): (&[Refusal], Option<Decided>),
    ) -> SinkNews {
        let Some(Slot::Planned { plan, io, refused, .. }) = self.slots.get_mut(&(sink, stream)) else {
            return SinkNews::Quiet; // a stale reply from an early dispatch
        };
        if *io != Some(id) {
            return SinkNews::Quiet;
        }
        *io = None;
        let attempt = refusals.last().map_or(plan.id, |r| r.then);
        match result {
            Ok(SinkOutcome::Applied | SinkOutcome::AlreadyApplied) => {
                fx.succeeded(Retry::SinkApply(sink, stream));
                let seq = plan.seq;
                self.slots.insert((sink, stream), Slot::Idle);
                self.fresh = true;
                SinkNews::Done(CompactionDone { sink, stream, id: attempt, seq })
            }
            Ok(SinkOutcome::Fatal) => SinkNews::Fatal(StopReason::SinkFatal { sink, stream, id: attempt }),
            Ok(SinkOutcome::Refused(list)) => {
                fx.succeeded(Retry::SinkApply(sink, stream));
                let Some(d) = decided else {
                    let first = list.first().and_then(|r| refused.sent.get(r.index as usize).map(|p| (p, &r.reason)));
                    let Some((&(key, position), reason)) = first else {
                        let what = "a refusal that names no record of the batch".to_string();
                        return SinkNews::Fatal(StopReason::SinkProtocol { sink, stream, what });
                    };
                    let (reason, refused) = (reason.clone(), list.len());
                    return SinkNews::Fatal(StopReason::SinkRefused {
                        sink,
                        stream,
                        id: attempt,
                        key,
                        position,
                        reason,
                        refused,
                    });
                };
                match letters::decide((plan, attempt), &refused.sent, list, (d.next_letters, d.at_ms)) {
                    Ok(refusal) => {
                        refused.deciding = true;
                        SinkNews::Refused(refusal)
                    }
                    Err(stop) => SinkNews::Fatal(stop),
                }
            }
            Ok(SinkOutcome::Retryable) | Err(_) => {
                fx.retry_later(Retry::SinkApply(sink, stream));
                SinkNews::Quiet
            }
        }
    }

    /// The dead-letter destination's answer to the dead letters of the
    /// `refused.delivered`-th refusal of the open plan.
    pub(super) fn on_letters(
        &mut self,
        fx: &mut Effects,
        (id, sink, stream): (IoId, SinkId, StreamId),
        result: Result<SinkOutcome, IoError>,
        refusals: &[Refusal],
    ) -> SinkNews {
        let Some(Slot::Planned { io, refused, .. }) = self.slots.get_mut(&(sink, stream)) else {
            return SinkNews::Quiet;
        };
        if *io != Some(id) {
            return SinkNews::Quiet;
        }
        *io = None;
        match result {
            Ok(SinkOutcome::Applied | SinkOutcome::AlreadyApplied) => {
                fx.succeeded(Retry::SinkApply(sink, stream));
                refused.delivered += 1;
                SinkNews::Next
            }
            Ok(SinkOutcome::Fatal | SinkOutcome::Refused(_)) => {
                let letters = refusals.get(refused.delivered).map_or(CompactionSeq(0), |r| r.letters);
                SinkNews::Fatal(StopReason::DeadLettersFatal { sink, stream, letters })
            }
            Ok(SinkOutcome::Retryable) | Err(_) => {
                fx.retry_later(Retry::SinkApply(sink, stream));
                SinkNews::Quiet
            }
        }
    }

    /// No batch planned or out.
    pub(super) fn idle(&self) -> bool {
        self.slots.values().all(|s| matches!(s, Slot::Idle))
    }
}
