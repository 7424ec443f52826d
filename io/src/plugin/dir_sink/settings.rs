//! The directory sink's settings: `--sink-dir*` flags, keys of `[sink]`.

use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct DirSinkArgs {
    /// Directory sink: where batches are written [default: DATA_DIR/sink].
    #[arg(long = "sink-dir", id = "sink_dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Directory sink: the mode of each batch file, in octal (directories
    /// get `x` wherever it has `r`), less the process's umask; it must let
    /// the owner read and write [default: 0640].
    #[arg(long = "sink-dir-mode", id = "sink_dir_mode", value_name = "MODE")]
    pub dir_mode: Option<String>,
}

/// The directory sink's settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DirSinkConfig {
    pub dir: PathBuf,
    pub mode: u32,
}

impl DirSinkArgs {
    /// The directory defaults to `sink` under the data directory.
    pub fn resolve(&self, data_dir: &Path) -> Result<DirSinkConfig, String> {
        Ok(DirSinkConfig {
            dir: self.dir.clone().unwrap_or_else(|| data_dir.join("sink")),
            mode: match &self.dir_mode {
                None => super::FILE_MODE_DEFAULT,
                Some(text) => file_mode(text)?,
            },
        })
    }
}

/// `--sink-dir-mode`: octal, at most 0777, at least owner read and write.
fn file_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 && mode & 0o600 == 0o600 => Ok(mode),
        _ => Err(format!(
            "--sink-dir-mode is {text:?}; give an octal file mode that lets the owner read and write, such as 0640 or \
             0600"
        )),
    }
}
