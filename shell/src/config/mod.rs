//! `skipprd run`'s configuration: command-line flags, then environment
//! variables, then the TOML file given with `--config`, then defaults. The
//! first that sets a value wins.
//!
//! Each setting is declared once, as a field with its flag and environment
//! variable (clap) and its file key (serde): the engine's here, the stores'
//! in `stores`, each built-in plugin's in its own folder under
//! `skippr_io::plugin` (listed by `plugin::registry`). The file and the
//! flags are layered by `layers`, never field by field.

mod layers;
mod skips;
mod stores;
#[cfg(test)]
mod tests;

pub use skippr_io::plugin::registry::{SinkArgs, SinkConfig, SourceArgs, SourceConfig};
pub use skips::{BatchSkip, InputSkip};
pub use stores::{
    AwsArgs, ClusterArgs, ClusterSettings, OffsetsArgs, OffsetsConfig, TableArgs, WalArgs, WalConfig, WalStorage,
};

use clap::Args;
use serde::{Deserialize, Serialize};
use skippr_core::rules::{record_bytes_max_for, segment_record_bytes_max, RECORD_BYTES_MAX_LIMIT};
use skippr_core::Limits;
use skippr_io::aws::AwsSettings;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `skipprd run`'s command line: the flags that only a command line gives,
/// and every setting.
#[derive(Args, Debug, Default)]
#[command(group(clap::ArgGroup::new("skips").multiple(true)))]
pub struct RunArgs {
    /// A TOML file with any of the settings below (flags and environment win).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
    /// Exit 0 once every finite source is exhausted, committed and delivered.
    #[arg(long)]
    pub once: bool,
    /// Give up exactly the input a refusal (exit 10) names, as its message
    /// prints it: STREAM:PARTITION:AT..NEXT, positions as the source counts
    /// them. Recorded in the WAL before anything is read; once done, it is
    /// a no-op. Repeat for several.
    #[arg(long, value_name = "STREAM:PARTITION:AT..NEXT", group = "skips")]
    pub skip_input: Vec<String>,
    /// Give up batch SEQ of STREAM, one the sink refuses as fatal (exit 8),
    /// as that message prints it: its records go to neither the sink nor
    /// the dead letters. Recorded in the WAL at start, before the batch is
    /// sent again; once done, a no-op. Repeat for several.
    #[arg(long, value_name = "STREAM:SEQ", group = "skips")]
    pub skip_batch: Vec<String>,
    /// Why the input or batch is given up, kept in the WAL with each
    /// --skip-input and --skip-batch.
    #[arg(long, value_name = "TEXT", requires = "skips")]
    pub skip_reason: Option<String>,
}

/// Every setting of `skipprd run` that the file may hold too: the flag and
/// environment variable (clap) and the TOML key (serde, snake_case; sources
/// and sinks in their own tables). Defaults are applied in `resolve`, from
/// core's where core has one.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone)]
pub struct Settings {
    /// Where the WAL, the offsets store and the lock live [default: ./data].
    #[arg(long, env = "DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub wal: WalArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub offsets: OffsetsArgs,
    // Not inside `offsets`: serde does not mark the keys of a flattened
    // struct nested in another as taken, so they would count as unknown.
    #[command(flatten)]
    #[serde(flatten)]
    pub table: TableArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub aws: AwsArgs,
    /// S3 mode: another writer may take the lease over once its holder has
    /// not renewed it for this long, in seconds; at least 0.2. Every S3 and
    /// DynamoDB request under the lease, its retries included, ends within
    /// 45 % of it (at most 60 s) [default: 10].
    #[arg(long, env = "SKIPPR_LEASE_SECONDS", value_name = "SECONDS", allow_negative_numbers = true)]
    pub lease_seconds: Option<f64>,
    /// Size of a WAL segment file in bytes [default: 67108864].
    #[arg(long, env = "WAL_BYTES_PER_FILE", value_name = "BYTES")]
    pub wal_bytes_per_file: Option<u64>,
    /// Seal a WAL segment once it is this old, in seconds [default: 60].
    #[arg(long, env = "WAL_MAX_DELAY_SECONDS", value_name = "SECONDS")]
    pub wal_max_delay_seconds: Option<f64>,
    /// The WAL's size limit in bytes, counting each segment that holds data
    /// at its file size: sources pause while it is reached (a WARN line,
    /// `skippr_wal_full` 1) until sinks catch up and old segments are
    /// deleted; at least two segments [default: 1073741824].
    #[arg(long, env = "WAL_MAX_BYTES", value_name = "BYTES")]
    pub wal_max_bytes: Option<u64>,
    /// Committed record bytes kept in memory for the sinks; compactions read
    /// the rest back from the WAL [default: 8388608].
    #[arg(long, env = "SKIPPR_RECORD_CACHE_BYTES", value_name = "BYTES")]
    pub record_cache_bytes: Option<u64>,
    /// The largest record a source may send, in bytes: a larger one stops
    /// the daemon (exit 10) naming where it is; at most 33554432 and half of
    /// WAL_BYTES_PER_FILE, which also caps the default [default: 4194304].
    #[arg(long, env = "SKIPPR_RECORD_BYTES_MAX", value_name = "BYTES")]
    pub record_bytes_max: Option<u64>,
    /// How long a clean shutdown may drain, in seconds [default: 30].
    #[arg(long, value_name = "SECONDS")]
    #[serde(rename = "drain_timeout_seconds")]
    pub drain_timeout: Option<f64>,
    /// Log an ERROR (and set `skippr_wal_stalled`) once every WAL or lease
    /// request has failed for this long, in seconds [default: 60].
    #[arg(long, env = "SKIPPR_STALL_SECONDS", value_name = "SECONDS")]
    pub stall_seconds: Option<f64>,
    /// With --once: exit 15 once WAL or lease requests have failed for this
    /// long without one success, in seconds [default: 300].
    #[arg(long, env = "SKIPPR_STALL_EXIT_SECONDS", value_name = "SECONDS")]
    pub stall_exit_seconds: Option<f64>,
    /// `text` or `json` logs on stderr [default: text].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// The pipeline's name, part of every offsets key and of the keys its batches have in the sinks (the directory and S3 sinks' tag, PostgreSQL's progress rows) [default: main].
    #[arg(long, value_name = "NAME")]
    pub pipeline: Option<String>,
    #[command(flatten)]
    #[serde(default)]
    pub source: SourceArgs,
    #[command(flatten)]
    #[serde(default)]
    pub sink: SinkArgs,
    /// A schema plugin, asked to accept each new schema a source sends
    /// before records under it are committed (run by `sh -c`) [default:
    /// none: every schema is accepted].
    #[arg(long, value_name = "CMD")]
    pub schema_command: Option<String>,
    /// Where records a sink refuses go (a value the destination cannot
    /// store): `off`, and a refusal stops the daemon (exit 8); `dir`, a
    /// file per dead-letter batch under --dead-letter-dir; `postgres`, a
    /// table per stream in --dead-letter-schema of the --postgres-url
    /// database; or `s3`, an object per dead-letter batch under
    /// --dead-letter-s3-prefix. Each refused record with its reason, exactly
    /// once (the decision is kept in the WAL). A batch a version 1 sink
    /// answers `fatal` for is split, down to the record it cannot take.
    /// Records refused at intake (not one JSON value on one line; off, they
    /// stop the daemon, exit 10) go there too, as `record_text` or
    /// `record_base64`; a record past --record-bytes-max still stops it
    /// [default: off].
    #[arg(long = "dead-letter", env = "SKIPPR_DEAD_LETTER", value_name = "KIND")]
    pub dead_letter: Option<String>,
    /// The `dir` dead-letter destination's directory [default:
    /// DATA_DIR/dead-letters].
    #[arg(long, env = "SKIPPR_DEAD_LETTER_DIR", value_name = "DIR")]
    pub dead_letter_dir: Option<PathBuf>,
    /// The `postgres` dead-letter destination's schema, in the database of
    /// --postgres-url; not the sink's --postgres-schema [default:
    /// skippr_dead_letters].
    #[arg(long, env = "SKIPPR_DEAD_LETTER_SCHEMA", value_name = "NAME")]
    pub dead_letter_schema: Option<String>,
    /// The `s3` dead-letter destination's bucket [default: the S3 sink's,
    /// --sink-s3-bucket].
    #[arg(long, env = "SKIPPR_DEAD_LETTER_S3_BUCKET", value_name = "BUCKET")]
    pub dead_letter_s3_bucket: Option<String>,
    /// The `s3` dead-letter destination's key prefix,
    /// `<prefix><stream>/<tag>.<seq>.jsonl`; not the S3 sink's prefix in the
    /// same bucket [default: dead-letters/].
    #[arg(long, env = "SKIPPR_DEAD_LETTER_S3_PREFIX", value_name = "PREFIX")]
    pub dead_letter_s3_prefix: Option<String>,
    /// The breaker: the daemon stops (exit 8) rather than let more than
    /// this many records be refused among the last --dead-letter-window
    /// decided, counted from the WAL (a restart does not reset it), so a
    /// destination that refuses everything cannot drain the input into the
    /// dead letters [default: 100].
    #[arg(long, env = "SKIPPR_DEAD_LETTER_MAX", value_name = "N")]
    pub dead_letter_max: Option<u64>,
    /// The breaker's window, in records decided (held by the sink or
    /// refused); at most 100000000 [default: 10000].
    #[arg(long, env = "SKIPPR_DEAD_LETTER_WINDOW", value_name = "N")]
    pub dead_letter_window: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics; a bare port binds
    /// 127.0.0.1 [default: off].
    #[arg(long, env = "SKIPPR_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// How long an external plugin may take to answer, in seconds, before it
    /// is killed and restarted [default: 30].
    #[arg(long, value_name = "SECONDS")]
    #[serde(rename = "plugin_timeout_seconds")]
    pub plugin_timeout: Option<f64>,
    /// Keys of the file that name no setting (an error).
    #[arg(skip)]
    #[serde(flatten, skip_serializing)]
    unknown: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    pub data_dir: PathBuf,
    pub wal: WalConfig,
    pub offsets: OffsetsConfig,
    /// The lease's table (S3 mode).
    pub lease_table: Option<String>,
    pub lease_seconds: f64,
    pub aws: AwsSettings,
    pub wal_bytes_per_file: u64,
    pub wal_max_delay_seconds: f64,
    pub wal_max_bytes: u64,
    pub record_cache_bytes: u64,
    pub record_bytes_max: u64,
    /// `--skip-input`, parsed, and the reason given with it.
    pub skips: Vec<InputSkip>,
    pub batch_skips: Vec<BatchSkip>,
    /// `None`: each skip's default reason.
    pub skip_reason: Option<String>,
    pub drain_timeout_seconds: f64,
    pub stall_seconds: f64,
    /// Only under `--once`.
    pub stall_exit_seconds: Option<f64>,
    pub once: bool,
    pub json_logs: bool,
    pub pipeline: String,
    pub plugin_timeout_seconds: f64,
    pub metrics_addr: Option<std::net::SocketAddr>,
    pub schema_command: Option<String>,
    pub source: SourceConfig,
    pub sink: SinkConfig,
    /// Where refused records go; `None`: nowhere, a refusal stops the run.
    pub dead_letter: Option<DeadLetterConfig>,
}

/// The dead-letter destination, and the breaker's bound.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterConfig {
    pub to: DeadLetterTo,
    pub limits: skippr_core::DeadLetters,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DeadLetterTo {
    /// A directory, written as the directory sink writes.
    Dir(PathBuf),
    /// A schema of a PostgreSQL database, written as the postgres sink
    /// writes (no columns, no keys): one table per stream, the letter in
    /// `data`.
    Postgres(skippr_io::plugin::postgres_sink::settings::PostgresConfig),
    /// A bucket and prefix, written as the S3 sink writes (not gzipped).
    S3(skippr_io::plugin::s3_sink::settings::S3SinkConfig),
}

fn dead_letter(s: &Settings, data_dir: &std::path::Path) -> Result<Option<DeadLetterConfig>, String> {
    let dir = || s.dead_letter_dir.clone().unwrap_or_else(|| data_dir.join("dead-letters"));
    let to = match s.dead_letter.as_deref().unwrap_or("off") {
        "off" => return Ok(None),
        "dir" => DeadLetterTo::Dir(dir()),
        "postgres" => DeadLetterTo::Postgres(postgres_letters(s)?),
        "s3" => DeadLetterTo::S3(s3_letters(s)?),
        other => return Err(format!("unknown dead-letter destination '{other}': use off, dir, postgres or s3")),
    };
    let defaults = skippr_core::DeadLetters::default();
    let limits = skippr_core::DeadLetters {
        max: s.dead_letter_max.unwrap_or(defaults.max),
        window: s.dead_letter_window.unwrap_or(defaults.window),
    };
    if limits.window == 0 || limits.window > skippr_core::format::BREAKER_WINDOW_MAX {
        return Err(format!(
            "{} is {}: it must be between 1 and {} records",
            named("--dead-letter-window", "SKIPPR_DEAD_LETTER_WINDOW", "dead_letter_window"),
            limits.window,
            skippr_core::format::BREAKER_WINDOW_MAX
        ));
    }
    Ok(Some(DeadLetterConfig { to, limits }))
}

/// The `postgres` dead-letter destination: the sink's database settings
/// (URL, password, TLS) with a schema of its own and plain tables.
fn postgres_letters(s: &Settings) -> Result<skippr_io::plugin::postgres_sink::settings::PostgresConfig, String> {
    let sink = &s.sink.postgres;
    if sink.postgres_url.is_none() {
        return Err("--dead-letter postgres writes into the database of --postgres-url (SKIPPR_POSTGRES_URL, or \
                    `postgres_url` in [sink]): give it, even when the sink is not postgres"
            .into());
    }
    let schema = s.dead_letter_schema.clone().unwrap_or_else(|| "skippr_dead_letters".into());
    let letters = skippr_io::plugin::postgres_sink::settings::PostgresArgs {
        postgres_schema: Some(schema.clone()),
        postgres_columns: None,
        postgres_upsert: None,
        ..sink.clone()
    };
    let mut config = letters.resolve().map_err(|e| format!("--dead-letter postgres: {e}"))?;
    config.verbatim = true;
    let sink_schema = sink.postgres_schema.as_deref().unwrap_or("public");
    if s.sink.kind.as_deref() == Some("postgres") && schema == sink_schema {
        return Err(format!(
            "--dead-letter-schema '{schema}' is the postgres sink's schema too: the dead letters of a stream and \
             its records would share a table and a progress row per batch number; name another schema"
        ));
    }
    Ok(config)
}

/// The `s3` dead-letter destination: its own bucket, or the S3 sink's under
/// another prefix.
fn s3_letters(s: &Settings) -> Result<skippr_io::plugin::s3_sink::settings::S3SinkConfig, String> {
    let sink = &s.sink.s3;
    let bucket = s.dead_letter_s3_bucket.clone().or_else(|| sink.s3_bucket.clone()).ok_or(
        "--dead-letter s3 needs a bucket: --dead-letter-s3-bucket BUCKET (SKIPPR_DEAD_LETTER_S3_BUCKET), or the S3 \
         sink's --sink-s3-bucket",
    )?;
    let prefix = s.dead_letter_s3_prefix.clone().unwrap_or_else(|| "dead-letters/".into());
    // Compared as the S3 sink writes them: `/out`, `out` and `out/` are one.
    let normal = skippr_io::s3_wal::normalize_prefix;
    let shared = s.sink.kind.as_deref() == Some("s3")
        && sink.s3_bucket.as_deref() == Some(bucket.as_str())
        && normal(sink.s3_prefix.as_deref().unwrap_or("")) == normal(&prefix);
    if shared {
        return Err(format!(
            "--dead-letter-s3-prefix '{prefix}' in bucket {bucket} is the S3 sink's too: the dead letters of a stream \
             and its batches would share keys by number; name another prefix"
        ));
    }
    Ok(skippr_io::plugin::s3_sink::settings::S3SinkConfig { bucket, prefix, gzip: false })
}

/// Under `--once`, how long WAL or lease requests may fail before exit 15.
const STALL_EXIT_SECONDS: f64 = 300.0;

/// How long an external plugin may take to answer.
const PLUGIN_TIMEOUT_SECONDS: f64 = 30.0;

/// The largest WAL segment: 16 GiB (each is created at its full size).
const WAL_BYTES_PER_FILE_MAX: u64 = 16 << 30;

/// The smallest `--record-bytes-max`.
const RECORD_BYTES_MIN: u64 = 1024;

/// The longest duration any setting takes: a year, in seconds.
use skippr_io::plugin::SECONDS_MAX;

/// A core duration as the seconds a setting is given in.
fn secs(d: skippr_core::Duration) -> f64 {
    d.as_micros() as f64 / 1e6
}

/// Resolves flags, environment, file and defaults into one configuration,
/// or says which value is wrong and what would be right.
pub fn resolve(args: &RunArgs) -> Result<RunConfig, String> {
    let s = match &args.config {
        Some(path) => layers::over_file(&args.settings, path)?,
        None => args.settings.clone(),
    };
    let stores = stores::stores(&s)?;
    let data_dir = s.data_dir.clone().unwrap_or_else(|| PathBuf::from("./data"));
    let wal = wal_sizes(&s)?;
    let drain_timeout_seconds = s.drain_timeout.unwrap_or(secs(Limits::default().drain_timeout));
    positive("--drain-timeout", drain_timeout_seconds)?;
    let stall_default = Limits::default().stall_report_after.map(secs).expect("core reports stalls by default");
    let stall_seconds = s.stall_seconds.unwrap_or(stall_default);
    positive(&named("--stall-seconds", "SKIPPR_STALL_SECONDS", "stall_seconds"), stall_seconds)?;
    let stall_exit_seconds = s.stall_exit_seconds.unwrap_or(STALL_EXIT_SECONDS);
    positive(&named("--stall-exit-seconds", "SKIPPR_STALL_EXIT_SECONDS", "stall_exit_seconds"), stall_exit_seconds)?;
    let json_logs = match s.log_format.as_deref().unwrap_or("text") {
        "text" => false,
        "json" => true,
        other => return Err(format!("unknown log format '{other}': use text or json")),
    };
    let metrics_addr = s.metrics_addr.as_deref().map(metrics_addr).transpose()?;
    let plugin_timeout_seconds = s.plugin_timeout.unwrap_or(PLUGIN_TIMEOUT_SECONDS);
    positive("--plugin-timeout", plugin_timeout_seconds)?;
    let sink = s.sink.resolve(&data_dir)?;
    let dead_letter = dead_letter(&s, &data_dir)?;
    if matches!(stores.wal, WalConfig::Clustered(_)) && sink == SinkConfig::Stdout {
        return Err("the stdout sink cannot be used in clustered mode: whichever host leads applies the batches, so \
                    the sink must be one every host reaches (a shared directory with --sink dir, or a command)"
            .into());
    }
    let source = s.source.resolve()?;
    if matches!(source, SourceConfig::Singer(_)) && !args.skip_input.is_empty() {
        return Err("--skip-input does not apply to a Singer tap: its positions are the daemon's count of what the \
                    tap sent, and what it sends again is counted anew, so a position names no record for good. Keep \
                    the record out of the tap's output (or, for one that is only too large, raise \
                    --record-bytes-max)"
            .into());
    }
    Ok(RunConfig {
        sink,
        source,
        data_dir,
        wal: stores.wal,
        offsets: stores.offsets,
        lease_table: stores.lease_table,
        lease_seconds: stores.lease_seconds,
        aws: stores.aws,
        wal_bytes_per_file: wal.bytes_per_file,
        wal_max_delay_seconds: wal.max_delay_seconds,
        wal_max_bytes: wal.max_bytes,
        record_cache_bytes: wal.record_cache_bytes,
        record_bytes_max: wal.record_bytes_max,
        skips: skips::input_skips(&args.skip_input)?,
        batch_skips: skips::batch_skips(&args.skip_batch)?,
        skip_reason: skips::skip_reason(args.skip_reason.as_deref())?,
        drain_timeout_seconds,
        stall_seconds,
        stall_exit_seconds: args.once.then_some(stall_exit_seconds),
        once: args.once,
        json_logs,
        pipeline: s.pipeline.clone().unwrap_or_else(|| "main".into()),
        plugin_timeout_seconds,
        metrics_addr,
        schema_command: s.schema_command.clone(),
        dead_letter,
    })
}

/// The WAL's sizes and the record limits that follow from them.
struct WalSizes {
    bytes_per_file: u64,
    max_delay_seconds: f64,
    max_bytes: u64,
    record_cache_bytes: u64,
    record_bytes_max: u64,
}

fn wal_sizes(s: &Settings) -> Result<WalSizes, String> {
    let limits = Limits::default();
    let bytes_per_file = s.wal_bytes_per_file.unwrap_or(limits.segment_bytes);
    let segment_name = || named("--wal-bytes-per-file", "WAL_BYTES_PER_FILE", "wal_bytes_per_file");
    if bytes_per_file > WAL_BYTES_PER_FILE_MAX {
        return Err(format!(
            "{} is {bytes_per_file}; a segment may be at most {WAL_BYTES_PER_FILE_MAX} bytes (16 GiB)",
            segment_name()
        ));
    }
    let max_delay_seconds = s.wal_max_delay_seconds.unwrap_or(secs(limits.segment_age_max));
    positive(&named("--wal-max-delay-seconds", "WAL_MAX_DELAY_SECONDS", "wal_max_delay_seconds"), max_delay_seconds)?;
    let max_bytes = s.wal_max_bytes.unwrap_or(limits.wal_bytes_max);
    if max_bytes < bytes_per_file.saturating_mul(2) {
        return Err(format!(
            "{} ({max_bytes}) must be at least two WAL segments (2 x {} = {}): raise it, or lower the segment size",
            named("--wal-max-bytes", "WAL_MAX_BYTES", "wal_max_bytes"),
            segment_name(),
            bytes_per_file.saturating_mul(2)
        ));
    }
    let record_bytes_max = s.record_bytes_max.unwrap_or(record_bytes_max_for(bytes_per_file));
    let record_name = || named("--record-bytes-max", "SKIPPR_RECORD_BYTES_MAX", "record_bytes_max");
    if !(RECORD_BYTES_MIN..=RECORD_BYTES_MAX_LIMIT).contains(&record_bytes_max) {
        return Err(format!(
            "{} is {record_bytes_max}; give a size between {RECORD_BYTES_MIN} and {RECORD_BYTES_MAX_LIMIT} bytes",
            record_name()
        ));
    }
    if record_bytes_max > segment_record_bytes_max(bytes_per_file) {
        return Err(format!(
            "{} is {record_bytes_max}, more than half a WAL segment ({} is {bytes_per_file}): a record must fit \
             a segment beside its snapshot; raise the segment size to at least {} or lower {}",
            record_name(),
            segment_name(),
            record_bytes_max * 2,
            record_name()
        ));
    }
    Ok(WalSizes {
        bytes_per_file,
        max_delay_seconds,
        max_bytes,
        record_cache_bytes: s.record_cache_bytes.unwrap_or(limits.record_cache_bytes),
        record_bytes_max,
    })
}

/// `PORT` (on 127.0.0.1) or `HOST:PORT`.
pub(crate) fn metrics_addr(a: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = a.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    a.parse().map_err(|_| format!("the metrics address '{a}' is neither a port nor HOST:PORT"))
}

/// A setting named the way the operator set it: the flag when the command
/// line has it, else the environment variable when that is set, else the
/// configuration file's key.
fn named(flag: &str, env: &str, key: &str) -> String {
    let on_line = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    if on_line {
        flag.to_string()
    } else if std::env::var_os(env).is_some() {
        env.to_string()
    } else {
        format!("{key} (the configuration file)")
    }
}

fn positive(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 && v <= SECONDS_MAX {
        Ok(())
    } else {
        Err(format!("{name} must be a positive number of seconds, at most {SECONDS_MAX} (a year), not {v}"))
    }
}
