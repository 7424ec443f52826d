//! Exit codes, documented in the README: a supervisor reads them.

/// Everything passed, or the daemon stopped cleanly.
pub const OK: i32 = 0;
/// A simulated run broke an invariant (or a saved failure still fails).
pub const SIM_FAILED: i32 = 1;
/// Bad command-line input (clap uses the same code).
pub const USAGE: i32 = 2;
