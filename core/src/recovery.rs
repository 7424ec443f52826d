//! Step one and two of crash recovery, as pure functions: from the segments
//! the scan admitted, rebuild the committed state, the records that sinks
//! still need, and where the writer continues. The host drives the I/O
//! around it (listing, reading, the offsets check, replay, resuming sources).

use crate::ids::*;
use crate::state::{CommittedState, RecordStore};
use crate::wal::{Corruption, Frame, ScannedSegment};
use std::collections::{BTreeMap, VecDeque};

/// What a sealed or active segment holds, for the deletion rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    pub id: SegmentId,
    pub last_lsn: Lsn,
    /// Per partition, the end position of the last batch in this segment:
    /// every record of the segment lies below it.
    pub ends: BTreeMap<PartitionKey, Position>,
    pub sealed: bool,
}

impl SegmentSummary {
    pub fn new(id: SegmentId, lsn: Lsn) -> Self {
        SegmentSummary { id, last_lsn: lsn, ends: BTreeMap::new(), sealed: false }
    }

    pub fn note(&mut self, lsn: Lsn, frame: &Frame) {
        self.last_lsn = lsn;
        match frame {
            Frame::SourceBatch(b) => {
                let end = self.ends.entry(b.key).or_default();
                *end = (*end).max(b.end);
            }
            Frame::Seal => self.sealed = true,
            _ => {}
        }
    }
}

/// The WAL as recovery found it.
#[derive(Debug, Default)]
pub struct RecoveredWal {
    pub state: CommittedState,
    pub records: RecordStore,
    /// Segments holding committed groups, oldest first.
    pub segments: VecDeque<SegmentSummary>,
    /// The unsealed last segment and the offset to append at.
    pub active: Option<(SegmentId, u64)>,
    /// Empty, valid segments after the data, ready for use.
    pub spares: VecDeque<SegmentId>,
    /// Segments after the data whose header never became valid.
    pub junk: Vec<SegmentId>,
    pub next_lsn: Lsn,
    /// The highest epoch found; the new writer takes the next one.
    pub epoch_max: Epoch,
    pub next_segment: SegmentId,
}

/// Folds the admitted groups into a `RecoveredWal`. A WAL that does not start
/// at LSN 0 must open with a snapshot (older segments were deleted under the
/// deletion rule); otherwise committed data is missing.
pub fn rebuild(scanned: Vec<ScannedSegment>) -> Result<RecoveredWal, Corruption> {
    let mut wal = RecoveredWal::default();
    let mut first_group = true;
    for seg in scanned {
        wal.next_segment = SegmentId(wal.next_segment.0.max(seg.id.0 + 1));
        let Some(header_epoch) = seg.header_epoch else {
            wal.junk.push(seg.id);
            continue;
        };
        wal.epoch_max = wal.epoch_max.max(header_epoch);
        if seg.groups.is_empty() {
            wal.spares.push_back(seg.id);
            continue;
        }
        assert!(wal.spares.is_empty(), "the scan admits no data after an empty segment");
        let mut summary = SegmentSummary::new(seg.id, seg.groups[0].lsn);
        for group in seg.groups {
            wal.epoch_max = wal.epoch_max.max(group.epoch);
            if first_group {
                first_group = false;
                let starts_with_snapshot = matches!(group.frames.first(), Some(Frame::Snapshot(_)));
                if group.lsn != Lsn(0) && !starts_with_snapshot {
                    return Err(Corruption {
                        segment: seg.id,
                        offset: group.offset,
                        what: "the WAL starts after LSN 0 without a snapshot: older segments are missing",
                    });
                }
            }
            for frame in group.frames {
                wal.state.apply(group.lsn, &frame);
                summary.note(group.lsn, &frame);
                if let Frame::SourceBatch(b) = frame {
                    wal.records.push(b.key, b.records);
                }
            }
            wal.next_lsn = Lsn(group.lsn.0 + 1);
        }
        if !seg.sealed {
            wal.active = Some((seg.id, seg.end));
        }
        wal.segments.push_back(summary);
    }
    Ok(wal)
}
