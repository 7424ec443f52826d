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

mod replies;
mod requests;
mod stop;

pub use replies::*;
pub use requests::*;
pub use stop::*;

use crate::ids::*;
use crate::time::Duration;

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
    /// Clustered mode: this host restored raft's log and its committed
    /// state from its own disk; its raft node starts (serving waits for an
    /// election, and `Recovered` for serving).
    LogRestored(LogRestored),
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
    /// An operator's batch skip at the end of recovery: `recorded` when
    /// the open plan is given up now (committed with the next group);
    /// otherwise the batch was done by an earlier run (applied, or given
    /// up), and nothing is done.
    BatchSkip {
        sink: SinkId,
        stream: StreamId,
        seq: CompactionSeq,
        recorded: bool,
    },
    /// Batch `seq` of (sink, stream) settled with refusals standing (the
    /// `Settled` frame committed): the refused records go to the dead
    /// letters as that pair's batch `letters`, with these reasons (one per
    /// record, in batch order).
    Refused {
        sink: SinkId,
        stream: StreamId,
        seq: CompactionSeq,
        letters: CompactionSeq,
        reasons: Vec<String>,
    },
    /// A sink that cannot name records answered `fatal` for batch `seq`
    /// of (sink, stream) and the engine cut it to the first half of its
    /// records, sent next as `id` (a `Split` frame committed).
    Split {
        sink: SinkId,
        stream: StreamId,
        seq: CompactionSeq,
        id: CompactionId,
    },
    /// A window closed with records of `partition` under one resume key
    /// past what its tail keeps (`TAIL_DIGESTS_MAX`, or less where the
    /// closing frame had to fit a commit group): after a restart, the tap's
    /// records past those kept may be delivered again (section 22).
    TailCut {
        source: SourceId,
        partition: u32,
        kept: usize,
    },
    /// The engine stopped; no further output follows.
    Stopped(StopReason),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySummary {
    pub segments: usize,
    /// Leftovers of deletions a crash interrupted (object stores), deleted.
    pub leftovers: usize,
    pub next_lsn: Lsn,
    pub partitions: usize,
    pub open_compactions: usize,
    /// Bytes of the WAL read to recover, and the time from the listing to
    /// the last of them scanned.
    pub scanned_bytes: u64,
    pub scan_time: Duration,
    /// Whether the previous run's stop record spared the scan.
    pub stop_record: StopRecordUse,
}

/// What a clustered host restored from its own disk at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRestored {
    /// Bytes of the WAL read, and the time from the listing to the last of
    /// them scanned.
    pub scanned_bytes: u64,
    pub scan_time: Duration,
    /// Raft's commit index (the saved one, raised to the first group on
    /// disk) and the last index on disk.
    pub commit: u64,
    pub last_index: u64,
    /// Bytes of the groups past the commit index, held in memory for raft.
    pub uncommitted_bytes: u64,
    /// What became of the last run's stop record.
    pub stop_record: StopRecordUse,
}

/// What a start made of the stop record the last run left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopRecordUse {
    #[default]
    /// There was none (the last run did not stop on SIGTERM with its WAL
    /// consistent, or this is the first).
    Absent,
    /// It matched the WAL: no segment was scanned.
    Used,
    /// Set aside, and the WAL scanned: why.
    Stale(&'static str),
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
