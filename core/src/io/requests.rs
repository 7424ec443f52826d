//! Requests, by what performs them: the WAL backend, the offsets store, the
//! writer lease, a plugin; and what they carry.

use crate::ids::*;
use crate::offsets::OffsetValue;
use crate::wal::{GroupPlace, Record};
use std::sync::Arc;

/// A request, by what performs it: the WAL backend, the offsets store, the
/// writer lease, or a plugin (sources, sinks, the schema plugin). A driver
/// routes on the outer variant and hands each backend only its own kind.
#[derive(Debug)]
pub enum IoOp {
    Wal(WalOp),
    Offsets(OffsetsOp),
    Lease(LeaseOp),
    Plugin(PluginOp),
}

#[derive(Debug)]
pub enum WalOp {
    /// Make everything the WAL holds durable: every segment file and the
    /// directory (data a crashed writer left in the page cache, files whose
    /// directory entry was never synced). The first step of recovery, so that
    /// nothing recovery reads can vanish later. A no-op where writes are
    /// durable once visible (S3).
    Sync,
    /// List the WAL's segments, and nothing else: whatever a listing finds
    /// stays where it is until the engine deletes it. Answer: `Segments`.
    List,
    /// Read `len` bytes of `segment` from `offset`, fewer where the segment
    /// ends (on disk its file, on S3 its last object): a short answer is
    /// how recovery finds a segment's end. Answer: `SegmentBytes`.
    ReadAt { segment: SegmentId, offset: u64, len: usize },
    /// Read back exactly the bytes at `places`, each one committed group or
    /// consecutive ones of its segment (`len` bytes from `offset`; on S3
    /// the objects from `offset` on, one after the other), for a
    /// compaction whose records are no longer in memory, or a lagging
    /// follower. Answer: `Groups`, one byte string per place, in order.
    ReadGroups { places: Vec<GroupPlace> },
    /// Create a segment of `size` bytes ahead of need, durably, starting
    /// with `header` (on disk a preallocated file; on S3 the header object).
    Create { segment: SegmentId, header: Vec<u8>, size: u64 },
    /// Make one commit group durable and visible at `offset` of `segment`.
    /// A retry after `IoError::Ambiguous` carries the identical bytes.
    Append { segment: SegmentId, offset: u64, lsn: Lsn, bytes: Arc<Vec<u8>> },
    /// Delete a segment that the deletion rule no longer needs.
    Delete { segment: SegmentId },
    /// Read the stop record the last run left (see `recovery::stop_record`).
    /// Answer: `StopRecord`, `None` where there is none.
    ReadStopRecord,
    /// Replace the stop record with these bytes, atomically and durably
    /// (on disk a new file renamed over the old, synced with its
    /// directory). Answer: `Done`.
    WriteStopRecord(Vec<u8>),
    /// Clustered mode: make one raft `Ready`'s groups durable, in order
    /// (see `Replicate`). Answer: `Done` once all of it is durable.
    Replicate(Replicate),
    /// Clustered mode: read the raft hard-state file (`DATA_DIR/raft-state`;
    /// zeros where there is none yet). Answer: `HardState`.
    ReadHardState,
    /// Clustered mode: install a snapshot (see `Install`). Answer: `Done`
    /// once the new WAL and hard state are durable; an error leaves the old
    /// ones as they were.
    InstallSnapshot(Install),
}

/// A snapshot to install: copy the manifest's segments from peer `from`
/// (the bytes it names, zeros after them, each file at its size) into a
/// staging area, check them (`consensus::snapshot::check_install`),
/// then replace every segment of the WAL with them and write the hard
/// state's slot, atomically: a crash leaves the old WAL and hard state or
/// the new ones, never a mix. `from` serves the transfer and reports its
/// end to its engine (`Input::SnapshotServed`).
#[derive(Debug)]
pub struct Install {
    pub from: u64,
    pub manifest: crate::consensus::snapshot::Manifest,
    /// (offset in the hard-state file, slot bytes).
    pub hard_state: (u64, Vec<u8>),
}

/// What one raft `Ready` asks of the disk, in this order, each step durable
/// before the next: the segments of a conflicting tail removed (newest
/// first), its groups in the first kept segment zeroed (newest first, one
/// sync each, so a crash leaves a prefix of the old log), the new groups
/// written (a group that opens a segment creates it first, preallocated,
/// with the header its envelope gives) with one `fdatasync`, then the hard
/// state's slot written and synced.
#[derive(Debug)]
pub struct Replicate {
    pub remove: Vec<SegmentId>,
    pub zero: Vec<GroupPlace>,
    pub groups: Vec<crate::consensus::entry::EntryGroup>,
    /// (offset in the hard-state file, slot bytes).
    pub hard_state: Option<(u64, Vec<u8>)>,
}

#[derive(Debug)]
pub enum OffsetsOp {
    /// Read every offsets entry. Answer: `Offsets`.
    Read,
    /// Write offsets entries; the store keeps a value only if its LSN is higher.
    Write { entries: Vec<OffsetEntry> },
}

#[derive(Debug)]
pub enum LeaseOp {
    /// Read the writer lease row (a consistent read). Answer: `Lease`.
    Read,
    /// Replace the lease row only if its version is still `expected` (`None`:
    /// only if there is no row). Answer: `Done`, or `IoError::Conflict` when
    /// the condition failed.
    Write { expected: Option<u64>, row: LeaseRow },
}

#[derive(Debug)]
pub enum PluginOp {
    /// Start a source with the recovered positions (a read-only snapshot).
    /// `skips`: per partition, the input from `at` to `next` an operator
    /// gave up (recorded in the WAL): the source passes over it, and the
    /// intake rules do not apply to it.
    SourceOpen { source: SourceId, resume: Vec<ResumePoint>, skips: Vec<(u32, Position, Position)> },
    /// Ask a source for up to `records_max` records. Answer: `Batches`,
    /// promptly, with what is available (possibly nothing: the engine asks
    /// again after `Limits::source_poll`). A clean shutdown waits for
    /// outstanding reads, so a driver never holds one open indefinitely.
    SourceRead { source: SourceId, records_max: u32 },
    /// Tell a source that everything below these positions is committed.
    SourceAck { source: SourceId, acks: Vec<(u32, Position)> },
    /// Hand a destination batch to a sink. Answer: `Sink`.
    SinkApply(SinkApply),
    /// Hand a batch of dead letters (`dead_letters::Letter` lines) to the
    /// dead-letter destination: the records `sink` refused of `stream`,
    /// numbered densely per (sink, stream). Answer: `Sink`.
    DeadLetters(SinkApply),
    /// Ask a sink, at recovery, for the highest sequence number it has
    /// applied, per stream, where it can tell. Answer: `SinkProgress` (empty
    /// when it cannot tell; an error counts as that too).
    SinkProgress { sink: SinkId },
    /// Ask the schema plugin to accept a stream's new schema (identified by
    /// `fingerprint`) before its first batch. Answer: `Schema`.
    SchemaDecide { stream: StreamId, fingerprint: u64, schema: Arc<[u8]> },
}

#[derive(Debug)]
pub struct SinkApply {
    pub sink: SinkId,
    pub stream: StreamId,
    pub id: CompactionId,
    pub seq: CompactionSeq,
    pub records: Records,
}

/// The records of a destination batch, back to back in one buffer: one
/// allocation per batch, not one per record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    bytes: Vec<u8>,
    /// Where each record ends in `bytes`.
    ends: Vec<usize>,
}

impl Records {
    pub fn push(&mut self, record: &[u8]) {
        self.bytes.extend_from_slice(record);
        self.ends.push(self.bytes.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of all records together.
    pub fn bytes_len(&self) -> usize {
        self.bytes.len()
    }

    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }

    pub fn iter(&self) -> RecordsIter<'_> {
        RecordsIter { records: self, next: 0, start: 0 }
    }

    /// Appends every record of `other`.
    pub fn extend_from(&mut self, other: &Records) {
        let base = self.bytes.len();
        self.bytes.extend_from_slice(&other.bytes);
        self.ends.extend(other.ends.iter().map(|e| base + e));
    }
}

impl<'a> FromIterator<&'a [u8]> for Records {
    fn from_iter<I: IntoIterator<Item = &'a [u8]>>(iter: I) -> Records {
        let mut records = Records::default();
        for r in iter {
            records.push(r);
        }
        records
    }
}

impl<'a> IntoIterator for &'a Records {
    type Item = &'a [u8];
    type IntoIter = RecordsIter<'a>;

    fn into_iter(self) -> RecordsIter<'a> {
        self.iter()
    }
}

/// The records of a `Records`, in order.
pub struct RecordsIter<'a> {
    records: &'a Records,
    next: usize,
    start: usize,
}

impl<'a> Iterator for RecordsIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let end = *self.records.ends.get(self.next)?;
        let record = &self.records.bytes[self.start..end];
        (self.next, self.start) = (self.next + 1, end);
        Some(record)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.records.ends.len() - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for RecordsIter<'_> {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetEntry {
    pub key: PartitionKey,
    pub value: OffsetValue,
    pub checkpoint: Option<Vec<u8>>,
}

/// The writer lease: one row per WAL, in the offsets table's service.
/// `generation` counts writers and becomes the high half of the writer's
/// epoch; `holder` identifies one run of one daemon (0: released);
/// `version` changes on every write, so a holder's renewals are visible
/// without comparing clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub generation: u64,
    pub holder: u64,
    pub version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    pub partition: u32,
    pub position: Position,
    pub checkpoint: Option<Vec<u8>>,
}

/// Records of one partition as a source hands them over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceBatchIn {
    pub partition: u32,
    pub stream: StreamId,
    /// Strictly increasing positions.
    pub records: Vec<Record>,
    /// The next position to read after these records.
    pub end: Position,
    pub checkpoint: Option<Vec<u8>>,
    /// The stream's schema these records follow, if the source sends one.
    /// A schema the WAL has no decision for is put to the schema plugin
    /// before the records are accepted.
    pub schema: Option<Arc<[u8]>>,
    /// Records that break an intake rule (`admit::check_record`), found
    /// where they arrived; the engine decides what becomes of them.
    pub faults: Vec<IntakeFault>,
    /// Whether the batch belongs to its source's window (section 22).
    pub window: Window,
    /// Windowed batches: each record's resume key (a hash of a Singer
    /// record's replication-key value), in record order, or nothing (no
    /// record has one). What the bookmark rule compares.
    pub keys: Vec<Option<u64>>,
}

/// How a source batch stands to its source's window (section 22). A source
/// that sends windows sends nothing else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Window {
    /// No window: committed, acknowledged and delivered as it comes.
    #[default]
    None,
    /// Its records join the source's open window (opening one): committed
    /// now, taken as read only when the window closes. No checkpoint.
    Open,
    /// Its records (there may be none) and the window so far close with
    /// its checkpoint, which becomes that of every partition the window
    /// holds.
    Close,
    /// The source starts over from its last closed window (a tap started
    /// again): the open window, if any, is void; each partition's next
    /// records may be its tail again (the bookmark rule). No records.
    Restart,
}

/// A record of a source batch that breaks an intake rule (not one JSON
/// value, not UTF-8, a line break, too large).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntakeFault {
    /// The record's position.
    pub position: Position,
    /// The rule it breaks.
    pub fault: crate::admit::RecordFault,
    /// The whole story for an operator: where the record is (the source
    /// names its file and offset) and what to do, down to the option that
    /// gives up exactly this record.
    pub why: String,
}
