//! The deterministic simulator for the skipprd engine.
//!
//! One `u64` seed drives a whole run: the scenario (pipeline shape, limits,
//! fault rates), a simulated disk or S3 bucket with its lease row, offsets
//! store, sources and sinks, and the schedule of crashes. The run has a fault phase and a quiet phase that must
//! converge, and an exactly-once checker judges it. A run is single-threaded;
//! sweeps put whole runs on separate threads. Same seed, same trace hash.

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
pub const SIM_VERSION: u32 = 18;
