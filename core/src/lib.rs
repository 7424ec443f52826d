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

/// What the engine admits from outside: the record and stream-name rules.
pub mod admit;
/// Compaction ids: stable across replays, derived from what a batch holds.
pub mod compaction;
/// `HostConfig`, `Limits`, `LeaseConfig`: validated once, policy derived once.
pub mod config;
/// The engine: `Host`, a coordinator over parts that own their state.
pub mod host;
/// Typed ids and positions.
pub mod ids;
/// The vocabulary: inputs, outputs, I/O requests and replies, stop reasons.
pub mod io;
/// Planted bugs, off by default, for the simulator's checker to catch.
pub mod mutation;
/// The 24-byte value the offsets store keeps per partition.
pub mod offsets;
/// The records sinks still need: in a bounded cache, or read back from the WAL.
pub mod records;
/// Reading a WAL back: the scan, the proof that it is whole, the rebuild.
pub mod recovery;
/// Consensus for the clustered WAL: raft-rs configured and driven by the
/// engine's ticks and seed (issue #12, in progress).
pub mod replication;
/// The rule every sink applies to a batch: new, the same again, or a conflict.
pub mod sink_ledger;
/// What the committed WAL says, folded into maps.
pub mod state;
/// The engine's own integer time.
pub mod time;
/// The WAL's byte formats and the object-store layout rules.
pub mod wal;

pub use config::{ConfigError, HostConfig, LeaseConfig, Limits};
pub use host::{Host, RarePaths};
pub use ids::{
    CompactionId, CompactionSeq, Epoch, IoId, Lsn, PartitionKey, Position, SegmentId, SinkId, SourceId, StreamId,
};
pub use io::{
    Input, Install, IoError, IoOp, IoReply, LeaseOp, LeaseRow, OffsetEntry, OffsetRow, OffsetsOp, Output, PeerMessage,
    PeerMessageType, PluginOp, Records, RecoverySummary, Replicate, ResumePoint, SinkApply, SinkOutcome, SourceBatchIn,
    StopReason, Timer, WalListing, WalOp,
};
pub use mutation::{Mutation, Mutations};
pub use offsets::OffsetValue;
pub use replication::replica::{PeerProgress, RaftStatus};
pub use time::{Duration, Instant};
