//! Segments: the header that opens every segment, the encoding of a commit
//! group, and the scan that recovery runs over the segments it finds.
//!
//! The scan admits only complete commit groups, in dense LSN order. A group
//! that fails to validate is a torn tail only when no valid commit record of a
//! later group follows it, in its own segment or any later one; anything else
//! is corruption, reported with the segment and byte offset. Rot inside the
//! very last group cannot be told from a torn write: that group is dropped
//! like a torn one (it was never acknowledged if the writer crashed, but
//! rot there after an acknowledgement loses it; see docs/ARCHITECTURE.md).

use super::frame::*;
use super::payload::{batch_end, batch_key, decode_payload, visit_batch};
use crate::ids::*;

pub const SEGMENT_MAGIC: [u8; 8] = *b"SKPRWAL\0";
pub const FORMAT_VERSION: u32 = 1;
pub const SEGMENT_HEADER_BYTES: usize = 32;
/// A group never holds more frames than this.
pub const GROUP_FRAMES_MAX: usize = 1 << 16;

/// `magic | version: u32 | crc: u32 | segment: u64 | epoch: u64`; the crc
/// covers every other byte of the header.
pub fn encode_header(segment: SegmentId, epoch: Epoch) -> Vec<u8> {
    let mut h = Vec::with_capacity(SEGMENT_HEADER_BYTES);
    h.extend_from_slice(&SEGMENT_MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&[0; 4]);
    h.extend_from_slice(&segment.0.to_le_bytes());
    h.extend_from_slice(&epoch.0.to_le_bytes());
    let crc = header_crc(&h);
    h[12..16].copy_from_slice(&crc.to_le_bytes());
    h
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    Truncated,
    Magic,
    Version(u32),
    Checksum,
    WrongSegment(SegmentId),
}

/// Reads a header back and checks it names `segment`. Returns the epoch of
/// the writer that created the segment.
pub fn decode_header(segment: SegmentId, bytes: &[u8]) -> Result<Epoch, HeaderError> {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return Err(HeaderError::Truncated);
    }
    let h = &bytes[..SEGMENT_HEADER_BYTES];
    if h[0..8] != SEGMENT_MAGIC {
        return Err(HeaderError::Magic);
    }
    if u32::from_le_bytes(h[12..16].try_into().unwrap()) != header_crc(h) {
        return Err(HeaderError::Checksum);
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    let id = SegmentId(u64::from_le_bytes(h[16..24].try_into().unwrap()));
    if id != segment {
        return Err(HeaderError::WrongSegment(id));
    }
    Ok(Epoch(u64::from_le_bytes(h[24..32].try_into().unwrap())))
}

fn header_crc(h: &[u8]) -> u32 {
    let c = crc32c::crc32c(&h[0..12]);
    crc32c::crc32c_append(c, &h[16..32])
}

/// Encodes `frames` followed by their commit record as one commit group.
pub fn encode_group(segment: SegmentId, epoch: Epoch, lsn: Lsn, frames: &[&Frame]) -> Vec<u8> {
    assert!(frames.len() < GROUP_FRAMES_MAX, "group frame count bound");
    let len: usize = frames.iter().map(|f| f.encoded_len()).sum();
    let mut out = Vec::with_capacity(len + COMMIT_FRAME_BYTES);
    for frame in frames {
        assert!(!matches!(frame, Frame::Commit(_)), "commit records are added here only");
        frame.encode(segment, epoch, lsn, &mut out);
    }
    assert_eq!(out.len(), len, "encoded_len is exact");
    let commit = CommitRecord { frames: frames.len() as u32, bytes: len as u32 };
    Frame::Commit(commit).encode(segment, epoch, lsn, &mut out);
    out
}

/// One admitted commit group.
#[derive(Debug)]
pub struct ScannedGroup {
    pub lsn: Lsn,
    pub epoch: Epoch,
    pub offset: u64,
    pub end: u64,
    pub frames: Vec<Frame>,
}

/// What the scan found in one segment.
#[derive(Debug)]
pub struct ScannedSegment {
    pub id: SegmentId,
    /// The creating writer's epoch, or `None` when the header is invalid
    /// (a segment whose creation was torn, after the end of the WAL).
    pub header_epoch: Option<Epoch>,
    pub groups: Vec<ScannedGroup>,
    /// The last group carries a seal: the WAL continues in the next segment.
    pub sealed: bool,
    /// Where the next group would be appended.
    pub end: u64,
    /// Valid groups skipped because a newer writer's group came before them.
    pub stale_groups: u32,
}

/// Committed data that cannot be trusted: recovery stops here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    pub segment: SegmentId,
    pub offset: u64,
    pub what: &'static str,
}

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
                Some(e) if e != g.lsn => Err(()),
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
const TAIL_PROBE_BYTES: usize = 64;

/// The place where the WAL `scanned` from `segments` ends on bytes that are
/// not a whole commit group, if it does: the segment where the scan ended
/// holds something other than zeros (a never written, preallocated tail)
/// where the next group would go. Recovery reads such bytes as a torn write
/// (the WAL's end); `wal verify` and the daemon's messages both report them
/// through this one judgement. A sealed segment or a torn creation ends
/// cleanly.
pub fn unreadable_tail(segments: &[(SegmentId, &[u8])], scanned: &[ScannedSegment]) -> Option<UnreadableTail> {
    // The WAL goes on past a sealed segment; it ends in the first one that
    // is not sealed (spares after it hold nothing yet).
    let last = scanned.iter().find(|s| !s.sealed)?;
    last.header_epoch?;
    let bytes = segments.iter().find(|(id, _)| *id == last.id)?.1;
    let from = (last.end as usize).min(bytes.len());
    let probe = &bytes[from..bytes.len().min(from + TAIL_PROBE_BYTES)];
    probe.iter().any(|b| *b != 0).then_some(UnreadableTail { segment: last.id, offset: last.end })
}

/// What a whole commit group is, checked without decoding its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupShape {
    pub epoch: Epoch,
    /// Frames before the commit record.
    pub frames: u32,
    pub sealed: bool,
    /// The group is a lone fence (raft's empty entry in clustered mode).
    pub lone_fence: bool,
    /// The group holds a membership change (a raft conf-change entry).
    pub membership: bool,
}

/// Checks that `bytes` are exactly one whole commit group of `segment` at
/// `lsn` (every frame's checksum, one LSN and epoch, the commit record
/// counting the frames and closing the bytes, nothing after a seal) and
/// returns its shape, decoding no payload but the commit record's.
pub fn group_shape(segment: SegmentId, lsn: Lsn, bytes: &[u8]) -> Option<GroupShape> {
    walk_group(segment, lsn, bytes, |_, _| {})
}

/// The partition and end of each source batch in a group `group_shape`
/// accepts, read without decoding its records.
pub fn group_batch_ends(segment: SegmentId, lsn: Lsn, bytes: &[u8]) -> Option<Vec<(PartitionKey, Position)>> {
    let mut ends = Vec::new();
    let mut bad = false;
    walk_group(segment, lsn, bytes, |kind, payload| {
        if kind == FrameKind::SourceBatch {
            match batch_end(payload) {
                Some(end) => ends.push(end),
                None => bad = true,
            }
        }
    })?;
    (!bad).then_some(ends)
}

/// Checks a group's frames as `group_shape` says, handing each frame
/// before the commit record to `each` (its kind and payload).
fn walk_group(
    segment: SegmentId,
    lsn: Lsn,
    bytes: &[u8],
    mut each: impl FnMut(FrameKind, &[u8]),
) -> Option<GroupShape> {
    let (mut at, mut frames, mut epoch, mut sealed, mut first) = (0, 0u32, None, false, None);
    let mut membership = false;
    loop {
        if at >= bytes.len() || frames as usize >= GROUP_FRAMES_MAX {
            return None;
        }
        let (l, e, kind, payload, len) = frame_parts(segment, &bytes[at..], true).ok()?;
        if l != lsn || epoch.is_some_and(|x| x != e) {
            return None;
        }
        epoch = Some(e);
        match kind {
            FrameKind::Commit => {
                let Ok(Frame::Commit(c)) = decode_payload(kind, payload) else { return None };
                if c.frames != frames || c.bytes as usize != at || at + len != bytes.len() {
                    return None;
                }
                let lone_fence = frames == 1 && first == Some(FrameKind::Fence);
                return Some(GroupShape { epoch: e, frames, sealed, lone_fence, membership });
            }
            _ if sealed => return None, // nothing but the commit record follows a seal
            FrameKind::Seal => sealed = true,
            FrameKind::Membership => membership = true,
            _ => {}
        }
        each(kind, payload);
        first.get_or_insert(kind);
        frames += 1;
        at += len;
    }
}

/// Checks that `bytes` are exactly one whole commit group of `segment` at
/// `lsn`: every frame's checksum, one LSN and epoch throughout, the commit
/// record closing the bytes. Returns the group (offsets relative to the
/// bytes) and whether it seals its segment. A follower checks each group
/// its leader sends before writing it (clustered mode).
pub fn check_group(segment: SegmentId, lsn: Lsn, bytes: &[u8]) -> Option<(ScannedGroup, bool)> {
    let (group, sealed) = read_group(segment, bytes, 0, Some(lsn), true).ok()?;
    (group.end as usize == bytes.len()).then_some((group, sealed))
}

/// Reads the group at `pos`; the bool is true when the group seals its segment.
fn read_group(
    segment: SegmentId,
    bytes: &[u8],
    pos: usize,
    expected: Option<Lsn>,
    verify: bool,
) -> Result<(ScannedGroup, bool), ()> {
    let mut frames = Vec::new();
    let mut at = pos;
    let mut sealed = false;
    let mut header: Option<(Lsn, Epoch)> = None;
    loop {
        let f = decode_frame(segment, bytes.get(at..).ok_or(())?, verify).map_err(|_| ())?;
        match header {
            None => {
                if expected.is_some_and(|e| e != f.lsn) {
                    return Err(());
                }
                header = Some((f.lsn, f.epoch));
            }
            Some((lsn, epoch)) if lsn != f.lsn || epoch != f.epoch => return Err(()),
            Some(_) => {}
        }
        let frame_at = at;
        at += f.len;
        match f.frame {
            Frame::Commit(c) => {
                if c.frames as usize != frames.len() || c.bytes as usize != frame_at - pos {
                    return Err(());
                }
                let (lsn, epoch) = header.expect("set by the first frame");
                let group = ScannedGroup { lsn, epoch, offset: pos as u64, end: at as u64, frames };
                return Ok((group, sealed));
            }
            Frame::Seal => {
                sealed = true;
                frames.push(Frame::Seal);
            }
            frame => {
                if sealed {
                    return Err(()); // nothing but the commit record follows a seal
                }
                frames.push(frame);
            }
        }
        if frames.len() >= GROUP_FRAMES_MAX {
            return Err(());
        }
    }
}

/// Where a committed group lies in the WAL: enough to read it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupPlace {
    pub lsn: Lsn,
    pub segment: SegmentId,
    pub offset: u64,
    pub len: u64,
}

/// What a group read back says when it is not the group committed there.
pub const READ_BACK_INVALID: &str = "a committed group read back for a sink fails validation";

/// Visits the records of the partitions `wanted` in the committed group at
/// `place`, in place: `each(partition, first position of its batch,
/// position, bytes)`. Checks exactly its bytes first: every frame's
/// checksum, one LSN (the one committed there) and one epoch throughout,
/// the commit record counting the frames and closing the bytes; nothing is
/// visited unless the whole group is valid.
pub fn read_group_back(
    place: GroupPlace,
    bytes: &[u8],
    wanted: impl Fn(PartitionKey) -> bool,
    mut each: impl FnMut(PartitionKey, Position, Position, &[u8]),
) -> Result<(), Corruption> {
    let corrupt = || Corruption { segment: place.segment, offset: place.offset, what: READ_BACK_INVALID };
    if bytes.len() as u64 != place.len {
        return Err(corrupt());
    }
    let (mut at, mut frames, mut epoch, mut batches) = (0, 0u32, None, Vec::new());
    loop {
        if at >= bytes.len() || frames as usize >= GROUP_FRAMES_MAX {
            return Err(corrupt());
        }
        let (lsn, e, kind, payload, len) = frame_parts(place.segment, &bytes[at..], true).map_err(|_| corrupt())?;
        if lsn != place.lsn || epoch.is_some_and(|x| x != e) {
            return Err(corrupt());
        }
        epoch = Some(e);
        match kind {
            FrameKind::Commit => {
                let Ok(Frame::Commit(c)) = decode_payload(kind, payload) else { return Err(corrupt()) };
                if c.frames != frames || c.bytes as usize != at || at + len != bytes.len() {
                    return Err(corrupt());
                }
                break;
            }
            FrameKind::SourceBatch if batch_key(payload).is_some_and(&wanted) => batches.push(payload),
            _ => {}
        }
        frames += 1;
        at += len;
    }
    for payload in batches {
        let key = batch_key(payload).expect("read above");
        let mut origin = None;
        visit_batch(payload, |position, record| {
            let first = *origin.get_or_insert(position);
            each(key, first, position, record);
        })
        .map_err(|_| corrupt())?;
    }
    Ok(())
}

/// The planted bug `admit-torn-segment`: reads the torn group at `pos` the
/// way a careless reader would, with no checksums and no commit record, and
/// keeps whatever records a frame cut short still seems to hold.
fn read_torn_group(segment: SegmentId, bytes: &[u8], pos: usize, expected: Option<Lsn>) -> Option<ScannedGroup> {
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

#[cfg(test)]
mod tests;
