//! The payload codec: how many bytes each kind of frame takes, and how it
//! is written and read back. The frame header and its checksum are
//! `frame.rs`'s.

use super::codec::{DecodeError, Reader, Writer};
use super::frame::*;
use crate::ids::*;

impl Frame {
    pub(super) fn payload_len(&self) -> usize {
        match self {
            Frame::SourceBatch(b) => {
                assert!(b.counted.is_none(), "a batch read counted is never written");
                2 + 4 + 2 + 8 + opt_len(&b.checkpoint) + 4 + b.records.iter().map(|r| 12 + r.bytes.len()).sum::<usize>()
            }
            Frame::SchemaDecision(_) => 2 + 8,
            Frame::CompactionPlanned(p) => plan_len(p),
            Frame::CompactionDone(d) => 2 + 2 + 8 + 8 + d.records.map_or(0, |_| 8),
            Frame::Snapshot(s) => {
                4 + s.partitions.iter().map(|(_, p)| 2 + 4 + 2 + 8 + 8 + 8 + opt_len(&p.checkpoint)).sum::<usize>()
                    + 4
                    + s.acked.len() * (2 + 2 + 4 + 8)
                    + 4
                    + s.next_seq.len() * (2 + 2 + 8)
                    + 4
                    + s.schemas.len() * (2 + 8)
                    + 4
                    + s.open.iter().map(plan_len).sum::<usize>()
                    + s.names.encoded_len()
                    + letters_len(s)
            }
            Frame::Seal | Frame::Fence | Frame::Finished | Frame::AllFinished => 0,
            Frame::Skipped(k) => 2 + 4 + 2 + 8 + 8 + 4 + k.reason.len(),
            Frame::Refused(r) => refusal_len(r),
            Frame::Settled(x) => settled_len(x),
            Frame::BatchSkipped(k) => 2 + 2 + 8 + 8 + 4 + k.reason.len(),
            Frame::Split(x) => split_len(x),
            Frame::Window(x) => window_len(x),
            Frame::Membership(cc) => cc.len(),
            Frame::Commit(_) => COMMIT_PAYLOAD_BYTES,
        }
    }

    pub(super) fn encode_payload(&self, w: &mut Writer<'_>) {
        match self {
            Frame::SourceBatch(b) => put_batch(w, b),
            Frame::SchemaDecision(d) => {
                w.u16(d.stream.0);
                w.u64(d.fingerprint);
            }
            Frame::CompactionPlanned(p) => put_plan(w, p),
            Frame::CompactionDone(d) => {
                w.u16(d.sink.0);
                w.u16(d.stream.0);
                w.u64(d.id.0);
                w.u64(d.seq.0);
                if let Some(n) = d.records {
                    w.u64(n);
                }
            }
            Frame::Snapshot(s) => put_snapshot(w, s),
            Frame::Seal | Frame::Fence | Frame::Finished | Frame::AllFinished => {}
            Frame::Skipped(k) => {
                put_key(w, k.key);
                w.u16(k.stream.0);
                w.u64(k.at.0);
                w.u64(k.next.0);
                w.bytes(k.reason.as_bytes());
            }
            Frame::Refused(r) => put_refusal(w, r),
            Frame::Settled(x) => put_settled(w, x),
            Frame::Split(x) => put_split(w, x),
            Frame::Window(x) => put_window(w, x),
            Frame::BatchSkipped(k) => {
                w.u16(k.sink.0);
                w.u16(k.stream.0);
                w.u64(k.seq.0);
                w.u64(k.id.0);
                w.bytes(k.reason.as_bytes());
            }
            Frame::Membership(cc) => w.buf.extend_from_slice(cc),
            Frame::Commit(c) => {
                w.u32(c.frames);
                w.u32(c.bytes);
            }
        }
    }
}

/// The partition of a source-batch payload, read without decoding the rest.
pub(super) fn batch_key(payload: &[u8]) -> Option<PartitionKey> {
    get_key(&mut Reader::new(payload)).ok()
}

/// A source-batch payload's partition and end, without its records.
pub(super) fn batch_end(payload: &[u8]) -> Option<(PartitionKey, Position)> {
    let mut r = Reader::new(payload);
    let key = get_key(&mut r).ok()?;
    let _stream = r.u16().ok()?;
    Some((key, Position(r.u64().ok()?)))
}

/// The sink, stream, id and number of a compaction-plan payload, read
/// without its ranges.
pub(super) fn plan_head(payload: &[u8]) -> Option<PlannedBatch> {
    let mut r = Reader::new(payload);
    let (sink, stream) = (SinkId(r.u16().ok()?), StreamId(r.u16().ok()?));
    let id = CompactionId(r.u64().ok()?);
    Some(PlannedBatch { sink, stream, id, seq: CompactionSeq(r.u64().ok()?) })
}

/// The attempt a refusal or split payload makes of its plan (sink, stream,
/// the id it is sent under next, number), read without its records or
/// ranges.
pub(super) fn refusal_head(payload: &[u8]) -> Option<PlannedBatch> {
    let mut r = Reader::new(payload);
    let (sink, stream) = (SinkId(r.u16().ok()?), StreamId(r.u16().ok()?));
    let _refused = r.u64().ok()?;
    let seq = CompactionSeq(r.u64().ok()?);
    Some(PlannedBatch { sink, stream, id: CompactionId(r.u64().ok()?), seq })
}

/// Visits the records of a source-batch payload in place, (position,
/// bytes), without decoding them into owned records; returns the batch's
/// partition.
pub(super) fn visit_batch(payload: &[u8], mut each: impl FnMut(Position, &[u8])) -> Result<PartitionKey, DecodeError> {
    let mut r = Reader::new(payload);
    let key = get_key(&mut r)?;
    let _stream = r.u16()?;
    let _end = r.u64()?;
    get_checkpoint(&mut r)?;
    let n = r.count(12)?;
    for _ in 0..n {
        let position = Position(r.u64()?);
        each(position, r.bytes()?);
    }
    if !r.is_empty() {
        return Err(DecodeError);
    }
    Ok(key)
}

pub(super) fn decode_payload(kind: FrameKind, payload: &[u8]) -> Result<Frame, DecodeError> {
    decode_payload_as(kind, payload, RecordMode::Owned)
}

/// `decode_payload`, reading a source batch's records as `mode` says.
pub(super) fn decode_payload_as(kind: FrameKind, payload: &[u8], mode: RecordMode) -> Result<Frame, DecodeError> {
    let mut r = Reader::new(payload);
    let frame = match kind {
        FrameKind::SourceBatch => Frame::SourceBatch(get_batch(&mut r, mode)?),
        FrameKind::SchemaDecision => {
            Frame::SchemaDecision(SchemaDecision { stream: StreamId(r.u16()?), fingerprint: r.u64()? })
        }
        FrameKind::CompactionPlanned => Frame::CompactionPlanned(get_plan(&mut r)?),
        FrameKind::CompactionDone => Frame::CompactionDone(CompactionDone {
            sink: SinkId(r.u16()?),
            stream: StreamId(r.u16()?),
            id: CompactionId(r.u64()?),
            seq: CompactionSeq(r.u64()?),
            records: if r.is_empty() { None } else { Some(r.u64()?) },
        }),
        FrameKind::Snapshot => Frame::Snapshot(get_snapshot(&mut r)?),
        FrameKind::Seal => Frame::Seal,
        FrameKind::Fence => Frame::Fence,
        FrameKind::Finished => Frame::Finished,
        FrameKind::AllFinished => Frame::AllFinished,
        FrameKind::Skipped => Frame::Skipped(Skipped {
            key: get_key(&mut r)?,
            stream: StreamId(r.u16()?),
            at: Position(r.u64()?),
            next: Position(r.u64()?),
            reason: String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError)?,
        }),
        FrameKind::Refused => Frame::Refused(get_refusal(&mut r)?),
        FrameKind::Settled => Frame::Settled(get_settled(&mut r)?),
        FrameKind::Split => Frame::Split(get_split(&mut r)?),
        FrameKind::Window => Frame::Window(get_window(&mut r)?),
        FrameKind::BatchSkipped => Frame::BatchSkipped(BatchSkipped {
            sink: SinkId(r.u16()?),
            stream: StreamId(r.u16()?),
            seq: CompactionSeq(r.u64()?),
            id: CompactionId(r.u64()?),
            reason: String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError)?,
        }),
        FrameKind::Membership => Frame::Membership(r.take_up_to(r.remaining()).to_vec()),
        FrameKind::Commit => Frame::Commit(CommitRecord { frames: r.u32()?, bytes: r.u32()? }),
    };
    if !r.is_empty() {
        return Err(DecodeError);
    }
    Ok(frame)
}

fn put_batch(w: &mut Writer<'_>, b: &SourceBatch) {
    assert!(b.counted.is_none(), "a batch read counted is never written");
    put_key(w, b.key);
    w.u16(b.stream.0);
    w.u64(b.end.0);
    if b.provisional {
        assert!(b.checkpoint.is_none(), "a provisional batch carries no checkpoint");
        w.u8(2);
    } else {
        w.opt_bytes(b.checkpoint.as_deref());
    }
    w.u32(b.records.len() as u32);
    for r in &b.records {
        w.u64(r.position.0);
        w.bytes(&r.bytes);
    }
}

fn get_batch(r: &mut Reader<'_>, mode: RecordMode) -> Result<SourceBatch, DecodeError> {
    let key = get_key(r)?;
    let stream = StreamId(r.u16()?);
    let end = Position(r.u64()?);
    let (checkpoint, provisional) = get_checkpoint(r)?;
    let n = r.count(12)?;
    let mut batch = SourceBatch { key, stream, end, checkpoint, records: Vec::new(), counted: None, provisional };
    match mode {
        RecordMode::Owned => {
            batch.records.reserve_exact(n);
            for _ in 0..n {
                let position = Position(r.u64()?);
                let bytes = r.bytes()?.to_vec();
                batch.records.push(Record { position, bytes });
            }
        }
        RecordMode::Counted if n > 0 => {
            let first = Position(r.u64()?);
            let mut c = Counted { count: n as u64, bytes: r.bytes()?.len() as u64, first, last: first };
            for _ in 1..n {
                c.last = Position(r.u64()?);
                c.bytes += r.bytes()?.len() as u64;
            }
            batch.counted = Some(c);
        }
        RecordMode::Counted => {}
    }
    Ok(batch)
}

pub(crate) fn put_snapshot(w: &mut Writer<'_>, s: &Snapshot) {
    w.u32(s.partitions.len() as u32);
    for (key, p) in &s.partitions {
        put_key(w, *key);
        w.u16(p.stream.0);
        w.u64(p.position.0);
        w.u64(p.lsn.0);
        w.u64(p.records);
        w.opt_bytes(p.checkpoint.as_deref());
    }
    w.u32(s.acked.len() as u32);
    for (sink, key, pos) in &s.acked {
        w.u16(sink.0);
        put_key(w, *key);
        w.u64(pos.0);
    }
    w.u32(s.next_seq.len() as u32);
    for (sink, stream, seq) in &s.next_seq {
        w.u16(sink.0);
        w.u16(stream.0);
        w.u64(seq.0);
    }
    w.u32(s.schemas.len() as u32);
    for d in &s.schemas {
        w.u16(d.stream.0);
        w.u64(d.fingerprint);
    }
    w.u32(s.open.len() as u32);
    for p in &s.open {
        put_plan(w, p);
    }
    for list in [&s.names.sources, &s.names.sinks, &s.names.streams] {
        w.u32(list.len() as u32);
        for name in list {
            w.bytes(name.as_bytes());
        }
    }
    let windows = has_windows(s);
    let letters = has_letters(s) || windows;
    if s.finished.is_some() || letters {
        // Zero where there is none: no group at LSN 0 is a terminal entry.
        w.u64(s.finished.map_or(0, |l| l.0));
        w.u64(s.all_finished.map_or(0, |l| l.0));
    }
    if letters {
        w.u32(s.letters.next_letters.len() as u32);
        for (sink, stream, seq) in &s.letters.next_letters {
            w.u16(sink.0);
            w.u16(stream.0);
            w.u64(seq.0);
        }
        w.u32(s.letters.refusals.len() as u32);
        for r in &s.letters.refusals {
            put_refusal(w, r);
        }
        w.u32(s.letters.settled.len() as u32);
        for x in &s.letters.settled {
            put_settled(w, x);
        }
        w.u64(s.letters.breaker.decided);
        w.u32(s.letters.breaker.refusals.len() as u32);
        for (at, n) in &s.letters.breaker.refusals {
            w.u64(*at);
            w.u64(*n);
        }
        if !s.letters.splits.is_empty() || windows {
            w.u32(s.letters.splits.len() as u32);
            for x in &s.letters.splits {
                put_split(w, x);
            }
        }
    }
    if windows {
        w.u32(s.windows.open.len() as u32);
        for (source, parts) in &s.windows.open {
            w.u16(source.0);
            put_window_parts(w, parts);
        }
        w.u32(s.windows.tails.len() as u32);
        for (source, t) in &s.windows.tails {
            w.u16(source.0);
            put_tail(w, t);
        }
        w.u32(s.windows.voids.len() as u32);
        for (key, from, to) in &s.windows.voids {
            put_key(w, *key);
            w.u64(from.0);
            w.u64(to.0);
        }
    }
}

/// Open windows and tails, in a tail of their own after the splits (so
/// other snapshots keep their bytes).
fn has_windows(s: &Snapshot) -> bool {
    !s.windows.open.is_empty() || !s.windows.tails.is_empty() || !s.windows.voids.is_empty()
}

fn has_letters(s: &Snapshot) -> bool {
    !s.letters.next_letters.is_empty()
        || !s.letters.refusals.is_empty()
        || !s.letters.settled.is_empty()
        || s.letters.breaker != Breaker::default()
        || !s.letters.splits.is_empty()
}

/// The snapshot's tail: the terminal entries (16 bytes), then the
/// dead-letter state; a snapshot with neither ends at its names, one with
/// only the first (as before dead letters) 16 bytes later.
fn letters_len(s: &Snapshot) -> usize {
    let windows = has_windows(s);
    let letters = has_letters(s) || windows;
    let tail = if s.finished.is_some() || letters { 16 } else { 0 };
    let windows_len = match windows {
        false => 0,
        true => {
            4 + s.windows.open.iter().map(|(_, parts)| 2 + 4 + parts.len() * WINDOW_PART_BYTES).sum::<usize>()
                + 4
                + s.windows.tails.iter().map(|(_, t)| 2 + TAIL_BYTES_MIN + 8 * t.digests.len()).sum::<usize>()
                + 4
                + s.windows.voids.len() * (6 + 8 + 8)
        }
    };
    windows_len
        + match letters {
            true => {
                tail + 4
                    + s.letters.next_letters.len() * 12
                    + 4
                    + s.letters.refusals.iter().map(refusal_len).sum::<usize>()
                    + 4
                    + s.letters.settled.iter().map(settled_len).sum::<usize>()
                    + 8
                    + 4
                    + s.letters.breaker.refusals.len() * 16
                    + match s.letters.splits.is_empty() && !windows {
                        true => 0,
                        false => 4 + s.letters.splits.iter().map(split_len).sum::<usize>(),
                    }
            }
            false => tail,
        }
}

pub(crate) fn get_snapshot(r: &mut Reader<'_>) -> Result<Snapshot, DecodeError> {
    let mut s = Snapshot::default();
    for _ in 0..r.count(33)? {
        let key = get_key(r)?;
        let p = PartitionState {
            stream: StreamId(r.u16()?),
            position: Position(r.u64()?),
            lsn: Lsn(r.u64()?),
            records: r.u64()?,
            checkpoint: r.opt_bytes()?,
        };
        s.partitions.push((key, p));
    }
    for _ in 0..r.count(16)? {
        s.acked.push((SinkId(r.u16()?), get_key(r)?, Position(r.u64()?)));
    }
    for _ in 0..r.count(12)? {
        s.next_seq.push((SinkId(r.u16()?), StreamId(r.u16()?), CompactionSeq(r.u64()?)));
    }
    for _ in 0..r.count(10)? {
        s.schemas.push(SchemaDecision { stream: StreamId(r.u16()?), fingerprint: r.u64()? });
    }
    for _ in 0..r.count(32)? {
        s.open.push(get_plan(r)?);
    }
    for list in [&mut s.names.sources, &mut s.names.sinks, &mut s.names.streams] {
        for _ in 0..r.count(4)? {
            list.push(String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError)?);
        }
    }
    if !r.is_empty() {
        s.finished = Some(Lsn(r.u64()?)).filter(|l| l.0 != 0);
        s.all_finished = Some(Lsn(r.u64()?)).filter(|l| l.0 != 0);
    }
    if !r.is_empty() {
        for _ in 0..r.count(12)? {
            s.letters.next_letters.push((SinkId(r.u16()?), StreamId(r.u16()?), CompactionSeq(r.u64()?)));
        }
        for _ in 0..r.count(REFUSAL_BYTES_MIN)? {
            s.letters.refusals.push(get_refusal(r)?);
        }
        for _ in 0..r.count(SETTLED_BYTES)? {
            s.letters.settled.push(get_settled(r)?);
        }
        s.letters.breaker.decided = r.u64()?;
        for _ in 0..r.count(16)? {
            s.letters.breaker.refusals.push((r.u64()?, r.u64()?));
        }
        // Splits, where there are any (snapshots before them end here).
        if !r.is_empty() {
            for _ in 0..r.count(SPLIT_BYTES_MIN)? {
                s.letters.splits.push(get_split(r)?);
            }
        }
        // Open windows and tails, where there are any.
        if !r.is_empty() {
            for _ in 0..r.count(2 + 4)? {
                let source = SourceId(r.u16()?);
                s.windows.open.push((source, get_window_parts(r)?));
            }
            for _ in 0..r.count(2 + TAIL_BYTES_MIN)? {
                let source = SourceId(r.u16()?);
                s.windows.tails.push((source, get_tail(r)?));
            }
            for _ in 0..r.count(6 + 8 + 8)? {
                s.windows.voids.push((get_key(r)?, Position(r.u64()?), Position(r.u64()?)));
            }
        }
    }
    Ok(s)
}

const SPLIT_BYTES_MIN: usize = 2 + 2 + 8 + 8 + 8 + 4;

/// A split's head is laid out as a refusal's (`refusal_head` reads both).
fn split_len(x: &Split) -> usize {
    SPLIT_BYTES_MIN + x.ranges.len() * (2 + 4 + 8 + 8)
}

fn put_split(w: &mut Writer<'_>, x: &Split) {
    w.u16(x.sink.0);
    w.u16(x.stream.0);
    w.u64(x.id.0);
    w.u64(x.seq.0);
    w.u64(x.then.0);
    put_ranges(w, &x.ranges);
}

fn get_split(r: &mut Reader<'_>) -> Result<Split, DecodeError> {
    let (sink, stream) = (SinkId(r.u16()?), StreamId(r.u16()?));
    let (id, seq, then) = (CompactionId(r.u64()?), CompactionSeq(r.u64()?), CompactionId(r.u64()?));
    Ok(Split { sink, stream, id, seq, then, ranges: get_ranges(r)? })
}

const REFUSAL_BYTES_MIN: usize = 2 + 2 + 8 + 8 + 8 + 8 + 4;
const SETTLED_BYTES: usize = 2 + 2 + 8 + 8 + 1 + 8;

/// A settlement's bytes: the flag says whether it has dead letters, and
/// (2) whether records quarantined at intake are among them, whose count
/// then follows (so a settlement without any keeps its bytes).
fn settled_len(x: &Settled) -> usize {
    SETTLED_BYTES + if x.letters.is_some() && x.quarantined > 0 { 8 } else { 0 }
}

fn put_settled(w: &mut Writer<'_>, x: &Settled) {
    debug_assert!(x.quarantined == 0 || x.letters.is_some(), "quarantined records have dead letters");
    w.u16(x.sink.0);
    w.u16(x.stream.0);
    w.u64(x.seq.0);
    w.u64(x.held.0);
    w.u8(match (x.letters, x.quarantined) {
        (None, _) => 0,
        (Some(_), 0) => 1,
        (Some(_), _) => 2,
    });
    w.u64(x.letters.map_or(0, |l| l.0));
    if x.letters.is_some() && x.quarantined > 0 {
        w.u64(x.quarantined);
    }
}

fn get_settled(r: &mut Reader<'_>) -> Result<Settled, DecodeError> {
    let (sink, stream, seq, held) =
        (SinkId(r.u16()?), StreamId(r.u16()?), CompactionSeq(r.u64()?), CompactionId(r.u64()?));
    let (letters, quarantined) = match (r.u8()?, r.u64()?) {
        (0, _) => (None, 0),
        (1, l) => (Some(CompactionSeq(l)), 0),
        (2, l) => match r.u64()? {
            0 => return Err(DecodeError),
            q => (Some(CompactionSeq(l)), q),
        },
        _ => return Err(DecodeError),
    };
    Ok(Settled { sink, stream, seq, held, letters, quarantined })
}

fn refusal_len(r: &Refusal) -> usize {
    REFUSAL_BYTES_MIN + r.records.iter().map(|x| 6 + 8 + 4 + x.reason.len()).sum::<usize>()
}

fn put_refusal(w: &mut Writer<'_>, r: &Refusal) {
    w.u16(r.sink.0);
    w.u16(r.stream.0);
    w.u64(r.id.0);
    w.u64(r.seq.0);
    w.u64(r.then.0);
    w.u64(r.at_ms);
    w.u32(r.records.len() as u32);
    for x in &r.records {
        put_key(w, x.key);
        w.u64(x.position.0);
        w.bytes(x.reason.as_bytes());
    }
}

fn get_refusal(r: &mut Reader<'_>) -> Result<Refusal, DecodeError> {
    let (sink, stream) = (SinkId(r.u16()?), StreamId(r.u16()?));
    let (id, seq, then) = (CompactionId(r.u64()?), CompactionSeq(r.u64()?), CompactionId(r.u64()?));
    let at_ms = r.u64()?;
    let mut records = Vec::new();
    for _ in 0..r.count(18)? {
        let (key, position) = (get_key(r)?, Position(r.u64()?));
        let reason = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError)?;
        records.push(RefusedRecord { key, position, reason });
    }
    Ok(Refusal { sink, stream, id, seq, then, at_ms, records })
}

/// A source batch's checkpoint and whether the batch is provisional: the
/// checkpoint's tag is 0 (none), 1 (one follows) or 2 (none, provisional:
/// so batches of no window keep their bytes).
pub(crate) fn get_checkpoint(r: &mut Reader<'_>) -> Result<(Option<Vec<u8>>, bool), DecodeError> {
    match r.u8()? {
        0 => Ok((None, false)),
        1 => Ok((Some(r.bytes()?.to_vec()), false)),
        2 => Ok((None, true)),
        _ => Err(DecodeError),
    }
}

const WINDOW_PART_BYTES: usize = 4 + 2 + 8 + 8 + 8;
const TAIL_BYTES_MIN: usize = 4 + 8 + 1 + 4;

fn window_len(x: &WindowEnd) -> usize {
    2 + 1
        + opt_len(&x.checkpoint)
        + 4
        + x.parts.len() * WINDOW_PART_BYTES
        + 4
        + x.tails.iter().map(|t| TAIL_BYTES_MIN + 8 * t.digests.len()).sum::<usize>()
}

fn put_window(w: &mut Writer<'_>, x: &WindowEnd) {
    w.u16(x.source.0);
    w.u8(u8::from(x.closed));
    w.opt_bytes(x.checkpoint.as_deref());
    put_window_parts(w, &x.parts);
    w.u32(x.tails.len() as u32);
    for t in &x.tails {
        put_tail(w, t);
    }
}

fn get_window(r: &mut Reader<'_>) -> Result<WindowEnd, DecodeError> {
    let source = SourceId(r.u16()?);
    let closed = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError),
    };
    let checkpoint = r.opt_bytes()?;
    let parts = get_window_parts(r)?;
    let mut tails = Vec::new();
    for _ in 0..r.count(TAIL_BYTES_MIN)? {
        tails.push(get_tail(r)?);
    }
    Ok(WindowEnd { source, checkpoint, closed, parts, tails })
}

fn put_window_parts(w: &mut Writer<'_>, parts: &[WindowPart]) {
    w.u32(parts.len() as u32);
    for p in parts {
        w.u32(p.partition);
        w.u16(p.stream.0);
        w.u64(p.from.0);
        w.u64(p.to.0);
        w.u64(p.records);
    }
}

fn get_window_parts(r: &mut Reader<'_>) -> Result<Vec<WindowPart>, DecodeError> {
    let mut parts = Vec::new();
    for _ in 0..r.count(WINDOW_PART_BYTES)? {
        parts.push(WindowPart {
            partition: r.u32()?,
            stream: StreamId(r.u16()?),
            from: Position(r.u64()?),
            to: Position(r.u64()?),
            records: r.u64()?,
        });
    }
    Ok(parts)
}

fn put_tail(w: &mut Writer<'_>, t: &Tail) {
    w.u32(t.partition);
    w.u64(t.key);
    w.u8(u8::from(t.more));
    w.u32(t.digests.len() as u32);
    for d in &t.digests {
        w.u64(*d);
    }
}

fn get_tail(r: &mut Reader<'_>) -> Result<Tail, DecodeError> {
    let (partition, key) = (r.u32()?, r.u64()?);
    let more = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError),
    };
    let mut digests = Vec::new();
    for _ in 0..r.count(8)? {
        digests.push(r.u64()?);
    }
    Ok(Tail { partition, key, digests, more })
}

fn opt_len(v: &Option<Vec<u8>>) -> usize {
    1 + v.as_ref().map_or(0, |b| 4 + b.len())
}

fn plan_len(p: &CompactionPlan) -> usize {
    2 + 2 + 8 + 8 + 8 + 4 + p.ranges.len() * (2 + 4 + 8 + 8)
}

pub(crate) fn put_key(w: &mut Writer<'_>, key: PartitionKey) {
    w.u16(key.source.0);
    w.u32(key.partition);
}

pub(crate) fn get_key(r: &mut Reader<'_>) -> Result<PartitionKey, DecodeError> {
    Ok(PartitionKey { source: SourceId(r.u16()?), partition: r.u32()? })
}

fn put_plan(w: &mut Writer<'_>, p: &CompactionPlan) {
    w.u16(p.sink.0);
    w.u16(p.stream.0);
    w.u64(p.id.0);
    w.u64(p.seq.0);
    w.u64(p.schema);
    put_ranges(w, &p.ranges);
}

/// A count, then each range: partition, from, to (22 bytes).
fn put_ranges(w: &mut Writer<'_>, ranges: &[Range]) {
    w.u32(ranges.len() as u32);
    for range in ranges {
        put_key(w, range.key);
        w.u64(range.from.0);
        w.u64(range.to.0);
    }
}

fn get_ranges(r: &mut Reader<'_>) -> Result<Vec<Range>, DecodeError> {
    let n = r.count(22)?;
    let mut ranges = Vec::with_capacity(n);
    for _ in 0..n {
        ranges.push(Range { key: get_key(r)?, from: Position(r.u64()?), to: Position(r.u64()?) });
    }
    Ok(ranges)
}

fn get_plan(r: &mut Reader<'_>) -> Result<CompactionPlan, DecodeError> {
    let sink = SinkId(r.u16()?);
    let stream = StreamId(r.u16()?);
    let id = CompactionId(r.u64()?);
    let seq = CompactionSeq(r.u64()?);
    let schema = r.u64()?;
    Ok(CompactionPlan { sink, stream, id, seq, schema, ranges: get_ranges(r)? })
}
