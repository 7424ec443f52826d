//! The sans-IO engine of skipprd.
//!
//! This crate does no I/O: no files, no sockets, no clock, no threads, no OS
//! randomness. It decides; a driver performs. Every event comes in through
//! [`Host::handle`], every effect goes out through [`Host::poll_output`] as an
//! [`Output::Io`] request that the driver answers with [`Input::IoDone`], and
//! [`Host::poll_timeout`] names the next deadline and its reason. Time is the
//! crate's own integer [`Instant`], passed in. Collections iterate in a fixed
//! order (`BTreeMap`, `Vec`), so the same inputs give the same outputs on
//! every machine; the simulator depends on it.
//!
//! Every module is private. What a driver may use is named below, once:
//! the engine at the crate's root, and four rooms for the rules a driver
//! shares with the engine: [`format`] (the WAL's bytes), [`cluster`] (the
//! hard-state file, snapshots, membership), [`rules`] (what is admitted) and
//! [`ledger`] (the rule every sink applies). The simulator also reads
//! [`testing`], which no production driver needs.

/// What the engine admits from outside: the record and stream-name rules.
mod admit;
/// Compaction ids: stable across replays, derived from what a batch holds.
mod compaction;
/// `HostConfig`, `Limits`, `LeaseConfig`: validated once, policy derived once.
mod config;
/// Consensus for the clustered WAL: raft-rs configured and driven by the
/// engine's ticks and seed, its log over the WAL, the hard-state file's
/// format, snapshots and membership. The engine's part that uses it is
/// `host::replication`.
mod consensus;
/// Dead letters: the line a refused record becomes.
mod dead_letters;
/// The engine: `Host`, a coordinator over parts that own their state.
mod host;
/// Typed ids and positions.
mod ids;
/// The vocabulary: inputs, outputs, I/O requests and replies, stop reasons.
mod io;
/// Planted bugs, off by default, for the simulator's checker to catch.
mod mutation;
/// The 24-byte value the offsets store keeps per partition.
mod offsets;
/// The records sinks still need: in a bounded cache, or read back from the WAL.
mod records;
/// Reading a WAL back: the scan, the proof that it is whole, the rebuild.
mod recovery;
/// The rule every sink applies to a batch: new, the same again, or a conflict.
mod sink_ledger;
/// What the committed WAL says, folded into maps.
mod state;
/// The engine's own integer time.
mod time;
/// The WAL's byte formats and the object-store layout rules.
mod wal;

pub use config::{BatchSkipRequest, ClusterConfig, SkipRequest, SKIP_REASON_BYTES_MAX};
pub use config::{ConfigError, DeadLetters, HostConfig, LeaseConfig, Limits};
pub use consensus::replica::{PeerProgress, RaftStatus};
pub use dead_letters::{
    kept_reason, quarantined, Letter, LetterRecord, Quarantined, AT_INTAKE, FATAL_ALONE, REASON_BYTES_MAX,
};
pub use host::{Host, RarePaths};
pub use ids::{
    CompactionId, CompactionSeq, Epoch, IoId, Lsn, PartitionKey, Position, SegmentId, SinkId, SourceId, StreamId,
};
pub use io::{
    Input, Install, IntakeFault, IoError, IoOp, IoReply, LeaseOp, LeaseRow, LogRestored, OffsetEntry, OffsetRow,
    OffsetsOp, Output, PeerMessage, PeerMessageType, PluginOp, Records, RecoverySummary, RefusedIndex, Replicate,
    ResumePoint, SinkApply, SinkOutcome, SourceBatchIn, Stall, StopReason, StopRecordUse, Timer, WalListing, WalOp,
    Window,
};
pub use mutation::{Mutation, Mutations};
pub use offsets::OffsetValue;
pub use time::{Duration, Instant};

/// The WAL's bytes as drivers store, read and lay them out: frames, commit
/// groups, segments, the object layout in S3, reading a WAL back.
pub mod format {
    pub use crate::recovery::{recover, Missing, Recovery, WalDamage};
    pub use crate::wal::stream::Scanned;
    pub use crate::wal::{
        encode_group, encode_header, first_overlap, lay_out, scan, split_leftovers, taken_key, unreadable_tail, Frame,
        GroupPlace, Record, ScannedSegment, SourceBatch, Tail, WindowEnd, WindowPart, SEGMENT_HEADER_BYTES,
        TAIL_DIGESTS_MAX, UNREADABLE_TAIL,
    };
    pub use crate::wal::{tail_segment, tail_unreadable, UnreadableTail, BREAKER_WINDOW_MAX, TAIL_PROBE_BYTES};
}

/// What a clustered host keeps and exchanges besides its segments: the
/// hard-state file, snapshot manifests, membership, the settings every host
/// must share, and what `wal verify` compares across hosts.
pub mod cluster {
    pub use crate::consensus::hard_state::{
        decode_file, encode_slot, first_file, slot_offset, Members, Saved, FILE_BYTES, SLOT_BYTES,
    };
    pub use crate::consensus::membership::JoinRefusal;
    pub use crate::consensus::snapshot::{check_install, Manifest, ManifestSegment};
    pub use crate::consensus::{prefix_digest, settings_fingerprint, ConfState, HardState};
}

/// What the engine admits from outside, for plugins that check early.
pub mod rules {
    pub use crate::admit::{
        check_record, check_stream_name, quarantines, record_bytes_max_for, segment_record_bytes_max, RecordFault,
        RECORD_BYTES_MAX_DEFAULT, RECORD_BYTES_MAX_LIMIT,
    };
}

/// The rule every sink applies to a batch: new, the same again, or a conflict.
pub mod ledger {
    pub use crate::sink_ledger::{conflict_message, judge, Digest, Entry, Scope, Verdict};
}

/// What the simulator and tests read besides the drivers' surface: the
/// committed state compared across recoveries, the shape of a clustered
/// log's entries and of a commit group. No production driver uses these.
pub mod testing {
    pub use crate::consensus::entry::{EntryGroup, Opening};
    pub use crate::consensus::log::LogRecord;
    pub use crate::state::CommittedState;
    pub use crate::wal::{group_facts, group_shape, GroupFacts, PlannedBatch};
}
