//! The stop record: what a run that stopped on SIGTERM, its WAL consistent,
//! leaves for the next start, so that it need not scan the segments again.
//! It holds the committed state, the write position, each segment's summary
//! (with the place of its last group) and where every batch (or run of
//! batches held only in the WAL) still held for a sink lies. It is only a
//! cache of what the WAL says: the next start
//! uses it only if the WAL still matches it (the same segments listed,
//! each header valid and naming its segment, each segment's last group
//! valid at its place with its LSN, nothing written after the WAL's end or
//! into a spare), and otherwise scans. The records themselves are never
//! taken from it: each group is checked when it is read back for a sink.
//!
//! A clustered host's record also keeps raft's log (`consensus::LogRecord`:
//! each group's end and term, not its bytes) and the commit index its
//! committed state stands at; a start uses it only if the hard state saved
//! holds that same commit index, and reads back (and checks) the groups
//! past it, and the log's last group with its term.
//!
//! `magic | version: u32 | crc32c: u32 | body`, the crc over the body.

use super::{Head, RecoveredWal, SegmentSummary};
use crate::consensus::log::LogRecord;
use crate::ids::*;
use crate::records::{HeldPlace, RecordLimits, RecordStore};
use crate::state::CommittedState;
use crate::wal::codec::{DecodeError, Reader, Writer};
use crate::wal::payload::{get_key, get_snapshot, put_key, put_snapshot};
use crate::wal::stream::ReadAt;
use crate::wal::{check_group, decode_header, read_span_back, GroupPlace, GroupSpan, Names, SEGMENT_HEADER_BYTES};

pub const STOP_RECORD_MAGIC: [u8; 8] = *b"SKPRSTOP";
const VERSION: u32 = 3;
/// How far past the WAL's end (or a spare's header) a start looks for
/// bytes a later run wrote.
pub const END_PROBE_BYTES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopRecord {
    /// The configuration's names when it was written: which batches are
    /// still held depends on the sinks configured, so a start under other
    /// names scans.
    pub config: Names,
    pub state: CommittedState,
    pub epoch: Epoch,
    pub next_lsn: Lsn,
    pub next_segment: SegmentId,
    pub active: Option<(SegmentId, u64)>,
    pub spares: Vec<SegmentId>,
    pub segments: Vec<SegmentSummary>,
    pub held: Vec<HeldPlace>,
    /// Clustered mode: raft's log, and the commit index `state` stands at.
    pub raft: Option<RaftRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftRecord {
    pub commit: u64,
    pub log: LogRecord,
}

/// One read a start makes to check a stop record against the WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The segment's header is valid and names it.
    Header(SegmentId),
    /// The segment's last group is valid at its place, with its LSN.
    LastGroup(GroupPlace),
    /// Nothing is written in the segment from `from` on.
    Unwritten { segment: SegmentId, from: u64 },
    /// Clustered mode: raft's entry at `place.lsn` is a valid group there,
    /// of `term` (its bytes are kept when it is past the commit index).
    Entry { place: GroupPlace, term: u64 },
}

impl Check {
    pub fn read(&self) -> ReadAt {
        match *self {
            Check::Header(segment) => ReadAt { segment, offset: 0, len: SEGMENT_HEADER_BYTES },
            Check::LastGroup(p) => ReadAt { segment: p.segment, offset: p.offset, len: p.len as usize },
            Check::Unwritten { segment, from } => ReadAt { segment, offset: from, len: END_PROBE_BYTES },
            Check::Entry { place: p, .. } => ReadAt { segment: p.segment, offset: p.offset, len: p.len as usize },
        }
    }

    /// `None` when `bytes` (what `read` answered) bear the record out;
    /// otherwise what does not match.
    pub fn mismatch(&self, bytes: &[u8]) -> Option<&'static str> {
        match *self {
            Check::Header(segment) => {
                decode_header(segment, bytes).err().map(|_| "a segment's header is not the one it names")
            }
            Check::LastGroup(place) => read_span_back(GroupSpan::of(place), bytes, |_| false, |_, _, _, _| {}, false)
                .err()
                .map(|_| "a segment's last group is not where the stop record has it"),
            Check::Unwritten { .. } => {
                bytes.iter().any(|b| *b != 0).then_some("bytes were written after the WAL's end the record names")
            }
            Check::Entry { place, term } => match check_group(place.segment, place.lsn, bytes) {
                Some((g, _)) if g.epoch == Epoch(term) => None,
                _ => Some("a group of raft's log is not the one the stop record has at its place"),
            },
        }
    }
}

impl StopRecord {
    /// Every segment the WAL must list, in order.
    pub fn listing(&self) -> Vec<SegmentId> {
        let raft = self.raft.iter().flat_map(|r| r.log.segments());
        let mut ids: Vec<SegmentId> =
            self.segments.iter().map(|s| s.id).chain(self.spares.iter().copied()).chain(raft).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The reads that check the record against the WAL, in order.
    pub fn checks(&self) -> Vec<Check> {
        let mut checks = Vec::with_capacity(2 * self.segments.len() + 2 * self.spares.len() + 1);
        for s in &self.segments {
            checks.push(Check::Header(s.id));
            checks.push(Check::LastGroup(s.last));
            if self.raft.is_none() && self.active.is_some_and(|(id, _)| id == s.id) {
                let from = self.active.expect("matched").1;
                checks.push(Check::Unwritten { segment: s.id, from });
            }
        }
        for &spare in &self.spares {
            checks.push(Check::Header(spare));
            checks.push(Check::Unwritten { segment: spare, from: SEGMENT_HEADER_BYTES as u64 });
        }
        if let Some(raft) = &self.raft {
            checks.extend(raft_checks(raft));
        }
        checks
    }

    /// What recovery would have found, records held only in the WAL.
    pub fn into_recovered(self, limits: RecordLimits) -> RecoveredWal {
        RecoveredWal {
            state: self.state,
            records: RecordStore::from_places(self.held, limits),
            segments: self.segments.into(),
            active: self.active,
            spares: self.spares.into(),
            junk: Vec::new(),
            next_lsn: self.next_lsn,
            epoch_max: self.epoch,
            next_segment: self.next_segment,
        }
    }

    /// The record of a clustered host whose hard state saved `commit`
    /// (raised to the first group on disk, as any restore does): one
    /// written at another commit index describes another state.
    pub fn matches_commit(&self, commit: u64) -> bool {
        self.raft.as_ref().is_some_and(|r| r.commit == crate::consensus::log::commit_on_disk(commit, r.log.base.0))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        let w = &mut Writer { buf: &mut body };
        let mut snapshot = Vec::new();
        put_snapshot(&mut Writer { buf: &mut snapshot }, &self.state.snapshot(false, &self.state.names));
        w.bytes(&snapshot);
        for list in [&self.config.sources, &self.config.sinks, &self.config.streams] {
            w.u32(list.len() as u32);
            for name in list {
                w.bytes(name.as_bytes());
            }
        }
        w.u64(self.epoch.0);
        w.u64(self.next_lsn.0);
        w.u64(self.next_segment.0);
        match self.active {
            None => w.u8(0),
            Some((id, offset)) => {
                w.u8(1);
                w.u64(id.0);
                w.u64(offset);
            }
        }
        w.u32(self.spares.len() as u32);
        for s in &self.spares {
            w.u64(s.0);
        }
        w.u32(self.segments.len() as u32);
        for s in &self.segments {
            w.u64(s.id.0);
            w.u64(s.last_lsn.0);
            put_place(w, s.last);
            w.u8(s.sealed as u8);
            let (tag, lsn) = match s.head {
                Head::Empty => (0, 0),
                Head::Fences { lsn } => (1, lsn.0),
                Head::Snapshot => (2, 0),
                Head::Other => (3, 0),
            };
            w.u8(tag);
            w.u64(lsn);
            w.u32(s.ends.len() as u32);
            for (key, end) in &s.ends {
                put_key(w, *key);
                w.u64(end.0);
            }
        }
        w.u32(self.held.len() as u32);
        for h in &self.held {
            put_key(w, h.key);
            put_place(w, h.span.place());
            for v in [h.span.last.0, h.origin.0, h.first.0, h.last.0, h.count, h.bytes] {
                w.u64(v);
            }
        }
        match &self.raft {
            None => w.u8(0),
            Some(raft) => {
                w.u8(1);
                w.u64(raft.commit);
                raft.log.encode(w);
            }
        }
        let mut out = Vec::with_capacity(16 + body.len());
        out.extend_from_slice(&STOP_RECORD_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// The record, or what is wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<StopRecord, &'static str> {
        if bytes.len() < 16 || bytes[..8] != STOP_RECORD_MAGIC {
            return Err("the stop record is not one");
        }
        if u32::from_le_bytes(bytes[8..12].try_into().unwrap()) != VERSION {
            return Err("the stop record is of another version");
        }
        let body = &bytes[16..];
        if u32::from_le_bytes(bytes[12..16].try_into().unwrap()) != crc32c::crc32c(body) {
            return Err("the stop record fails its checksum");
        }
        decode_body(body).map_err(|_| "the stop record does not decode")
    }
}

/// Raft's log, checked: each group past the commit index and the last
/// one, each valid at its place with its term (raft's log matching: a log
/// whose last entry has the same index and term as the record's holds the
/// same entries), and nothing written after the log's end.
fn raft_checks(raft: &RaftRecord) -> Vec<Check> {
    let log = &raft.log;
    let (base, last) = (log.base.0, log.last_index());
    let mut checks: Vec<Check> = (base + 1..=last)
        .filter(|&index| index > raft.commit || index == last)
        .map(|index| Check::Entry { place: log.place(index), term: log.term(index) })
        .collect();
    let end = log.ends.last().unwrap_or(&log.base_end);
    if !end.sealed {
        checks.push(Check::Unwritten { segment: end.segment, from: end.end });
    }
    checks
}

fn put_place(w: &mut Writer<'_>, p: GroupPlace) {
    for v in [p.lsn.0, p.segment.0, p.offset, p.len] {
        w.u64(v);
    }
}

fn get_place(r: &mut Reader<'_>) -> Result<GroupPlace, DecodeError> {
    Ok(GroupPlace { lsn: Lsn(r.u64()?), segment: SegmentId(r.u64()?), offset: r.u64()?, len: r.u64()? })
}

fn decode_body(body: &[u8]) -> Result<StopRecord, DecodeError> {
    let r = &mut Reader::new(body);
    let snapshot = get_snapshot(&mut Reader::new(r.bytes()?))?;
    let state = CommittedState::from_snapshot(&snapshot);
    let mut config = Names::default();
    for list in [&mut config.sources, &mut config.sinks, &mut config.streams] {
        for _ in 0..r.count(4)? {
            list.push(String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError)?);
        }
    }
    let (epoch, next_lsn, next_segment) = (Epoch(r.u64()?), Lsn(r.u64()?), SegmentId(r.u64()?));
    let active = match r.u8()? {
        0 => None,
        1 => Some((SegmentId(r.u64()?), r.u64()?)),
        _ => return Err(DecodeError),
    };
    let spares: Vec<SegmentId> = (0..r.count(8)?).map(|_| r.u64().map(SegmentId)).collect::<Result<_, _>>()?;
    let mut segments = Vec::new();
    for _ in 0..r.count(62)? {
        let (id, last_lsn, last) = (SegmentId(r.u64()?), Lsn(r.u64()?), get_place(r)?);
        let sealed = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(DecodeError),
        };
        let (tag, lsn) = (r.u8()?, Lsn(r.u64()?));
        let head = match tag {
            0 => Head::Empty,
            1 => Head::Fences { lsn },
            2 => Head::Snapshot,
            3 => Head::Other,
            _ => return Err(DecodeError),
        };
        let mut s = SegmentSummary { id, last_lsn, last, ends: Default::default(), sealed, head };
        for _ in 0..r.count(14)? {
            s.ends.insert(get_key(r)?, Position(r.u64()?));
        }
        segments.push(s);
    }
    let mut held = Vec::new();
    for _ in 0..r.count(86)? {
        let (key, place) = (get_key(r)?, get_place(r)?);
        let [last_lsn, origin, first, last, count, bytes] =
            [r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?];
        let GroupPlace { lsn, segment, offset, len } = place;
        if last_lsn < lsn.0 {
            return Err(DecodeError);
        }
        let span = GroupSpan { lsn, last: Lsn(last_lsn), segment, offset, len };
        let (origin, first, last) = (Position(origin), Position(first), Position(last));
        held.push(HeldPlace { key, span, origin, first, last, count, bytes });
    }
    let raft = match r.u8()? {
        0 => None,
        1 => {
            let raft = RaftRecord { commit: r.u64()?, log: LogRecord::decode(r)? };
            if raft.commit > raft.log.last_index() {
                // Its state would stand at a commit index its log lacks.
                return Err(DecodeError);
            }
            Some(raft)
        }
        _ => return Err(DecodeError),
    };
    if !r.is_empty() {
        return Err(DecodeError);
    }
    Ok(StopRecord { config, state, epoch, next_lsn, next_segment, active, spares, segments, held, raft })
}

#[cfg(test)]
mod tests;
