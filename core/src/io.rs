//! The engine's closed vocabulary: every event comes in as an `Input`, every
//! effect goes out as an `Output`. An I/O effect is an `Output::Io { id, op }`
//! that the driver performs and answers with `Input::IoDone { id, result }`;
//! an error is data, never a panic.
//!
//! The WAL operations fit both an appended, fsynced commit group on disk and a
//! whole-object conditional create on S3: `WalCreate` makes a segment ready
//! (preallocated file, header, file and directory fsync; or nothing on S3),
//! `WalAppend` makes one commit group durable and visible (one write and one
//! `fdatasync`; or one `If-None-Match: *` put at the group's LSN key).

use crate::ids::*;
use crate::offsets::OffsetValue;
use crate::recovery::Missing;
use crate::time::Duration;
use crate::wal::{Corruption, GroupPlace, Record};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug)]
pub enum Input {
    IoDone {
        id: IoId,
        result: Result<IoReply, IoError>,
    },
    /// The deadline returned by `poll_timeout` has passed.
    Timeout,
    /// SIGTERM or SIGINT: stop reading sources, commit and drain, then stop.
    Shutdown,
    /// A raft message from a peer (clustered mode; the transport has
    /// checked that it comes from the peer it names).
    Peer(Box<PeerMessage>),
    /// Clustered mode, to the leader: let host `node` (started by `cluster
    /// join` on an empty DATA_DIR) join as a learner in place of the lost
    /// voter `replaces`; it is promoted, and `replaces` removed for good,
    /// once it has caught up. Refusals come back as `JoinRefused`.
    Join {
        node: u64,
        replaces: u64,
    },
    /// Clustered mode, to the leader: the transfer of a snapshot's segments
    /// to node `to` ended, having served them all (`ok`) or not.
    SnapshotServed {
        to: u64,
        ok: bool,
    },
    /// Clustered mode: peer `by` says node `node` was removed from the
    /// cluster (its answer to a message from a removed id, `TellRemoved`).
    /// Heeded only when `node` is this host and `by` a member it knows.
    Removed {
        by: u64,
        node: u64,
    },
}

/// A raft message between hosts (raft-rs's protobuf type).
pub type PeerMessage = raft::eraftpb::Message;
pub use raft::eraftpb::MessageType as PeerMessageType;

#[derive(Debug)]
pub enum Output {
    Io {
        id: IoId,
        op: IoOp,
    },
    /// Recovery finished; sources are being resumed.
    Recovered(RecoverySummary),
    /// Another writer holds the WAL's lease; this one waits until the
    /// holder releases it or its row stays unchanged for the steal span.
    /// Emitted once per holder seen.
    LeaseWait {
        holder: u64,
        generation: u64,
    },
    /// WAL (or lease) requests have failed for `for_` without a single
    /// success: retrying goes on, but the pipeline makes no progress.
    /// Emitted once per stall.
    Stalled {
        what: Stall,
        for_: Duration,
    },
    /// A request of the reported stall succeeded again.
    Unstalled,
    /// The WAL reached its size limit (`Limits::wal_bytes_max`): sources are
    /// not read until sinks catch up and old segments are deleted. Emitted
    /// once each time the limit is reached.
    WalFull {
        bytes: u64,
        limit: u64,
    },
    /// The WAL is below its size limit again; sources are read.
    WalRoom {
        bytes: u64,
    },
    /// A raft message for the peer `message.to` (clustered mode). Sent at
    /// most once; raft retransmits what is lost.
    Send(Box<PeerMessage>),
    /// This host's raft term or role changed (clustered mode): `leader` is
    /// the leader's node id as far as this host knows (0: none).
    Role {
        term: u64,
        leader: u64,
        is_leader: bool,
    },
    /// A message came from node `to`, removed from the cluster for good:
    /// tell it so (`Input::Removed` on its side), and it stops rather than
    /// waiting for a leader that will never answer it.
    TellRemoved {
        to: u64,
    },
    /// A `Join` was refused, and why (this host does not lead, the id is
    /// taken or removed, another change is under way).
    JoinRefused {
        node: u64,
        why: crate::consensus::membership::JoinRefusal,
    },
    /// An operator's skip at the start of a run: `recorded` when it is
    /// committed to the WAL now; otherwise the partition's committed
    /// `position` is already at or past its end (it was done by an earlier
    /// run), and nothing is done.
    Skip {
        key: PartitionKey,
        at: Position,
        next: Position,
        position: Position,
        recorded: bool,
    },
    /// The engine stopped; no further output follows.
    Stopped(StopReason),
}

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
    /// Read a whole segment. Answer: `SegmentBytes`.
    Read { segment: SegmentId },
    /// Read back exactly the bytes of the committed groups at `places`, for
    /// a compaction whose records are no longer in memory. Answer: `Groups`,
    /// in the same order.
    ReadGroups { places: Vec<GroupPlace> },
    /// Create a segment of `size` bytes ahead of need, durably, starting
    /// with `header` (on disk a preallocated file; on S3 the header object).
    Create { segment: SegmentId, header: Vec<u8>, size: u64 },
    /// Make one commit group durable and visible at `offset` of `segment`.
    /// A retry after `IoError::Ambiguous` carries the identical bytes.
    Append { segment: SegmentId, offset: u64, lsn: Lsn, bytes: Arc<Vec<u8>> },
    /// Delete a segment that the deletion rule no longer needs.
    Delete { segment: SegmentId },
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
}

#[derive(Debug)]
pub enum IoReply {
    Done,
    Segments(WalListing),
    SegmentBytes(Vec<u8>),
    Groups(Vec<Vec<u8>>),
    /// The raft hard-state file's bytes (clustered mode).
    HardState(Vec<u8>),
    Offsets(Vec<OffsetRow>),
    Lease(Option<LeaseRow>),
    /// `exhausted`: a finite source has nothing more, ever.
    Batches {
        batches: Vec<SourceBatchIn>,
        exhausted: bool,
    },
    /// The source cannot go on until an operator changes something (a
    /// Singer tap sending more between two states than the host may hold):
    /// `why` says what. The engine stops; nothing committed is lost.
    SourceRefused {
        why: String,
    },
    Sink {
        outcome: SinkOutcome,
        rows: u64,
    },
    /// Per stream, the highest sequence number the sink has applied.
    SinkProgress(Vec<(StreamId, CompactionSeq)>),
    /// The schema plugin's verdict; `reason` says why it refused.
    Schema {
        accept: bool,
        reason: String,
    },
}

/// What a WAL listing found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalListing {
    /// Segment files (disk): one id per file.
    Files(Vec<SegmentId>),
    /// An object store (S3): per segment, the offsets of the objects it
    /// holds (0 is the header). Which of them still belong to the WAL is the
    /// engine's decision (`wal::oldest_to_keep`); it deletes the leftovers.
    Objects(BTreeMap<SegmentId, Vec<u64>>),
}

/// One offsets entry as the store holds it: key, raw value (24 bytes when
/// healthy), checkpoint.
pub type OffsetRow = (PartitionKey, Vec<u8>, Option<Vec<u8>>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkOutcome {
    Applied,
    AlreadyApplied,
    Retryable,
    Fatal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoError {
    /// The outcome is unknown (timeout, lost reply): it may or may not have
    /// taken effect. Retried with the identical request.
    Ambiguous,
    /// Out of space: nothing was written.
    NoSpace,
    /// A conditional write found something else in place: a WAL key holding
    /// different bytes (another writer got there first), or a lease row that
    /// changed. Never retried as is.
    Conflict,
    /// It failed. For a WAL write this includes a failed fsync, after which
    /// the unsynced pages are gone: the engine stops and recovery decides.
    Failed,
}

/// Why the engine stopped. The daemon maps each to a documented exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Shutdown drained everything.
    Clean,
    /// Shutdown did not drain before the deadline.
    DrainTimedOut,
    /// Committed WAL data failed validation: fail closed.
    Corrupt(Corruption),
    /// Committed WAL that recovery needs is not there (a segment deleted by
    /// hand, a backup restored without one): fail closed.
    WalIncomplete(Missing),
    /// The offsets store holds a position the WAL does not: committed WAL data
    /// was lost, or the store belongs to another WAL.
    OffsetsAheadOfWal { key: PartitionKey, store: Position, wal: Position },
    /// A sink has applied a batch whose sequence number the WAL never
    /// planned: the WAL is older than the sink's destination (an older copy
    /// restored, or a new WAL beside an old destination).
    SinkAheadOfWal { sink: SinkId, stream: StreamId, applied: CompactionSeq, wal_next: CompactionSeq },
    /// An offsets entry is not the 24-byte value: the store was damaged or
    /// belongs to something else.
    OffsetsMalformed { key: PartitionKey, len: usize },
    /// A WAL segment could not be read during recovery, after retries.
    WalReadFailed { segment: SegmentId },
    /// A WAL write failed; the group's fate is decided by recovery.
    WalWriteFailed { segment: SegmentId, error: IoError },
    /// Another writer wrote where this one was about to commit: this writer
    /// lost the WAL (a newer writer took the lease) or raced one. Nothing of
    /// this writer's past the last commit was acknowledged; the next start
    /// recovers what the WAL holds.
    Fenced { segment: SegmentId, offset: u64 },
    /// The lease was taken by another writer while this one ran.
    LeaseLost { holder: u64, generation: u64 },
    /// A sink answered `fatal`.
    SinkFatal { sink: SinkId, stream: StreamId, id: CompactionId },
    /// A source broke the protocol (positions going backwards, a record too
    /// large for a commit group, a partition changing stream).
    SourceProtocol { source: SourceId, partition: u32, what: &'static str },
    /// A source said it cannot go on until an operator changes something.
    SourceRefused { source: SourceId, why: String },
    /// An operator's skip names input that is not next to be read: the
    /// partition's committed position is past its start but short of its
    /// end.
    SkipNotNext { key: PartitionKey, at: Position, next: Position, position: Position },
    /// The snapshot no longer fits in a segment: raise the segment size.
    SegmentTooSmall { needed: u64 },
    /// The configuration names a source, sink or stream differently from
    /// the WAL under the same id (renamed, reordered or removed).
    NamesChanged { kind: &'static str, index: usize, wal: String, config: String },
    /// WAL (or lease) requests failed for the configured stall limit
    /// without one success (`--once` only; nothing committed is lost).
    Stalled { what: Stall, for_: Duration },
    /// The schema plugin refused a stream's new schema.
    SchemaRejected { stream: StreamId, fingerprint: u64, reason: String },
    /// Clustered mode: this host led `term` and no longer does. Everything
    /// only a leader holds is dropped by stopping; the next start follows.
    Deposed { term: u64 },
    /// Clustered mode: this host's raft log or hard state cannot be trusted
    /// (acknowledged groups missing from its disk, a damaged hard-state
    /// file, an entry that is not a group it may write): it must not vote.
    ClusterLog { what: String },
    /// Clustered mode: this host takes no part in the cluster: its
    /// DATA_DIR has no cluster identity (never initialized, or wiped),
    /// belongs to another node id, or its id was removed.
    NotMember { what: String },
    /// Clustered mode: this host installed a snapshot from its leader (its
    /// WAL now ends at `index`); it restarts to recover from it.
    SnapshotInstalled { index: u64 },
    /// Clustered `--once`: the run is done (the terminal entry committed at
    /// `index`), but by the drain timeout this leader had not heard that
    /// `nodes` learnt so, or (`nodes` empty) this follower had lost its
    /// leader before hearing that every member had. A member that had not
    /// learnt it needs a majority to, when it starts again.
    FinishedUnconfirmed { index: u64, nodes: Vec<u64> },
}

impl StopReason {
    /// Clustered mode: a stop after which the host's engine starts again as
    /// a follower (crash-only: everything only a leader held is dropped,
    /// the disk holds the rest), rather than the process exiting.
    pub fn restarts_as_follower(&self) -> bool {
        matches!(self, StopReason::Deposed { .. } | StopReason::SnapshotInstalled { .. })
    }
}

/// What has been failing, in a stall (`Output::Stalled`,
/// `StopReason::Stalled`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// WAL requests.
    Wal,
    /// Writer-lease requests (S3 mode).
    Lease,
    /// Clustered mode: no leader with a majority is known.
    RaftQuorum,
    /// Clustered mode: besides, no peer has sent this host a single message
    /// since the stall began: the others are down, cannot be reached, or do
    /// not know this host.
    RaftNoPeer,
}

impl Stall {
    pub fn as_str(self) -> &'static str {
        match self {
            Stall::Wal => "WAL",
            Stall::Lease => "lease",
            Stall::RaftQuorum => "raft quorum",
            Stall::RaftNoPeer => "raft peers",
        }
    }
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As the string it names, quoted: `StopReason`'s `Debug`, which the
/// simulator's trace hashes, reads as it did when this was a string.
impl std::fmt::Debug for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySummary {
    pub segments: usize,
    /// Leftovers of deletions a crash interrupted (object stores), deleted.
    pub leftovers: usize,
    pub next_lsn: Lsn,
    pub partitions: usize,
    pub open_compactions: usize,
}

/// The reason a deadline from `poll_timeout` exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// A backoff before retrying an I/O, or before re-reading an idle source.
    Retry,
    /// The active segment reaches its age limit and will be sealed.
    SegmentAge,
    /// The clean-shutdown drain runs out of time.
    Drain,
    /// The writer lease is due for renewal, or another holder's row is due
    /// for another look.
    Lease,
    /// WAL requests have been failing long enough to report, or to stop.
    Stall,
    /// The next raft tick (clustered mode).
    Raft,
}
