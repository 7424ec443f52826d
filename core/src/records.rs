//! The records sinks still need: every committed source batch that some sink
//! has not acknowledged, by partition, in position order. Each batch is
//! known by where its group lies in the WAL; its records are also kept in
//! memory while the cache has room (`Limits::record_cache_bytes`), and
//! otherwise read back from the WAL when a compaction needs them. Segments
//! are immutable once committed, and the deletion rule keeps every segment
//! that holds a record some sink has not acknowledged.

use crate::ids::*;
use crate::io::Records;
use crate::wal::{Counted, GroupPlace, GroupSpan, Range, Record};
use std::collections::{BTreeMap, VecDeque};

/// Batches held only in the WAL fold into runs whose groups start within
/// one block of this many bytes of their segment: what one read-back asks
/// for at most (the groups between are read too), and what keeps the
/// store's size a fraction of the WAL's whatever the batches' size.
pub const RUN_BLOCK_BYTES: u64 = 4 << 20;

/// How much the store keeps, and how it folds what it does not keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLimits {
    /// Record bytes in memory at most (`Limits::record_cache_bytes`).
    pub cache_bytes: u64,
    /// Records in one run at most: a compaction takes a run whole, so
    /// this is the destination batch's bound (`Limits::compaction_records_max`).
    pub run_records: u64,
}

impl RecordLimits {
    /// No bound: everything in memory (the store an engine starts with,
    /// replaced by the one recovery rebuilds; tests).
    pub const UNBOUNDED: RecordLimits = RecordLimits { cache_bytes: u64::MAX, run_records: u64::MAX };
}

/// Committed source batches of one partition, held until every sink has
/// acknowledged them: one batch (in memory or not), or a run of
/// consecutive batches held only in the WAL.
#[derive(Clone, Debug)]
struct Held {
    /// The groups its records lie in: one, or for a run the consecutive
    /// groups of one segment from its first batch's to its last's.
    span: GroupSpan,
    /// The position of its first record as committed (how a read-back
    /// finds it), and of its first and last record still held.
    origin: Position,
    first: Position,
    last: Position,
    count: u64,
    bytes: u64,
    /// In memory, or `None`: only in the WAL.
    records: Option<VecDeque<Record>>,
    /// Of an open window (section 22): a run joins only batches of its
    /// own kind, so a void window's batches can be dropped whole.
    provisional: bool,
    /// No batch joins it: a void window's records lay after it, and a run
    /// never spans them.
    sealed: bool,
}

/// What a stop record keeps of a batch or run held: where it lies and what
/// of it is still held, without its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldPlace {
    pub key: PartitionKey,
    pub span: GroupSpan,
    pub origin: Position,
    pub first: Position,
    pub last: Position,
    pub count: u64,
    pub bytes: u64,
}

/// Records read back from the WAL for one compaction: per partition and
/// the position of their batch's first record as committed, the records
/// inside the plan's range.
pub type ReadBack = BTreeMap<(PartitionKey, Position), Kept>;

/// Records of one committed batch read back: their positions and bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub positions: Vec<Position>,
    pub records: Records,
}

impl Kept {
    pub fn push(&mut self, position: Position, record: &[u8]) {
        self.positions.push(position);
        self.records.push(record);
    }
}

/// A destination batch's records in batch order, and where each is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gathered {
    pub records: Records,
    pub places: Vec<(PartitionKey, Position)>,
}

#[derive(Clone, Debug)]
pub struct RecordStore {
    parts: BTreeMap<PartitionKey, VecDeque<Held>>,
    limits: RecordLimits,
    /// Record bytes in memory (at most `limits.cache_bytes`).
    cached: u64,
    /// A batch did not fit since the cache last made room.
    spilled: bool,
    /// Every record held, in memory or not: count and bytes.
    count: u64,
    bytes: u64,
}

impl Default for RecordStore {
    fn default() -> Self {
        RecordStore::new(RecordLimits::UNBOUNDED)
    }
}

impl RecordStore {
    pub fn new(limits: RecordLimits) -> RecordStore {
        RecordStore { parts: BTreeMap::new(), limits, cached: 0, spilled: false, count: 0, bytes: 0 }
    }

    /// Bytes of every record held, in memory or only in the WAL.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn limits(&self) -> RecordLimits {
        self.limits
    }

    /// Record bytes in memory.
    pub fn cached_bytes(&self) -> u64 {
        self.cached
    }

    /// Batches and runs held: how many entries the store keeps.
    pub fn entries(&self) -> usize {
        self.parts.values().map(VecDeque::len).sum()
    }

    /// A committed batch of `key` from the group at `place`. Its records
    /// stay in memory if the cache has room for all of them.
    pub fn push(&mut self, key: PartitionKey, place: GroupPlace, records: Vec<Record>) {
        self.push_as(key, place, records, false)
    }

    /// A committed batch of an open window (section 22): held like any
    /// other, never in a run with batches outside its window.
    pub fn push_provisional(&mut self, key: PartitionKey, place: GroupPlace, records: Vec<Record>) {
        self.push_as(key, place, records, true)
    }

    fn push_as(&mut self, key: PartitionKey, place: GroupPlace, records: Vec<Record>, provisional: bool) {
        let (Some(first), Some(last)) = (records.first(), records.last()) else { return };
        let (first, last) = (first.position, last.position);
        let bytes: u64 = records.iter().map(|r| r.bytes.len() as u64).sum();
        let count = records.len() as u64;
        if self.cached.saturating_add(bytes) > self.limits.cache_bytes {
            self.spilled = true;
            return self.push_counted_as(key, place, Counted { first, last, count, bytes }, provisional);
        }
        (self.count, self.bytes, self.cached) = (self.count + count, self.bytes + bytes, self.cached + bytes);
        let held = Held {
            span: GroupSpan::of(place),
            origin: first,
            first,
            last,
            count,
            bytes,
            records: Some(records.into()),
            provisional,
            sealed: false,
        };
        self.parts.entry(key).or_default().push_back(held);
    }

    /// A committed batch held only in the WAL (read counted, or past the
    /// cache): it joins the partition's last run when it can.
    pub fn push_counted(&mut self, key: PartitionKey, place: GroupPlace, c: Counted) {
        self.push_counted_as(key, place, c, false)
    }

    /// `push_counted` for a batch of an open window, or not.
    pub fn push_counted_as(&mut self, key: PartitionKey, place: GroupPlace, c: Counted, provisional: bool) {
        if c.count == 0 {
            return;
        }
        (self.count, self.bytes) = (self.count + c.count, self.bytes + c.bytes);
        let part = self.parts.entry(key).or_default();
        let run_records = self.limits.run_records;
        let joins = |h: &&mut Held| {
            h.records.is_none() && !h.sealed && h.provisional == provisional && h.count + c.count <= run_records
        };
        if let Some(run) = part.back_mut().filter(joins) {
            if run.span.reach(place, RUN_BLOCK_BYTES) {
                (run.last, run.count, run.bytes) = (c.last, run.count + c.count, run.bytes + c.bytes);
                return;
            }
        }
        let held = Held {
            span: GroupSpan::of(place),
            origin: c.first,
            first: c.first,
            last: c.last,
            count: c.count,
            bytes: c.bytes,
            records: None,
            provisional,
            sealed: false,
        };
        part.push_back(held);
    }

    /// A source's window ended (section 22): each partition's batches of it
    /// settle (closed) or are dropped (void).
    pub fn window_ended(&mut self, x: &crate::wal::WindowEnd) {
        for part in &x.parts {
            let key = PartitionKey { source: x.source, partition: part.partition };
            match x.closed {
                true => self.settle(key),
                false => self.void(key, part.from),
            }
        }
    }

    /// The window holding `key`'s provisional batches closed: they are
    /// held like any other from now on (a later window's never join them).
    pub fn settle(&mut self, key: PartitionKey) {
        let Some(part) = self.parts.get_mut(&key) else { return };
        for held in part.iter_mut().rev().take_while(|h| h.provisional) {
            held.provisional = false;
        }
    }

    /// The window holding `key`'s records from `from` on is void: they
    /// are dropped (they lie after everything else held of `key`), and no
    /// batch joins what is left.
    pub fn void(&mut self, key: PartitionKey, from: Position) {
        let Some(part) = self.parts.get_mut(&key) else { return };
        while let Some(held) = part.back().filter(|h| h.first >= from) {
            (self.count, self.bytes) = (self.count - held.count, self.bytes - held.bytes);
            if held.records.is_some() {
                self.cached -= held.bytes;
            }
            part.pop_back();
        }
        assert!(part.back().is_none_or(|h| h.last < from), "a window's records lie after the rest");
        if let Some(held) = part.back_mut() {
            held.sealed = true;
        }
    }

    /// Every batch and run held, by where it lies: what a stop record keeps.
    pub fn held(&self) -> Vec<HeldPlace> {
        let mut out = Vec::with_capacity(self.entries());
        for (key, part) in &self.parts {
            out.extend(part.iter().map(|h| HeldPlace {
                key: *key,
                span: h.span,
                origin: h.origin,
                first: h.first,
                last: h.last,
                count: h.count,
                bytes: h.bytes,
            }));
        }
        out
    }

    /// The batches and runs a stop record names, held only in the WAL
    /// (their records come back through the read-back path, checked there).
    pub fn from_places(places: Vec<HeldPlace>, limits: RecordLimits) -> RecordStore {
        let mut store = RecordStore::new(limits);
        for h in places {
            (store.count, store.bytes) = (store.count + h.count, store.bytes + h.bytes);
            let held = Held {
                span: h.span,
                origin: h.origin,
                first: h.first,
                last: h.last,
                count: h.count,
                bytes: h.bytes,
                records: None,
                provisional: false,
                sealed: false,
            };
            store.parts.entry(h.key).or_default().push_back(held);
        }
        store
    }

    /// Whether a batch pushed now may stay in memory: none has been left
    /// out since the cache last made room.
    pub fn has_room(&self) -> bool {
        !self.spilled && self.cached < self.limits.cache_bytes
    }

    /// Holds to `limits` from now on, dropping the newest batches' records
    /// first (the oldest are compacted next).
    pub fn set_limits(&mut self, limits: RecordLimits) {
        self.limits = limits;
        self.spilled = false;
        let mut cached: Vec<(GroupSpan, PartitionKey, Position)> = Vec::new();
        for (key, part) in &self.parts {
            cached.extend(part.iter().filter(|h| h.records.is_some()).map(|h| (h.span, *key, h.first)));
        }
        cached.sort();
        while self.cached > self.limits.cache_bytes {
            let (_, key, first) = cached.pop().expect("cached bytes are in some batch");
            let part = self.parts.get_mut(&key).expect("listed above");
            let held = part.iter_mut().find(|h| h.first == first).expect("listed above");
            let records = held.records.take().expect("listed as cached");
            self.cached -= records.iter().map(|r| r.bytes.len() as u64).sum::<u64>();
        }
    }

    /// Drops the records of `key` below `below`: whole batches and runs,
    /// and the front of a batch in memory.
    pub fn prune(&mut self, key: PartitionKey, below: Position) {
        let Some(part) = self.parts.get_mut(&key) else { return };
        let cached = self.cached;
        while let Some(held) = part.front_mut() {
            if held.first >= below {
                break;
            }
            if held.last < below {
                let held = part.pop_front().expect("front exists");
                self.count -= held.count;
                self.bytes -= held.bytes;
                if held.records.is_some() {
                    self.cached -= held.bytes;
                }
                continue;
            }
            let Some(records) = &mut held.records else { break };
            while records.front().is_some_and(|r| r.position < below) {
                let r = records.pop_front().expect("front exists");
                let n = r.bytes.len() as u64;
                (held.count, held.bytes, self.count, self.bytes, self.cached) =
                    (held.count - 1, held.bytes - n, self.count - 1, self.bytes - n, self.cached - n);
            }
            held.first = records.front().expect("the last record is not below").position;
            break;
        }
        self.spilled &= self.cached == cached;
    }

    fn overlapping(&self, key: PartitionKey, from: Position, to: Position) -> impl Iterator<Item = &Held> {
        let part = self.parts.get(&key);
        let start = part.map_or(0, |p| p.partition_point(|h| h.last < from));
        part.into_iter().flat_map(move |p| p.range(start..)).take_while(move |h| h.first < to)
    }

    /// How many held records of `key` from `from` (below `end`) a batch of
    /// at most `budget` takes, and the position it ends at. A batch or run
    /// only in the WAL counts whole (all its records, even those below
    /// `from`); it goes in whole when nothing came before it, so every
    /// range moves on.
    pub fn take(&self, key: PartitionKey, from: Position, end: Position, budget: usize) -> (usize, Position) {
        let mut n = 0;
        for held in self.overlapping(key, from, end) {
            match &held.records {
                Some(records) => {
                    let start = records.partition_point(|r| r.position < from);
                    for r in records.range(start..).take_while(|r| r.position < end) {
                        if n >= budget {
                            return (n, r.position);
                        }
                        n += 1;
                    }
                }
                None if n > 0 && n + held.count as usize > budget => return (n, held.first),
                None => n += held.count as usize,
            }
        }
        (n, end)
    }

    /// The groups a compaction of `ranges` must read back from the WAL,
    /// in LSN order, each once: spans that share a group are read as one
    /// (a run's groups start within one block, so what is merged stays
    /// within a block and a group).
    pub fn spans(&self, ranges: &[Range]) -> Vec<GroupSpan> {
        let mut spans: Vec<GroupSpan> = ranges
            .iter()
            .flat_map(|r| self.overlapping(r.key, r.from, r.to))
            .filter(|h| h.records.is_none())
            .map(|h| h.span)
            .collect();
        spans.sort();
        let mut merged: Vec<GroupSpan> = Vec::with_capacity(spans.len());
        for span in spans {
            if !merged.last_mut().is_some_and(|last| last.merge(&span)) {
                merged.push(span);
            }
        }
        merged
    }

    /// The bytes of every record in `ranges`, in order: from memory, or from
    /// what was read back (already cut to the ranges). `Err` names a batch
    /// or run the read-back lacks, or of which it holds fewer records than
    /// the run counts where the range takes it whole.
    pub fn gather(&self, ranges: &[Range], read: &ReadBack) -> Result<Gathered, GroupSpan> {
        let mut out = Gathered::default();
        for r in ranges {
            for held in self.overlapping(r.key, r.from, r.to) {
                match &held.records {
                    Some(records) => {
                        for rec in records.iter().filter(|rec| rec.position >= r.from && rec.position < r.to) {
                            out.records.push(&rec.bytes);
                            out.places.push((r.key, rec.position));
                        }
                    }
                    None => {
                        if !read.contains_key(&(r.key, held.origin)) {
                            return Err(held.span);
                        }
                        let mut n = 0;
                        for (_, batch) in read.range((r.key, held.origin)..=(r.key, held.last)) {
                            n += batch.records.len() as u64;
                            out.records.extend_from(&batch.records);
                            out.places.extend(batch.positions.iter().map(|&p| (r.key, p)));
                        }
                        if r.from <= held.first && held.last < r.to && n != held.count {
                            return Err(held.span);
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: PartitionKey = PartitionKey { source: SourceId(0), partition: 0 };
    const OTHER: PartitionKey = PartitionKey { source: SourceId(0), partition: 1 };

    fn limits(cache_bytes: u64, run_records: u64) -> RecordLimits {
        RecordLimits { cache_bytes, run_records }
    }

    /// Groups of 100 bytes tiling segment 1 from offset 100.
    fn place(lsn: u64) -> GroupPlace {
        GroupPlace { lsn: Lsn(lsn), segment: SegmentId(1), offset: 100 * lsn, len: 100 }
    }

    fn span(lsn: u64, last: u64) -> GroupSpan {
        GroupSpan {
            lsn: Lsn(lsn),
            last: Lsn(last),
            segment: SegmentId(1),
            offset: 100 * lsn,
            len: 100 * (last - lsn + 1),
        }
    }

    fn batch(positions: std::ops::Range<u64>) -> Vec<Record> {
        positions.map(|p| Record { position: Position(p), bytes: vec![p as u8; 10] }).collect()
    }

    fn counted(positions: std::ops::Range<u64>) -> Counted {
        let n = positions.end - positions.start;
        Counted { first: Position(positions.start), last: Position(positions.end - 1), count: n, bytes: 10 * n }
    }

    fn range(from: u64, to: u64) -> Range {
        Range { key: KEY, from: Position(from), to: Position(to) }
    }

    fn records(positions: std::ops::Range<u64>) -> Kept {
        let mut kept = Kept::default();
        for p in positions {
            kept.push(Position(p), &[p as u8; 10]);
        }
        kept
    }

    #[test]
    fn batches_past_the_cache_are_only_placed_and_read_back() {
        let mut s = RecordStore::new(limits(30, 100));
        s.push(KEY, place(1), batch(0..2)); // 20 bytes: cached
        s.push(KEY, place(2), batch(2..4)); // would make 40: WAL only
        s.push(KEY, place(3), batch(4..5)); // 30, the bound: cached
        assert_eq!((s.len(), s.bytes(), s.cached_bytes()), (5, 50, 30));
        assert_eq!(s.spans(&[range(0, 2)]), vec![]);
        assert_eq!(s.spans(&[range(1, 5)]), vec![span(2, 2)]);
        assert_eq!(s.gather(&[range(1, 5)], &ReadBack::new()), Err(span(2, 2)));
        let read = ReadBack::from([((KEY, Position(2)), records(2..4))]);
        let got = s.gather(&[range(1, 5)], &read).unwrap();
        assert_eq!(got.records.iter().collect::<Vec<_>>(), vec![&[1u8; 10][..], &[2; 10], &[3; 10], &[4; 10]]);
        assert_eq!(got.places, (1..5).map(|p| (KEY, Position(p))).collect::<Vec<_>>());
    }

    #[test]
    fn batches_only_in_the_wal_fold_into_runs_of_consecutive_groups() {
        let mut s = RecordStore::new(limits(0, 6));
        s.push_counted(KEY, place(1), counted(0..2));
        s.push_counted(KEY, place(3), counted(2..4)); // group 2 holds none of KEY's
        s.push(KEY, place(4), batch(4..6)); // past the cache too
        assert_eq!(s.entries(), 1);
        // At the run's bound of records the next batch starts a run...
        s.push_counted(KEY, place(5), counted(6..7));
        // ...as one in another segment does...
        let elsewhere = GroupPlace { segment: SegmentId(2), ..place(6) };
        s.push_counted(KEY, elsewhere, counted(7..8));
        // ...and one starting in another block of its segment.
        let far = GroupPlace { lsn: Lsn(7), offset: elsewhere.offset + RUN_BLOCK_BYTES, ..elsewhere };
        s.push_counted(KEY, far, counted(8..9));
        assert_eq!((s.entries(), s.len(), s.bytes()), (4, 9, 90));
        let spans = s.spans(&[range(0, 9)]);
        assert_eq!(&spans[..2], &[span(1, 4), span(5, 5)]);
        assert_eq!(spans[2], GroupSpan::of(elsewhere));
        // A batch in memory ends a run: the next starts another.
        let mut s = RecordStore::new(limits(20, 100));
        s.push_counted(KEY, place(1), counted(0..1));
        s.push(KEY, place(2), batch(1..2));
        s.push_counted(KEY, place(3), counted(2..3));
        assert_eq!(s.spans(&[range(0, 9)]), vec![span(1, 1), span(3, 3)]);
        // Two batches of a partition in one group are one run.
        let mut s = RecordStore::new(limits(0, 100));
        s.push_counted(KEY, place(1), counted(0..1));
        s.push_counted(KEY, place(1), counted(1..2));
        assert_eq!((s.entries(), s.spans(&[range(0, 9)])), (1, vec![span(1, 1)]));
    }

    #[test]
    fn a_run_is_gathered_whole_from_what_its_span_gave() {
        let mut s = RecordStore::new(limits(0, 100));
        s.push_counted(KEY, place(1), counted(0..2));
        s.push_counted(KEY, place(2), counted(2..3));
        s.push_counted(KEY, place(3), counted(3..5));
        let all = ReadBack::from([
            ((KEY, Position(0)), records(0..2)),
            ((KEY, Position(2)), records(2..3)),
            ((KEY, Position(3)), records(3..5)),
        ]);
        let got = s.gather(&[range(0, 9)], &all).unwrap();
        assert_eq!(got.records.len(), 5);
        // A batch of the run missing from what was read back is caught.
        let mut short = all.clone();
        short.remove(&(KEY, Position(2)));
        assert_eq!(s.gather(&[range(0, 9)], &short), Err(span(1, 3)));
        // A range that takes only part of the run gets what the read-back
        // kept of it (cut to the range there).
        let cut = ReadBack::from([((KEY, Position(0)), records(1..2)), ((KEY, Position(2)), records(2..3))]);
        assert_eq!(s.gather(&[range(1, 3)], &cut).unwrap().records.len(), 2);
    }

    #[test]
    fn spans_of_partitions_over_the_same_groups_are_read_once() {
        let mut s = RecordStore::new(limits(0, 100));
        for lsn in 1..=4 {
            s.push_counted(KEY, place(lsn), counted(lsn * 10..lsn * 10 + 1));
        }
        for lsn in 3..=6 {
            s.push_counted(OTHER, place(lsn), counted(lsn * 10..lsn * 10 + 1));
        }
        s.push_counted(OTHER, GroupPlace { segment: SegmentId(2), ..place(8) }, counted(80..81));
        let ranges = [range(0, 99), Range { key: OTHER, from: Position(0), to: Position(99) }];
        let spans = s.spans(&ranges);
        assert_eq!(spans[0], span(1, 6));
        assert_eq!(spans.len(), 2);
    }

    #[test]
    fn take_counts_records_and_whole_batches_in_the_wal() {
        let mut s = RecordStore::new(limits(20, 100));
        s.push(KEY, place(1), batch(0..2));
        s.push(KEY, place(2), batch(2..5));
        s.push(KEY, place(3), batch(5..6));
        assert_eq!(s.take(KEY, Position(0), Position(9), 1), (1, Position(1)));
        // A batch in the WAL goes in whole or waits for the next plan...
        assert_eq!(s.take(KEY, Position(0), Position(9), 3), (2, Position(2)));
        // ...unless it comes first.
        assert_eq!(s.take(KEY, Position(2), Position(9), 1), (4, Position(9)));
        assert_eq!(s.take(KEY, Position(0), Position(9), 10), (6, Position(9)));
        assert_eq!(s.take(KEY, Position(6), Position(9), 10), (0, Position(9)));
    }

    #[test]
    fn pruning_frees_memory_and_the_cache_bound_drops_the_newest_first() {
        let mut s = RecordStore::default();
        s.push(KEY, place(1), batch(0..3));
        s.push(KEY, place(2), batch(3..5));
        s.prune(KEY, Position(1));
        assert_eq!((s.len(), s.bytes(), s.cached_bytes()), (4, 40, 40));
        s.set_limits(limits(25, 100));
        assert_eq!((s.len(), s.cached_bytes()), (4, 20));
        assert_eq!(s.spans(&[range(0, 9)]), vec![span(2, 2)]);
        s.prune(KEY, Position(4));
        assert_eq!((s.len(), s.bytes(), s.cached_bytes()), (2, 20, 0));
        s.prune(KEY, Position(5));
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }
}
