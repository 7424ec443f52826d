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
//! What it owns: WAL commit groups and their byte format ([`wal`]), offset
//! materialization ([`offsets`]), compaction planning with stable ids
//! ([`compaction`]), recovery ([`recovery`]) and the clean-shutdown drain.

pub mod compaction;
pub mod config;
pub mod host;
pub mod ids;
pub mod io;
pub mod mutation;
pub mod offsets;
pub mod recovery;
pub mod state;
pub mod time;
pub mod wal;

pub use config::{ConfigError, HostConfig, LeaseConfig, Limits};
pub use host::Host;
pub use ids::*;
pub use io::*;
pub use mutation::{Mutation, Mutations};
pub use offsets::OffsetValue;
pub use time::{Duration, Instant};
