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
use crate::wal::{
    read_span_back, CompactionDone, CompactionPlan, Corruption, Frame, GroupSpan, Range, Refusal, Settled, Split,
};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub(super) struct Compaction {
    slots: BTreeMap<(SinkId, StreamId), Slot>,
    planned: BTreeMap<(SinkId, PartitionKey), Position>,
    next_seq: BTreeMap<(SinkId, StreamId), CompactionSeq>,
    /// Something an idle slot could plan may have arrived (records
    /// committed, a slot freed) since the idle slots last found nothing.
    fresh: bool,
    /// Splits decided, and probes that found a version from before a split
    /// held (rare paths, counted for the simulator).
    splits: u64,
    held_before_split: u64,
    /// Where the next plan of (sink, partition) ends at the latest: after a
    /// split plan was done with its first half, the rest of the version it
    /// was cut from, which holds a record the sink cannot take, is planned
    /// alone, so the halving goes on inside it (one plan, then cleared).
    cap: BTreeMap<(SinkId, PartitionKey), Position>,
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
        refused: Box<Refused>,
    },
}

/// Where an open plan stands with its refusals in this run.
#[derive(Default)]
struct Refused {
    /// The dead letters of its settlement were delivered (sent again after
    /// a restart: the destination dedupes).
    delivered: bool,
    /// A refusal or settlement is on its way into the WAL: nothing is sent
    /// until it commits.
    deciding: bool,
    /// The sink answered `fatal` to a later attempt: the attempt at this
    /// index is sent to learn whether the sink holds it.
    probing: Option<usize>,
    /// The index of the attempt last sent, where each of its records is,
    /// and how many records quarantined at intake it left out.
    attempt: usize,
    sent: Vec<(PartitionKey, Position)>,
    quarantined: u64,
    /// Sent again by a restarted engine (its plan came from the WAL).
    replayed: bool,
    /// The attempts of a plan without refusals that the sink may hold
    /// unknown to this engine: those a process that died may have sent
    /// (every one the WAL held at this start), and those sent by this one
    /// without an answer. Every other attempt was answered `fatal` (not
    /// held) and was sent by nobody else.
    suspect: BTreeSet<usize>,
    /// The planted bug `dead-letters-before-decision`: the records of the
    /// attempt last sent.
    records: Option<crate::io::Records>,
}

/// The planted bugs of dead letters.
#[derive(Clone, Copy, Default)]
pub(super) struct LetterBugs {
    pub before_decision: bool,
    pub decide_again: bool,
    pub renumbered: bool,
    /// `split-loses-rest`: a split plan done leaves the planned-through
    /// positions where the plan ended before its split.
    pub split_loses_rest: bool,
    /// `quarantine-sent`: records quarantined at intake are sent.
    pub quarantine_sent: bool,
}

/// What the committed WAL says of a slot's open plan: its splits, its
/// refusals, and which attempt the sink holds, once known. Its attempts,
/// by index: the plan's own id, then the `then` of each split, then that
/// of each refusal.
#[derive(Clone, Copy)]
pub(super) struct Chain<'a> {
    pub splits: &'a [Split],
    pub refusals: &'a [Refusal],
    pub settled: Option<&'a Settled>,
}

impl<'a> Chain<'a> {
    /// The planted bug `replay-decides-again`: a replayed plan's chain as
    /// if nothing had been decided.
    fn forgotten(self, refused: &Refused, bugs: LetterBugs) -> Self {
        match bugs.decide_again && refused.replayed {
            true => Chain { splits: &[], refusals: &[], settled: None },
            false => self,
        }
    }

    /// What the committed WAL says of the open plan of `slot`.
    pub(super) fn of(committed: &CommittedState, slot: (SinkId, StreamId)) -> Chain<'_> {
        let (splits, refusals) = (committed.splits_of(slot), committed.refusals_of(slot));
        Chain { splits, refusals, settled: committed.settled.get(&slot) }
    }

    /// The index of the last attempt.
    fn last(&self) -> usize {
        self.splits.len() + self.refusals.len()
    }

    /// The id of the plan's attempt at `index`.
    fn attempt(&self, plan: &CompactionPlan, index: usize) -> CompactionId {
        match index.checked_sub(1) {
            None => plan.id,
            Some(i) if i < self.splits.len() => self.splits[i].then,
            Some(i) => self.refusals[i - self.splits.len()].then,
        }
    }

    /// The index of the attempt `id`.
    fn index_of(&self, plan: &CompactionPlan, id: CompactionId) -> usize {
        (0..=self.last()).find(|&i| self.attempt(plan, i) == id).expect("an attempt of the plan")
    }

    /// The ranges the plan's attempt at `index` covers.
    fn ranges<'r>(&self, plan: &'r CompactionPlan, index: usize) -> &'r [Range]
    where
        'a: 'r,
    {
        crate::state::attempt_ranges(plan, self.splits, index)
    }

    /// Where the attempt at `index` is a cut (a split's), the ranges of the
    /// version it was cut from.
    fn cut_from<'r>(&self, plan: &'r CompactionPlan, index: usize) -> Option<&'r [Range]>
    where
        'a: 'r,
    {
        (1..=self.splits.len()).contains(&index).then(|| self.ranges(plan, index - 1))
    }

    /// The refusals made before the attempt at `index`.
    fn refusals_before(&self, index: usize) -> &[Refusal] {
        &self.refusals[..index.saturating_sub(self.splits.len())]
    }
}

/// With dead letters on, what a decision about a slot's plan needs: the
/// next dead-letter number, and the time.
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

/// With dead letters on, a `fatal` that no refusal explains stands after
/// this many answers.
const FATAL_ATTEMPTS: u32 = 8;

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
    /// Records refused, or the attempt the sink holds found: record the
    /// decision.
    Decided(Frame),
    /// Send what comes next (dead letters delivered; an earlier attempt
    /// to try).
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
                let suspect = (0..=Chain::of(committed, key).last()).collect();
                let refused = Box::new(Refused { replayed: true, suspect, ..Refused::default() });
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
        let budget = cfg.limits.compaction_records_max as usize;
        let over_window = cfg.mutations.has(crate::Mutation::CompactionOverOpenWindow);
        let mut ranges = self.ranges(budget, committed, records, sink, stream, over_window);
        // A cap bounds one plan of its stream.
        let capped = self.cap.len();
        let ours = |&(s, key): &(SinkId, PartitionKey)| {
            s == sink && committed.partitions.get(&key).is_some_and(|p| p.stream == stream)
        };
        self.cap.retain(|k, _| !ours(k));
        if ranges.is_empty() && self.cap.len() < capped {
            ranges = self.ranges(budget, committed, records, sink, stream, over_window);
        }
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
        let (refused, fetch) = (Box::default(), None);
        self.slots
            .insert((sink, stream), Slot::Planned { plan: plan.clone(), committed: false, io: None, fetch, refused });
        Some(plan)
    }

    /// Up to `budget` committed records of `stream` past what `sink` has
    /// planned, as one range per partition. `over_window` is the planted
    /// bug `compaction-over-open-window`.
    fn ranges(
        &self,
        mut budget: usize,
        committed: &CommittedState,
        records: &RecordStore,
        sink: SinkId,
        stream: StreamId,
        over_window: bool,
    ) -> Vec<Range> {
        let mut ranges = Vec::new();
        for (&key, p) in &committed.partitions {
            if p.stream != stream || budget == 0 {
                continue;
            }
            let from = self.planned.get(&(sink, key)).copied().unwrap_or_default();
            let position = if over_window { committed.resume_position(key) } else { p.position };
            let end = self.cap.get(&(sink, key)).map_or(position, |&cap| cap.min(position));
            if end <= from {
                continue;
            }
            let (n, to) = records.take(key, from, end, budget);
            if n == 0 {
                continue;
            }
            budget = budget.saturating_sub(n);
            ranges.push(Range { key, from, to });
        }
        ranges
    }

    /// An operator gave up the open plan of (sink, stream) at recovery: the
    /// slot is idle (its planned-through positions are already past it).
    /// `too_far` is the planted bug `batch-skip-too-far`.
    pub(super) fn give_up(&mut self, sink: SinkId, stream: StreamId, committed: &CommittedState, too_far: bool) {
        self.slots.insert((sink, stream), Slot::Idle);
        self.fresh = true;
        if too_far {
            for (&key, p) in committed.partitions.iter().filter(|(_, p)| p.stream == stream) {
                self.planned.insert((sink, key), p.position);
            }
        }
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

    /// A refusal or settlement of the open plan of (sink, stream)
    /// committed: true when the slot may send again.
    pub(super) fn decision_committed(&mut self, sink: SinkId, stream: StreamId) -> bool {
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
    /// refused, the attempt sent is the last (or the one being probed);
    /// once the plan settled, its dead letters go out, and then it is done
    /// (returned). `unstable_id` is the planted bug `unstable-compaction-id`.
    pub(super) fn dispatch(
        &mut self,
        (fx, cfg): (&mut Effects, &HostConfig),
        records: &RecordStore,
        (sink, stream): (SinkId, StreamId),
        chain: Chain<'_>,
        (unstable_id, bugs): (Option<Epoch>, LetterBugs),
    ) -> Result<Option<CompactionDone>, StopReason> {
        let Some(Slot::Planned { plan, committed: true, io: io @ None, fetch, refused }) =
            self.slots.get_mut(&(sink, stream))
        else {
            return Ok(None);
        };
        if refused.deciding {
            return Ok(None);
        }
        let chain = chain.forgotten(refused, bugs);
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
            return Ok(None);
        }
        let gathered = records.gather(&plan.ranges, &fetch.read).map_err(|span| {
            StopReason::Corrupt(Corruption { segment: span.segment, offset: span.offset, what: READ_BACK_INVALID })
        })?;
        if cfg.dead_letters.is_none() && letters::undeliverable(chain, &gathered) {
            return Err(StopReason::DeadLettersOff { sink, stream, seq: plan.seq });
        }
        if let Some(x) = chain.settled {
            let standing = x.standing(chain.refusals);
            let index = chain.index_of(plan, x.held);
            let held = chain.ranges(plan, index).to_vec();
            if let (Some(seq), false) = (x.letters, refused.delivered) {
                let seq = CompactionSeq(seq.0 + (bugs.renumbered && refused.replayed) as u64);
                let letters = letters::letters(cfg, standing, (x, &held), &gathered);
                let batch = SinkApply { sink, stream, id: letters_id(x.held), seq, records: letters };
                *io = Some(fx.io(Pending::DeadLetters(sink, stream), IoOp::Plugin(PluginOp::DeadLetters(batch))));
                return Ok(None);
            }
            let rest = chain.cut_from(plan, index).map(<[Range]>::to_vec);
            let (held_records, _) = letters::attempt(gathered, &held, standing, bugs.quarantine_sent);
            let records = Some(held_records.records.len() as u64);
            let done = CompactionDone { sink, stream, id: x.held, seq: plan.seq, records };
            self.slots.insert((sink, stream), Slot::Idle);
            self.fresh = true;
            self.planned_to(sink, &held, rest.as_deref(), bugs);
            return Ok(Some(done));
        }
        let index = refused.probing.unwrap_or(chain.last());
        let (ranges, before) = (chain.ranges(plan, index), chain.refusals_before(index));
        let (Gathered { records: batch, places }, quarantined) =
            letters::attempt(gathered, ranges, before, bugs.quarantine_sent);
        (refused.attempt, refused.sent, refused.quarantined) = (index, places, quarantined);
        refused.records = bugs.before_decision.then(|| batch.clone());
        let attempt = chain.attempt(plan, index);
        let id = match unstable_id {
            Some(epoch) => CompactionId(attempt.0 ^ epoch.0.wrapping_mul(0x9e37_79b9)),
            None => attempt,
        };
        let op = IoOp::Plugin(PluginOp::SinkApply(SinkApply { sink, stream, id, seq: plan.seq, records: batch }));
        *io = Some(fx.io(Pending::SinkApply(sink, stream), op));
        Ok(None)
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

    /// A sink's answer to the attempt sent. With refusals committed, an
    /// attempt the sink holds settles the plan, and `fatal` (the number
    /// held by another attempt) sends the one before. A refusal, with dead
    /// letters on, becomes a `Refusal` frame to commit (`decided` says
    /// what it needs); off, it stops the engine naming the first record
    /// refused.
    pub(super) fn on_reply(
        &mut self,
        fx: &mut Effects,
        (id, sink, stream): (IoId, SinkId, StreamId),
        result: Result<SinkOutcome, IoError>,
        (chain, decided, bugs): (Chain<'_>, Option<Decided>, LetterBugs),
    ) -> SinkNews {
        let Some(Slot::Planned { plan, io, refused, .. }) = self.slots.get_mut(&(sink, stream)) else {
            return SinkNews::Quiet; // a stale reply from an early dispatch
        };
        if *io != Some(id) {
            return SinkNews::Quiet;
        }
        *io = None;
        let chain = chain.forgotten(refused, bugs);
        let index = refused.attempt;
        let attempt = chain.attempt(plan, index);
        match result {
            Ok(SinkOutcome::Applied | SinkOutcome::AlreadyApplied) => {
                fx.succeeded(Retry::SinkApply(sink, stream));
                if chain.refusals.is_empty() && index == chain.last() && refused.quarantined == 0 {
                    let (seq, records) = (plan.seq, Some(refused.sent.len() as u64));
                    let held = chain.ranges(plan, index).to_vec();
                    let rest = chain.cut_from(plan, index).map(<[Range]>::to_vec);
                    self.slots.insert((sink, stream), Slot::Idle);
                    self.fresh = true;
                    self.planned_to(sink, &held, rest.as_deref(), bugs);
                    return SinkNews::Done(CompactionDone { sink, stream, id: attempt, seq, records });
                }
                // The sink holds an attempt after refusals, or (a probe)
                // an earlier one, or one that left out records quarantined
                // at intake.
                self.held_before_split += (index < chain.splits.len()) as u64;
                refused.deciding = true;
                let quarantined = refused.quarantined;
                let letters = (index > chain.splits.len() || quarantined > 0)
                    .then(|| decided.map_or(CompactionSeq(0), |d| d.next_letters));
                let (seq, held) = (plan.seq, attempt);
                SinkNews::Decided(Frame::Settled(Settled { sink, stream, seq, held, letters, quarantined }))
            }
            Ok(SinkOutcome::Fatal | SinkOutcome::FatalUnnamed) if index > 0 && !chain.refusals.is_empty() => {
                // The number may be held by another attempt: one that was
                // refused may have landed after all (sent by a process
                // that has died since). Ask about the one before.
                fx.succeeded(Retry::SinkApply(sink, stream));
                refused.probing = Some(index - 1);
                SinkNews::Next
            }
            // With dead letters on, a sink that cannot name records
            // answered `fatal` for a plan without refusals: an earlier
            // version (before a split) that may have landed after all is
            // asked about, newest first; once none may, the last version is
            // cut in half, or its one record refused. A writer superseded
            // meanwhile cannot commit that.
            Ok(SinkOutcome::FatalUnnamed) if decided.is_some() && chain.refusals.is_empty() => {
                fx.succeeded(Retry::SinkApply(sink, stream));
                if let Some(&earlier) = refused.suspect.range(..index).next_back() {
                    refused.probing = Some(earlier);
                    return SinkNews::Next;
                }
                let last = chain.last();
                let ranges = chain.ranges(plan, last);
                // The places sent are the last version's or (a probe) an
                // earlier one's, which holds them.
                let sent: Vec<_> = refused.sent.iter().copied().filter(|&p| letters::within(ranges, p)).collect();
                let at_ms = decided.map_or(0, |d| d.at_ms);
                match letters::split((plan, chain.attempt(plan, last)), ranges, &sent, at_ms) {
                    Some(frame) => {
                        self.splits += matches!(frame, Frame::Split(_)) as u64;
                        (refused.deciding, refused.probing) = (true, None);
                        SinkNews::Decided(frame)
                    }
                    None => SinkNews::Fatal(StopReason::SinkFatal { sink, stream, id: attempt, seq: plan.seq }),
                }
            }
            // With dead letters on, another process's attempt of this plan
            // (one this engine's committed state does not know yet: a
            // leader's successor, a writer's that took the lease over) may
            // hold the number: a few retries give this engine time to learn
            // it was superseded and stop for that, before `fatal` stands.
            Ok(SinkOutcome::Fatal | SinkOutcome::FatalUnnamed)
                if decided.is_some() && fx.attempts(Retry::SinkApply(sink, stream)) + 1 < FATAL_ATTEMPTS =>
            {
                fx.retry_later(Retry::SinkApply(sink, stream));
                SinkNews::Quiet
            }
            Ok(SinkOutcome::Fatal | SinkOutcome::FatalUnnamed) => {
                SinkNews::Fatal(StopReason::SinkFatal { sink, stream, id: attempt, seq: plan.seq })
            }
            Ok(SinkOutcome::Refused(list)) => {
                fx.succeeded(Retry::SinkApply(sink, stream));
                if refused.probing.is_some() {
                    let what = format!(
                        "it refused records of {attempt}, which it had answered another under the \
                                        same number before"
                    );
                    return SinkNews::Fatal(StopReason::SinkProtocol { sink, stream, what });
                }
                let Some(d) = decided else {
                    let first = list.first().and_then(|r| refused.sent.get(r.index as usize).map(|p| (p, &r.reason)));
                    let Some((&(key, position), reason)) = first else {
                        let what = "a refusal that names no record of the batch".to_string();
                        return SinkNews::Fatal(StopReason::SinkProtocol { sink, stream, what });
                    };
                    let (reason, refused) = (crate::dead_letters::kept_reason(reason), list.len());
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
                match letters::decide((plan, attempt), &refused.sent, list, d.at_ms) {
                    Ok(refusal) => {
                        refused.deciding = true;
                        if let Some(records) = refused.records.take() {
                            // The planted bug: the dead letters go now.
                            let letters = letters::early(&refusal, &refused.sent, &records);
                            let batch = SinkApply {
                                sink,
                                stream,
                                id: letters_id(attempt),
                                seq: d.next_letters,
                                records: letters,
                            };
                            *io = Some(
                                fx.io(Pending::DeadLetters(sink, stream), IoOp::Plugin(PluginOp::DeadLetters(batch))),
                            );
                        }
                        SinkNews::Decided(Frame::Refused(refusal))
                    }
                    Err(stop) => SinkNews::Fatal(stop),
                }
            }
            Ok(SinkOutcome::Retryable) => {
                fx.retry_later(Retry::SinkApply(sink, stream));
                SinkNews::Quiet
            }
            Err(_) => {
                // No answer: the request may still land.
                refused.suspect.insert(index);
                fx.retry_later(Retry::SinkApply(sink, stream));
                SinkNews::Quiet
            }
        }
    }

    /// The dead-letter destination's answer to the dead letters of the
    /// open plan's settlement.
    pub(super) fn on_letters(
        &mut self,
        fx: &mut Effects,
        (id, sink, stream): (IoId, SinkId, StreamId),
        result: Result<SinkOutcome, IoError>,
        settled: Option<&Settled>,
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
                refused.delivered = true;
                SinkNews::Next
            }
            Ok(SinkOutcome::Fatal | SinkOutcome::FatalUnnamed | SinkOutcome::Refused(_)) => {
                let letters = settled.and_then(|x| x.letters).unwrap_or_default();
                SinkNews::Fatal(StopReason::DeadLettersFatal { sink, stream, letters })
            }
            Ok(SinkOutcome::Retryable) | Err(_) => {
                fx.retry_later(Retry::SinkApply(sink, stream));
                SinkNews::Quiet
            }
        }
    }

    /// The open plan of `sink` is done with the attempt that covers
    /// `ranges`: the next plan starts where that ends (a split plan's rest
    /// is planned again), and where that attempt is a cut of a version the
    /// sink answered `fatal` for, ends where that version ended (`rest`).
    fn planned_to(&mut self, sink: SinkId, ranges: &[Range], rest: Option<&[Range]>, bugs: LetterBugs) {
        if bugs.split_loses_rest {
            return;
        }
        for r in ranges {
            self.planned.insert((sink, r.key), r.to);
        }
        for r in rest.unwrap_or_default() {
            self.cap.insert((sink, r.key), r.to);
        }
    }

    /// Splits decided, and versions from before a split found held.
    pub(super) fn split_counts(&self) -> (u64, u64) {
        (self.splits, self.held_before_split)
    }

    /// No batch planned or out.
    pub(super) fn idle(&self) -> bool {
        self.slots.values().all(|s| matches!(s, Slot::Idle))
    }
}
