//! Simulated sources, sinks and offsets store.
//!
//! Sources produce deterministic records (a pure function of seed, source,
//! partition and position), can replay from any position at or above what
//! they were acked, discard acked data, and re-send from their acked position
//! after a restart when the scenario says so. Sinks keep the ledger every
//! real sink keeps (core's `sink_ledger`). The offsets store applies a write only when its LSN is
//! higher, as the real stores do.

use crate::scenario::{LettersSpec, SourceSpec, TapSpec};
use skippr_core::format::Record;
use skippr_core::ledger::{judge, Digest, Entry, Verdict};
use skippr_core::rules::RecordFault;
use skippr_core::{
    CompactionId, CompactionSeq, Duration, Instant, OffsetEntry, OffsetValue, PartitionKey, Position, Records,
    RefusedIndex, StreamId,
};
use skippr_core::{ResumePoint, SourceBatchIn, Window};
use std::collections::BTreeMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Bytes of the record at `position`: `source: u8 | partition: u8 |
/// position: u32 | payload`, so the checker can tell where any output byte
/// came from and compare it with what the source emitted.
pub fn record_bytes(seed: u64, source: u16, partition: u32, position: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    record_bytes_into(&mut out, seed, source, partition, position);
    out
}

/// `record_bytes`, written into `out` (cleared first).
pub fn record_bytes_into(out: &mut Vec<u8>, seed: u64, source: u16, partition: u32, position: u64) {
    out.clear();
    let mut key = [0u8; 14];
    key[0..2].copy_from_slice(&source.to_le_bytes());
    key[2..6].copy_from_slice(&partition.to_le_bytes());
    key[6..14].copy_from_slice(&position.to_le_bytes());
    let h = xxh3_64_with_seed(&key, seed);
    let len = 8 + (h % 40) as usize;
    // The header, then eight payload bytes per step of a 64-bit LCG, built
    // on the stack and copied once.
    let mut buf = [0u8; 6 + 47 + 8];
    buf[0] = source as u8;
    buf[1] = partition as u8;
    buf[2..6].copy_from_slice(&(position as u32).to_le_bytes());
    let mut x = h;
    let mut at = 6;
    while at < 6 + len {
        x = x.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(0x1405_7b7e_f767_814f);
        buf[at..at + 8].copy_from_slice(&x.to_le_bytes());
        at += 8;
    }
    out.extend_from_slice(&buf[..6 + len]);
}

/// The schema a sim source sends for `stream`: version 1 before the
/// scenario's switch time, version 2 after, so every stream changes schema
/// mid-run (a source re-sending old records after a restart sends them under
/// the new version).
pub fn schema_bytes(stream: u16, version: u8) -> std::sync::Arc<[u8]> {
    format!("{{\"stream\":{stream},\"version\":{version}}}").into_bytes().into()
}

/// The source's opaque checkpoint at `position`.
pub fn checkpoint_bytes(partition: u32, position: u64) -> Vec<u8> {
    let mut c = b"cp".to_vec();
    c.extend_from_slice(&partition.to_le_bytes());
    c.extend_from_slice(&position.to_le_bytes());
    c
}

#[derive(Clone)]
struct Cursor {
    next: u64,
    acked: u64,
}

#[derive(Clone)]
pub struct SimSource {
    pub id: u16,
    seed: u64,
    spec: SourceSpec,
    cursors: Vec<Cursor>,
    turn: usize,
    /// Schemas by stream, before and after `schema_switch`.
    schemas: Vec<[std::sync::Arc<[u8]>; 2]>,
    schema_switch: Instant,
    /// A replay of dead letters: per partition (one per stream), the
    /// records of the letters it sends.
    letters: Option<Vec<Vec<Vec<u8>>>>,
    /// Per mille of records sent broken (`SimSource::broken`).
    broken_permille: u64,
    /// A Singer-like tap's state, when the spec makes it one.
    tap: Option<Tap>,
}

/// A Singer-like tap over a table of rows per partition: row `r`'s bytes
/// are what `record_bytes` gives for position `r` (so the checker knows
/// each row wherever the engine puts it), its replication-key value `r /
/// group`. Positions are the tap's own count, which only grows.
#[derive(Clone)]
struct Tap {
    spec: TapSpec,
    /// Next row to send, and next position, per partition.
    row: Vec<u64>,
    pos: Vec<u64>,
    /// The state the tap last sent: its number and each partition's next
    /// row (its bookmark).
    k: u64,
    bookmark: Vec<u64>,
    /// Rows sent since that state.
    in_window: u64,
    /// The host is told of a start before anything else.
    announce: bool,
    /// Between two syncs: the next one starts then.
    next_sync: Option<Instant>,
    /// Reads so far (each read's dice).
    reads: u64,
}

impl Tap {
    /// Each partition's first row when the tap starts from its bookmarks:
    /// the first row under the bookmark's value (inclusive), or the
    /// bookmark.
    fn resume_rows(&mut self) {
        for (row, &b) in self.row.iter_mut().zip(&self.bookmark) {
            *row = match self.spec.inclusive && b > 0 {
                true => (b - 1) / self.spec.group * self.spec.group,
                false => b,
            };
        }
        self.in_window = 0;
    }
}

/// A tap's checkpoint: its state's number, then each partition's bookmark.
pub fn tap_checkpoint(k: u64, bookmarks: &[u64]) -> Vec<u8> {
    let mut c = b"tap".to_vec();
    c.extend_from_slice(&k.to_le_bytes());
    for b in bookmarks {
        c.extend_from_slice(&b.to_le_bytes());
    }
    c
}

fn read_tap_checkpoint(bytes: &[u8], partitions: usize) -> Option<(u64, Vec<u64>)> {
    let rest = bytes.strip_prefix(b"tap")?;
    if rest.len() != 8 * (partitions + 1) {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(rest[8 * i..8 * i + 8].try_into().expect("eight bytes"));
    Some((word(0), (1..=partitions).map(word).collect()))
}

/// The record a replay of dead letters sends for the letter at `position`
/// of `partition` (the stream's letters in the destination's order): the
/// header every simulated record has, naming the replay's own place, then
/// the refused record (without its header of a replay, if the letter came
/// from one: the daemon sends a letter's record as it was first refused).
pub fn replayed_bytes(out: &mut Vec<u8>, replay: u16, partition: u32, position: u64, letter: &[u8]) {
    out.clear();
    out.push(replay as u8);
    out.push(partition as u8);
    out.extend_from_slice(&(position as u32).to_le_bytes());
    out.extend_from_slice(refused_record(replay, letter));
}

/// The record a dead letter holds, as the source that first sent it sent it.
pub fn refused_record(replay: u16, letter: &[u8]) -> &[u8] {
    match letter.first() {
        Some(&b) if b == replay as u8 && letter.len() >= 6 => &letter[6..],
        _ => letter,
    }
}

impl SimSource {
    pub fn new(seed: u64, id: u16, spec: SourceSpec, streams: u16, schema_switch: Instant) -> SimSource {
        let cursors = spec.partitions.iter().map(|_| Cursor { next: 0, acked: 0 }).collect();
        let schemas = (0..streams).map(|s| [schema_bytes(s, 1), schema_bytes(s, 2)]).collect();
        let tap = spec.tap.clone().map(|t| {
            let n = spec.partitions.len();
            let zeros = vec![0; n];
            Tap {
                spec: t,
                row: zeros.clone(),
                pos: zeros.clone(),
                k: 0,
                bookmark: zeros,
                in_window: 0,
                announce: true,
                next_sync: None,
                reads: 0,
            }
        });
        SimSource { id, seed, spec, cursors, turn: 0, schemas, schema_switch, letters: None, broken_permille: 0, tap }
    }

    /// The source sends `permille` of its records broken: each is named to
    /// the engine as breaking an intake rule, as the daemon's driver names
    /// one that is not JSON.
    pub fn with_broken(mut self, permille: u64) -> SimSource {
        self.broken_permille = permille;
        self
    }

    /// Whether a record is sent broken: a pure function of its bytes, so
    /// the checker knows it too.
    pub fn broken(permille: u64, seed: u64, record: &[u8]) -> bool {
        permille > 0 && xxh3_64_with_seed(record, seed ^ 0x0b40_4e11) % 1000 < permille
    }

    /// A replay, as source `id`, of the dead letters a destination holds:
    /// per stream, each letter's record.
    pub fn replay(id: u16, letters: &[Vec<Vec<u8>>], schema_switch: Instant) -> SimSource {
        let spec = SourceSpec {
            partitions: letters
                .iter()
                .enumerate()
                .map(|(s, l)| crate::scenario::PartitionSpec { stream: s as u16, records: l.len() as u64 })
                .collect(),
            record_interval: Duration::from_micros(1),
            resends: false,
            tap: None,
        };
        let mut source = SimSource::new(0, id, spec, letters.len() as u16, schema_switch);
        source.letters = Some(letters.to_vec());
        source
    }

    /// Resumes at the host's positions, or, for a source that re-sends, at
    /// its own acked position. Data below the acked position is gone.
    pub fn open(&mut self, resume: &[ResumePoint]) {
        if let Some(t) = &mut self.tap {
            // From the newest state the host holds, at its positions.
            let n = t.row.len();
            let newest = resume.iter().filter_map(|r| read_tap_checkpoint(r.checkpoint.as_deref()?, n));
            let (k, bookmark) = newest.max_by_key(|(k, _)| *k).unwrap_or((0, vec![0; n]));
            for (p, pos) in t.pos.iter_mut().enumerate() {
                *pos = resume.iter().find(|r| r.partition == p as u32).map_or(0, |r| r.position.0);
            }
            (t.k, t.bookmark, t.announce, t.next_sync) = (k, bookmark, true, None);
            t.resume_rows();
            return;
        }
        for (p, c) in self.cursors.iter_mut().enumerate() {
            let at = resume.iter().find(|r| r.partition == p as u32).map_or(0, |r| r.position.0);
            c.next = if self.spec.resends { c.acked } else { at.max(c.acked) };
        }
    }

    pub fn acked(&self, partition: u32) -> u64 {
        self.cursors.get(partition as usize).map_or(0, |c| c.acked)
    }

    fn available(&self, p: usize, now: Instant) -> u64 {
        let produced = now.as_micros() / self.spec.record_interval.as_micros().max(1) + 1;
        produced.min(self.spec.partitions[p].records)
    }

    /// Up to `records_max` records from at most two partitions, taking turns.
    pub fn read(&mut self, records_max: u32, now: Instant) -> (Vec<SourceBatchIn>, bool) {
        if self.tap.is_some() {
            return self.read_tap(records_max, now);
        }
        let mut batches = Vec::new();
        let mut budget = records_max as u64;
        let n = self.cursors.len();
        for k in 0..n {
            if budget == 0 || batches.len() == 2 {
                break;
            }
            let p = (self.turn + k) % n;
            let available = self.available(p, now);
            let from = self.cursors[p].next;
            if from >= available {
                continue;
            }
            let to = available.min(from + budget);
            budget -= to - from;
            let partition = p as u32;
            let record = |pos: u64| match &self.letters {
                None => record_bytes(self.seed, self.id, partition, pos),
                Some(letters) => {
                    let mut out = Vec::new();
                    replayed_bytes(&mut out, self.id, partition, pos, &letters[p][pos as usize]);
                    out
                }
            };
            let records: Vec<Record> =
                (from..to).map(|pos| Record { position: Position(pos), bytes: record(pos) }).collect();
            let faults = records
                .iter()
                .filter(|r| Self::broken(self.broken_permille, self.seed, &r.bytes))
                .map(|r| skippr_core::IntakeFault {
                    position: r.position,
                    fault: RecordFault::NotJson("the simulator's source broke it".into()),
                    why: format!("partition {partition} position {} is broken", r.position.0),
                })
                .collect();
            self.cursors[p].next = to;
            batches.push(SourceBatchIn {
                partition,
                stream: StreamId(self.spec.partitions[p].stream),
                records,
                end: Position(to),
                checkpoint: Some(checkpoint_bytes(partition, to)),
                schema: Some(
                    self.schemas[self.spec.partitions[p].stream as usize][(now >= self.schema_switch) as usize].clone(),
                ),
                faults,
                window: skippr_core::Window::None,
                keys: Vec::new(),
            });
        }
        self.turn = (self.turn + 1) % n;
        let exhausted = self.cursors.iter().enumerate().all(|(p, c)| c.next >= self.spec.partitions[p].records);
        (batches, exhausted)
    }

    /// The host says everything below these positions is committed: the
    /// source may drop it for good.
    pub fn ack(&mut self, acks: &[(u32, Position)]) {
        for &(p, pos) in acks {
            let c = &mut self.cursors[p as usize];
            c.acked = c.acked.max(pos.0);
        }
    }

    /// The highest position handed to the host so far in this partition.
    pub fn sent(&self, partition: u32) -> u64 {
        if let Some(t) = &self.tap {
            return t.pos.get(partition as usize).copied().unwrap_or(0);
        }
        self.cursors.get(partition as usize).map_or(0, |c| c.next)
    }

    /// A tap's read: a restart first when it (re)starts, then rows of an
    /// open window as they are available, taking turns, each under its
    /// replication-key value; a state after every `state_every` rows and
    /// at the end of a sync (unless this sync ends without one); a death
    /// mid-window now and then (it starts over from its last state).
    fn read_tap(&mut self, records_max: u32, now: Instant) -> (Vec<SourceBatchIn>, bool) {
        let n = self.spec.partitions.len();
        let available: Vec<u64> = (0..n).map(|p| self.available(p, now)).collect();
        let (seed, id, switch) = (self.seed, self.id, self.schema_switch);
        let records_of: Vec<u64> = self.spec.partitions.iter().map(|p| p.records).collect();
        let streams: Vec<u16> = self.spec.partitions.iter().map(|p| p.stream).collect();
        let broken = self.broken_permille;
        let schema = |stream: u16| Some(self.schemas[stream as usize][(now >= switch) as usize].clone());
        let schemas: Vec<_> = streams.iter().map(|&s| schema(s)).collect();
        let t = self.tap.as_mut().expect("a tap");
        t.reads += 1;
        let empty = |window: Window, checkpoint: Option<Vec<u8>>, end: u64| SourceBatchIn {
            partition: 0,
            stream: StreamId(streams[0]),
            records: Vec::new(),
            end: Position(end),
            checkpoint,
            schema: None,
            faults: Vec::new(),
            window,
            keys: Vec::new(),
        };
        let mut out = Vec::new();
        if let Some(at) = t.next_sync {
            if now < at {
                return (out, false);
            }
            t.next_sync = None;
            t.announce = true;
            t.resume_rows();
        }
        if std::mem::take(&mut t.announce) {
            out.push(empty(Window::Restart, None, t.pos[0]));
        }
        if t.bookmark.iter().zip(&records_of).all(|(b, r)| b >= r) {
            return (out, true);
        }
        let dice = xxh3_64_with_seed(&t.reads.to_le_bytes(), seed ^ (id as u64) ^ 0x7a9);
        if t.in_window > 0 && dice % 1000 < t.spec.dies {
            // Dies mid-window: starts over from its last state.
            t.announce = true;
            t.resume_rows();
            return (out, false);
        }
        let mut budget = records_max as u64;
        let mut closed = false;
        let mut batches: Vec<Option<SourceBatchIn>> = vec![None; n];
        'rows: for k in 0..n {
            let p = (self.turn + k) % n;
            while budget > 0 && t.row[p] < available[p] {
                let row = t.row[p];
                let bytes = record_bytes(seed, id, p as u32, row);
                let b = batches[p].get_or_insert_with(|| SourceBatchIn {
                    partition: p as u32,
                    stream: StreamId(streams[p]),
                    records: Vec::new(),
                    end: Position(t.pos[p]),
                    checkpoint: None,
                    schema: schemas[p].clone(),
                    faults: Vec::new(),
                    window: Window::Open,
                    keys: Vec::new(),
                });
                if Self::broken(broken, seed, &bytes) {
                    b.faults.push(skippr_core::IntakeFault {
                        position: Position(t.pos[p]),
                        fault: RecordFault::NotJson("the simulator's tap broke it".into()),
                        why: format!("partition {p} row {row} is broken"),
                    });
                }
                b.records.push(Record { position: Position(t.pos[p]), bytes });
                b.keys.push(Some(row / t.spec.group));
                t.pos[p] += 1;
                b.end = Position(t.pos[p]);
                t.row[p] += 1;
                t.in_window += 1;
                budget -= 1;
                if t.in_window >= t.spec.state_every {
                    closed = true;
                    break 'rows;
                }
            }
        }
        self.turn = (self.turn + 1) % n;
        out.extend(batches.into_iter().flatten());
        let caught_up = (0..n).all(|p| t.row[p] >= available[p]);
        let ends_sync = !closed && caught_up;
        let final_state = ends_sync && t.in_window > 0 && (dice >> 20) % 1000 >= t.spec.no_final_state;
        if closed || final_state {
            // A bookmark never goes back: after an inclusive start, the
            // rows sent again are below the one the tap started from.
            t.k += 1;
            for (b, &row) in t.bookmark.iter_mut().zip(&t.row) {
                *b = (*b).max(row);
            }
            t.in_window = 0;
            out.push(empty(Window::Close, Some(tap_checkpoint(t.k, &t.bookmark)), t.pos[0]));
        }
        if ends_sync {
            t.next_sync = Some(now + t.spec.interval);
        }
        (out, false)
    }
}

/// The model of a sink: a ledger of the batch held under each (stream,
/// sequence number), judged by core's rule as every real sink judges it
/// (one pipeline of one WAL, so the scope is implied): a new number is
/// applied, the same batch again is `already_applied`, another id or other
/// records under a number is `fatal`.
#[derive(Clone, Default)]
pub struct SimSink {
    held: BTreeMap<(StreamId, CompactionSeq), Entry>,
    /// The highest sequence number applied, per stream.
    highest: BTreeMap<StreamId, CompactionSeq>,
    /// Records refused once (by their first six bytes: source, partition,
    /// position), for a sink that refuses each only the first time.
    refused_once: std::collections::BTreeSet<[u8; 6]>,
    /// Poisoned records seen once, for poison that is fatal only the first
    /// time.
    poisoned_once: std::collections::BTreeSet<[u8; 6]>,
}

impl SimSink {
    /// Whether the ledger holds nothing under this batch's number (what a
    /// real sink looks at first: a batch it holds is a replay, whatever its
    /// records would say now).
    pub fn is_new(&self, stream: StreamId, seq: CompactionSeq) -> bool {
        !self.held.contains_key(&(stream, seq))
    }

    /// The rule's verdict on this batch; a new one is applied.
    pub fn apply(&mut self, id: CompactionId, stream: StreamId, seq: CompactionSeq, records: &Records) -> Verdict {
        let claim = Entry { id, digest: Some(Digest::of_records(records)) };
        let verdict = judge(claim, self.held.get(&(stream, seq)).copied());
        if verdict == Verdict::New {
            self.held.insert((stream, seq), claim);
            let highest = self.highest.entry(stream).or_insert(seq);
            *highest = (*highest).max(seq);
        }
        verdict
    }

    /// The records of a batch this sink refuses, by index, with a reason:
    /// those whose hash falls under the spec's share, every time or only
    /// the first time each is seen. Nothing of a batch with one is applied.
    pub fn refusals(&mut self, spec: &LettersSpec, seed: u64, records: &Records) -> Vec<RefusedIndex> {
        let mut out = Vec::new();
        for (i, r) in records.iter().enumerate() {
            let refused = xxh3_64_with_seed(r, seed ^ 0x5ead_1e77) % 1000 < spec.share_permille;
            let first = r.len() >= 6 && self.refused_once.insert(r[..6].try_into().expect("six bytes"));
            if refused && (spec.always || first) {
                let reason = format!("SIM 22P02: {i}");
                out.push(RefusedIndex { index: i as u32, reason });
            }
        }
        out
    }

    /// Whether a batch holds a record no batch can carry to this sink
    /// (`PoisonSpec`): a pure function of the records.
    pub fn poisoned(permille: u64, seed: u64, records: &Records) -> bool {
        records.iter().any(|r| Self::poison(permille, seed, r))
    }

    /// Whether one record is poisoned.
    pub fn poison(permille: u64, seed: u64, record: &[u8]) -> bool {
        xxh3_64_with_seed(record, seed ^ 0x0090_150a) % 1000 < permille
    }

    /// Whether this sink answers `fatal` for a batch: it holds a poisoned
    /// record, seen for the first time where the poison is fatal only
    /// then (every poisoned record of the batch counts as seen).
    pub fn poison_fatal(&mut self, spec: &crate::scenario::PoisonSpec, seed: u64, records: &Records) -> bool {
        let mut fatal = false;
        for r in records.iter().filter(|r| Self::poison(spec.permille, seed, r)) {
            let first = r.len() >= 6 && self.poisoned_once.insert(r[..6].try_into().expect("six bytes"));
            fatal |= spec.always || first;
        }
        fatal
    }

    /// What the sink can tell the host at recovery.
    pub fn progress(&self) -> Vec<(StreamId, CompactionSeq)> {
        self.highest.iter().map(|(s, q)| (*s, *q)).collect()
    }
}

/// The offsets store: the 24-byte value and the checkpoint beside it.
#[derive(Clone, Default)]
pub struct SimOffsets {
    entries: BTreeMap<PartitionKey, ([u8; 24], Option<Vec<u8>>)>,
    /// The planted bug `offsets-regress`: writes without the LSN condition.
    unconditional: bool,
}

impl SimOffsets {
    pub fn new(unconditional: bool) -> SimOffsets {
        SimOffsets { entries: BTreeMap::new(), unconditional }
    }

    /// Applies the writes whose LSN is higher; returns (key, old, new) of the
    /// values that changed.
    pub fn write(&mut self, entries: &[OffsetEntry]) -> Vec<(PartitionKey, Option<OffsetValue>, OffsetValue)> {
        let mut changed = Vec::new();
        for e in entries {
            let bytes = e.value.encode();
            assert_eq!(OffsetValue::decode(&bytes), Ok(e.value), "offset values round-trip");
            let old = self.entries.get(&e.key).map(|(b, _)| OffsetValue::decode(b).expect("24 bytes"));
            if OffsetValue::replaces(&e.value, old.as_ref()) || (self.unconditional && old != Some(e.value)) {
                self.entries.insert(e.key, (bytes, e.checkpoint.clone()));
                changed.push((e.key, old, e.value));
            }
        }
        changed
    }

    pub fn read(&self) -> Vec<skippr_core::OffsetRow> {
        self.entries.iter().map(|(k, (b, c))| (*k, b.to_vec(), c.clone())).collect()
    }

    pub fn position(&self, key: PartitionKey) -> Option<Position> {
        self.entries.get(&key).map(|(b, _)| OffsetValue::decode(b).expect("24 bytes").position)
    }
}
