//! The object layout of a WAL kept as objects (S3 mode): a segment is a
//! header object at offset 0 and one object per commit group at its offset,
//! each created only if absent. Fetching the objects is the driver's job;
//! the rules are here, once, for the S3 driver and its simulated twin: how a
//! segment's objects lay out as its bytes, what a put that found its key
//! taken means, and which listed segments still belong to the WAL.

use crate::ids::SegmentId;
use crate::io::IoError;
use crate::wal::SEGMENT_HEADER_BYTES;
use std::collections::BTreeMap;

/// Which listed segments of an object-store WAL are leftovers, for the S3
/// driver and its simulated twin. Segments are
/// deleted oldest first, header first, and data never goes to a segment older
/// than one with data; objects do not vanish by themselves. So below the
/// oldest segment with a header and a first group, everything is a leftover:
/// the groups of an interrupted delete (no header), or a header and groups
/// that late copies of puts brought back after their segment was deleted
/// (without the first group, which a late copy would also need). With no
/// data anywhere, headerless groups below the oldest header are leftovers and
/// headers alone are spares. Returns the oldest segment to keep.
pub fn oldest_to_keep(listed: &BTreeMap<SegmentId, Vec<u64>>) -> Option<SegmentId> {
    let has_header = |offsets: &Vec<u64>| offsets.contains(&0);
    // A segment's first group sits right after its header; a segment that
    // lacks it holds only late copies of objects of a deleted segment.
    let first_group = SEGMENT_HEADER_BYTES as u64;
    let oldest_data = listed.iter().find(|(_, o)| has_header(o) && o.contains(&first_group)).map(|(s, _)| *s);
    let oldest_headed = listed.iter().find(|(_, o)| has_header(o)).map(|(s, _)| *s);
    match (oldest_data, oldest_headed) {
        (Some(data), _) => Some(data),
        (None, Some(headed)) => Some(headed),
        (None, None) => listed.keys().last().map(|s| SegmentId(s.0 + 1)),
    }
}

/// The listed segments split by `oldest_to_keep`: the leftovers below the
/// oldest segment that counts, and the WAL's segments, each in id order.
pub fn split_leftovers(listed: &BTreeMap<SegmentId, Vec<u64>>) -> (Vec<SegmentId>, Vec<SegmentId>) {
    let keep = oldest_to_keep(listed);
    listed.keys().copied().partition(|s| keep.is_some_and(|k| *s < k))
}

/// The first object, by offset, that starts before the one ahead of it
/// ends: two writers wrote the segment, and it cannot be laid out.
/// `objects` are (offset, size) in offset order.
pub fn first_overlap(objects: impl IntoIterator<Item = (u64, u64)>) -> Option<u64> {
    let mut end = 0u64;
    for (offset, size) in objects {
        if offset < end {
            return Some(offset);
        }
        end = offset + size;
    }
    None
}

/// A segment's bytes: each object at its offset, zeros in any gap (a group
/// whose put has not landed yet reads as the end of the WAL). `objects` are
/// (offset, bytes) in offset order; an overlap is refused, naming its offset.
pub fn lay_out<'a>(objects: impl IntoIterator<Item = (u64, &'a [u8])>) -> Result<Vec<u8>, u64> {
    let mut out = Vec::new();
    for (offset, bytes) in objects {
        let at = offset as usize;
        if at < out.len() {
            return Err(offset);
        }
        out.resize(at, 0);
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// A conditional put found its key taken (`412`): the same bytes are this
/// writer's own earlier put that landed (a success); other bytes are another
/// writer's (`Conflict`, never overwritten).
pub fn taken_key(existing: &[u8], ours: &[u8]) -> Result<(), IoError> {
    if existing == ours {
        Ok(())
    } else {
        Err(IoError::Conflict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(items: &[(u64, &[u64])]) -> BTreeMap<SegmentId, Vec<u64>> {
        items.iter().map(|(s, o)| (SegmentId(*s), o.to_vec())).collect()
    }

    #[test]
    fn everything_below_the_oldest_data_segment_is_a_leftover() {
        let l = listed(&[(1, &[32]), (2, &[0]), (3, &[0, 32]), (4, &[32]), (5, &[0])]);
        assert_eq!(oldest_to_keep(&l), Some(SegmentId(3)), "1: groups of a delete, 2: a header brought back");
        let l = listed(&[(5, &[0, 900]), (7, &[0, 32, 500])]);
        assert_eq!(oldest_to_keep(&l), Some(SegmentId(7)), "5: a header and a later group brought back");
    }

    #[test]
    fn objects_lay_out_with_zeros_in_gaps_and_overlaps_are_refused() {
        assert_eq!(lay_out([(0, &b"hh"[..]), (4, &b"gg"[..])]), Ok(b"hh\0\0gg".to_vec()));
        assert_eq!(lay_out([(0, &b"hh"[..]), (1, &b"gg"[..])]), Err(1));
        assert_eq!(first_overlap([(0, 32), (32, 10), (40, 5)]), Some(40));
        assert_eq!(first_overlap([(0, 32), (32, 10), (50, 5)]), None);
        assert_eq!(taken_key(b"a", b"a"), Ok(()));
        assert_eq!(taken_key(b"a", b"b"), Err(IoError::Conflict));
    }

    #[test]
    fn without_data_headers_alone_are_spares() {
        assert_eq!(oldest_to_keep(&listed(&[(1, &[32]), (2, &[0]), (3, &[0])])), Some(SegmentId(2)));
        assert_eq!(oldest_to_keep(&listed(&[(1, &[32])])), Some(SegmentId(2)));
        assert_eq!(oldest_to_keep(&listed(&[])), None);
    }
}
