//! The scan that recovery runs over the segments it finds: the dense run of
//! complete commit groups, a torn tail told from corruption by looking for
//! a later commit record, and the unreadable tail `wal verify` reports.

use super::frame::*;
use super::segment::*;
use crate::ids::*;

/// What a `Corruption` says when a segment's first group continues from a
/// later LSN than the sealed segment before it ends at: the segments that
/// held the LSNs between are missing (`recovery::recover` names them).
pub const SEGMENTS_MISSING: &str = "its first LSN does not follow the sealed segment before it: segments are missing";

/// Scans `segments` (sorted by id) and admits the dense run of complete
/// commit groups. `lenient_tail` is the planted bug `admit-torn-segment`.
pub fn scan(segments: &[(SegmentId, &[u8])], lenient_tail: bool) -> Result<Vec<ScannedSegment>, Corruption> {
    let mut scan = Scan { segments, lenient_tail, expected: None, newest: Epoch(0), ended: false };
    (0..segments.len()).map(|i| scan.segment(i)).collect()
}

/// Where a scan stands between segments.
struct Scan<'a> {
    segments: &'a [(SegmentId, &'a [u8])],
    lenient_tail: bool,
    /// The LSN the next group must carry.
    expected: Option<Lsn>,
    /// The highest writer epoch admitted so far.
    newest: Epoch,
    /// The WAL has ended: what follows is read as nothing.
    ended: bool,
}

impl Scan<'_> {
    fn segment(&mut self, i: usize) -> Result<ScannedSegment, Corruption> {
        let (id, bytes) = self.segments[i];
        let end = SEGMENT_HEADER_BYTES as u64;
        let mut seg =
            ScannedSegment { id, header_epoch: None, groups: Vec::new(), sealed: false, end, stale_groups: 0 };
        match decode_header(id, bytes) {
            Ok(epoch) => seg.header_epoch = Some(epoch),
            Err(_) => {
                // A torn creation holds zeros after its header, never a
                // valid commit record of this segment: one means the header
                // rotted under committed data.
                if !self.ended && (holds_commit(id, bytes) || commit_follows(self.segments, i, 0, self.expected)) {
                    return Err(Corruption { segment: id, offset: 0, what: "segment header is invalid" });
                }
                self.ended = true;
            }
        }
        if !self.ended {
            seg.end = self.groups(i, &mut seg)? as u64;
        }
        Ok(seg)
    }

    /// Admits the segment's groups; returns where the next would go.
    fn groups(&mut self, i: usize, seg: &mut ScannedSegment) -> Result<usize, Corruption> {
        let (id, bytes) = self.segments[i];
        let mut pos = SEGMENT_HEADER_BYTES;
        loop {
            let read = read_group(id, bytes, pos, None, true);
            // A group of a writer older than one already admitted was written
            // by a writer that lost the lease and had not noticed: it is not
            // the WAL's, and the new writer continues after it.
            if let Ok((group, _)) = &read {
                if group.epoch < self.newest {
                    pos = group.end as usize;
                    seg.stale_groups += 1;
                    continue;
                }
            }
            // A valid first group whose LSN jumps past the sealed segment
            // before it: whole segments in between are gone.
            if let (Ok((group, _)), Some(e)) = (&read, self.expected) {
                if pos == SEGMENT_HEADER_BYTES && group.lsn > e {
                    return Err(Corruption { segment: id, offset: pos as u64, what: SEGMENTS_MISSING });
                }
            }
            let read = read.and_then(|(g, sealed)| match self.expected {
                Some(e) if e != g.lsn => Err(GroupError::Invalid),
                _ => Ok((g, sealed)),
            });
            let Ok((group, sealed)) = read else {
                return self.torn(i, seg, pos);
            };
            self.newest = self.newest.max(group.epoch);
            self.expected = Some(Lsn(group.lsn.0 + 1));
            pos = group.end as usize;
            seg.groups.push(group);
            if sealed {
                seg.sealed = true;
                return Ok(pos);
            }
        }
    }

    /// The group at `pos` does not validate: the end of the WAL, unless a
    /// committed group follows it (then it is corruption).
    fn torn(&mut self, i: usize, seg: &mut ScannedSegment, mut pos: usize) -> Result<usize, Corruption> {
        let (id, bytes) = self.segments[i];
        if commit_follows(self.segments, i, pos, self.expected) {
            let what = "a commit group fails validation and later groups are committed";
            return Err(Corruption { segment: id, offset: pos as u64, what });
        }
        if self.lenient_tail {
            if let Some(group) = read_torn_group(id, bytes, pos, self.expected) {
                pos = group.end as usize;
                seg.groups.push(group);
            }
        }
        self.ended = true;
        Ok(pos)
    }
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

/// Does `bytes` hold any checksum-valid commit record of `segment`?
fn holds_commit(segment: SegmentId, bytes: &[u8]) -> bool {
    (SEGMENT_HEADER_BYTES..bytes.len().saturating_sub(COMMIT_FRAME_BYTES - 1))
        .any(|at| bytes[at] == COMMIT_PAYLOAD_BYTES as u8 && commit_record_at(segment, &bytes[at..]).is_some())
}

/// Is there a valid commit record of a later group after `pos` in segment
/// `i`, or anywhere in a later segment? With no group admitted yet, "later"
/// means a second, higher LSN after the first one found.
fn commit_follows(segments: &[(SegmentId, &[u8])], i: usize, pos: usize, expected: Option<Lsn>) -> bool {
    let mut lowest: Option<Lsn> = None;
    for (j, &(id, bytes)) in segments.iter().enumerate().skip(i) {
        let start = if j == i { pos + 1 } else { SEGMENT_HEADER_BYTES };
        let mut at = start;
        while at + COMMIT_FRAME_BYTES <= bytes.len() {
            // A commit record starts with its length, 8: jump to the next 8.
            match memchr::memchr(COMMIT_PAYLOAD_BYTES as u8, &bytes[at..bytes.len() - COMMIT_FRAME_BYTES + 1]) {
                Some(skip) => at += skip,
                None => break,
            }
            if let Some(lsn) = commit_record_at(id, &bytes[at..]) {
                match expected {
                    Some(e) if lsn > e => return true,
                    Some(_) => {}
                    None => match lowest {
                        Some(low) if lsn > low => return true,
                        Some(_) => {}
                        None => lowest = Some(lsn),
                    },
                }
            }
            at += 1;
        }
    }
    false
}
