//! The deterministic simulator for the skipprd engine.
//!
//! One `u64` seed drives a whole run: the scenario (pipeline shape, limits,
//! fault rates), simulated WAL devices (disks or an S3 bucket with its lease
//! row), offsets stores, sources and sinks, and the schedule of crashes. A
//! run has a fault phase and a quiet phase that must converge, and an
//! exactly-once checker judges it. A run is single-threaded; sweeps put
//! whole runs on separate threads. Same seed, same trace hash.
//!
//! Where things live: `world` is the harness every mode shares (one
//! scheduler, process slots, the run loop, the report, the
//! recovery-idempotence check); `writer` (disk and S3) and `cluster` (raft
//! hosts, a network, a durability model) are its topologies; `device`,
//! `disk`, `s3` and `plugins` are the simulated services; `checker` the
//! exactly-once reference model; `scenario` and `rng` what a seed draws;
//! `sweep`, `shrink` and `trace` run many seeds, shrink one, and hash a run.

pub mod checker;
pub mod cluster;
pub mod device;
pub mod disk;
pub mod operator;
pub mod plugins;
pub mod rng;
pub mod s3;
pub mod scenario;
pub mod shrink;
pub mod sweep;
pub mod trace;
pub mod world;
pub mod writer;

pub use checker::{invariant, Violation};
pub use world::{run, Outcome, RunOptions, RunReport, RunStats};

/// Bumped whenever a change alters what a seed does, so saved failures say
/// which simulator found them.
pub const SIM_VERSION: u32 = 29;
