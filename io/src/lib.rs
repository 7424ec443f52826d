//! Real drivers for the skipprd engine.
//!
//! This crate performs what `skippr-core` decides: the disk WAL, the S3 WAL,
//! the clustered WAL, the offsets stores, plugin processes and the built-in
//! sources and sinks. It is empty until the daemon's `run` command lands (see
//! the open issues); the simulator in `skippr-sim` drives the engine today.
