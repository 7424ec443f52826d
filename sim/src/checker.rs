//! The exactly-once checker: a reference model of the contract, fed only from
//! what sources emitted and were acked, what sinks received, and what the
//! offsets store holds. It never reads the engine's own bookkeeping. A
//! failure names the invariant it broke.

use crate::plugins::{checkpoint_bytes, record_bytes_into, replayed_bytes, SimSink, SimSource};
use crate::scenario::Scenario;
use skippr_core::ledger::Verdict;
use skippr_core::{CompactionId, CompactionSeq, OffsetValue, PartitionKey, Position, SinkId, SourceId, StreamId};
use skippr_core::{ResumePoint, SinkApply, AT_INTAKE, FATAL_ALONE};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The invariants, by the names failures carry.
pub mod invariant {
    pub const ACKED_RECORD_LOST: &str = "acked-record-lost";
    pub const ACK_BEYOND_SENT: &str = "ack-beyond-sent";
    pub const COMMITTED_POSITION_REGRESSED: &str = "committed-position-regressed";
    pub const OFFSETS_LEAD_WAL: &str = "offsets-lead-wal";
    pub const OFFSETS_REGRESSED: &str = "offsets-regressed";
    pub const OFFSETS_NOT_MATERIALIZED: &str = "offsets-not-materialized";
    pub const CHECKPOINT_MISMATCH: &str = "checkpoint-mismatch";
    pub const FOREIGN_BYTES: &str = "foreign-bytes";
    pub const DUPLICATE_DELIVERY: &str = "duplicate-delivery";
    pub const LOST_RECORD: &str = "lost-record";
    pub const WRONG_STREAM: &str = "wrong-stream";
    pub const COMPACTION_ID_UNSTABLE: &str = "compaction-id-unstable";
    pub const SEQUENCE_REUSED: &str = "sequence-reused";
    pub const SEQUENCE_GAP: &str = "sequence-gap";
    pub const RECOVERY_NOT_IDEMPOTENT: &str = "recovery-not-idempotent";
    pub const STALLED: &str = "liveness-stalled";
    pub const CLEAN_SHUTDOWN: &str = "clean-shutdown";
    pub const UNEXPECTED_STOP: &str = "unexpected-stop";
    pub const CORE_ASSERTION: &str = "core-assertion";
    pub const NONDETERMINISM: &str = "nondeterminism";
    pub const LOST_SEGMENT_UNNOTICED: &str = "lost-segment-unnoticed";
    pub const STOP_RECORD_UNFAITHFUL: &str = "stop-record-unfaithful";
    pub const DEAD_LETTER_CONFLICT: &str = "dead-letter-conflict";
    pub const DEAD_LETTER_MALFORMED: &str = "dead-letter-malformed";
    pub const SKIPPED_DELIVERED: &str = "skipped-delivered";
    pub const DEAD_LETTER_UNFOUNDED: &str = "dead-letter-unfounded";
    pub const BROKEN_DELIVERED: &str = "broken-record-delivered";
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

struct Apply {
    sink: SinkId,
    stream: StreamId,
    seq: u64,
    digest: u64,
    records: usize,
}

pub struct Checker {
    /// Per (sink, partition): dead letters ahead of the sink's next
    /// position, and positions the sink passed over that its dead letters
    /// must still bring (dead letters on only).
    ahead: BTreeMap<(SinkId, PartitionKey), BTreeSet<u64>>,
    gaps: BTreeMap<(SinkId, PartitionKey), BTreeSet<u64>>,
    letters_on: bool,
    /// Poison's per mille, where a sink has poison.
    poison: Option<u64>,
    /// Per mille of records the sources send broken (refused at intake).
    broken: u64,
    split_letters: u64,
    /// Dead letters of records refused at intake.
    intake_letters: u64,
    /// Per (sink, partition): positions of batches the operator gave up;
    /// the batch numbers given up; how many records that accounts for.
    skipped: BTreeMap<(SinkId, PartitionKey), BTreeSet<u64>>,
    skipped_seqs: BTreeSet<(SinkId, StreamId, u64)>,
    skipped_records: u64,
    /// The next dead-letter batch number per (sink, stream).
    next_letters: BTreeMap<(SinkId, StreamId), u64>,
    /// The replay of dead letters, when the scenario has one: its source
    /// id; the records of the sink's dead letters per stream, in their
    /// order (what a replay sends, by position); its records that reached
    /// the sink or the dead letters.
    replay: Option<u16>,
    letter_log: Vec<Vec<Vec<u8>>>,
    replayed: u64,
    dead_letters: u64,
    seed: u64,
    /// Records and stream of every partition, as the scenario defines them.
    partitions: BTreeMap<PartitionKey, (u64, StreamId)>,
    /// Sources that are Singer-like taps: their records are rows (the
    /// position in a record's bytes is its row), their positions the
    /// tap's own count, their checkpoints its state.
    taps: BTreeSet<SourceId>,
    sinks: u16,
    acked: BTreeMap<PartitionKey, u64>,
    resumed: BTreeMap<PartitionKey, u64>,
    applies: BTreeMap<(SinkId, CompactionId), Apply>,
    seq_owner: BTreeMap<(SinkId, StreamId, u64), CompactionId>,
    next_seq: BTreeMap<(SinkId, StreamId), u64>,
    next_pos: BTreeMap<(SinkId, PartitionKey), u64>,
    delivered: u64,
    total: u64,
    scratch: Vec<u8>,
    pub violation: Option<Violation>,
}

impl Checker {
    pub fn new(scenario: &Scenario) -> Checker {
        let mut partitions = BTreeMap::new();
        for (s, spec) in scenario.sources.iter().enumerate() {
            for (p, part) in spec.partitions.iter().enumerate() {
                let key = PartitionKey { source: SourceId(s as u16), partition: p as u32 };
                partitions.insert(key, (part.records, StreamId(part.stream)));
            }
        }
        // A replay's partition per stream holds nothing until it starts.
        let replay = scenario.replay_source();
        for (id, stream) in replay.into_iter().flat_map(|id| (0..scenario.streams).map(move |s| (id, s))) {
            partitions.insert(PartitionKey { source: SourceId(id), partition: stream as u32 }, (0, StreamId(stream)));
        }
        let taps = (0..scenario.sources.len() as u16)
            .filter(|&s| scenario.sources[s as usize].tap.is_some())
            .map(SourceId)
            .collect();
        Checker {
            seed: scenario.seed,
            partitions,
            taps,
            sinks: scenario.sinks,
            acked: BTreeMap::new(),
            resumed: BTreeMap::new(),
            applies: BTreeMap::new(),
            seq_owner: BTreeMap::new(),
            next_seq: BTreeMap::new(),
            next_pos: BTreeMap::new(),
            ahead: BTreeMap::new(),
            gaps: BTreeMap::new(),
            letters_on: scenario.letters.on,
            poison: scenario.poison.on.then_some(scenario.poison.permille),
            broken: scenario.letters.broken_permille(),
            split_letters: 0,
            intake_letters: 0,
            skipped: BTreeMap::new(),
            skipped_seqs: BTreeSet::new(),
            skipped_records: 0,
            next_letters: BTreeMap::new(),
            replay,
            letter_log: vec![Vec::new(); scenario.streams as usize],
            replayed: 0,
            dead_letters: 0,
            delivered: 0,
            scratch: Vec::with_capacity(64),
            total: scenario.total_records() * scenario.sinks as u64,
            violation: None,
        }
    }

    pub fn fail(&mut self, invariant: &'static str, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation { invariant, detail });
        }
    }

    /// A source is resumed after recovery. Its positions come from committed
    /// WAL: they cover everything it was acked, never go backwards, and are
    /// at least what the offsets store holds.
    pub fn on_resume(
        &mut self,
        source: SourceId,
        resume: &[ResumePoint],
        stored: impl Fn(PartitionKey) -> Option<Position>,
    ) {
        let keys: Vec<PartitionKey> = self.partitions.keys().filter(|k| k.source == source).copied().collect();
        for key in keys {
            let point = resume.iter().find(|r| r.partition == key.partition);
            let at = point.map_or(0, |r| r.position.0);
            let acked = self.acked.get(&key).copied().unwrap_or(0);
            if at < acked {
                self.fail(invariant::ACKED_RECORD_LOST, format!("{key} resumed at {at} but was acked through {acked}"));
            }
            let before = self.resumed.insert(key, at).unwrap_or(0);
            if at < before {
                self.fail(
                    invariant::COMMITTED_POSITION_REGRESSED,
                    format!("{key} resumed at {at} after an earlier resume at {before}"),
                );
            }
            if let Some(store) = stored(key) {
                if store.0 > at {
                    self.fail(
                        invariant::OFFSETS_LEAD_WAL,
                        format!("{key}: offsets store holds {} > WAL {at}", store.0),
                    );
                }
            }
            if let Some(cp) = point.and_then(|p| p.checkpoint.as_ref()).filter(|_| !self.taps.contains(&source)) {
                if *cp != checkpoint_bytes(key.partition, at) {
                    self.fail(
                        invariant::CHECKPOINT_MISMATCH,
                        format!("{key}: checkpoint does not match position {at}"),
                    );
                }
            }
        }
    }

    pub fn on_ack(&mut self, source: SourceId, acks: &[(u32, Position)], sent: impl Fn(u32) -> u64) {
        for &(partition, pos) in acks {
            let key = PartitionKey { source, partition };
            if pos.0 > sent(partition) {
                self.fail(
                    invariant::ACK_BEYOND_SENT,
                    format!("{key} acked at {} beyond {} sent", pos.0, sent(partition)),
                );
            }
            let a = self.acked.entry(key).or_insert(0);
            *a = (*a).max(pos.0);
        }
    }

    pub fn on_offsets_changed(&mut self, key: PartitionKey, old: Option<OffsetValue>, new: OffsetValue) {
        if let Some(old) = old {
            if new.position < old.position {
                self.fail(
                    invariant::OFFSETS_REGRESSED,
                    format!("{key}: offsets moved from {} back to {}", old.position.0, new.position.0),
                );
            }
        }
    }

    /// A sink received a destination batch; `verdict` is its ledger's. A
    /// conflict there is a batch the checker fails below (another id under
    /// a number, other records under an id), so a run stops before the
    /// engine hears the sink's `fatal`.
    pub fn on_apply(&mut self, a: &SinkApply, verdict: Verdict) {
        if matches!(verdict, Verdict::Conflict(_)) && self.letters_on {
            // Nothing applied: another attempt of the plan holds the number
            // (one refused, that landed after all), and the engine goes on
            // to learn which. Without dead letters a conflict is a bug,
            // and judged as an apply under a number already carried.
            return;
        }
        let digest = digest(&a.records);
        if let Some(prev) = self.applies.get(&(a.sink, a.id)) {
            if prev.digest != digest || prev.seq != a.seq.0 || prev.stream != a.stream || prev.sink != a.sink {
                let detail = format!(
                    "{} applied with {} records (seq {}) and again with {} records (seq {})",
                    a.id,
                    prev.records,
                    prev.seq,
                    a.records.len(),
                    a.seq.0
                );
                self.fail(invariant::COMPACTION_ID_UNSTABLE, detail);
            }
            return;
        }
        assert_ne!(verdict, Verdict::Same, "the sink holds only batches the checker has seen");
        let apply = Apply { sink: a.sink, stream: a.stream, seq: a.seq.0, digest, records: a.records.len() };
        self.applies.insert((a.sink, a.id), apply);
        if let Some(owner) = self.seq_owner.insert((a.sink, a.stream, a.seq.0), a.id) {
            let detail =
                format!("sink {} stream {} seq {} carried {owner} and then {}", a.sink, a.stream, a.seq.0, a.id);
            return self.fail(invariant::SEQUENCE_REUSED, detail);
        }
        let next = self.next_seq.entry((a.sink, a.stream)).or_insert(0);
        while self.skipped_seqs.contains(&(a.sink, a.stream, *next)) {
            *next += 1;
        }
        if a.seq.0 != *next {
            let detail = format!("sink {} stream {} applied seq {} when {} was next", a.sink, a.stream, a.seq.0, next);
            return self.fail(invariant::SEQUENCE_GAP, detail);
        }
        *next += 1;
        for bytes in &a.records {
            if let Err(v) = self.check_record(a.sink, a.stream, bytes, false) {
                return self.fail(v.invariant, v.detail);
            }
        }
    }

    /// A batch of dead letters the destination was handed, and its
    /// ledger's verdict. A new one must be the next number of its (sink,
    /// stream), and each line a dead letter of a record the source emitted
    /// that reached neither the sink nor the dead letters before.
    pub fn on_letters(&mut self, a: &SinkApply, verdict: Verdict) {
        match verdict {
            Verdict::Same => return,
            Verdict::Conflict(c) => {
                let detail = format!("dead-letter batch {} of sink {} stream {}: {c}", a.seq.0, a.sink, a.stream);
                return self.fail(invariant::DEAD_LETTER_CONFLICT, detail);
            }
            Verdict::New => {}
        }
        let next = self.next_letters.entry((a.sink, a.stream)).or_insert(0);
        if a.seq.0 != *next {
            let detail =
                format!("sink {} stream {} got dead-letter batch {} when {} was next", a.sink, a.stream, a.seq.0, next);
            return self.fail(invariant::SEQUENCE_GAP, detail);
        }
        *next += 1;
        for line in &a.records {
            let Some(bytes) = letter_record(line) else {
                let detail = format!("a dead letter without a reason or a record: {}", String::from_utf8_lossy(line));
                return self.fail(invariant::DEAD_LETTER_MALFORMED, detail);
            };
            let bytes = &*bytes;
            if let Err(v) = self.check_record(a.sink, a.stream, bytes, true) {
                return self.fail(v.invariant, v.detail);
            }
            // A record refused at intake is one the source sent broken,
            // and one the source sent broken can only be refused there.
            let at_intake = line.windows(AT_INTAKE.len()).any(|w| w == AT_INTAKE.as_bytes());
            if at_intake != self.is_broken(bytes) {
                let detail = format!(
                    "sink {}: a dead letter {} intake's reason of a record the source sent {}: {}",
                    a.sink,
                    if at_intake { "with" } else { "without" },
                    if at_intake { "whole" } else { "broken" },
                    String::from_utf8_lossy(line)
                );
                return self.fail(invariant::DEAD_LETTER_UNFOUNDED, detail);
            }
            self.intake_letters += at_intake as u64;
            // A record found by splitting must be one the sink cannot take.
            if line.windows(FATAL_ALONE.len()).any(|w| w == FATAL_ALONE.as_bytes()) {
                if !self.poison.is_some_and(|permille| SimSink::poison(permille, self.seed, bytes)) {
                    let detail = format!("sink {} refused no record of {}", a.sink, String::from_utf8_lossy(line));
                    return self.fail(invariant::DEAD_LETTER_UNFOUNDED, detail);
                }
                self.split_letters += 1;
            }
            if self.replay.is_some() {
                self.letter_log[a.stream.0 as usize].push(bytes.to_vec());
            }
            self.dead_letters += 1;
        }
    }

    /// A start replays the dead letters the destination holds now: the
    /// replay's partition of each stream holds, from here on, one record
    /// per dead letter the checker has seen arrive, and every one of them
    /// must reach the sink or the dead letters once.
    pub fn on_replay(&mut self, id: u16) {
        for (stream, log) in self.letter_log.iter().enumerate() {
            let key = PartitionKey { source: SourceId(id), partition: stream as u32 };
            let part = self.partitions.get_mut(&key).expect("a replay partition per stream");
            self.total += log.len() as u64 - part.0;
            part.0 = log.len() as u64;
        }
    }

    /// Replayed dead letters that reached the sink or the dead letters.
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// Dead letters of records the engine found by splitting.
    pub fn split_letters(&self) -> u64 {
        self.split_letters
    }

    /// Dead letters of records refused at intake.
    pub fn intake_letters(&self) -> u64 {
        self.intake_letters
    }

    /// The operator gave up batch `seq` of (sink, stream), which the sink
    /// was sent with `records` and never took: those records are accounted
    /// as given up, by name, and must never reach that sink (nor its dead
    /// letters); the sink's numbers pass over `seq`.
    pub fn on_batch_skip(
        &mut self,
        sink: SinkId,
        stream: StreamId,
        seq: CompactionSeq,
        records: &skippr_core::Records,
    ) {
        if !self.skipped_seqs.insert((sink, stream, seq.0)) {
            let detail = format!("sink {sink} stream {stream} batch {} given up twice", seq.0);
            return self.fail(invariant::SKIPPED_DELIVERED, detail);
        }
        for bytes in records {
            let Some((key, pos)) = place(bytes) else {
                return self.fail(invariant::FOREIGN_BYTES, "a record shorter than any the sources emit".into());
            };
            let delivered = self.next_pos.get(&(sink, key)).is_some_and(|&n| pos < n)
                && !self.gaps.get(&(sink, key)).is_some_and(|g| g.contains(&pos));
            if delivered || !self.skipped.entry((sink, key)).or_default().insert(pos) {
                let detail = format!("sink {sink} {key} position {pos}: given up after it was delivered or given up");
                return self.fail(invariant::SKIPPED_DELIVERED, detail);
            }
            self.skipped_records += 1;
        }
    }

    /// Records that went to the dead letters.
    pub fn dead_letters(&self) -> u64 {
        self.dead_letters
    }

    /// Checks a record that reached sink `sink` (or, `letter`, its dead
    /// letters): each record of each partition goes to exactly one of the
    /// two, once. The sink receives a partition's records in order; a
    /// plan's dead letters arrive before the rest of it, so they may be
    /// ahead of the sink, and the sink passes over them.
    fn check_record(&mut self, sink: SinkId, stream: StreamId, bytes: &[u8], letter: bool) -> Result<(), Violation> {
        let foreign = |why: &str| Violation { invariant: invariant::FOREIGN_BYTES, detail: why.to_string() };
        if bytes.len() < 6 {
            return Err(foreign("a record shorter than any the sources emit"));
        }
        let key = PartitionKey { source: SourceId(bytes[0] as u16), partition: bytes[1] as u32 };
        let pos = u32::from_le_bytes(bytes[2..6].try_into().unwrap()) as u64;
        let Some(&(records, part_stream)) = self.partitions.get(&key) else {
            return Err(foreign("a record from no known partition"));
        };
        match self.replay {
            Some(id) if key.source.0 == id && pos < records => {
                let letter = &self.letter_log[key.partition as usize][pos as usize];
                replayed_bytes(&mut self.scratch, id, key.partition, pos, letter);
            }
            _ if pos < records => record_bytes_into(&mut self.scratch, self.seed, key.source.0, key.partition, pos),
            _ => {}
        }
        if pos >= records || bytes != self.scratch.as_slice() {
            return Err(foreign(&format!("{key} position {pos}: bytes differ from what the source emitted")));
        }
        if part_stream != stream {
            let detail = format!("{key} belongs to stream {part_stream} but reached stream {stream}");
            return Err(Violation { invariant: invariant::WRONG_STREAM, detail });
        }
        if !letter && self.is_broken(bytes) {
            let detail = format!("sink {sink} got {key} position {pos}, which the source sent broken");
            return Err(Violation { invariant: invariant::BROKEN_DELIVERED, detail });
        }
        let skipped = self.skipped.get(&(sink, key));
        if skipped.is_some_and(|s| s.contains(&pos)) {
            let what = if letter { "a dead letter of" } else { "" };
            let detail = format!("sink {sink} got {what} {key} position {pos}, of a batch the operator gave up");
            return Err(Violation { invariant: invariant::SKIPPED_DELIVERED, detail });
        }
        let next = self.next_pos.entry((sink, key)).or_insert(0);
        let ahead = self.ahead.entry((sink, key)).or_default();
        let gaps = self.gaps.entry((sink, key)).or_default();
        let passed_over = gaps.contains(&pos);
        if (pos < *next && !(letter && passed_over)) || ahead.contains(&pos) {
            let what = if letter { "a dead letter of" } else { "" };
            let detail = format!("sink {sink} got {what} {key} position {pos} again (next expected {next})");
            return Err(Violation { invariant: invariant::DUPLICATE_DELIVERY, detail });
        }
        if letter && passed_over {
            gaps.remove(&pos);
        } else if letter {
            ahead.insert(pos);
        } else {
            // The sink passes over records refused in its plan: without
            // dead letters that is a loss at once; with them, their dead
            // letters must still come (the run is complete only then).
            let given_up = |p: &u64| skipped.is_some_and(|s| s.contains(p));
            let missing: Vec<u64> = (*next..pos).filter(|p| !ahead.contains(p) && !given_up(p)).collect();
            if let Some(&gap) = missing.first().filter(|_| !self.letters_on) {
                let detail = format!("sink {sink} got {key} position {pos}, skipping {gap} (next expected {next})");
                return Err(Violation { invariant: invariant::LOST_RECORD, detail });
            }
            gaps.extend(missing);
            *next = pos + 1;
        }
        while ahead.first().is_some_and(|&p| p <= *next) {
            let p = ahead.pop_first().expect("first exists");
            *next = (*next).max(p + 1);
        }
        self.delivered += 1;
        self.replayed += (self.replay == Some(key.source.0)) as u64;
        Ok(())
    }

    /// Whether the source sent this record broken (a replay never does).
    fn is_broken(&self, bytes: &[u8]) -> bool {
        self.replay != bytes.first().map(|&b| b as u16) && SimSource::broken(self.broken, self.seed, bytes)
    }

    /// Every record of every partition reached every sink (or its dead
    /// letters), or was given up by the operator.
    pub fn complete(&self) -> bool {
        self.delivered + self.skipped_records == self.total
    }

    /// Has every sink received the record of `key` at `position`?
    pub fn delivered_to_all(&self, key: PartitionKey, position: u64) -> bool {
        (0..self.sinks).all(|s| {
            let passed_over = self.gaps.get(&(SinkId(s), key)).is_some_and(|g| g.contains(&position));
            self.next_pos.get(&(SinkId(s), key)).is_some_and(|&next| next > position) && !passed_over
        })
    }

    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The first partition a sink is still missing records of.
    pub fn missing(&self) -> Option<String> {
        for (key, &(records, _)) in &self.partitions {
            for sink in (0..self.sinks).map(SinkId) {
                let mut got = self.next_pos.get(&(sink, *key)).copied().unwrap_or(0);
                // A batch given up at the end of a partition.
                while self.skipped.get(&(sink, *key)).is_some_and(|s| s.contains(&got)) {
                    got += 1;
                }
                if got < records {
                    return Some(format!("sink {sink} has {got} of {records} records of {key}"));
                }
                if let Some(gap) = self.gaps.get(&(sink, *key)).and_then(|g| g.first()) {
                    return Some(format!(
                        "sink {sink} passed over {key} position {gap}, and no dead letter of it came"
                    ));
                }
            }
        }
        None
    }

    /// After a clean shutdown the offsets store holds every final position.
    /// (A tap's positions are its own count, which void windows and rows
    /// sent again also take: only the checks at resumes apply.)
    pub fn check_materialized(&mut self, stored: impl Fn(PartitionKey) -> Option<Position>) {
        let taps = &self.taps;
        let keys: Vec<(PartitionKey, u64)> =
            self.partitions.iter().filter(|(k, _)| !taps.contains(&k.source)).map(|(k, (n, _))| (*k, *n)).collect();
        for (key, records) in keys {
            let at = stored(key).map_or(0, |p| p.0);
            if at != records {
                let detail = format!("{key}: offsets store holds {at} after a clean shutdown, WAL holds {records}");
                self.fail(invariant::OFFSETS_NOT_MATERIALIZED, detail);
            }
        }
    }

    pub fn compactions(&self) -> usize {
        self.applies.len()
    }
}

/// Where a record the sources emitted comes from: its partition and
/// position, from its first six bytes.
fn place(bytes: &[u8]) -> Option<(PartitionKey, u64)> {
    let head = bytes.get(..6)?;
    let key = PartitionKey { source: SourceId(head[0] as u16), partition: head[1] as u32 };
    Some((key, u32::from_le_bytes(head[2..6].try_into().expect("four bytes")) as u64))
}

/// A dead letter's record bytes, if the line carries a reason and a
/// record: what follows `"record":`, less the closing brace.
pub(crate) fn letter_record(line: &[u8]) -> Option<Cow<'_, [u8]>> {
    // The record comes last, under the first `,"record` (in the fields
    // before it, a quote is escaped).
    const KEY: &[u8] = b",\"record";
    let reason = line.windows(10).any(|w| w == b"\"reason\":\"");
    if !reason || line.last() != Some(&b'}') {
        return None;
    }
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &line[at..line.len() - 1];
    if let Some(record) = rest.strip_prefix(b"\":") {
        return Some(Cow::Borrowed(record));
    }
    if let Some(text) = rest.strip_prefix(b"_text\":") {
        return serde_json::from_slice::<String>(text).ok().map(|t| Cow::Owned(t.into_bytes()));
    }
    use base64::Engine as _;
    let b64 = rest.strip_prefix(b"_base64\":\"")?.strip_suffix(b"\"")?;
    base64::engine::general_purpose::STANDARD.decode(b64).ok().map(Cow::Owned)
}

fn digest(records: &skippr_core::Records) -> u64 {
    let mut h = records.len() as u64;
    for r in records {
        h = h.rotate_left(17) ^ xxhash_rust::xxh3::xxh3_64(r);
    }
    h
}

#[cfg(test)]
mod tests {
    //! Each invariant fails when fed the event that breaks it; the planted
    //! bugs prove the same end to end through the simulator.

    use super::*;
    use crate::plugins::record_bytes;
    use skippr_core::{CompactionSeq, ResumePoint};

    fn setup() -> (Scenario, Checker) {
        let scenario = Scenario::from_seed(7);
        let checker = Checker::new(&scenario);
        (scenario, checker)
    }

    fn key0() -> PartitionKey {
        PartitionKey { source: SourceId(0), partition: 0 }
    }

    fn apply(s: &Scenario, id: u64, seq: u64, stream: u16, positions: &[u64]) -> SinkApply {
        SinkApply {
            sink: SinkId(0),
            stream: StreamId(stream),
            id: CompactionId(id),
            seq: CompactionSeq(seq),
            records: positions
                .iter()
                .map(|&p| record_bytes(s.seed, 0, 0, p))
                .collect::<Vec<_>>()
                .iter()
                .map(|r| &r[..])
                .collect(),
        }
    }

    fn stream0(s: &Scenario) -> u16 {
        s.sources[0].partitions[0].stream
    }

    fn broke(c: &Checker) -> &'static str {
        c.violation.as_ref().map_or("none", |v| v.invariant)
    }

    #[test]
    fn in_order_delivery_passes() {
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0, 1, 2]), Verdict::New);
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0, 1, 2]), Verdict::Same);
        c.on_apply(&apply(&s, 2, 1, stream0(&s), &[3]), Verdict::New);
        assert_eq!(broke(&c), "none");
        assert_eq!(c.delivered(), 4);
    }

    #[test]
    fn duplicate_lost_and_foreign_records() {
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0, 1, 1]), Verdict::New);
        assert_eq!(broke(&c), invariant::DUPLICATE_DELIVERY);
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0, 2]), Verdict::New);
        assert_eq!(broke(&c), invariant::LOST_RECORD);
        let (s, mut c) = setup();
        let mut a = apply(&s, 1, 0, stream0(&s), &[0]);
        let mut flipped = a.records.get(0).unwrap().to_vec();
        *flipped.last_mut().unwrap() ^= 1;
        a.records = [&flipped[..]].into_iter().collect();
        c.on_apply(&a, Verdict::New);
        assert_eq!(broke(&c), invariant::FOREIGN_BYTES);
    }

    #[test]
    fn a_batch_given_up_is_passed_over_by_name_and_never_delivered() {
        let (s, mut c) = setup();
        let st = StreamId(stream0(&s));
        c.on_apply(&apply(&s, 1, 0, st.0, &[0, 1]), Verdict::New);
        c.on_batch_skip(SinkId(0), st, CompactionSeq(1), &apply(&s, 2, 1, st.0, &[2, 3]).records);
        // The next batch, numbered past the one given up, passes over it.
        c.on_apply(&apply(&s, 3, 2, st.0, &[4]), Verdict::New);
        assert_eq!(broke(&c), "none");
        assert_eq!(c.delivered(), 3);
        // A record given up that reaches the sink after all.
        let (s, mut c) = setup();
        c.on_batch_skip(SinkId(0), st, CompactionSeq(0), &apply(&s, 2, 0, st.0, &[0, 1]).records);
        c.on_apply(&apply(&s, 3, 1, st.0, &[1, 2]), Verdict::New);
        assert_eq!(broke(&c), invariant::SKIPPED_DELIVERED);
        // Passing over records that were not given up is still a loss.
        let (s, mut c) = setup();
        c.on_batch_skip(SinkId(0), st, CompactionSeq(0), &apply(&s, 2, 0, st.0, &[0]).records);
        c.on_apply(&apply(&s, 3, 1, st.0, &[2]), Verdict::New);
        assert_eq!(broke(&c), invariant::LOST_RECORD);
        // A number given up is not a gap; one that was not is.
        let (s, mut c) = setup();
        c.on_batch_skip(SinkId(0), st, CompactionSeq(0), &apply(&s, 2, 0, st.0, &[0]).records);
        c.on_apply(&apply(&s, 3, 2, st.0, &[1]), Verdict::New);
        assert_eq!(broke(&c), invariant::SEQUENCE_GAP);
    }

    /// Replayed dead letters are a new source's records: each must reach
    /// the sink (or the dead letters) once, with the letter's record.
    #[test]
    fn replayed_dead_letters_are_the_replays_records_once() {
        let s = (0..).map(Scenario::from_seed).find(|s| s.replay).expect("a seed that replays");
        let (id, st) = (s.replay_source().unwrap(), StreamId(stream0(&s)));
        let letter_of = |pos: u64| {
            let mut line = br#"{"reason":"SIM","record":"#.to_vec();
            line.extend_from_slice(&record_bytes(s.seed, 0, 0, pos));
            line.push(b'}');
            line
        };
        let replayed = |payload: &[u8]| {
            let mut out = Vec::new();
            replayed_bytes(&mut out, id, st.0 as u32, 0, payload);
            out
        };
        let batch = |seq: u64, records: &[&[u8]]| SinkApply {
            sink: SinkId(0),
            stream: st,
            id: CompactionId(100 + seq),
            seq: CompactionSeq(seq),
            records: records.iter().copied().collect(),
        };
        let start = || {
            let mut c = Checker::new(&s);
            c.on_letters(&batch(0, &[&letter_of(0)]), Verdict::New);
            c.on_apply(&apply(&s, 1, 0, st.0, &[1, 2]), Verdict::New);
            let total = c.total;
            c.on_replay(id);
            assert_eq!(c.total, total + 1, "the replay adds one record per dead letter");
            c
        };
        let good = replayed(&record_bytes(s.seed, 0, 0, 0));
        let mut c = start();
        c.on_apply(&batch(1, &[&good]), Verdict::New);
        assert_eq!((broke(&c), c.replayed()), ("none", 1));
        c.on_apply(&batch(2, &[&good]), Verdict::New);
        assert_eq!(broke(&c), invariant::DUPLICATE_DELIVERY);
        // Refused again: its dead letter is the replay's record's.
        let mut c = start();
        let mut again = br#"{"reason":"SIM","record":"#.to_vec();
        again.extend_from_slice(&good);
        again.push(b'}');
        c.on_letters(&batch(1, &[&again]), Verdict::New);
        assert_eq!(broke(&c), "none");
        // A record the letter did not hold.
        let mut c = start();
        c.on_apply(&batch(1, &[&replayed(&record_bytes(s.seed, 0, 0, 1))]), Verdict::New);
        assert_eq!(broke(&c), invariant::FOREIGN_BYTES);
    }

    /// A dead letter of a record found by splitting must be of a record
    /// its sink cannot take (poisoned).
    #[test]
    fn a_record_found_by_splitting_must_be_poisoned() {
        let poisoned =
            |s: &Scenario, pos: u64| SimSink::poison(s.poison.permille, s.seed, &record_bytes(s.seed, 0, 0, pos));
        let n = |s: &Scenario| s.sources[0].partitions[0].records;
        let s = (0..)
            .map(Scenario::from_seed)
            .find(|s| s.poison.on && s.letters.on && (0..n(s)).any(|p| poisoned(s, p)))
            .expect("such a seed");
        let st = StreamId(stream0(&s));
        let poisoned = |pos: u64| poisoned(&s, pos);
        let letter = |pos: u64| {
            let mut line = format!(r#"{{"reason":"{FATAL_ALONE}","record":"#).into_bytes();
            line.extend_from_slice(&record_bytes(s.seed, 0, 0, pos));
            line.push(b'}');
            SinkApply {
                sink: SinkId(0),
                stream: st,
                id: CompactionId(7),
                seq: CompactionSeq(0),
                records: [line.as_slice()].into_iter().collect(),
            }
        };
        let bad = (0..n(&s)).find(|&p| poisoned(p)).expect("a poisoned position");
        let good = (0..).find(|&p| !poisoned(p)).expect("a clean position");
        let mut c = Checker::new(&s);
        c.on_letters(&letter(bad), Verdict::New);
        assert_eq!((broke(&c), c.split_letters()), ("none", 1));
        let mut c = Checker::new(&s);
        c.on_letters(&letter(good), Verdict::New);
        assert_eq!(broke(&c), invariant::DEAD_LETTER_UNFOUNDED);
    }

    /// A record the source sent broken never reaches a sink, and its dead
    /// letter (as text or base64) says it was refused at intake; a whole
    /// record cannot be.
    #[test]
    fn a_broken_record_reaches_only_the_dead_letters_with_intake_s_reason() {
        let broken = |s: &Scenario, pos: u64| {
            SimSource::broken(s.letters.broken_permille(), s.seed, &record_bytes(s.seed, 0, 0, pos))
        };
        let n = |s: &Scenario| s.sources[0].partitions[0].records;
        let s = (0..).map(Scenario::from_seed).find(|s| (0..n(s)).any(|p| broken(s, p))).expect("such a seed");
        let st = StreamId(stream0(&s));
        let bad = (0..n(&s)).find(|&p| broken(&s, p)).expect("a broken position");
        let good = (0..).find(|&p| !broken(&s, p)).expect("a whole position");
        let letter = |pos: u64, reason: &str| {
            let letter = skippr_core::Letter {
                stream: "s",
                sink: "k",
                source: "src",
                partition: 0,
                position: Position(pos),
                compaction_id: CompactionId(7),
                seq: CompactionSeq(0),
                reason,
                at_ms: 0,
                record: skippr_core::LetterRecord::Intake(&record_bytes(s.seed, 0, 0, pos)),
            };
            let mut line = Vec::new();
            letter.write(&mut line);
            line
        };
        let batch = |line: &[u8]| SinkApply {
            sink: SinkId(0),
            stream: st,
            id: CompactionId(7),
            seq: CompactionSeq(0),
            records: [line].into_iter().collect(),
        };
        let mut c = Checker::new(&s);
        c.on_letters(&batch(&letter(bad, "refused at intake: no JSON")), Verdict::New);
        assert_eq!((broke(&c), c.dead_letters(), c.intake_letters()), ("none", 1, 1));
        let mut c = Checker::new(&s);
        c.on_apply(&apply(&s, 1, 0, st.0, &[bad]), Verdict::New);
        assert_eq!(broke(&c), invariant::BROKEN_DELIVERED);
        let mut c = Checker::new(&s);
        c.on_letters(&batch(&letter(good, "refused at intake: no JSON")), Verdict::New);
        assert_eq!(broke(&c), invariant::DEAD_LETTER_UNFOUNDED);
        let mut c = Checker::new(&s);
        c.on_letters(&batch(&letter(bad, "the sink said no")), Verdict::New);
        assert_eq!(broke(&c), invariant::DEAD_LETTER_UNFOUNDED);
        // Both forms of a record refused at intake read back as its bytes.
        assert_eq!(letter_record(&letter(bad, "r")).as_deref(), Some(&record_bytes(s.seed, 0, 0, bad)[..]));
        let text = br#"{"reason":"r","record_text":"{\n"}"#;
        assert_eq!(letter_record(text).as_deref(), Some(&b"{\n"[..]));
    }

    #[test]
    fn wrong_stream() {
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 0, 1 - stream0(&s), &[0]), Verdict::New);
        assert_eq!(broke(&c), invariant::WRONG_STREAM);
    }

    #[test]
    fn unstable_ids_and_sequences() {
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0, 1]), Verdict::New);
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0]), Verdict::Same);
        assert_eq!(broke(&c), invariant::COMPACTION_ID_UNSTABLE);
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 0, stream0(&s), &[0]), Verdict::New);
        c.on_apply(&apply(&s, 2, 0, stream0(&s), &[1]), Verdict::New);
        assert_eq!(broke(&c), invariant::SEQUENCE_REUSED);
        let (s, mut c) = setup();
        c.on_apply(&apply(&s, 1, 1, stream0(&s), &[0]), Verdict::New);
        assert_eq!(broke(&c), invariant::SEQUENCE_GAP);
    }

    #[test]
    fn acks_resumes_and_offsets() {
        let (_, mut c) = setup();
        c.on_ack(SourceId(0), &[(0, Position(5))], |_| 4);
        assert_eq!(broke(&c), invariant::ACK_BEYOND_SENT);

        let (_, mut c) = setup();
        c.on_ack(SourceId(0), &[(0, Position(5))], |_| 9);
        let at = |p| vec![ResumePoint { partition: 0, position: Position(p), checkpoint: None }];
        c.on_resume(SourceId(0), &at(4), |_| None);
        assert_eq!(broke(&c), invariant::ACKED_RECORD_LOST);

        let (_, mut c) = setup();
        c.on_resume(SourceId(0), &at(6), |_| None);
        c.on_resume(SourceId(0), &at(5), |_| None);
        assert_eq!(broke(&c), invariant::COMMITTED_POSITION_REGRESSED);

        let (_, mut c) = setup();
        c.on_resume(SourceId(0), &at(6), |k| (k == key0()).then_some(Position(7)));
        assert_eq!(broke(&c), invariant::OFFSETS_LEAD_WAL);

        let (_, mut c) = setup();
        let cp = vec![ResumePoint { partition: 0, position: Position(6), checkpoint: Some(b"cp-other".to_vec()) }];
        c.on_resume(SourceId(0), &cp, |_| None);
        assert_eq!(broke(&c), invariant::CHECKPOINT_MISMATCH);

        let (_, mut c) = setup();
        let v = |p, l| OffsetValue { position: Position(p), lsn: skippr_core::Lsn(l), records: p };
        c.on_offsets_changed(key0(), Some(v(6, 1)), v(5, 2));
        assert_eq!(broke(&c), invariant::OFFSETS_REGRESSED);

        let (_, mut c) = setup();
        c.check_materialized(|_| Some(Position(1)));
        assert_eq!(broke(&c), invariant::OFFSETS_NOT_MATERIALIZED);
    }
}
