//! External plugins' settings: the command that starts each
//! (`--source-command`, `--sink-command`, `--schema-command`).

use clap::Args;
use serde::{Deserialize, Serialize};

/// The external source, `command` in `[source]`.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct CommandSourceArgs {
    /// External source: the command that starts the plugin (run by `sh -c`).
    #[arg(long = "source-command", id = "source_command", value_name = "CMD")]
    pub command: Option<String>,
}

/// The external sink, `command` in `[sink]`.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct CommandSinkArgs {
    /// External sink: the command that starts the plugin (run by `sh -c`).
    #[arg(long = "sink-command", id = "sink_command", value_name = "CMD")]
    pub command: Option<String>,
}

impl CommandSourceArgs {
    pub fn resolve(&self) -> Result<String, String> {
        self.command.clone().ok_or_else(|| {
            "the command source needs its command: --source-command CMD, or `command` in [source]".into()
        })
    }
}

impl CommandSinkArgs {
    pub fn resolve(&self) -> Result<String, String> {
        self.command
            .clone()
            .ok_or_else(|| "the command sink needs its command: --sink-command CMD, or `command` in [sink]".into())
    }
}
