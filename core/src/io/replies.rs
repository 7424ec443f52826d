//! A request's answer: what the driver found, or an error as data.

use super::{LeaseRow, SourceBatchIn};
use crate::ids::*;
use std::collections::BTreeMap;

#[derive(Debug)]
pub enum IoReply {
    Done,
    Segments(WalListing),
    SegmentBytes(bytes::Bytes),
    Groups(Vec<Vec<u8>>),
    /// The stop record's bytes, if there is one.
    StopRecord(Option<Vec<u8>>),
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
    /// Segment files (disk): one id per file, with the file's length (a
    /// clustered host's log needs each segment's size, and a scan that
    /// stops at a seal never reaches the end of the file).
    Files(Vec<(SegmentId, u64)>),
    /// An object store (S3): per segment, the offsets of the objects it
    /// holds (0 is the header). Which of them still belong to the WAL is the
    /// engine's decision (`wal::oldest_to_keep`); it deletes the leftovers.
    Objects(BTreeMap<SegmentId, Vec<u64>>),
}

/// One offsets entry as the store holds it: key, raw value (24 bytes when
/// healthy), checkpoint.
pub type OffsetRow = (PartitionKey, Vec<u8>, Option<Vec<u8>>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkOutcome {
    Applied,
    AlreadyApplied,
    Retryable,
    Fatal,
    /// `fatal` from a sink that cannot name the records it cannot take
    /// (runtime protocol version 1): with dead letters on, the engine
    /// splits the batch to find them (`Split`); without, as `Fatal`.
    FatalUnnamed,
    /// Nothing of the batch took effect, and these records of it never
    /// will (runtime protocol version 2): the engine commits the refusal,
    /// sends them to the dead letters and the rest again. Sorted by index,
    /// each index once, within the batch, at least one.
    Refused(Vec<RefusedIndex>),
}

/// A record of a batch a sink refused: its index in the batch, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedIndex {
    pub index: u32,
    pub reason: String,
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
