//! The built-in plugins by kind: the settings of every one of them, which
//! the shell flattens into `skipprd run`'s flags and the file's `[source]`
//! and `[sink]` tables, and the one each kind resolves to. A plugin's own
//! settings, defaults and checks live in its folder (`settings.rs`); this
//! file only lists the kinds and picks one.

use super::dir_sink::settings::{DirSinkArgs, DirSinkConfig};
use super::file_source::settings::{FileSourceArgs, FileSourceConfig};
use super::generator::settings::{GeneratorArgs, GeneratorConfig};
use super::postgres_sink::settings::{PostgresArgs, PostgresConfig};
use super::process::settings::{CommandSinkArgs, CommandSourceArgs};
use super::s3_sink::settings::{S3SinkArgs, S3SinkConfig};
use super::singer::settings::{SingerArgs, SingerConfig};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// A kind named by `--source` or `--sink`, and every kind there is.
fn kind<K: Copy>(given: Option<&str>, default: K, kinds: &[(&str, K)], what: &str) -> Result<K, String> {
    let Some(name) = given else { return Ok(default) };
    match kinds.iter().find(|(n, _)| *n == name) {
        Some((_, k)) => Ok(*k),
        None => {
            let names: Vec<&str> = kinds.iter().map(|(n, _)| *n).collect();
            Err(format!("unknown {what} '{name}': use one of {}", names.join(", ")))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Generator,
    File,
    Singer,
    Command,
}

const SOURCES: &[(&str, SourceKind)] = &[
    ("generator", SourceKind::Generator),
    ("file", SourceKind::File),
    ("singer", SourceKind::Singer),
    ("command", SourceKind::Command),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkKind {
    Dir,
    Stdout,
    Command,
    Postgres,
    S3,
}

const SINKS: &[(&str, SinkKind)] = &[
    ("dir", SinkKind::Dir),
    ("stdout", SinkKind::Stdout),
    ("command", SinkKind::Command),
    ("postgres", SinkKind::Postgres),
    ("s3", SinkKind::S3),
];

/// Every source's settings, in the file's `[source]` table.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct SourceArgs {
    /// The source: `generator`, `file`, `singer` for a Singer tap, or
    /// `command` for an external plugin [default: generator].
    #[arg(long = "source", id = "source", value_name = "KIND")]
    pub kind: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub generator: GeneratorArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub file: FileSourceArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub command: CommandSourceArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub singer: SingerArgs,
    /// Keys of the table that name no setting (an error).
    #[arg(skip)]
    #[serde(flatten, skip_serializing)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Every sink's settings, in the file's `[sink]` table.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
pub struct SinkArgs {
    /// The sink: `dir`, `stdout`, `postgres` (a table per stream, one
    /// transaction per batch with its progress row), `s3` (an object per
    /// batch, created only if absent), or `command` for an external plugin
    /// [default: dir].
    #[arg(long = "sink", id = "sink", value_name = "KIND")]
    pub kind: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub dir: DirSinkArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub command: CommandSinkArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub s3: S3SinkArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub postgres: PostgresArgs,
    /// Keys of the table that name no setting (an error).
    #[arg(skip)]
    #[serde(flatten, skip_serializing)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// The source a run starts, its settings checked.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    Generator(GeneratorConfig),
    File(FileSourceConfig),
    Command { command: String },
    Singer(SingerConfig),
}

/// The sink a run starts, its settings checked.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkConfig {
    Dir(DirSinkConfig),
    Stdout,
    Command { command: String },
    Postgres(PostgresConfig),
    S3(S3SinkConfig),
}

impl SourceArgs {
    pub fn resolve(&self) -> Result<SourceConfig, String> {
        Ok(match kind(self.kind.as_deref(), SourceKind::Generator, SOURCES, "source")? {
            SourceKind::Generator => SourceConfig::Generator(self.generator.resolve()?),
            SourceKind::File => SourceConfig::File(self.file.resolve()?),
            SourceKind::Command => SourceConfig::Command { command: self.command.resolve()? },
            SourceKind::Singer => SourceConfig::Singer(self.singer.resolve()?),
        })
    }
}

impl SinkArgs {
    /// A directory sink's default place is under `data_dir`.
    pub fn resolve(&self, data_dir: &Path) -> Result<SinkConfig, String> {
        Ok(match kind(self.kind.as_deref(), SinkKind::Dir, SINKS, "sink")? {
            SinkKind::Dir => SinkConfig::Dir(self.dir.resolve(data_dir)?),
            SinkKind::Stdout => SinkConfig::Stdout,
            SinkKind::Command => SinkConfig::Command { command: self.command.resolve()? },
            SinkKind::Postgres => SinkConfig::Postgres(self.postgres.resolve()?),
            SinkKind::S3 => SinkConfig::S3(self.s3.resolve()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_kind_is_named_with_every_kind_there_is() {
        let source = SourceArgs { kind: Some("tap".into()), ..SourceArgs::default() };
        assert_eq!(source.resolve().unwrap_err(), "unknown source 'tap': use one of generator, file, singer, command");
        let sink = SinkArgs { kind: Some("ftp".into()), ..SinkArgs::default() };
        assert_eq!(
            sink.resolve(Path::new("d")).unwrap_err(),
            "unknown sink 'ftp': use one of dir, stdout, command, postgres, s3"
        );
    }

    #[test]
    fn each_kind_defaults_to_what_a_first_run_needs() {
        let SourceConfig::Generator(g) = SourceArgs::default().resolve().unwrap() else { panic!("not the generator") };
        assert_eq!((g.streams, g.partitions, g.records), (vec!["events".to_string()], 2, 10_000));
        let SinkConfig::Dir(d) = SinkArgs::default().resolve(Path::new("data")).unwrap() else { panic!("not dir") };
        assert_eq!(d.dir, Path::new("data/sink"));
    }
}
