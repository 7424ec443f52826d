//! The Singer source's settings: `--singer-*` flags, keys of `[source]`.

use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct SingerArgs {
    /// Singer source: the tap and its arguments (run by `sh -c`), e.g.
    /// `tap-jsonl --config tap.json`; skipprd adds `--state`, `--catalog`
    /// and `--properties`.
    #[arg(long = "singer-command", env = "SKIPPR_SINGER_COMMAND", hide_env_values = true, value_name = "CMD")]
    pub singer_command: Option<String>,
    /// Singer source: the catalog passed as `--catalog`; its selected streams
    /// are the streams [default: the tap's `--discover` output, not passed].
    #[arg(long = "singer-catalog", value_name = "FILE")]
    pub singer_catalog: Option<PathBuf>,
    /// Singer source: a properties file passed as `--properties` (older
    /// taps), read like a catalog.
    #[arg(long = "singer-properties", value_name = "FILE")]
    pub singer_properties: Option<PathBuf>,
    /// Singer source: seconds from the end of one sync to the start of the
    /// next, from the last state handed to the WAL; 0 (or --once) runs one
    /// sync, then the source is done [default: 60].
    #[arg(long = "singer-interval", value_name = "S")]
    pub singer_interval: Option<f64>,
    /// Gone: a tap's window is committed to the WAL as it comes, and the
    /// WAL's size limit bounds it. Refused with a message saying so.
    #[arg(long = "singer-buffer-bytes", value_name = "N", hide = true)]
    pub singer_buffer_bytes: Option<u64>,
}

/// The Singer source's settings, checked; the run adds the rest of
/// `SingerSettings` (timeouts and sizes the engine decides).
#[derive(Debug, Clone, PartialEq)]
pub struct SingerConfig {
    pub command: String,
    pub catalog: Option<PathBuf>,
    pub properties: Option<PathBuf>,
    /// Seconds between syncs; `None`: one sync.
    pub interval: Option<f64>,
}

impl SingerArgs {
    pub fn resolve(&self) -> Result<SingerConfig, String> {
        let interval = self.singer_interval.unwrap_or(60.0);
        let max = super::super::SECONDS_MAX;
        if !interval.is_finite() || !(0.0..=max).contains(&interval) {
            return Err(format!("--singer-interval is {interval}; give seconds, 0 or more and at most {max} (a year)"));
        }
        if self.singer_buffer_bytes.is_some() {
            return Err("--singer-buffer-bytes (singer_buffer_bytes) is gone: a tap's records are committed to the \
                        WAL as they come, and a window between two STATEs may be as large as the WAL's limit \
                        (--wal-max-bytes); remove the setting"
                .into());
        }
        if self.singer_catalog.is_some() && self.singer_properties.is_some() {
            return Err("give the Singer tap a catalog or a properties file, not both".into());
        }
        Ok(SingerConfig {
            command: self.singer_command.clone().ok_or(
                "the singer source needs its tap: --singer-command \"tap-x --config tap.json\", \
                 SKIPPR_SINGER_COMMAND, or `singer_command` in [source]",
            )?,
            catalog: self.singer_catalog.clone(),
            properties: self.singer_properties.clone(),
            interval: (interval > 0.0).then_some(interval),
        })
    }
}
