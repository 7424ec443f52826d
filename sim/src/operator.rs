//! What an operator does to a WAL while no daemon runs: deletes a segment
//! by hand (or restores a backup without one of its files). The run that
//! follows must stop at recovery, naming what is missing, before it
//! delivers anything; unless the segment held nothing any sink still needed,
//! in which case the run may also go on and must then pass as usual.

use crate::checker::Checker;
use skippr_core::format::{scan, Frame};
use skippr_core::{PartitionKey, Position, SegmentId};

/// A segment the operator deleted, and whether a sink still needed it.
#[derive(Clone, Copy, Debug)]
pub struct LostSegment {
    pub segment: SegmentId,
    /// Engines of this generation and later started after the loss.
    pub gen: u64,
    /// A segment in the middle always is (the WAL after it depends on it);
    /// the oldest is when a sink has not received one of its records.
    pub needed: bool,
}

/// Picks a segment with committed groups that another such segment
/// follows, and says whether a sink still needed it. The newest one with
/// data is never picked: without it the WAL looks like one that crashed
/// before its last commits, which only an offsets store that had already
/// materialized them can tell (documented, not simulated).
pub fn pick(segments: &[(SegmentId, Vec<u8>)], draw: u64, checker: &Checker) -> Option<(SegmentId, bool)> {
    let with_data: Vec<(SegmentId, &[u8])> = segments
        .iter()
        .filter(|(id, bytes)| scan(&[(*id, bytes)], false).is_ok_and(|s| !s[0].groups.is_empty()))
        .map(|(id, bytes)| (*id, bytes.as_slice()))
        .collect();
    if with_data.len() < 2 {
        return None;
    }
    let i = (draw % (with_data.len() as u64 - 1)) as usize;
    let (segment, bytes) = with_data[i];
    // A segment in the middle always matters: the WAL after it continues
    // from its LSNs. The oldest matters if it holds a record some sink
    // has not received.
    Some((segment, i > 0 || holds_undelivered(segment, bytes, &closed_windows(&with_data), checker)))
}

/// The positions of every window a `Window` frame in these segments
/// closed, per partition: a tap's provisional records count only there (a
/// void window's, or one open still, which recovery voids, never do).
fn closed_windows(segments: &[(SegmentId, &[u8])]) -> Vec<(PartitionKey, Position, Position)> {
    let mut closed = Vec::new();
    for (id, bytes) in segments {
        let Ok(scanned) = scan(&[(*id, bytes)], false) else { continue };
        for frame in scanned.iter().flat_map(|s| &s.groups).flat_map(|g| &g.frames) {
            if let Frame::Window(x) = frame.clone() {
                let parts = x.parts.iter().filter(|_| x.closed);
                closed.extend(parts.map(|p| (PartitionKey { source: x.source, partition: p.partition }, p.from, p.to)));
            }
        }
    }
    closed
}

/// Does any record in `bytes` still have to reach a sink? A record's row
/// is the position its bytes name (a tap's positions are its own count).
fn holds_undelivered(
    segment: SegmentId,
    bytes: &[u8],
    closed: &[(PartitionKey, Position, Position)],
    checker: &Checker,
) -> bool {
    let Ok(scanned) = scan(&[(segment, bytes)], false) else { return true };
    let counts =
        |key: PartitionKey, at: Position| closed.iter().any(|&(k, from, to)| k == key && from <= at && at < to);
    scanned.iter().flat_map(|s| &s.groups).flat_map(|g| &g.frames).any(|frame| match frame {
        Frame::SourceBatch(b) => b.records.iter().any(|r| {
            let row = r.bytes.get(2..6).map_or(r.position.0, |h| u32::from_le_bytes(h.try_into().unwrap()) as u64);
            (!b.provisional || counts(b.key, r.position)) && !checker.delivered_to_all(b.key, row)
        }),
        _ => false,
    })
}
