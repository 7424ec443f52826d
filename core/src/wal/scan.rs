//! The scan that recovery runs over the segments it finds: the dense run of
//! complete commit groups, a torn tail told from corruption by looking for
//! a later commit record, and the unreadable tail `wal verify` reports.

use super::frame::*;
use super::segment::*;
use super::stream::{Scanned, StreamScan};
use crate::ids::*;

/// What a `Corruption` says when a segment's first group continues from a
/// later LSN than the sealed segment before it ends at: the segments that
/// held the LSNs between are missing (`recovery::recover` names them).
pub const SEGMENTS_MISSING: &str = "its first LSN does not follow the sealed segment before it: segments are missing";

/// Scans `segments` (sorted by id) and admits the dense run of complete
/// commit groups. `lenient_tail` is the planted bug `admit-torn-segment`.
/// It is the streaming scan (`stream.rs`) run over bytes already read.
pub fn scan(segments: &[(SegmentId, &[u8])], lenient_tail: bool) -> Result<Vec<ScannedSegment>, Corruption> {
    let mut stream = StreamScan::new(segments.iter().map(|(id, _)| *id).collect(), lenient_tail, 1 << 20);
    let (mut out, mut groups) = (Vec::with_capacity(segments.len()), Vec::new());
    while let Some(read) = stream.next_read() {
        // Each segment is read in turn: the one after those done.
        let bytes = segments[out.len()].1;
        let from = (read.offset as usize).min(bytes.len());
        for item in stream.feed(bytes[from..(from + read.len).min(bytes.len())].to_vec())? {
            match item {
                Scanned::Group(_, group) => groups.push(group),
                Scanned::Segment(mut seg) => {
                    seg.groups = std::mem::take(&mut groups);
                    out.push(seg);
                }
                Scanned::Bytes(_) => unreachable!("not asked for"),
            }
        }
    }
    Ok(out)
}

/// Where a scanned WAL ends on bytes that are not a whole commit group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnreadableTail {
    pub segment: SegmentId,
    pub offset: u64,
}

/// What the WAL's last bytes are when they do not validate: one sentence,
/// the same wherever a tool or the daemon reports them.
pub const UNREADABLE_TAIL: &str = "bytes that are not a whole commit group: a write torn by a crash (recovery \
     ends the WAL before them), or damage to the last committed group; from the WAL alone the two cannot be told \
     apart";

/// How many bytes past the WAL's end are looked at: a torn write leaves a
/// frame header there at least.
pub const TAIL_PROBE_BYTES: usize = 64;

/// The place where the WAL `scanned` from `segments` ends on bytes that are
/// not a whole commit group, if it does: the segment where the scan ended
/// holds something other than zeros (a never written, preallocated tail)
/// where the next group would go. Recovery reads such bytes as a torn write
/// (the WAL's end); `wal verify` and the daemon's messages both report them
/// through this one judgement. A sealed segment or a torn creation ends
/// cleanly.
pub fn unreadable_tail(segments: &[(SegmentId, &[u8])], scanned: &[ScannedSegment]) -> Option<UnreadableTail> {
    let last = tail_segment(scanned.iter())?;
    let bytes = segments.iter().find(|(id, _)| *id == last.id)?.1;
    let from = (last.end as usize).min(bytes.len());
    tail_unreadable(last, &bytes[from..bytes.len().min(from + TAIL_PROBE_BYTES)])
}

/// The segment the WAL ends in: it goes on past a sealed segment and ends
/// in the first one that is not sealed (spares after it hold nothing yet),
/// unless that one's creation was torn.
pub fn tail_segment<'a>(mut scanned: impl Iterator<Item = &'a ScannedSegment>) -> Option<&'a ScannedSegment> {
    scanned.find(|s| !s.sealed).filter(|s| s.header_epoch.is_some())
}

/// `unreadable_tail`'s judgement of the bytes `probe` found at the end of
/// the segment `tail_segment` named (up to `TAIL_PROBE_BYTES` of them).
pub fn tail_unreadable(last: &ScannedSegment, probe: &[u8]) -> Option<UnreadableTail> {
    let probe = &probe[..probe.len().min(TAIL_PROBE_BYTES)];
    probe.iter().any(|b| *b != 0).then_some(UnreadableTail { segment: last.id, offset: last.end })
}

/// The planted bug `admit-torn-segment`: reads the torn group at `pos` the
/// way a careless reader would, with no checksums and no commit record, and
/// keeps whatever records a frame cut short still seems to hold.
pub(super) fn read_torn_group(
    segment: SegmentId,
    bytes: &[u8],
    pos: usize,
    expected: Option<Lsn>,
) -> Option<ScannedGroup> {
    let mut frames = Vec::new();
    let mut at = pos;
    let mut header: Option<(Lsn, Epoch)> = None;
    while let Some(buf) = bytes.get(at..).filter(|b| b.len() >= FRAME_HEADER_BYTES) {
        let payload_len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
        let lsn = Lsn(u64::from_le_bytes(buf[8..16].try_into().unwrap()));
        let epoch = Epoch(u64::from_le_bytes(buf[16..24].try_into().unwrap()));
        match header {
            None if expected.is_some_and(|e| e != lsn) => break,
            None => header = Some((lsn, epoch)),
            Some(h) if h != (lsn, epoch) => break,
            Some(_) => {}
        }
        let payload = &buf[FRAME_HEADER_BYTES..buf.len().min(FRAME_HEADER_BYTES + payload_len)];
        let frame = match buf[FRAME_HEADER_BYTES - 1] {
            k if k == FrameKind::SourceBatch as u8 => decode_batch_lenient(payload),
            _ => decode_frame(segment, buf, false).ok().map(|f| f.frame),
        };
        match frame {
            Some(Frame::Commit(_)) | None => break,
            Some(frame) => frames.push(frame),
        }
        at += FRAME_HEADER_BYTES + payload_len;
    }
    let (lsn, epoch) = header?;
    (!frames.is_empty()).then_some(ScannedGroup { lsn, epoch, offset: pos as u64, end: at as u64, frames })
}
