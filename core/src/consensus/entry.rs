//! A raft entry is a commit group. The raft index is the group's LSN and
//! the entry's term its epoch, so the log raft-rs replicates and the WAL
//! every host scans are one thing, and LSNs stay dense.
//!
//! The leader decides where each group goes; an entry carries that place
//! in a small envelope ahead of the group's bytes (`encode_entry`), and
//! every host writes the same bytes at the same place, so all hosts'
//! segments are byte-identical. A group that opens a segment carries the
//! segment's header epoch and size too: segment size comes from the log,
//! not from each host's setting.
//!
//! raft-rs's own entry, the empty one a new leader appends at its term,
//! has no envelope: every host derives its group, a lone `Fence` frame at
//! the new term, and its place from where the log ends (`LogEnd::next`).
//! A fence may open a segment without a snapshot; the next group of the
//! leader's own writer carries one.
//!
//! A membership change is a group too: one the leader's writer built with a
//! `Membership` frame among its frames. Its entry is a raft conf-change
//! entry whose data is the change (raft-rs reads it) and whose context is
//! the envelope and the group; the group's frame holds the same bytes.

use crate::ids::*;
use crate::wal::{check_group, encode_group, encode_header, group_shape, Frame, GroupPlace, SEGMENT_HEADER_BYTES};
use bytes::Bytes;
use raft::eraftpb::{Entry, EntryType};
use std::fmt;

pub const ENVELOPE_VERSION: u8 = 1;
/// `version: u8 | segment: u64 | offset: u64 | opening epoch + 1: u64 (0:
/// the group does not open its segment) | segment bytes: u64`.
pub const ENVELOPE_BYTES: usize = 1 + 8 + 8 + 8 + 8;

/// What a group that opens a segment tells every host about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opening {
    /// The epoch in the segment's header.
    pub epoch: Epoch,
    pub segment_bytes: u64,
}

/// Where the leader put a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub segment: SegmentId,
    pub offset: u64,
    pub opens: Option<Opening>,
}

/// Where the log ends: just after the group at `lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEnd {
    pub lsn: Lsn,
    pub segment: SegmentId,
    /// The byte after the last group in `segment`.
    pub end: u64,
    /// The last group sealed `segment`: the next opens the following one.
    pub sealed: bool,
    /// The size of `segment`, as the group that opened it said.
    pub segment_bytes: u64,
}

/// One group as a host writes it: its place, the segment it opens (if
/// any), whether it seals its segment, and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryGroup {
    pub place: GroupPlace,
    pub opens: Option<Opening>,
    pub sealed: bool,
    /// A slice of the entry's data (no copy), or a derived fence.
    pub bytes: Bytes,
}

/// An entry that is not the group its place and index say: a leader's bug
/// or damaged bytes. The host stops rather than write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryError {
    pub index: u64,
    pub what: &'static str,
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft entry {}: {}", self.index, self.what)
    }
}

/// The segment and first group every host of a new cluster starts with:
/// segment 0, header epoch 0, a fence at LSN 0 (raft's index 0, term 0).
/// Returns the log's end after it and the bytes that begin segment 0.
pub fn genesis(segment_bytes: u64) -> (LogEnd, Vec<u8>) {
    let segment = SegmentId(0);
    let mut bytes = encode_header(segment, Epoch(0));
    bytes.extend_from_slice(&encode_group(segment, Epoch(0), Lsn(0), &[&Frame::Fence]));
    let end = LogEnd { lsn: Lsn(0), segment, end: bytes.len() as u64, sealed: false, segment_bytes };
    (end, bytes)
}

/// Prepends the envelope for `place` to a group's bytes.
pub fn encode_entry(place: &Placement, group: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE_BYTES + group.len());
    out.push(ENVELOPE_VERSION);
    out.extend_from_slice(&place.segment.0.to_le_bytes());
    out.extend_from_slice(&place.offset.to_le_bytes());
    let (epoch, size) = place.opens.map_or((0, 0), |o| (o.epoch.0 + 1, o.segment_bytes));
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(group);
    out
}

/// Splits an entry's data into the leader's placement and the group bytes.
pub fn decode_entry(data: &[u8]) -> Option<(Placement, &[u8])> {
    if data.len() < ENVELOPE_BYTES || data[0] != ENVELOPE_VERSION {
        return None;
    }
    let u = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("eight bytes"));
    let opens = match u(17) {
        0 => None,
        e => Some(Opening { epoch: Epoch(e - 1), segment_bytes: u(25) }),
    };
    Some((Placement { segment: SegmentId(u(1)), offset: u(9), opens }, &data[ENVELOPE_BYTES..]))
}

impl LogEnd {
    /// Where the next group goes: after the last one, or at the start of
    /// the next segment when the last one sealed its own. A group opening
    /// a segment gives it `epoch` and this segment's size.
    pub fn next(&self, epoch: Epoch) -> Placement {
        if self.sealed {
            let opens = Some(Opening { epoch, segment_bytes: self.segment_bytes });
            Placement { segment: SegmentId(self.segment.0 + 1), offset: SEGMENT_HEADER_BYTES as u64, opens }
        } else {
            Placement { segment: self.segment, offset: self.end, opens: None }
        }
    }

    /// The group an entry stands for, checked against where the log ends:
    /// raft's empty entry is a fence placed by `next`; any other carries its
    /// place, which must be `next`'s (a segment that opens may give itself
    /// another size), and bytes that are one whole group at `index` of
    /// epoch `term` that fits its segment.
    pub fn group_for(&self, index: u64, term: u64, data: &Bytes) -> Result<EntryGroup, EntryError> {
        let err = |what| EntryError { index, what };
        if index != self.lsn.0 + 1 {
            return Err(err("it does not follow the end of the log"));
        }
        let (place, bytes) = if data.is_empty() {
            let place = self.next(Epoch(term));
            (place, Bytes::from(encode_group(place.segment, Epoch(term), Lsn(index), &[&Frame::Fence])))
        } else {
            let (place, bytes) = decode_entry(data).ok_or(err("its envelope is not one this version writes"))?;
            let expected = self.next(place.opens.map_or(Epoch(term), |o| o.epoch));
            let size_given = place.opens.is_some() && expected.opens.is_some();
            if (place.segment, place.offset) != (expected.segment, expected.offset)
                || place.opens.is_some() != expected.opens.is_some()
            {
                return Err(err("its place is not where the log ends"));
            }
            let place = if size_given { place } else { expected };
            let at = data.len() - bytes.len();
            (place, data.slice(at..))
        };
        let Some(shape) = group_shape(place.segment, Lsn(index), &bytes) else {
            return Err(err("its bytes are not one whole commit group at its index"));
        };
        let sealed = shape.sealed;
        if shape.epoch != Epoch(term) {
            return Err(err("its group's epoch is not the entry's term"));
        }
        let size = place.opens.map_or(self.segment_bytes, |o| o.segment_bytes);
        if place.offset + bytes.len() as u64 > size {
            return Err(err("its group runs past the end of its segment"));
        }
        let gp = GroupPlace { lsn: Lsn(index), segment: place.segment, offset: place.offset, len: bytes.len() as u64 };
        Ok(EntryGroup { place: gp, opens: place.opens, sealed, bytes })
    }

    /// The group a raft entry stands for (see `group_for`). A conf-change
    /// entry's group is its context, and must hold, in its one membership
    /// frame, the change the entry's data makes.
    pub fn group_for_entry(&self, e: &Entry) -> Result<EntryGroup, EntryError> {
        let err = |what| EntryError { index: e.index, what };
        match e.get_entry_type() {
            EntryType::EntryNormal => self.group_for(e.index, e.term, &e.data),
            EntryType::EntryConfChangeV2 if e.context.is_empty() => Err(err(
                "a membership change without its group (an automatic leave, which this version never asks for)",
            )),
            EntryType::EntryConfChangeV2 => {
                let g = self.group_for(e.index, e.term, &e.context)?;
                match membership_change(&g) {
                    Some(cc) if cc == e.data.as_ref() => Ok(g),
                    _ => Err(err("its group does not hold the membership change the entry makes")),
                }
            }
            EntryType::EntryConfChange => {
                Err(err("a conf change of raft's first version, which this version never makes"))
            }
        }
    }

    /// The end after `group`, which `group_for` placed after this one.
    pub fn after(&self, group: &EntryGroup) -> LogEnd {
        LogEnd {
            lsn: group.place.lsn,
            segment: group.place.segment,
            end: group.place.offset + group.place.len,
            sealed: group.sealed,
            segment_bytes: group.opens.map_or(self.segment_bytes, |o| o.segment_bytes),
        }
    }
}

/// The membership change a group holds: the payload of its one
/// `Membership` frame (none if it has none, or more than one).
pub fn membership_change(g: &EntryGroup) -> Option<Vec<u8>> {
    let (group, _) = check_group(g.place.segment, g.place.lsn, &g.bytes)?;
    let mut changes = group.frames.into_iter().filter_map(|f| match f {
        Frame::Membership(cc) => Some(cc),
        _ => None,
    });
    let first = changes.next()?;
    changes.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::{scan, SourceBatch};

    pub(crate) fn batch_frame(n: usize) -> Frame {
        let key = PartitionKey { source: SourceId(0), partition: 0 };
        let records = (0..n).map(|i| crate::wal::Record { position: Position(i as u64), bytes: vec![7; 40] }).collect();
        Frame::SourceBatch(SourceBatch {
            key,
            stream: StreamId(0),
            end: Position(n as u64),
            checkpoint: None,
            records,
            counted: None,
            provisional: false,
        })
    }

    #[test]
    fn the_envelope_round_trips_and_refuses_what_it_does_not_know() {
        let place = Placement {
            segment: SegmentId(4),
            offset: 32,
            opens: Some(Opening { epoch: Epoch(0), segment_bytes: 1 << 20 }),
        };
        let data = encode_entry(&place, b"group");
        assert_eq!(decode_entry(&data), Some((place, &b"group"[..])));
        let place = Placement { opens: None, ..place };
        assert_eq!(decode_entry(&encode_entry(&place, b"")), Some((place, &b""[..])));
        let mut bad = data.clone();
        bad[0] = 9;
        assert_eq!(decode_entry(&bad), None);
        assert_eq!(decode_entry(&data[..ENVELOPE_BYTES - 1]), None);
    }

    #[test]
    fn entries_placed_from_the_log_end_scan_as_the_wal() {
        // Genesis, a leader's fence, two batches, a sealing batch, the next
        // leader's fence opening segment 1, a batch after it.
        let size = 4096;
        let (mut end, first) = genesis(size);
        let mut segments = vec![first];
        let mut push = |end: &mut LogEnd, index: u64, term: u64, data: Vec<u8>| {
            let g = end.group_for(index, term, &Bytes::from(data)).unwrap();
            let seg = g.place.segment.0 as usize;
            if let Some(o) = g.opens {
                assert_eq!(g.place.offset, SEGMENT_HEADER_BYTES as u64);
                segments.push(encode_header(g.place.segment, o.epoch));
            }
            assert_eq!(segments[seg].len() as u64, g.place.offset, "groups are back to back");
            segments[seg].extend_from_slice(&g.bytes);
            *end = end.after(&g);
        };
        push(&mut end, 1, 1, Vec::new());
        for (index, seal) in [(2, false), (3, false), (4, true)] {
            let at = end.next(Epoch(1));
            let b = batch_frame(3);
            let frames: Vec<&Frame> = if seal { vec![&b, &Frame::Seal] } else { vec![&b] };
            let group = encode_group(at.segment, Epoch(1), Lsn(index), &frames);
            push(&mut end, index, 1, encode_entry(&at, &group));
        }
        assert!(end.sealed);
        push(&mut end, 5, 2, Vec::new());
        assert_eq!((end.segment, end.sealed), (SegmentId(1), false));
        let at = end.next(Epoch(2));
        let group = encode_group(at.segment, Epoch(2), Lsn(6), &[&batch_frame(1)]);
        push(&mut end, 6, 2, encode_entry(&at, &group));
        let refs: Vec<(SegmentId, &[u8])> =
            segments.iter().enumerate().map(|(i, s)| (SegmentId(i as u64), s.as_slice())).collect();
        let scanned = scan(&refs, false).unwrap();
        let lsns: Vec<(u64, u64)> =
            scanned.iter().flat_map(|s| s.groups.iter().map(|g| (g.lsn.0, g.epoch.0))).collect();
        assert_eq!(lsns, vec![(0, 0), (1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2)]);
        assert_eq!(scanned[1].header_epoch, Some(Epoch(2)), "the fence opened segment 1 at its term");
    }

    #[test]
    fn an_entry_out_of_place_or_of_another_term_is_refused() {
        let (end, _) = genesis(4096);
        let at = end.next(Epoch(1));
        let group = encode_group(at.segment, Epoch(1), Lsn(1), &[&batch_frame(1)]);
        let wrong = Placement { offset: at.offset + 8, ..at };
        let b = |v: Vec<u8>| Bytes::from(v);
        let e = end.group_for(1, 1, &b(encode_entry(&wrong, &group))).unwrap_err();
        assert_eq!(e.what, "its place is not where the log ends");
        let e = end.group_for(1, 2, &b(encode_entry(&at, &group))).unwrap_err();
        assert_eq!(e.what, "its group's epoch is not the entry's term");
        let e = end.group_for(2, 1, &b(encode_entry(&at, &group))).unwrap_err();
        assert_eq!(e.what, "it does not follow the end of the log");
        let e = end.group_for(1, 1, &b(encode_entry(&at, &group[..group.len() - 1]))).unwrap_err();
        assert_eq!(e.what, "its bytes are not one whole commit group at its index");
        let opens = Placement { opens: Some(Opening { epoch: Epoch(1), segment_bytes: 4096 }), ..at };
        let e = end.group_for(1, 1, &b(encode_entry(&opens, &group))).unwrap_err();
        assert_eq!(e.what, "its place is not where the log ends");
        let small = LogEnd { segment_bytes: at.offset + 10, ..end };
        let e = small.group_for(1, 1, &b(encode_entry(&at, &group))).unwrap_err();
        assert_eq!(e.what, "its group runs past the end of its segment");
    }
}
