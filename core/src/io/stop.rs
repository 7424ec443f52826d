//! Why the engine stopped, and what a stall is of.

use super::IoError;
use crate::ids::*;
use crate::recovery::Missing;
use crate::time::Duration;
use crate::wal::Corruption;

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
    SinkFatal { sink: SinkId, stream: StreamId, id: CompactionId, seq: CompactionSeq },
    /// A sink refused records and dead letters are off: the first of them,
    /// where it is and why, and how many the batch held.
    SinkRefused {
        sink: SinkId,
        stream: StreamId,
        id: CompactionId,
        key: PartitionKey,
        position: Position,
        reason: String,
        refused: usize,
    },
    /// A sink's answer broke the protocol in a way a retry cannot mend (a
    /// refusal naming a record the batch does not hold).
    SinkProtocol { sink: SinkId, stream: StreamId, what: String },
    /// The dead-letter destination answered `fatal` (or refused a dead
    /// letter) for the dead-letter batch `letters` of (sink, stream).
    DeadLettersFatal { sink: SinkId, stream: StreamId, letters: CompactionSeq },
    /// Dead letters are off, but batch `seq` of (sink, stream) has records
    /// whose refusal (by the sink, or at intake) a run with them on
    /// committed: they can go nowhere else.
    DeadLettersOff { sink: SinkId, stream: StreamId, seq: CompactionSeq },
    /// Settling a batch would put more than `max` records refused among
    /// the last `window` decided (`--dead-letter-max`): nothing of it is
    /// done; the next start asks the sink again.
    DeadLetterLimit { sink: SinkId, stream: StreamId, refused: u64, max: u64, window: u64 },

    /// A source broke the protocol (positions going backwards, a record too
    /// large for a commit group, a partition changing stream).
    SourceProtocol { source: SourceId, partition: u32, what: &'static str },
    /// A source said it cannot go on until an operator changes something.
    SourceRefused { source: SourceId, why: String },
    /// The WAL reached its size limit (`limit` bytes, `WAL_MAX_BYTES`) with
    /// its oldest segment holding records of `source`'s open window: no
    /// segment can go until the window closes, and no more of it can be
    /// read (section 22).
    WindowTooLarge { source: SourceId, limit: u64 },
    /// An operator's skip names input that is not next to be read: the
    /// partition's committed position is past its start but short of its
    /// end.
    SkipNotNext { key: PartitionKey, at: Position, next: Position, position: Position },
    /// `run --skip-batch` names a batch that is not planned yet (`next` is
    /// the first number not planned), or one its sink holds already with
    /// dead letters to deliver (`settled`): nothing is given up.
    BatchSkipNotOpen { sink: SinkId, stream: StreamId, seq: CompactionSeq, next: CompactionSeq, settled: bool },
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
    /// Clustered mode: besides, no peer has sent this host a message since
    /// the stall began, or for two election timeouts: the others are down,
    /// cannot be reached, or do not know this host. (A stop names it only
    /// when not a single message arrived in the whole stall.)
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
