//! The built-in `stdout` sink.

use super::{PluginError, Sink};
use skippr_core::{CompactionId, Records, SinkOutcome};
use std::io::Write;

/// The built-in stdout sink: prints each record on its own line. It cannot
/// tell a replay from a new batch, so after a crash it may print a batch
/// twice: use it for looking, not for exactly-once delivery.
pub struct StdoutSink;

impl Sink for StdoutSink {
    fn apply(&mut self, _: &str, _: u64, _: CompactionId, records: &Records) -> Result<SinkOutcome, PluginError> {
        let mut out = std::io::stdout().lock();
        for r in records {
            out.write_all(r).and_then(|_| out.write_all(b"\n")).map_err(|e| PluginError(format!("stdout: {e}")))?;
        }
        out.flush().map_err(|e| PluginError(format!("stdout: {e}")))?;
        Ok(SinkOutcome::Applied)
    }
}
