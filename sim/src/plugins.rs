//! Simulated sources, sinks and offsets store.
//!
//! Sources produce deterministic records (a pure function of seed, source,
//! partition and position), can replay from any position at or above what
//! they were acked, discard acked data, and re-send from their acked position
//! after a restart when the scenario says so. Sinks keep the ledger every
//! real sink keeps (core's `sink_ledger`). The offsets store applies a write only when its LSN is
//! higher, as the real stores do.

use crate::scenario::{LettersSpec, SourceSpec};
use skippr_core::format::Record;
use skippr_core::ledger::{judge, Digest, Entry, Verdict};
use skippr_core::rules::RecordFault;
use skippr_core::{
    CompactionId, CompactionSeq, Duration, Instant, OffsetEntry, OffsetValue, PartitionKey, Position, Records,
    RefusedIndex, StreamId,
};
use skippr_core::{ResumePoint, SourceBatchIn};
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
        SimSource { id, seed, spec, cursors, turn: 0, schemas, schema_switch, letters: None, broken_permille: 0 }
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
        };
        let mut source = SimSource::new(0, id, spec, letters.len() as u16, schema_switch);
        source.letters = Some(letters.to_vec());
        source
    }

    /// Resumes at the host's positions, or, for a source that re-sends, at
    /// its own acked position. Data below the acked position is gone.
    pub fn open(&mut self, resume: &[ResumePoint]) {
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
        self.cursors.get(partition as usize).map_or(0, |c| c.next)
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
