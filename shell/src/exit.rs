//! Exit codes, documented in the README: a supervisor reads them.

use skippr_core::StopReason;

/// Everything passed, or the daemon stopped cleanly.
pub const OK: i32 = 0;
/// A simulated run broke an invariant (or a saved failure still fails); for
/// `run` and the tools, an error not listed below.
pub const SIM_FAILED: i32 = 1;
pub const FAILED: i32 = 1;
/// Bad command-line input (clap uses the same code).
pub const USAGE: i32 = 2;
/// A configuration value is wrong (unknown `WAL_STORAGE`, a bad TOML file).
pub const CONFIG: i32 = 3;
/// `DATA_DIR` cannot be used: missing and not creatable, not writable, or
/// locked by another skipprd.
pub const DATA_DIR: i32 = 4;
/// Committed WAL data is corrupt or missing (fail closed).
pub const WAL_CORRUPT: i32 = 5;
/// The offsets store is ahead of the WAL or damaged.
pub const OFFSETS: i32 = 6;
/// A WAL write failed.
pub const WAL_WRITE: i32 = 7;
/// A sink answered `fatal`.
pub const SINK_FATAL: i32 = 8;
/// A clean shutdown could not drain in time: the run is untrusted and the
/// next start recovers from the WAL.
pub const DRAIN_FAILED: i32 = 9;
/// A source broke the protocol, or cannot go on until its settings change.
pub const SOURCE_PROTOCOL: i32 = 10;
/// An external plugin could not be started (bad command, no hello, another
/// protocol version).
pub const PLUGIN: i32 = 11;
/// The schema plugin refused a new schema.
pub const SCHEMA_REJECTED: i32 = 12;
/// S3 or DynamoDB cannot be used: the bucket or table is missing, access is
/// denied, no region is set, or the service does not answer.
pub const REMOTE: i32 = 13;
/// Another writer took this WAL over (its commit was where this one's would
/// go, or it took the lease): this daemon stopped without acknowledging
/// anything it had not committed.
pub const FENCED: i32 = 14;
/// Under `--once`: WAL (or lease) requests failed for the stall limit without
/// one success; nothing committed is lost, the next start recovers.
pub const STALLED: i32 = 15;

pub fn for_stop(reason: &StopReason) -> i32 {
    match reason {
        StopReason::Clean | StopReason::FinishedUnconfirmed { .. } => OK,
        StopReason::DrainTimedOut => DRAIN_FAILED,
        StopReason::Corrupt(_) | StopReason::WalIncomplete(_) | StopReason::ClusterLog { .. } => WAL_CORRUPT,
        StopReason::OffsetsAheadOfWal { .. }
        | StopReason::OffsetsMalformed { .. }
        | StopReason::SinkAheadOfWal { .. } => OFFSETS,
        StopReason::WalWriteFailed { .. } | StopReason::WalReadFailed { .. } => WAL_WRITE,
        StopReason::SinkFatal { .. }
        | StopReason::SinkRefused { .. }
        | StopReason::SinkProtocol { .. }
        | StopReason::DeadLettersFatal { .. }
        | StopReason::DeadLetterLimit { .. } => SINK_FATAL,
        StopReason::SourceProtocol { .. } | StopReason::SourceRefused { .. } | StopReason::WindowTooLarge { .. } => {
            SOURCE_PROTOCOL
        }
        StopReason::SegmentTooSmall { .. } | StopReason::NamesChanged { .. } | StopReason::NotMember { .. } => CONFIG,
        StopReason::SkipNotNext { .. } | StopReason::BatchSkipNotOpen { .. } | StopReason::DeadLettersOff { .. } => {
            CONFIG
        }
        StopReason::SchemaRejected { .. } => SCHEMA_REJECTED,
        StopReason::Fenced { .. }
        | StopReason::LeaseLost { .. }
        | StopReason::Deposed { .. }
        | StopReason::SnapshotInstalled { .. } => FENCED,
        StopReason::Stalled { .. } => STALLED,
    }
}
