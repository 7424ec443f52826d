//! Real drivers for the skipprd engine.
//!
//! This crate performs what `skippr-core` decides, and decides nothing itself:
//! the disk WAL ([`disk_wal`]) and the S3 WAL ([`s3_wal`]), the embedded
//! offsets store ([`offsets_db`]) and the DynamoDB one with the writer lease
//! ([`dynamo`]),
//! the sources and sinks, built-in and external ([`plugin`]), and the one tokio event loop
//! that feeds the engine its inputs and performs its outputs ([`driver`]).

pub mod ack_latency;
pub mod aws;
pub mod clock;
pub mod disk_wal;
pub mod driver;
pub mod dynamo;
pub mod hard_state_file;
pub mod health;
pub mod metrics;
pub mod offsets_db;
pub mod peer;
pub mod planted;
pub mod plugin;
pub mod s3_wal;

pub use clock::Clock;
pub use disk_wal::DiskWal;
pub use driver::{drive, Backends, OffsetsBackend, RunTotals, WalBackend};
pub use offsets_db::OffsetsDb;
