//! What the committed WAL says, folded into maps. One `apply` serves both the
//! live engine (after a group commits) and recovery (for every admitted
//! group), so the two can never disagree about what a frame means.

use crate::ids::*;
pub use crate::wal::PartitionState;
use crate::wal::{
    BatchSkipped, Breaker, CompactionPlan, Frame, LetterState, Names, Range, Refusal, SchemaDecision, Settled, Skipped,
    Snapshot, Split, Tail, WindowEnd, WindowPart, WindowState,
};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommittedState {
    pub partitions: BTreeMap<PartitionKey, PartitionState>,
    /// Compacted-through position each sink has acknowledged, per partition.
    pub acked: BTreeMap<(SinkId, PartitionKey), Position>,
    pub next_seq: BTreeMap<(SinkId, StreamId), CompactionSeq>,
    pub schemas: BTreeMap<StreamId, u64>,
    /// Planned and committed, not yet recorded as done.
    pub open: BTreeMap<(SinkId, StreamId), CompactionPlan>,
    /// The names the last committed snapshot carried.
    pub names: Names,
    /// Clustered `--once`: the terminal entry's LSN, while no source batch
    /// has committed after it, and the LSN of the entry that says every
    /// member had learnt of it.
    pub finished: Option<Lsn>,
    pub all_finished: Option<Lsn>,
    /// The splits committed for each open plan, in order (all before its
    /// first refusal).
    pub splits: BTreeMap<(SinkId, StreamId), Vec<Split>>,
    /// The refusals committed for each open plan, in order.
    pub refusals: BTreeMap<(SinkId, StreamId), Vec<Refusal>>,
    /// Which attempt the sink holds, for open plans with refusals, once
    /// known.
    pub settled: BTreeMap<(SinkId, StreamId), Settled>,
    /// The next dead-letter batch number per (sink, stream).
    pub next_letters: BTreeMap<(SinkId, StreamId), CompactionSeq>,
    /// Records decided and refused, for the dead-letter breaker.
    pub breaker: Breaker,
    /// Each source's open window: its provisional batches so far, by
    /// partition (section 22).
    pub windows: BTreeMap<SourceId, BTreeMap<u32, WindowPart>>,
    /// Each partition's tail: its last records at one resume key, from
    /// the last window that closed with records of it.
    pub tails: BTreeMap<PartitionKey, Tail>,
    /// Void windows some sink has not passed, per partition: from, to. A
    /// sink whose acknowledged position reaches a void window's start moves
    /// past it (nothing there is ever delivered).
    pub voids: BTreeMap<PartitionKey, BTreeMap<Position, Position>>,
}

impl CommittedState {
    /// Folds one committed frame in.
    pub fn apply(&mut self, lsn: Lsn, frame: &Frame) {
        match frame {
            Frame::SourceBatch(b) if b.provisional => {
                let from = self.partitions.get(&b.key).map_or(Position(0), |p| p.position);
                let part = self.windows.entry(b.key.source).or_default().entry(b.key.partition).or_insert(WindowPart {
                    partition: b.key.partition,
                    stream: b.stream,
                    from,
                    to: from,
                    records: 0,
                });
                assert_eq!(part.stream, b.stream, "a window's partition keeps its stream");
                part.to = b.end;
                part.records += b.count();
                self.finished = None;
                self.all_finished = None;
            }
            Frame::SourceBatch(b) => {
                assert!(!self.windows.contains_key(&b.key.source), "a source with an open window sends only to it");
                let p = self.partitions.entry(b.key).or_insert(PartitionState {
                    stream: b.stream,
                    position: Position(0),
                    lsn,
                    records: 0,
                    checkpoint: None,
                });
                p.position = b.end;
                p.lsn = lsn;
                p.records += b.count();
                p.checkpoint.clone_from(&b.checkpoint);
                self.finished = None;
                self.all_finished = None;
            }
            Frame::SchemaDecision(d) => {
                self.schemas.insert(d.stream, d.fingerprint);
            }
            Frame::CompactionPlanned(plan) => {
                self.next_seq.insert((plan.sink, plan.stream), CompactionSeq(plan.seq.0 + 1));
                self.open.insert((plan.sink, plan.stream), plan.clone());
            }
            Frame::CompactionDone(done) => {
                let slot = (done.sink, done.stream);
                let held = self.settled.get(&slot).map(|x| x.held).or_else(|| self.attempt(slot));
                assert_eq!(held, Some(done.id), "compaction-done names the attempt the sink holds");
                let ranges = self.ranges_of(slot, done.id).to_vec();
                let plan = self.open.remove(&slot).expect("an attempt is of an open plan");
                self.splits.remove(&slot);
                let refusals = self.refusals.remove(&slot).unwrap_or_default();
                let settled = self.settled.remove(&slot);
                let standing = settled.as_ref().map_or(&[][..], |x| x.standing(&refusals));
                let quarantined = settled.as_ref().map_or(0, |x| x.quarantined);
                let standing = standing.iter().map(|r| r.records.len() as u64).sum::<u64>() + quarantined;
                if let Some(n) = done.records {
                    self.breaker.decide(n, standing);
                }
                for r in &ranges {
                    self.acked.insert((plan.sink, r.key), r.to);
                    self.pass_voids(plan.sink, r.key);
                }
            }
            Frame::Split(x) => {
                let slot = (x.sink, x.stream);
                assert_eq!(self.attempt(slot), Some(x.id), "a split names the open plan's last attempt");
                assert!(self.refusals_of(slot).is_empty(), "no split after a refusal");
                assert!(!self.settled.contains_key(&slot), "no split after the plan settled");
                self.splits.entry(slot).or_default().push(x.clone());
            }
            Frame::Refused(r) => {
                let slot = (r.sink, r.stream);
                assert_eq!(self.attempt(slot), Some(r.id), "a refusal names the open plan's last attempt");
                assert!(!self.settled.contains_key(&slot), "no refusal after the plan settled");
                self.refusals.entry(slot).or_default().push(r.clone());
            }
            Frame::Settled(x) => {
                let slot = (x.sink, x.stream);
                assert!(self.attempts(slot).contains(&x.held), "the sink holds an attempt of the open plan");
                if let Some(letters) = x.letters {
                    self.next_letters.insert(slot, CompactionSeq(letters.0 + 1));
                }
                self.settled.insert(slot, x.clone());
            }
            Frame::Snapshot(s) => self.restore(s),
            Frame::Finished => {
                self.finished = Some(lsn);
                self.all_finished = None;
            }
            Frame::AllFinished => self.all_finished = self.finished.map(|_| lsn),
            Frame::Skipped(k) => self.skip(lsn, k),
            Frame::BatchSkipped(k) => self.skip_batch(k),
            Frame::Window(x) => self.end_window(lsn, x),
            Frame::Seal | Frame::Commit(_) | Frame::Fence | Frame::Membership(_) => {}
        }
    }

    /// A source's open window ends: closed, its partitions move to their
    /// ends with the closing checkpoint and their tails are replaced; void,
    /// they move there as they were (no position is used twice), and so
    /// does every sink that had delivered everything before it.
    fn end_window(&mut self, lsn: Lsn, x: &WindowEnd) {
        let open = self.windows.remove(&x.source).unwrap_or_default();
        assert!(open.values().copied().eq(x.parts.iter().copied()), "a window's end names its open window's parts");
        let sinks = self.names.sinks.len() as u16;
        for part in &x.parts {
            let key = PartitionKey { source: x.source, partition: part.partition };
            let fresh = PartitionState { stream: part.stream, position: part.from, lsn, records: 0, checkpoint: None };
            let p = self.partitions.entry(key).or_insert(fresh);
            assert_eq!(p.position, part.from, "a window starts where its partition stood");
            (p.position, p.lsn) = (part.to, lsn);
            if x.closed {
                p.records += part.records;
                p.checkpoint.clone_from(&x.checkpoint);
            } else if part.from < part.to {
                self.voids.entry(key).or_default().insert(part.from, part.to);
                for sink in (0..sinks).map(SinkId) {
                    self.pass_voids(sink, key);
                }
            }
        }
        for t in &x.tails {
            let key = PartitionKey { source: x.source, partition: t.partition };
            match t.digests.is_empty() {
                true => self.tails.remove(&key),
                false => self.tails.insert(key, t.clone()),
            };
        }
        self.finished = None;
        self.all_finished = None;
    }

    /// A sink's acknowledged position of `key` moves past every void window
    /// that starts there; void windows every sink passed are forgotten.
    fn pass_voids(&mut self, sink: SinkId, key: PartitionKey) {
        let Some(voids) = self.voids.get(&key) else { return };
        let mut at = self.acked(sink, key);
        while let Some(&to) = voids.get(&at) {
            at = to;
        }
        self.acked.insert((sink, key), at);
        let sinks = self.names.sinks.len() as u16;
        let floor = (0..sinks).map(|s| self.acked(SinkId(s), key)).min().unwrap_or_default();
        let voids = self.voids.get_mut(&key).expect("looked up above");
        voids.retain(|_, to| *to > floor);
        if voids.is_empty() {
            self.voids.remove(&key);
        }
    }

    /// Where partition `key` resumes: past its source's open window if it
    /// has records there (a restart voids the window: section 22).
    pub fn resume_position(&self, key: PartitionKey) -> Position {
        let open = self.windows.get(&key.source).and_then(|w| w.get(&key.partition)).map(|part| part.to);
        open.unwrap_or_else(|| self.partitions.get(&key).map_or(Position(0), |p| p.position))
    }

    /// The void end of `source`'s open window, if it has one.
    pub fn void_window(&self, source: SourceId) -> Option<WindowEnd> {
        let parts = self.windows.get(&source)?.values().copied().collect();
        Some(WindowEnd { source, checkpoint: None, closed: false, parts, tails: Vec::new() })
    }

    /// An operator gave up an open plan: it is done, its refusals with it,
    /// and its sink's acknowledged positions move past its ranges.
    fn skip_batch(&mut self, k: &BatchSkipped) {
        let slot = (k.sink, k.stream);
        let ranges = self.ranges_of(slot, self.attempt(slot).expect("a batch skip names the open plan")).to_vec();
        let plan = self.open.remove(&slot).expect("a batch skip names the open plan");
        assert_eq!((plan.seq, plan.id), (k.seq, k.id), "a batch skip names the open plan");
        assert!(!self.settled.contains_key(&slot), "a settled plan is not given up");
        self.refusals.remove(&slot);
        self.splits.remove(&slot);
        for r in &ranges {
            self.acked.insert((plan.sink, r.key), r.to);
            self.pass_voids(plan.sink, r.key);
        }
    }

    /// An operator's skip: where the partition is at its start, it moves
    /// on past it, and so does every sink that had delivered everything
    /// before it. Elsewhere the batch that passes over it does that.
    fn skip(&mut self, lsn: Lsn, k: &Skipped) {
        if k.at == Position(0) && !self.partitions.contains_key(&k.key) {
            let fresh = PartitionState { stream: k.stream, position: k.at, lsn, records: 0, checkpoint: None };
            self.partitions.insert(k.key, fresh);
        }
        let Some(p) = self.partitions.get_mut(&k.key).filter(|p| p.position == k.at) else { return };
        p.position = k.next;
        p.lsn = lsn;
        for sink in (0..self.names.sinks.len() as u16).map(SinkId) {
            if self.acked(sink, k.key) == k.at {
                self.acked.insert((sink, k.key), k.next);
            }
        }
        self.finished = None;
        self.all_finished = None;
    }

    /// Everything a snapshot frame carries. `drop_frontier` is the planted
    /// bug `snapshot-drops-frontier`.
    pub fn snapshot(&self, drop_frontier: bool, names: &Names) -> Snapshot {
        Snapshot {
            names: names.clone(),
            partitions: self.partitions.iter().map(|(key, p)| (*key, p.clone())).collect(),
            acked: if drop_frontier {
                Vec::new()
            } else {
                self.acked.iter().map(|(&(sink, key), &pos)| (sink, key, pos)).collect()
            },
            next_seq: self.next_seq.iter().map(|(&(sink, stream), &seq)| (sink, stream, seq)).collect(),
            schemas: self
                .schemas
                .iter()
                .map(|(&stream, &fingerprint)| SchemaDecision { stream, fingerprint })
                .collect(),
            open: self.open.values().cloned().collect(),
            finished: self.finished,
            all_finished: self.all_finished,
            letters: Box::new(LetterState {
                next_letters: self.next_letters.iter().map(|(&(sink, stream), &seq)| (sink, stream, seq)).collect(),
                refusals: self.refusals.values().flatten().cloned().collect(),
                settled: self.settled.values().cloned().collect(),
                breaker: self.breaker.clone(),
                splits: self.splits.values().flatten().cloned().collect(),
            }),
            windows: Box::new(WindowState {
                open: self.windows.iter().map(|(&source, parts)| (source, parts.values().copied().collect())).collect(),
                tails: self.tails.iter().map(|(key, t)| (key.source, t.clone())).collect(),
                voids: self.voids.iter().flat_map(|(key, v)| v.iter().map(|(f, t)| (*key, *f, *t))).collect(),
            }),
        }
    }

    /// The state a snapshot carries, exactly (a stop record's round trip).
    pub fn from_snapshot(s: &Snapshot) -> CommittedState {
        let mut state = CommittedState::default();
        state.restore(s);
        state
    }

    fn restore(&mut self, s: &Snapshot) {
        self.partitions = s.partitions.iter().cloned().collect();
        self.acked = s.acked.iter().map(|&(sink, key, pos)| ((sink, key), pos)).collect();
        self.next_seq = s.next_seq.iter().map(|&(sink, stream, seq)| ((sink, stream), seq)).collect();
        self.schemas = s.schemas.iter().map(|d| (d.stream, d.fingerprint)).collect();
        self.open = s.open.iter().map(|p| ((p.sink, p.stream), p.clone())).collect();
        self.names = s.names.clone();
        self.finished = s.finished;
        self.all_finished = s.all_finished;
        let l = &s.letters;
        self.next_letters = l.next_letters.iter().map(|&(sink, stream, seq)| ((sink, stream), seq)).collect();
        self.refusals = BTreeMap::new();
        for r in &l.refusals {
            self.refusals.entry((r.sink, r.stream)).or_default().push(r.clone());
        }
        self.splits = BTreeMap::new();
        for x in &l.splits {
            self.splits.entry((x.sink, x.stream)).or_default().push(x.clone());
        }
        self.settled = l.settled.iter().map(|x| ((x.sink, x.stream), x.clone())).collect();
        self.breaker = l.breaker.clone();
        let w = &s.windows;
        self.windows =
            w.open.iter().map(|(source, parts)| (*source, parts.iter().map(|p| (p.partition, *p)).collect())).collect();
        self.tails = w
            .tails
            .iter()
            .map(|(source, t)| (PartitionKey { source: *source, partition: t.partition }, t.clone()))
            .collect();
        self.voids = BTreeMap::new();
        for (key, from, to) in &w.voids {
            self.voids.entry(*key).or_default().insert(*from, *to);
        }
    }

    /// Every attempt of the open plan of `slot`, oldest first: its own id,
    /// then the `then` of each split, then that of each refusal.
    pub fn attempts(&self, slot: (SinkId, StreamId)) -> Vec<CompactionId> {
        let Some(plan) = self.open.get(&slot) else { return Vec::new() };
        let splits = self.splits_of(slot).iter().map(|x| x.then);
        std::iter::once(plan.id).chain(splits).chain(self.refusals_of(slot).iter().map(|r| r.then)).collect()
    }

    /// The open plan's last attempt: its own id until it is split or a
    /// sink refuses records of it, then the `then` of the last of those.
    pub fn attempt(&self, slot: (SinkId, StreamId)) -> Option<CompactionId> {
        let plan = self.open.get(&slot)?;
        let split = self.splits_of(slot).last().map(|x| x.then);
        Some(self.refusals_of(slot).last().map(|r| r.then).or(split).unwrap_or(plan.id))
    }

    /// The splits committed for the open plan of `slot`.
    pub fn splits_of(&self, slot: (SinkId, StreamId)) -> &[Split] {
        self.splits.get(&slot).map_or(&[], Vec::as_slice)
    }

    /// The ranges attempt `id` of the open plan of `slot` covers.
    pub fn ranges_of(&self, slot: (SinkId, StreamId), id: CompactionId) -> &[Range] {
        let plan = self.open.get(&slot).expect("an attempt of an open plan");
        let index = self.attempts(slot).iter().position(|&a| a == id).expect("an attempt of the open plan");
        attempt_ranges(plan, self.splits_of(slot), index)
    }

    /// The refusals committed for the open plan of `slot`.
    pub fn refusals_of(&self, slot: (SinkId, StreamId)) -> &[Refusal] {
        self.refusals.get(&slot).map_or(&[], Vec::as_slice)
    }

    pub fn acked(&self, sink: SinkId, key: PartitionKey) -> Position {
        self.acked.get(&(sink, key)).copied().unwrap_or_default()
    }

    /// Where the next plan for (sink, partition) starts: past the acknowledged
    /// position and past any open plan.
    pub fn planned_through(&self, sink: SinkId, key: PartitionKey) -> Position {
        let stream = self.partitions.get(&key).map(|p| p.stream);
        let open = stream.filter(|&s| self.open.contains_key(&(sink, s))).and_then(|s| {
            let slot = (sink, s);
            let ranges = self.ranges_of(slot, self.attempt(slot).expect("an open plan"));
            ranges.iter().find(|r| r.key == key).map(|r| r.to)
        });
        self.acked(sink, key).max(open.unwrap_or_default())
    }
}

/// The ranges the attempt at `index` of `plan` covers (attempts by index:
/// the plan's own, then each split's, then each refusal's): the plan's,
/// cut by the splits before it; a refusal keeps its version's ranges.
pub fn attempt_ranges<'a>(plan: &'a CompactionPlan, splits: &'a [Split], index: usize) -> &'a [Range] {
    match index.min(splits.len()).checked_sub(1) {
        None => &plan.ranges,
        Some(i) => &splits[i].ranges,
    }
}
