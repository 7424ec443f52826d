//! The file source's settings: `--file-*` flags, keys of `[source]`.

use clap::Args;
use serde::{Deserialize, Serialize};
use skippr_core::rules::check_stream_name;
use std::path::PathBuf;

#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct FileSourceArgs {
    /// File source: the directory whose `*.jsonl` files are read.
    #[arg(long = "file-dir", id = "file_dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// File source: the stream its records go to [default: lines].
    #[arg(long = "file-stream", value_name = "NAME")]
    pub stream: Option<String>,
    /// File source: keep tailing the files (`true`), or be exhausted once
    /// every file is read (`false`, for --once) [default: true].
    #[arg(long = "file-follow", value_name = "BOOL")]
    pub follow: Option<bool>,
}

/// The file source's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSourceConfig {
    pub dir: PathBuf,
    pub stream: String,
    pub follow: bool,
}

impl FileSourceArgs {
    pub fn resolve(&self) -> Result<FileSourceConfig, String> {
        let dir =
            self.dir.clone().ok_or("the file source needs its directory: --file-dir DIR, or `dir` in [source]")?;
        let stream = self.stream.clone().unwrap_or_else(|| "lines".into());
        check_stream_name(&stream).map_err(|why| format!("the file source's stream: {why}"))?;
        Ok(FileSourceConfig { dir, stream, follow: self.follow.unwrap_or(true) })
    }
}
