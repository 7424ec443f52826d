//! Segments: the header that opens every segment, the encoding of a commit
//! group, and reading one group (`stream.rs` reads segments a window at a
//! time; `scan.rs` runs that over bytes already read).
//!
//! The scan admits only complete commit groups, in dense LSN order. A group
//! that fails to validate is a torn tail only when no valid commit record of a
//! later group follows it, in its own segment or any later one; anything else
//! is corruption, reported with the segment and byte offset. Rot inside the
//! very last group cannot be told from a torn write: that group is dropped
//! like a torn one (it was never acknowledged if the writer crashed, but
//! rot there after an acknowledgement loses it; see docs/ARCHITECTURE.md).

use super::frame::*;
use super::payload::{batch_end, batch_key, decode_payload, plan_head, refusal_head, visit_batch};
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

/// What a checker needs of a group `group_shape` accepts: the partition
/// and end of each source batch, and the batches its compaction plans
/// name (and the attempts its refusals make of them), read without
/// decoding records or ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupFacts {
    pub ends: Vec<(PartitionKey, Position)>,
    pub plans: Vec<PlannedBatch>,
}

pub fn group_facts(segment: SegmentId, lsn: Lsn, bytes: &[u8]) -> Option<GroupFacts> {
    let mut facts = GroupFacts::default();
    let mut bad = false;
    walk_group(segment, lsn, bytes, |kind, payload| match kind {
        FrameKind::SourceBatch => match batch_end(payload) {
            Some(end) => facts.ends.push(end),
            None => bad = true,
        },
        FrameKind::CompactionPlanned => match plan_head(payload) {
            Some(plan) => facts.plans.push(plan),
            None => bad = true,
        },
        FrameKind::Refused | FrameKind::Split => match refusal_head(payload) {
            Some(attempt) => facts.plans.push(attempt),
            None => bad = true,
        },
        _ => {}
    })?;
    (!bad).then_some(facts)
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
    let (group, sealed) = read_group(segment, bytes, 0, Some(lsn), true, RecordMode::Owned).ok()?;
    (group.end as usize == bytes.len()).then_some((group, sealed))
}

/// Why the group at a place was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GroupError {
    /// Not a whole, valid commit group there.
    Invalid,
    /// The bytes given end inside a frame that would need the first `.0`
    /// bytes: more of the segment may make it whole (the streaming scan).
    Short(usize),
}

/// Reads the group at `pos`; the bool is true when the group seals its
/// segment. `bytes` may end before the segment does: a frame cut short by
/// their end is `Short`, which a caller holding the whole segment takes as
/// `Invalid`. Source batches' records are read as `mode` says.
pub(super) fn read_group(
    segment: SegmentId,
    bytes: &[u8],
    pos: usize,
    expected: Option<Lsn>,
    verify: bool,
    mode: RecordMode,
) -> Result<(ScannedGroup, bool), GroupError> {
    let mut frames = Vec::new();
    let mut at = pos;
    let mut sealed = false;
    let mut header: Option<(Lsn, Epoch)> = None;
    loop {
        let buf = bytes.get(at..).ok_or(GroupError::Invalid)?;
        if let Some(needed) = frame_needs(buf) {
            return Err(GroupError::Short(at + needed));
        }
        let f = decode_frame_as(segment, buf, verify, mode).map_err(|_| GroupError::Invalid)?;
        match header {
            None => {
                if expected.is_some_and(|e| e != f.lsn) {
                    return Err(GroupError::Invalid);
                }
                header = Some((f.lsn, f.epoch));
            }
            Some((lsn, epoch)) if lsn != f.lsn || epoch != f.epoch => return Err(GroupError::Invalid),
            Some(_) => {}
        }
        let frame_at = at;
        at += f.len;
        match f.frame {
            Frame::Commit(c) => {
                if c.frames as usize != frames.len() || c.bytes as usize != frame_at - pos {
                    return Err(GroupError::Invalid);
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
                    return Err(GroupError::Invalid); // nothing but the commit record follows a seal
                }
                frames.push(frame);
            }
        }
        if frames.len() >= GROUP_FRAMES_MAX {
            return Err(GroupError::Invalid);
        }
    }
}

/// How many bytes the frame at the start of `buf` needs when `buf` holds
/// fewer: its header, then the payload its header names (a length past the
/// group limit is no frame at all, whatever follows).
fn frame_needs(buf: &[u8]) -> Option<usize> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Some(FRAME_HEADER_BYTES);
    }
    let payload_len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
    let len = FRAME_HEADER_BYTES + payload_len;
    (payload_len <= GROUP_BYTES_LIMIT && buf.len() < len).then_some(len)
}

/// Where a committed group lies in the WAL: enough to read it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupPlace {
    pub lsn: Lsn,
    pub segment: SegmentId,
    pub offset: u64,
    pub len: u64,
}

/// Consecutive committed groups of one segment, read back as one: from the
/// group at `lsn` (at `offset`) through the group at `last`, `len` bytes
/// in all. Groups tile their segment, so the bytes between two committed
/// groups are exactly the groups between them. What a run of batches held
/// only in the WAL is read back from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupSpan {
    pub lsn: Lsn,
    pub last: Lsn,
    pub segment: SegmentId,
    pub offset: u64,
    pub len: u64,
}

impl GroupSpan {
    /// One group.
    pub fn of(place: GroupPlace) -> GroupSpan {
        let GroupPlace { lsn, segment, offset, len } = place;
        GroupSpan { lsn, last: lsn, segment, offset, len }
    }

    /// Where the span lies, as a read asks for it (its first group's LSN).
    pub fn place(&self) -> GroupPlace {
        GroupPlace { lsn: self.lsn, segment: self.segment, offset: self.offset, len: self.len }
    }

    fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Takes in the committed group at `place` and the groups before it,
    /// when it is the span's last group or lies later in the same segment
    /// and starts within the same block of `block` bytes as the span's
    /// first group (so spans of different partitions over the same groups
    /// stop at the same places).
    pub fn reach(&mut self, place: GroupPlace, block: u64) -> bool {
        if place.lsn == self.last && place.segment == self.segment && place.offset + place.len == self.end() {
            return true;
        }
        let fits = place.segment == self.segment
            && place.lsn > self.last
            && place.offset >= self.end()
            && place.offset / block == self.offset / block;
        if fits {
            (self.last, self.len) = (place.lsn, place.offset + place.len - self.offset);
        }
        fits
    }

    /// Takes in `other` when the two share a group (then they lie in the
    /// same segment, and together they are consecutive groups again).
    pub fn merge(&mut self, other: &GroupSpan) -> bool {
        let shared = other.lsn <= self.last && self.lsn <= other.last;
        if shared {
            let (start, end) = (self.offset.min(other.offset), self.end().max(other.end()));
            (self.lsn, self.last, self.offset, self.len) =
                (self.lsn.min(other.lsn), self.last.max(other.last), start, end - start);
        }
        shared
    }
}

/// What a group read back says when it is not the group committed there.
pub const READ_BACK_INVALID: &str = "a committed group read back for a sink fails validation";

/// Visits the records of the partitions `wanted` in the committed groups of
/// `span`, in place: `each(partition, first position of its batch,
/// position, bytes)`. Checks exactly its bytes first: group after group,
/// every frame's checksum, one LSN per group (the next one committed
/// there) and one epoch throughout it, each commit record counting its
/// frames and closing its group, the last group closing the bytes; nothing
/// is visited unless every group is valid. `first_group_only` is the
/// planted bug `read-back-one-group-of-a-run`.
pub fn read_span_back(
    span: GroupSpan,
    bytes: &[u8],
    wanted: impl Fn(PartitionKey) -> bool,
    mut each: impl FnMut(PartitionKey, Position, Position, &[u8]),
    first_group_only: bool,
) -> Result<(), Corruption> {
    let corrupt =
        |at: usize| Corruption { segment: span.segment, offset: span.offset + at as u64, what: READ_BACK_INVALID };
    if bytes.len() as u64 != span.len || span.last < span.lsn {
        return Err(corrupt(0));
    }
    let (mut at, mut batches) = (0, Vec::new());
    for lsn in span.lsn.0..=span.last.0 {
        let skip = first_group_only && lsn > span.lsn.0;
        let kept = batches.len();
        at += group_back(span.segment, Lsn(lsn), &bytes[at..], &wanted, &mut batches).ok_or_else(|| corrupt(at))?;
        if skip {
            batches.truncate(kept);
        }
    }
    if at != bytes.len() {
        return Err(corrupt(at));
    }
    for payload in batches {
        let key = batch_key(payload).expect("read above");
        let mut origin = None;
        visit_batch(payload, |position, record| {
            let first = *origin.get_or_insert(position);
            each(key, first, position, record);
        })
        .map_err(|_| corrupt(0))?;
    }
    Ok(())
}

/// Checks the group at the start of `bytes` (committed at `lsn` in
/// `segment`, which seeds its checksums) and keeps the payloads of its
/// source batches of the partitions `wanted`; returns its length.
fn group_back<'a>(
    segment: SegmentId,
    lsn: Lsn,
    bytes: &'a [u8],
    wanted: impl Fn(PartitionKey) -> bool,
    batches: &mut Vec<&'a [u8]>,
) -> Option<usize> {
    let (mut at, mut frames, mut epoch) = (0, 0u32, None);
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
                return (c.frames == frames && c.bytes as usize == at).then_some(at + len);
            }
            FrameKind::SourceBatch if batch_key(payload).is_some_and(&wanted) => batches.push(payload),
            _ => {}
        }
        frames += 1;
        at += len;
    }
}

#[cfg(test)]
mod tests;
