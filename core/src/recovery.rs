//! Step one and two of crash recovery, as pure functions: from the segments
//! the scan admitted, rebuild the committed state, the records that sinks
//! still need, and where the writer continues. The host drives the I/O
//! around it (listing, reading, the offsets check, replay, resuming sources).

use crate::consensus::log::commit_on_disk;
use crate::ids::*;
use crate::records::{RecordLimits, RecordStore};
use crate::state::CommittedState;
use crate::wal::stream::{ReadAt, Scanned, StreamScan};
use crate::wal::SEGMENTS_MISSING;
use crate::wal::{Corruption, Frame, GroupPlace, RecordMode, ScannedGroup, ScannedSegment, Snapshot, SourceBatch};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

pub mod stop_record;

/// Why the segments found cannot be recovered: damaged bytes, or committed
/// data that is not there at all. Either way nothing is delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalDamage {
    Corrupt(Corruption),
    Missing(Missing),
}

impl From<Corruption> for WalDamage {
    fn from(c: Corruption) -> Self {
        WalDamage::Corrupt(c)
    }
}

/// Committed WAL that the surviving segments prove once existed and that
/// recovery still needs: a segment deleted by hand, or a backup restored
/// without one of its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The first group of `before` continues from a later LSN than the
    /// sealed segment `after` ends at: the segments between held `lsns`.
    Gap { after: SegmentId, before: SegmentId, lsns: Option<(Lsn, Lsn)> },
    /// The oldest surviving segment starts at `first_lsn`, after records
    /// that `sink` never acknowledged: the segments that held them were
    /// not deleted under the deletion rule.
    Head {
        first: SegmentId,
        first_lsn: Lsn,
        sink: SinkId,
        sink_name: String,
        key: PartitionKey,
        source_name: String,
        /// The sink acknowledged everything below this position...
        acked: Position,
        /// ...and the missing segments held records up to this one.
        needed_to: Position,
    },
}

/// The checks recovery makes on the segments it read, sorted by id: every
/// group valid and LSNs continuing from segment to segment (the scan; a
/// jump means whole segments are gone), and nothing missing before the
/// oldest segment that a sink still needs (`Rebuild`). Segment ids alone
/// prove nothing: deleting a torn creation leaves a gap in them.
/// `lenient_tail` is the planted bug `admit-torn-segment`; `trust_missing`
/// is `ignore-missing-segments`.
pub fn recover(
    segments: &[(SegmentId, &[u8])],
    lenient_tail: bool,
    trust_missing: bool,
) -> Result<RecoveredWal, WalDamage> {
    let listed = segments.iter().map(|(id, _)| *id).collect();
    let mut recovery = Recovery::new(listed, lenient_tail, trust_missing, 1 << 20);
    while let Some(read) = recovery.next_read() {
        let bytes = segments.iter().find(|(id, _)| *id == read.segment).expect("a listed segment").1;
        let from = (read.offset as usize).min(bytes.len());
        recovery.feed(bytes[from..(from + read.len).min(bytes.len())].to_vec())?;
    }
    recovery.finish()
}

/// Recovery's scan and rebuild over the listed segments, fed a window at a
/// time: it holds the window, the group it is in and what it rebuilt, not
/// the WAL.
pub struct Recovery {
    listed: Vec<SegmentId>,
    scan: StreamScan,
    rebuild: Rebuild,
    lenient_tail: bool,
    trust_missing: bool,
    window: usize,
    drop_unfinished: bool,
    /// The last group the scan admitted: (segment, LSN).
    last: Option<(SegmentId, Lsn)>,
    /// Clustered mode: groups are folded in through this LSN only.
    through: Option<Lsn>,
    /// A group of the segment being scanned was past `through`.
    cut: bool,
}

impl Recovery {
    pub fn new(listed: Vec<SegmentId>, lenient_tail: bool, trust_missing: bool, window: usize) -> Recovery {
        Recovery {
            scan: StreamScan::new(listed.clone(), lenient_tail, window),
            listed,
            rebuild: Rebuild::new(!trust_missing),
            lenient_tail,
            trust_missing,
            window,
            drop_unfinished: false,
            last: None,
            through: None,
            cut: false,
        }
    }

    /// Clustered mode: only the groups through raft's commit index are
    /// folded in, `commit` raised to the first group found (every group
    /// on disk up to the first is committed: segments go only once a
    /// committed snapshot after them is applied). Later groups wait for
    /// raft: handed out with their bytes (`Scanned::Bytes`), their segment
    /// left unsealed.
    pub fn applying_through(mut self, commit: Lsn) -> Recovery {
        self.scan = self.scan.keeping_bytes_past(commit);
        self.through = Some(commit);
        self
    }

    /// The planted bug `drop-unfinished-group`.
    pub fn dropping_unfinished_groups(mut self) -> Recovery {
        self.scan = self.scan.dropping_unfinished_groups();
        self.drop_unfinished = true;
        self
    }

    /// The read recovery waits for; `None` once every segment is scanned.
    pub fn next_read(&self) -> Option<ReadAt> {
        self.scan.next_read()
    }

    /// Keeps records in memory within `limits` while rebuilding, the
    /// oldest first (they are compacted first), the rest folded into runs
    /// held only in the WAL, and forgets each record all `sinks`
    /// acknowledged as the scan passes each segment.
    pub fn with_record_cache(mut self, limits: RecordLimits, sinks: u16) -> Recovery {
        self.rebuild.wal.records = RecordStore::new(limits);
        self.rebuild.sinks = Some(sinks);
        self
    }

    /// Keeps no records at all, only the committed state (`wal verify`).
    pub fn without_records(mut self) -> Recovery {
        self.rebuild.keep_records = false;
        self
    }

    /// The bytes `next_read` asked for.
    pub fn feed(&mut self, bytes: impl Into<Bytes>) -> Result<(), WalDamage> {
        self.feed_seeing(bytes, |_| {})
    }

    /// `feed`, showing `see` each group and segment the scan admitted
    /// before it is folded in (what `wal verify` lists).
    pub fn feed_seeing(&mut self, bytes: impl Into<Bytes>, mut see: impl FnMut(&mut Scanned)) -> Result<(), WalDamage> {
        // Records are decoded only while they may stay in memory; past that
        // they are checked and counted, and read back when a sink needs them.
        let keeps = self.rebuild.keep_records && self.rebuild.wal.records.has_room();
        self.scan.read_records(if keeps { RecordMode::Owned } else { RecordMode::Counted });
        match self.scan.feed(bytes) {
            Ok(scanned) => {
                for mut item in scanned {
                    // `see` may take a group's bytes (`Scanned::Bytes`):
                    // nothing here needs them.
                    see(&mut item);
                    match item {
                        Scanned::Group(segment, group) => {
                            let first = self.last.is_none();
                            self.last = Some((segment, group.lsn));
                            if let Some(through) = &mut self.through {
                                if first {
                                    *through = Lsn(commit_on_disk(through.0, group.lsn.0));
                                }
                                if group.lsn > *through {
                                    self.cut = true;
                                    continue;
                                }
                            }
                            self.rebuild.group(segment, group);
                        }
                        Scanned::Segment(mut seg) => {
                            if std::mem::take(&mut self.cut) {
                                seg.sealed = false;
                            }
                            self.rebuild.segment(seg)
                        }
                        Scanned::Bytes(_) => {}
                    }
                }
                Ok(())
            }
            Err(c) if c.what == SEGMENTS_MISSING && self.trust_missing => {
                // The planted bug: recover from the segments after the jump,
                // as if whatever is missing had been deleted under the rule.
                let from = self.listed.iter().position(|id| *id == c.segment).expect("the scan names a listed segment");
                *self = self.restarted_at(from);
                Ok(())
            }
            Err(c) if c.what == SEGMENTS_MISSING => Err(WalDamage::Missing(self.gap(c.segment))),
            Err(c) => Err(WalDamage::Corrupt(c)),
        }
    }

    /// A fresh recovery of the listed segments from the `from`th on, with
    /// the same settings.
    fn restarted_at(&self, from: usize) -> Recovery {
        let mut fresh = Recovery::new(self.listed[from..].to_vec(), self.lenient_tail, self.trust_missing, self.window);
        fresh.rebuild.wal.records = RecordStore::new(self.rebuild.wal.records.limits());
        (fresh.rebuild.sinks, fresh.rebuild.keep_records) = (self.rebuild.sinks, self.rebuild.keep_records);
        assert!(self.through.is_none(), "clustered mode never trusts missing segments");
        match self.drop_unfinished {
            true => fresh.dropping_unfinished_groups(),
            false => fresh,
        }
    }

    pub fn finish(self) -> Result<RecoveredWal, WalDamage> {
        assert!(self.scan.is_done(), "every listed segment is scanned first");
        self.rebuild.finish()
    }

    /// The segments missing before `before`, whose first group the scan
    /// found past the end of the sealed segments ahead of it.
    fn gap(&self, before: SegmentId) -> Missing {
        let (after, lsns) = match (self.last, self.scan.jumped_to()) {
            (Some((after, a)), Some(b)) => (after, Some((Lsn(a.0 + 1), Lsn(b.0 - 1)))),
            (Some((after, _)), None) => (after, None),
            (None, _) => (SegmentId(before.0.saturating_sub(1)), None),
        };
        Missing::Gap { after, before, lsns }
    }
}

/// What a sealed or active segment holds, for the deletion rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    pub id: SegmentId,
    pub last_lsn: Lsn,
    /// Where its last group noted lies (a stop record names it, so the next
    /// start can check the segment still ends there).
    pub last: GroupPlace,
    /// Per partition, the end position of the last batch in this segment:
    /// every record of the segment lies below it.
    pub ends: BTreeMap<PartitionKey, Position>,
    pub sealed: bool,
    pub head: Head,
}

/// How a segment opens, as far as its groups have been noted. A WAL whose
/// older segments were deleted must open with a snapshot; in clustered mode
/// raft's lone fences (a new leader's empty entry) may come before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Head {
    #[default]
    Empty,
    /// Only lone fences so far, the last at `lsn`.
    Fences {
        lsn: Lsn,
    },
    Snapshot,
    Other,
}

impl SegmentSummary {
    pub fn new(place: GroupPlace) -> Self {
        let (id, last_lsn) = (place.segment, place.lsn);
        SegmentSummary { id, last_lsn, last: place, ends: BTreeMap::new(), sealed: false, head: Head::Empty }
    }

    /// A frame of the group at `place`, this segment's newest.
    pub fn note(&mut self, place: GroupPlace, frame: &Frame) {
        let lsn = place.lsn;
        self.last = place;
        self.head = match (self.head, frame) {
            (Head::Fences { lsn: l }, _) if l == lsn => Head::Other,
            (Head::Empty | Head::Fences { .. }, Frame::Fence) => Head::Fences { lsn },
            (Head::Empty | Head::Fences { .. }, Frame::Snapshot(_)) => Head::Snapshot,
            (Head::Empty | Head::Fences { .. }, _) => Head::Other,
            (head, _) => head,
        };
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
/// deletion rule), and every sink that snapshot names must since have
/// acknowledged everything below its positions; otherwise committed data is
/// missing.
pub fn rebuild(scanned: Vec<ScannedSegment>, check_head: bool) -> Result<RecoveredWal, WalDamage> {
    let mut r = Rebuild::new(check_head);
    for mut seg in scanned {
        for group in std::mem::take(&mut seg.groups) {
            r.group(seg.id, group);
        }
        r.segment(seg);
    }
    r.finish()
}

/// `rebuild`, a group at a time, as a streaming scan hands them out: each
/// group of a segment, then the segment itself. The first damage it finds
/// is held until `finish`, so that the scan's own findings, which a whole
/// scan makes before any rebuilding, go first.
pub struct Rebuild {
    wal: RecoveredWal,
    check_head: bool,
    /// Records are kept at all, and pruned below what this many sinks all
    /// acknowledged at each segment's end (`None`: kept to the end).
    keep_records: bool,
    sinks: Option<u16>,
    first_group: bool,
    head: Option<(SegmentId, Lsn, Snapshot)>,
    /// The segment whose groups are arriving.
    summary: Option<SegmentSummary>,
    damage: Option<WalDamage>,
}

impl Rebuild {
    pub fn new(check_head: bool) -> Rebuild {
        Rebuild {
            wal: RecoveredWal::default(),
            check_head,
            keep_records: true,
            sinks: None,
            first_group: true,
            head: None,
            summary: None,
            damage: None,
        }
    }

    pub fn group(&mut self, segment: SegmentId, group: ScannedGroup) {
        if self.damage.is_some() {
            return;
        }
        let wal = &mut self.wal;
        let place = GroupPlace { lsn: group.lsn, segment, offset: group.offset, len: group.end - group.offset };
        let summary = self.summary.get_or_insert_with(|| SegmentSummary::new(place));
        wal.epoch_max = wal.epoch_max.max(group.epoch);
        // Raft's lone fences may come before a clustered WAL's snapshot.
        let lone_fence = group.lsn != Lsn(0) && matches!(group.frames.as_slice(), [Frame::Fence]);
        if self.first_group && !lone_fence {
            self.first_group = false;
            let starts_with_snapshot = matches!(group.frames.first(), Some(Frame::Snapshot(_)));
            if group.lsn != Lsn(0) && !starts_with_snapshot {
                self.damage = Some(WalDamage::Corrupt(Corruption {
                    segment,
                    offset: group.offset,
                    what: "the WAL starts after LSN 0 without a snapshot: older segments are missing",
                }));
                return;
            }
            if let (true, Some(Frame::Snapshot(s))) = (self.check_head && group.lsn != Lsn(0), group.frames.first()) {
                self.head = Some((segment, group.lsn, s.clone()));
            }
        }
        for frame in group.frames {
            wal.state.apply(group.lsn, &frame);
            summary.note(place, &frame);
            match (frame, self.keep_records) {
                (Frame::SourceBatch(SourceBatch { key, counted: Some(c), provisional, .. }), true) => {
                    wal.records.push_counted_as(key, place, c, provisional)
                }
                (Frame::SourceBatch(b), true) if b.provisional => wal.records.push_provisional(b.key, place, b.records),
                (Frame::SourceBatch(b), true) => wal.records.push(b.key, place, b.records),
                (Frame::Window(x), true) => wal.records.window_ended(&x),
                _ => {}
            }
        }
        wal.next_lsn = Lsn(group.lsn.0 + 1);
    }

    /// A segment is done; its groups came before.
    pub fn segment(&mut self, seg: ScannedSegment) {
        let wal = &mut self.wal;
        wal.next_segment = SegmentId(wal.next_segment.0.max(seg.id.0 + 1));
        let summary = self.summary.take();
        if self.damage.is_some() {
            return;
        }
        if let Some(sinks) = self.sinks {
            for &key in wal.state.partitions.keys() {
                let floor = (0..sinks).map(|s| wal.state.acked(SinkId(s), key)).min();
                wal.records.prune(key, floor.unwrap_or_default());
            }
        }
        let Some(header_epoch) = seg.header_epoch else {
            wal.junk.push(seg.id);
            return;
        };
        wal.epoch_max = wal.epoch_max.max(header_epoch);
        let Some(summary) = summary else {
            wal.spares.push_back(seg.id);
            return;
        };
        assert!(wal.spares.is_empty(), "the scan admits no data after an empty segment");
        if !seg.sealed {
            wal.active = Some((seg.id, seg.end));
        }
        wal.segments.push_back(summary);
    }

    pub fn finish(self) -> Result<RecoveredWal, WalDamage> {
        if let Some(damage) = self.damage {
            return Err(damage);
        }
        if let Some((first, first_lsn, snapshot)) = &self.head {
            if let Some(missing) = head_missing(&self.wal.state, *first, *first_lsn, snapshot) {
                return Err(WalDamage::Missing(missing));
            }
        }
        Ok(self.wal)
    }
}

/// Everything below the oldest segment's opening snapshot is gone. That is
/// the deletion rule's doing only if every sink the snapshot names has
/// acknowledged (by the end of the surviving WAL) every partition up to the
/// position the snapshot gives it. A sink added after the snapshot is not
/// named there: it receives what the WAL still holds.
///
/// A window open at the snapshot had records in the missing segments too
/// (section 22): they were needed unless every sink passed them, the window
/// was void (a sink yet to pass it has it among its voids), or it is open
/// still (recovery voids it).
fn head_missing(state: &CommittedState, first: SegmentId, first_lsn: Lsn, snapshot: &Snapshot) -> Option<Missing> {
    let mut needed: BTreeMap<PartitionKey, Position> =
        snapshot.partitions.iter().map(|(key, p)| (*key, p.position)).collect();
    for (source, parts) in &snapshot.windows.open {
        for part in parts {
            let key = PartitionKey { source: *source, partition: part.partition };
            let void = state.voids.get(&key).is_some_and(|v| v.contains_key(&part.from));
            let still_open =
                state.windows.get(source).and_then(|w| w.get(&part.partition)).is_some_and(|w| w.from == part.from);
            if !void && !still_open {
                needed.insert(key, part.to);
            }
        }
    }
    for (s, sink_name) in snapshot.names.sinks.iter().enumerate() {
        let sink = SinkId(s as u16);
        for (key, &position) in &needed {
            let acked = state.acked(sink, *key);
            if acked < position {
                let source_name = snapshot.names.sources.get(key.source.0 as usize).cloned().unwrap_or_default();
                return Some(Missing::Head {
                    first,
                    first_lsn,
                    sink,
                    sink_name: sink_name.clone(),
                    key: *key,
                    source_name,
                    acked,
                    needed_to: position,
                });
            }
        }
    }
    None
}
