//! The scan, fed a window of bytes at a time: what `scan` decides over
//! whole segments, decided while reading each segment once, in order, with
//! only the window and the group it is in held. It asks for the next read
//! (`next_read`) and hands each admitted group and each finished segment
//! out as it goes (`feed`), so recovery keeps what it folds them into and
//! nothing more.
//!
//! The torn-tail rule looks past the group that fails: it is the WAL's end
//! only if no valid commit record of a later group follows, in its segment
//! or a later one. The stream goes on reading after that group, looking
//! only for commit records, with the failure held as pending corruption
//! until the last segment ends.

use super::frame::*;
use super::scan::{read_torn_group, SEGMENTS_MISSING};
use super::segment::*;
use crate::ids::*;
use bytes::Bytes;

/// What the streaming scan hands out, in WAL order.
#[derive(Debug)]
pub enum Scanned {
    /// An admitted group of a segment.
    Group(SegmentId, ScannedGroup),
    /// A segment is done: its header epoch, seal, end and stale groups (its
    /// groups came before, one by one).
    Segment(ScannedSegment),
    /// The bytes of the group handed out just before, for a group past the
    /// LSN `keeping_bytes_past` names (a clustered host holds the groups
    /// raft has not committed as raft entries).
    Bytes(Vec<u8>),
}

/// The next bytes the scan needs: `len` bytes of `segment` from `offset`
/// (fewer when the segment ends before: that is how its end is found).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAt {
    pub segment: SegmentId,
    pub offset: u64,
    pub len: usize,
}

/// The rule a failure is held under while the rest of the WAL is read.
struct Probe {
    /// What the scan fails with if a commit record follows.
    pending: Corruption,
    /// An invalid header: any valid commit record of its own segment from
    /// here on means it rotted under committed data.
    any_commit: Option<(SegmentId, usize)>,
    /// With no group admitted before the failure, "later" means a higher
    /// LSN than the first commit record found after it.
    lowest: Option<Lsn>,
    /// The planted bug `admit-torn-segment`: where the torn group starts;
    /// the rest of its segment is kept to read it carelessly.
    lenient_from: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Header,
    Groups(usize),
    Probing(usize),
}

pub struct StreamScan {
    listed: Vec<SegmentId>,
    lenient_tail: bool,
    /// The planted bug `drop-unfinished-group`.
    drop_unfinished: bool,
    /// How source batches' records are read.
    records: RecordMode,
    window: usize,
    /// The segment being read, by its place in `listed`.
    i: usize,
    step: Step,
    /// Bytes of the current segment from offset `base`; `eof` once a read
    /// came back short.
    base: usize,
    buf: Bytes,
    eof: bool,
    /// At least this many bytes of the segment are needed before the scan
    /// can go on.
    needed: usize,
    seg: ScannedSegment,
    /// The LSN the next group must carry, and the highest writer epoch
    /// admitted so far.
    expected: Option<Lsn>,
    newest: Epoch,
    probe: Option<Probe>,
    /// The LSN of the group that jumped past the sealed segment before it.
    jumped_to: Option<Lsn>,
    /// Groups past this LSN are handed out with their bytes.
    bytes_past: Option<Lsn>,
}

fn fresh(id: SegmentId) -> ScannedSegment {
    ScannedSegment {
        id,
        header_epoch: None,
        groups: Vec::new(),
        sealed: false,
        end: SEGMENT_HEADER_BYTES as u64,
        stale_groups: 0,
    }
}

impl StreamScan {
    /// A scan of `listed` (sorted by id) in reads of `window` bytes.
    /// `lenient_tail` is the planted bug `admit-torn-segment`.
    pub fn new(listed: Vec<SegmentId>, lenient_tail: bool, window: usize) -> StreamScan {
        let first = listed.first().copied().unwrap_or_default();
        StreamScan {
            listed,
            lenient_tail,
            drop_unfinished: false,
            records: RecordMode::Owned,
            window: window.max(COMMIT_FRAME_BYTES),
            i: 0,
            step: Step::Header,
            base: 0,
            buf: Bytes::new(),
            eof: false,
            needed: SEGMENT_HEADER_BYTES,
            seg: fresh(first),
            expected: None,
            newest: Epoch(0),
            probe: None,
            jumped_to: None,
            bytes_past: None,
        }
    }

    /// Hands out the bytes of every group past `lsn` too, after the group
    /// (`Scanned::Bytes`).
    pub fn keeping_bytes_past(mut self, lsn: Lsn) -> StreamScan {
        self.bytes_past = Some(lsn);
        self
    }

    /// The planted bug `drop-unfinished-group`: a group the window cut off
    /// is taken for a torn one.
    pub fn dropping_unfinished_groups(mut self) -> StreamScan {
        self.drop_unfinished = true;
        self
    }

    /// Reads the records of the source batches it hands out from now on as
    /// `mode` says.
    pub fn read_records(&mut self, mode: RecordMode) {
        self.records = mode;
    }

    /// The read the scan waits for; `None` once every segment is done. It
    /// starts where the bytes the scan still needs start (a group the last
    /// window cut off is read again whole, rather than kept and copied) and
    /// reaches past what it needs.
    pub fn next_read(&self) -> Option<ReadAt> {
        let segment = *self.listed.get(self.i)?;
        let len = self.window.max(self.needed.saturating_sub(self.base));
        Some(ReadAt { segment, offset: self.base as u64, len })
    }

    /// After the scan found segments missing: the LSN the segment after
    /// them starts at.
    pub fn jumped_to(&self) -> Option<Lsn> {
        self.jumped_to
    }

    pub fn is_done(&self) -> bool {
        self.i >= self.listed.len()
    }

    /// The bytes `next_read` asked for (fewer at the segment's end). Hands
    /// out what they complete, or the corruption the scan found.
    pub fn feed(&mut self, bytes: impl Into<Bytes>) -> Result<Vec<Scanned>, Corruption> {
        let bytes = bytes.into();
        let asked = self.next_read().expect("a read was asked for").len;
        self.eof = bytes.len() < asked;
        self.buf = bytes;
        let mut out = Vec::new();
        while !self.is_done() {
            let more = match self.step {
                Step::Header => self.header(),
                Step::Groups(pos) => self.groups(pos, &mut out)?,
                Step::Probing(pos) => self.probing(pos, &mut out)?,
            };
            if more {
                return Ok(out);
            }
        }
        Ok(out)
    }

    /// Wants more bytes (true) unless the segment's end or `upto` is held.
    fn short_of(&mut self, upto: usize) -> bool {
        let short = !self.eof && self.base + self.buf.len() < upto;
        if short {
            self.needed = upto;
        }
        short
    }

    fn header(&mut self) -> bool {
        if self.short_of(SEGMENT_HEADER_BYTES) {
            return true;
        }
        let id = self.seg.id;
        let header = decode_header(id, &self.buf);
        self.seg.header_epoch = header.ok();
        self.step = match (header, &self.probe) {
            (_, Some(_)) => Step::Probing(SEGMENT_HEADER_BYTES),
            (Ok(_), None) => Step::Groups(SEGMENT_HEADER_BYTES),
            // A torn creation holds zeros after its header, never a valid
            // commit record of this segment: one means the header rotted
            // under committed data.
            (Err(_), None) => {
                let pending = Corruption { segment: id, offset: 0, what: "segment header is invalid" };
                let any_commit = Some((id, SEGMENT_HEADER_BYTES));
                self.probe = Some(Probe { pending, any_commit, lowest: None, lenient_from: None });
                Step::Probing(1)
            }
        };
        false
    }

    /// Admits the segment's groups from `pos`; true when it needs more bytes.
    fn groups(&mut self, mut pos: usize, out: &mut Vec<Scanned>) -> Result<bool, Corruption> {
        let id = self.seg.id;
        loop {
            let read = match read_group(id, &self.buf, pos - self.base, None, true, self.records) {
                Err(GroupError::Short(_)) if self.drop_unfinished && !self.eof => Err(()),
                Err(GroupError::Short(n)) if self.short_of(self.base + n) => {
                    self.keep_from(pos);
                    self.step = Step::Groups(pos);
                    return Ok(true);
                }
                Err(_) => Err(()),
                Ok((mut group, sealed)) => {
                    group.offset += self.base as u64;
                    group.end += self.base as u64;
                    Ok((group, sealed))
                }
            };
            // A group of a writer older than one already admitted was
            // written by a writer that lost the lease and had not noticed:
            // it is not the WAL's, and the new writer continues after it.
            if let Ok((group, _)) = &read {
                if group.epoch < self.newest {
                    pos = group.end as usize;
                    self.seg.stale_groups += 1;
                    continue;
                }
            }
            // A valid first group whose LSN jumps past the sealed segment
            // before it: whole segments in between are gone.
            if let (Ok((group, _)), Some(e)) = (&read, self.expected) {
                if pos == SEGMENT_HEADER_BYTES && group.lsn > e {
                    self.jumped_to = Some(group.lsn);
                    return Err(Corruption { segment: id, offset: pos as u64, what: SEGMENTS_MISSING });
                }
            }
            let read = read.and_then(|(g, sealed)| match self.expected {
                Some(e) if e != g.lsn => Err(()),
                _ => Ok((g, sealed)),
            });
            let Ok((group, sealed)) = read else {
                self.torn(pos);
                return Ok(false);
            };
            self.newest = self.newest.max(group.epoch);
            self.expected = Some(Lsn(group.lsn.0 + 1));
            let (at, lsn) = (pos, group.lsn);
            pos = group.end as usize;
            out.push(Scanned::Group(id, group));
            if self.bytes_past.is_some_and(|past| lsn > past) {
                out.push(Scanned::Bytes(self.buf[at - self.base..pos - self.base].to_vec()));
            }
            if sealed {
                self.seg.sealed = true;
                self.seg.end = pos as u64;
                self.next_segment(out);
                return Ok(false);
            }
        }
    }

    /// The group at `pos` does not validate: the end of the WAL, unless a
    /// committed group follows it (then it is corruption).
    fn torn(&mut self, pos: usize) {
        let what = "a commit group fails validation and later groups are committed";
        let pending = Corruption { segment: self.seg.id, offset: pos as u64, what };
        let lenient_from = self.lenient_tail.then_some(pos);
        self.probe = Some(Probe { pending, any_commit: None, lowest: None, lenient_from });
        self.seg.end = pos as u64;
        self.step = Step::Probing(pos + 1);
    }

    /// Looks for a commit record that proves the pending failure is
    /// corruption, from `pos` to the segment's end.
    fn probing(&mut self, pos: usize, out: &mut Vec<Scanned>) -> Result<bool, Corruption> {
        let id = self.seg.id;
        let end = self.base + self.buf.len();
        let mut at = pos;
        while at + COMMIT_FRAME_BYTES <= end {
            let from = at - self.base;
            let last = self.buf.len() - COMMIT_FRAME_BYTES + 1;
            // A commit record starts with its length, 8: jump to the next 8.
            match memchr::memchr(COMMIT_PAYLOAD_BYTES as u8, &self.buf[from..last]) {
                Some(skip) => at += skip,
                None => {
                    at = end - COMMIT_FRAME_BYTES + 1;
                    break;
                }
            }
            if let Some(lsn) = commit_record_at(id, &self.buf[at - self.base..]) {
                if self.proves_corruption(id, at, lsn) {
                    let probe = self.probe.take().expect("probing");
                    return Err(probe.pending);
                }
            }
            at += 1;
        }
        if !self.eof {
            let keep = self.probe.as_ref().and_then(|p| p.lenient_from).unwrap_or(at);
            self.keep_from(keep.min(at));
            self.step = Step::Probing(at);
            // A window past what is held: the read starts at what is kept
            // (the planted bug keeps the rest of the segment), so asking
            // for one more byte would move a byte at a time.
            self.needed = end + self.window;
            return Ok(true);
        }
        if let Some(from) = self.probe.as_mut().and_then(|p| p.lenient_from.take()) {
            if let Some(mut group) = read_torn_group(id, &self.buf, from - self.base, self.expected) {
                group.offset += self.base as u64;
                group.end += self.base as u64;
                self.seg.end = group.end;
                out.push(Scanned::Group(id, group));
            }
        }
        self.next_segment(out);
        Ok(false)
    }

    fn proves_corruption(&mut self, id: SegmentId, at: usize, lsn: Lsn) -> bool {
        let expected = self.expected;
        let probe = self.probe.as_mut().expect("probing");
        if probe.any_commit.is_some_and(|(s, from)| s == id && at >= from) {
            return true;
        }
        match (expected, probe.lowest) {
            (Some(e), _) => lsn > e,
            (None, Some(low)) => lsn > low,
            (None, None) => {
                probe.lowest = Some(lsn);
                false
            }
        }
    }

    /// The scan needs the segment's bytes from `pos` on: the next read
    /// starts there, and the window held goes.
    fn keep_from(&mut self, pos: usize) {
        self.base = self.base.max(pos);
        self.buf = Bytes::new();
    }

    fn next_segment(&mut self, out: &mut Vec<Scanned>) {
        self.i += 1;
        let next = fresh(self.listed.get(self.i).copied().unwrap_or_default());
        out.push(Scanned::Segment(std::mem::replace(&mut self.seg, next)));
        (self.step, self.base, self.eof, self.needed) = (Step::Header, 0, false, SEGMENT_HEADER_BYTES);
        self.buf.clear();
        if self.is_done() {
            // Nothing followed the failure: the WAL ends there.
            self.probe = None;
        }
    }
}

#[cfg(test)]
mod tests;
