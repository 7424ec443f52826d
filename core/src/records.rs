//! The records sinks still need: every committed source batch that some sink
//! has not acknowledged, by partition, in position order. Each batch is
//! known by where its group lies in the WAL; its records are also kept in
//! memory while the cache has room (`Limits::record_cache_bytes`), and
//! otherwise read back from the WAL when a compaction needs them. Segments
//! are immutable once committed, and the deletion rule keeps every segment
//! that holds a record some sink has not acknowledged.

use crate::ids::*;
use crate::io::Records;
use crate::wal::{Counted, GroupPlace, Range, Record};
use std::collections::{BTreeMap, VecDeque};

/// One committed source batch, held until every sink has acknowledged it.
#[derive(Clone, Debug)]
struct Held {
    place: GroupPlace,
    /// The position of its first record as committed (how a read-back
    /// finds it), and of its first and last record still held.
    origin: Position,
    first: Position,
    last: Position,
    count: u64,
    bytes: u64,
    /// In memory, or `None`: only in the WAL.
    records: Option<VecDeque<Record>>,
}

/// A held batch as a stop record keeps it: where it lies and what of it is
/// still held, without its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldPlace {
    pub key: PartitionKey,
    pub place: GroupPlace,
    pub origin: Position,
    pub first: Position,
    pub last: Position,
    pub count: u64,
    pub bytes: u64,
}

/// Records read back from the WAL for one compaction: per partition and
/// the position of their batch's first record as committed, the records
/// inside the plan's range.
pub type ReadBack = BTreeMap<(PartitionKey, Position), Records>;

#[derive(Clone, Debug)]
pub struct RecordStore {
    parts: BTreeMap<PartitionKey, VecDeque<Held>>,
    /// Record bytes in memory, and the bound they stay under.
    cached: u64,
    cache_max: u64,
    /// A batch did not fit since the cache last made room.
    spilled: bool,
    /// Every record held, in memory or not: count and bytes.
    count: u64,
    bytes: u64,
}

impl Default for RecordStore {
    fn default() -> Self {
        RecordStore::new(u64::MAX)
    }
}

impl RecordStore {
    pub fn new(cache_max: u64) -> RecordStore {
        RecordStore { parts: BTreeMap::new(), cached: 0, cache_max, spilled: false, count: 0, bytes: 0 }
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

    /// The bound on record bytes in memory.
    pub fn cache_max(&self) -> u64 {
        self.cache_max
    }

    /// Record bytes in memory.
    pub fn cached_bytes(&self) -> u64 {
        self.cached
    }

    /// A committed batch of `key` from the group at `place`. Its records
    /// stay in memory if the cache has room for all of them.
    pub fn push(&mut self, key: PartitionKey, place: GroupPlace, records: Vec<Record>) {
        let (Some(first), Some(last)) = (records.first(), records.last()) else { return };
        let (first, last) = (first.position, last.position);
        let bytes: u64 = records.iter().map(|r| r.bytes.len() as u64).sum();
        let count = records.len() as u64;
        self.count += count;
        self.bytes += bytes;
        let fits = self.cached.saturating_add(bytes) <= self.cache_max;
        if fits {
            self.cached += bytes;
        }
        self.spilled |= !fits;
        let records = fits.then(|| records.into());
        self.parts.entry(key).or_default().push_back(Held { place, origin: first, first, last, count, bytes, records });
    }

    /// Every batch held, by where it lies: what a stop record keeps.
    pub fn held(&self) -> Vec<HeldPlace> {
        let mut out = Vec::with_capacity(self.parts.values().map(VecDeque::len).sum());
        for (key, part) in &self.parts {
            out.extend(part.iter().map(|h| HeldPlace {
                key: *key,
                place: h.place,
                origin: h.origin,
                first: h.first,
                last: h.last,
                count: h.count,
                bytes: h.bytes,
            }));
        }
        out
    }

    /// The batches a stop record names, held only in the WAL (their records
    /// come back through the read-back path, checked there).
    pub fn from_places(places: Vec<HeldPlace>, cache_max: u64) -> RecordStore {
        let mut store = RecordStore::new(cache_max);
        for h in places {
            (store.count, store.bytes) = (store.count + h.count, store.bytes + h.bytes);
            let held = Held {
                place: h.place,
                origin: h.origin,
                first: h.first,
                last: h.last,
                count: h.count,
                bytes: h.bytes,
                records: None,
            };
            store.parts.entry(h.key).or_default().push_back(held);
        }
        store
    }

    /// A committed batch read counted (`RecordMode::Counted`): held only in
    /// the WAL.
    pub fn push_counted(&mut self, key: PartitionKey, place: GroupPlace, c: Counted) {
        if c.count == 0 {
            return;
        }
        (self.count, self.bytes) = (self.count + c.count, self.bytes + c.bytes);
        let held = Held {
            place,
            origin: c.first,
            first: c.first,
            last: c.last,
            count: c.count,
            bytes: c.bytes,
            records: None,
        };
        self.parts.entry(key).or_default().push_back(held);
    }

    /// Whether a batch pushed now may stay in memory: none has been left
    /// out since the cache last made room.
    pub fn has_room(&self) -> bool {
        !self.spilled && self.cached < self.cache_max
    }

    /// Keeps at most `cache_max` bytes in memory from now on, dropping the
    /// newest batches' records first (the oldest are compacted next).
    pub fn set_cache_max(&mut self, cache_max: u64) {
        self.cache_max = cache_max;
        self.spilled = false;
        let mut cached: Vec<(GroupPlace, PartitionKey, Position)> = Vec::new();
        for (key, part) in &self.parts {
            cached.extend(part.iter().filter(|h| h.records.is_some()).map(|h| (h.place, *key, h.first)));
        }
        cached.sort();
        while self.cached > self.cache_max {
            let (_, key, first) = cached.pop().expect("cached bytes are in some batch");
            let part = self.parts.get_mut(&key).expect("listed above");
            let held = part.iter_mut().find(|h| h.first == first).expect("listed above");
            let records = held.records.take().expect("listed as cached");
            self.cached -= records.iter().map(|r| r.bytes.len() as u64).sum::<u64>();
        }
    }

    /// Drops the records of `key` below `below`: whole batches, and the
    /// front of a batch in memory.
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
    /// at most `budget` takes, and the position it ends at. A batch only in
    /// the WAL counts whole (all its records, even those below `from`); it
    /// goes in whole when nothing came before it, so every range moves on.
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
    /// in LSN order, each once.
    pub fn places(&self, ranges: &[Range]) -> Vec<GroupPlace> {
        let mut places: Vec<GroupPlace> = ranges
            .iter()
            .flat_map(|r| self.overlapping(r.key, r.from, r.to))
            .filter(|h| h.records.is_none())
            .map(|h| h.place)
            .collect();
        places.sort();
        places.dedup();
        places
    }

    /// The bytes of every record in `ranges`, in order: from memory, or from
    /// what was read back (already cut to the ranges). `Err` names a batch
    /// the read-back lacks.
    pub fn gather(&self, ranges: &[Range], read: &ReadBack) -> Result<Records, GroupPlace> {
        let mut out = Records::default();
        for r in ranges {
            for held in self.overlapping(r.key, r.from, r.to) {
                match &held.records {
                    Some(records) => {
                        for rec in records.iter().filter(|rec| rec.position >= r.from && rec.position < r.to) {
                            out.push(&rec.bytes);
                        }
                    }
                    None => out.extend_from(read.get(&(r.key, held.origin)).ok_or(held.place)?),
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

    fn place(lsn: u64) -> GroupPlace {
        GroupPlace { lsn: Lsn(lsn), segment: SegmentId(1), offset: 100 * lsn, len: 50 }
    }

    fn batch(positions: std::ops::Range<u64>) -> Vec<Record> {
        positions.map(|p| Record { position: Position(p), bytes: vec![p as u8; 10] }).collect()
    }

    fn range(from: u64, to: u64) -> Range {
        Range { key: KEY, from: Position(from), to: Position(to) }
    }

    #[test]
    fn batches_past_the_cache_are_only_placed_and_read_back() {
        let mut s = RecordStore::new(30);
        s.push(KEY, place(1), batch(0..2)); // 20 bytes: cached
        s.push(KEY, place(2), batch(2..4)); // would make 40: WAL only
        s.push(KEY, place(3), batch(4..5)); // 30, the bound: cached
        assert_eq!((s.len(), s.bytes(), s.cached_bytes()), (5, 50, 30));
        assert_eq!(s.places(&[range(0, 2)]), vec![]);
        assert_eq!(s.places(&[range(1, 5)]), vec![place(2)]);
        assert_eq!(s.gather(&[range(1, 5)], &ReadBack::new()), Err(place(2)));
        let read = ReadBack::from([((KEY, Position(2)), [[2u8; 10], [3; 10]].iter().map(|r| &r[..]).collect())]);
        let got = s.gather(&[range(1, 5)], &read).unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![&[1u8; 10][..], &[2; 10], &[3; 10], &[4; 10]]);
    }

    #[test]
    fn take_counts_records_and_whole_batches_in_the_wal() {
        let mut s = RecordStore::new(20);
        s.push(KEY, place(1), batch(0..2));
        s.push(KEY, place(2), batch(2..5));
        s.push(KEY, place(3), batch(5..6));
        assert_eq!(s.take(KEY, Position(0), Position(9), 1), (1, Position(1)));
        // A batch in the WAL goes in whole or waits for the next plan...
        assert_eq!(s.take(KEY, Position(0), Position(9), 3), (2, Position(2)));
        // ...unless it comes first.
        assert_eq!(s.take(KEY, Position(2), Position(9), 1), (3, Position(5)));
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
        s.set_cache_max(25);
        assert_eq!((s.len(), s.cached_bytes()), (4, 20));
        assert_eq!(s.places(&[range(0, 9)]), vec![place(2)]);
        s.prune(KEY, Position(4));
        assert_eq!((s.len(), s.bytes(), s.cached_bytes()), (2, 20, 0));
        s.prune(KEY, Position(5));
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }
}
