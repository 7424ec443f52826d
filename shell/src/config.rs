//! `skipprd run`'s configuration: command-line flags, then environment
//! variables, then the TOML file given with `--config`, then defaults. The
//! first that sets a value wins.

use clap::Args;
use serde::Deserialize;
use skippr_core::admit::{check_stream_name, record_bytes_max_for, segment_record_bytes_max, RECORD_BYTES_MAX_LIMIT};
use skippr_core::{LeaseConfig, Limits};
use skippr_io::aws::AwsSettings;
use skippr_io::plugin::postgres_sink::{
    asks_for_tls, connection_config, describe, tls_config, Column, ColumnType, PostgresSettings,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the WAL lives. `run`, `wal verify` and `offsets` share these.
#[derive(Args, Deserialize, Debug, Default, Clone)]
pub struct WalArgs {
    /// Where the WAL lives: `disk` (segment files under DATA_DIR/wal), `s3`
    /// (objects in a bucket, with a writer lease in DynamoDB) or
    /// `clustered` (DATA_DIR/wal on 3 or 5 hosts, replicated by raft; see
    /// the --cluster-* settings) [default: disk].
    #[arg(long, env = "WAL_STORAGE", value_name = "KIND")]
    pub wal_storage: Option<String>,
    /// S3 mode: the bucket that holds the WAL.
    #[arg(long, env = "SKIPPR_WAL_S3_BUCKET", value_name = "BUCKET")]
    pub s3_bucket: Option<String>,
    /// S3 mode: the key prefix of the WAL's objects [default: skipprd/wal/].
    #[arg(long, env = "SKIPPR_WAL_S3_PREFIX", value_name = "PREFIX")]
    pub s3_prefix: Option<String>,
}

impl WalArgs {
    pub fn storage(&self) -> &str {
        self.wal_storage.as_deref().unwrap_or("disk")
    }

    pub fn prefix(&self) -> String {
        self.s3_prefix.clone().unwrap_or_else(|| "skipprd/wal/".into())
    }

    /// Each value set here, else the one in `file`.
    fn or(&self, file: WalArgs) -> WalArgs {
        WalArgs {
            wal_storage: self.wal_storage.clone().or(file.wal_storage),
            s3_bucket: self.s3_bucket.clone().or(file.s3_bucket),
            s3_prefix: self.s3_prefix.clone().or(file.s3_prefix),
        }
    }
}

/// Clustered mode: who this host is, where its peers are, and the TLS
/// files that prove it.
#[derive(Args, Deserialize, Debug, Default, Clone)]
pub struct ClusterArgs {
    /// Clustered mode: this host's raft node id, as `skipprd cluster init`
    /// or `cluster join` gave it to its DATA_DIR.
    #[arg(long, env = "SKIPPR_CLUSTER_NODE_ID", value_name = "ID")]
    pub cluster_node_id: Option<u64>,
    /// Clustered mode: every host's peer address, `ID=HOST:PORT` separated
    /// by commas (such as `1=10.0.0.1:7001,2=10.0.0.2:7001,3=10.0.0.3:7001`);
    /// this host listens on its own entry's address only.
    #[arg(long, env = "SKIPPR_CLUSTER_PEERS", value_name = "LIST")]
    pub cluster_peers: Option<String>,
    /// Clustered mode: the cluster CA's certificate (PEM), which every
    /// peer's certificate must be issued by (`skipprd cluster certs` makes one).
    #[arg(long, env = "SKIPPR_CLUSTER_CA", value_name = "FILE")]
    pub cluster_ca: Option<PathBuf>,
    /// Clustered mode: this host's certificate (PEM), issued by the CA for
    /// the name `skippr-node-<ID>`.
    #[arg(long, env = "SKIPPR_CLUSTER_CERT", value_name = "FILE")]
    pub cluster_cert: Option<PathBuf>,
    /// Clustered mode: this host's private key (PEM), mode 0600.
    #[arg(long, env = "SKIPPR_CLUSTER_KEY", value_name = "FILE")]
    pub cluster_key: Option<PathBuf>,
}

impl ClusterArgs {
    fn or(&self, file: ClusterArgs) -> ClusterArgs {
        ClusterArgs {
            cluster_node_id: self.cluster_node_id.or(file.cluster_node_id),
            cluster_peers: self.cluster_peers.clone().or(file.cluster_peers),
            cluster_ca: self.cluster_ca.clone().or(file.cluster_ca),
            cluster_cert: self.cluster_cert.clone().or(file.cluster_cert),
            cluster_key: self.cluster_key.clone().or(file.cluster_key),
        }
    }
}

/// The DynamoDB table of offsets and the writer lease.
#[derive(Args, Deserialize, Debug, Default, Clone)]
pub struct TableArgs {
    /// The DynamoDB table for offsets and the writer lease (required in S3
    /// mode); create it with `skipprd offsets init-table`.
    #[arg(long, env = "SKIPPR_OFFSET_DYNAMODB_TABLE", value_name = "TABLE")]
    pub dynamodb_table: Option<String>,
}

/// Where offsets are materialized.
#[derive(Args, Deserialize, Debug, Default, Clone)]
pub struct OffsetsArgs {
    /// Where offsets are materialized: `disk` (DATA_DIR/offsets.redb) or
    /// `dynamodb` [default: dynamodb in S3 mode, disk otherwise].
    #[arg(long, env = "SKIPPR_OFFSET_STORE", value_name = "KIND")]
    pub offset_store: Option<String>,
}

/// How the AWS services are reached.
#[derive(Args, Deserialize, Debug, Default, Clone)]
pub struct AwsArgs {
    /// The AWS region [default: the SDK's chain, such as AWS_REGION].
    #[arg(long, env = "SKIPPR_AWS_REGION", value_name = "REGION")]
    pub aws_region: Option<String>,
    /// An endpoint for S3 and DynamoDB, such as a local server
    /// (`http://127.0.0.1:5000`) [default: AWS's own].
    #[arg(long, env = "SKIPPR_AWS_ENDPOINT", value_name = "URL")]
    pub aws_endpoint: Option<String>,
}

impl AwsArgs {
    /// SDK settings for a tool: no lease, so the SDK's own timeouts.
    pub fn settings(&self) -> AwsSettings {
        AwsSettings { region: self.aws_region.clone(), endpoint: self.aws_endpoint.clone(), operation_timeout: None }
    }
}

/// Every setting of `skipprd run`, declared once: the flag and environment
/// variable (clap) and the TOML key (serde, snake_case; sources and sinks in
/// their own tables). Defaults are applied in `resolve`, from core's where
/// core has one. Precedence: flag, then environment, then the file, then
/// the default.
#[derive(Args, Deserialize, Debug, Default)]
pub struct RunArgs {
    /// A TOML file with any of the settings below (flags and environment win).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
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
    /// Exit 0 once every finite source is exhausted, committed and delivered.
    #[arg(long)]
    #[serde(skip)]
    pub once: bool,
    /// Give up exactly the input a refusal (exit 10) names, as its message
    /// prints it: STREAM:PARTITION:AT..NEXT, positions as the source counts
    /// them. Recorded in the WAL before anything is read; once done, it is
    /// a no-op. Repeat for several.
    #[arg(long, value_name = "STREAM:PARTITION:AT..NEXT")]
    #[serde(skip)]
    pub skip_input: Vec<String>,
    /// Why the input is given up, kept in the WAL with each --skip-input.
    #[arg(long, value_name = "TEXT", requires = "skip_input")]
    #[serde(skip)]
    pub skip_reason: Option<String>,
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
    #[serde(flatten)]
    unknown: BTreeMap<String, toml::Value>,
}

/// The source, in the file's `[source]` table.
#[derive(Args, Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct SourceArgs {
    /// The source: `generator`, `file`, `singer` for a Singer tap, or
    /// `command` for an external plugin [default: generator].
    #[arg(long = "source", id = "source", value_name = "KIND")]
    pub kind: Option<String>,
    /// Generator: stream names, comma-separated [default: events].
    #[arg(long = "generator-streams", value_name = "LIST", value_delimiter = ',')]
    pub streams: Option<Vec<String>>,
    /// Generator: partitions per stream [default: 2].
    #[arg(long = "generator-partitions", value_name = "N")]
    pub partitions: Option<u32>,
    /// Generator: records per partition, 0 for endless [default: 10000].
    #[arg(long = "generator-records", value_name = "N")]
    pub records: Option<u64>,
    /// Generator: seed of the record contents [default: 1].
    #[arg(long = "generator-seed", value_name = "N")]
    pub seed: Option<u64>,
    /// Generator: records per second over all partitions, 0 for no limit
    /// [default: 0].
    #[arg(long = "generator-rate", value_name = "N")]
    pub rate: Option<u64>,
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
    /// External source: the command that starts the plugin (run by `sh -c`).
    #[arg(long = "source-command", id = "source_command", value_name = "CMD")]
    pub command: Option<String>,
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
    /// Singer source: bytes of records held in memory between two STATE
    /// messages; a tap that sends more stops the daemon (exit 10) with a
    /// message naming this setting [default: 67108864].
    #[arg(long = "singer-buffer-bytes", value_name = "N")]
    pub singer_buffer_bytes: Option<u64>,
}

/// The sink, in the file's `[sink]` table.
#[derive(Args, Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct SinkArgs {
    /// The sink: `dir`, `stdout`, `postgres` (a table per stream, one
    /// transaction per batch with its progress row), `s3` (an object per
    /// batch, created only if absent), or `command` for an external plugin
    /// [default: dir].
    #[arg(long = "sink", id = "sink", value_name = "KIND")]
    pub kind: Option<String>,
    /// Directory sink: where batches are written [default: DATA_DIR/sink].
    #[arg(long = "sink-dir", id = "sink_dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Directory sink: the mode of each batch file, in octal (directories
    /// get `x` wherever it has `r`), less the process's umask; it must let
    /// the owner read and write [default: 0640].
    #[arg(long = "sink-dir-mode", id = "sink_dir_mode", value_name = "MODE")]
    pub dir_mode: Option<String>,
    /// External sink: the command that starts the plugin (run by `sh -c`).
    #[arg(long = "sink-command", id = "sink_command", value_name = "CMD")]
    pub command: Option<String>,
    /// S3 sink: the bucket batches go to (one object per batch).
    #[arg(long = "sink-s3-bucket", id = "sink_s3_bucket", env = "SKIPPR_SINK_S3_BUCKET", value_name = "BUCKET")]
    pub s3_bucket: Option<String>,
    /// S3 sink: the key prefix, `<prefix><stream>/<seq>.jsonl` [default: none].
    #[arg(long = "sink-s3-prefix", id = "sink_s3_prefix", env = "SKIPPR_SINK_S3_PREFIX", value_name = "PREFIX")]
    pub s3_prefix: Option<String>,
    /// S3 sink: gzip each object (`.jsonl.gz`) [default: false].
    #[arg(long = "sink-s3-gzip", id = "sink_s3_gzip", value_name = "BOOL")]
    pub s3_gzip: Option<bool>,
    /// PostgreSQL sink: the database, `postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require]`
    /// (the password may come from --postgres-password-file or PGPASSWORD
    /// instead; it is never logged).
    #[arg(long = "postgres-url", env = "SKIPPR_POSTGRES_URL", hide_env_values = true, value_name = "URL")]
    pub postgres_url: Option<String>,
    /// PostgreSQL sink: a file holding the password (mode 0600 or stricter).
    #[arg(long = "postgres-password-file", env = "SKIPPR_POSTGRES_PASSWORD_FILE", value_name = "FILE")]
    pub postgres_password_file: Option<PathBuf>,
    /// PostgreSQL sink: the CA certificate(s), PEM, that the server's
    /// certificate must chain to when the URL asks for TLS
    /// (`sslmode=require`, `verify-ca` or `verify-full`: the chain and the
    /// host name are always verified) [default: the system's roots].
    #[arg(long = "postgres-ca-file", env = "SKIPPR_POSTGRES_CA_FILE", value_name = "FILE")]
    pub postgres_ca_file: Option<PathBuf>,
    /// PostgreSQL sink: the schema of its tables [default: public].
    #[arg(long = "postgres-schema", value_name = "NAME")]
    pub postgres_schema: Option<String>,
    /// PostgreSQL sink: top-level fields of each record kept in columns of
    /// their own beside `data`, as `FIELD:TYPE,...` (types text, bigint,
    /// integer, numeric, double, boolean, jsonb), for tables it creates.
    #[arg(long = "postgres-columns", value_name = "LIST")]
    pub postgres_columns: Option<String>,
    /// PostgreSQL sink: keep one row per key, the latest, in tables it
    /// creates: each stream's key is the one its source declares (a Singer
    /// catalog's `key_properties`); for taps that send records again
    /// [default: false].
    #[arg(long = "postgres-upsert", value_name = "BOOL")]
    pub postgres_upsert: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    Generator {
        streams: Vec<String>,
        partitions: u32,
        records: u64,
        seed: u64,
        rate: u64,
    },
    File {
        dir: PathBuf,
        stream: String,
        follow: bool,
    },
    Command {
        command: String,
    },
    Singer {
        command: String,
        catalog: Option<PathBuf>,
        properties: Option<PathBuf>,
        /// `None`: run once.
        interval: Option<f64>,
        buffer_bytes: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum SinkConfig {
    Dir { dir: PathBuf, mode: u32 },
    Stdout,
    Command { command: String },
    Postgres(PostgresConfig),
    S3 { bucket: String, prefix: String, gzip: bool },
}

/// The PostgreSQL sink's settings. Its `Debug` leaves the password out.
#[derive(Clone, PartialEq)]
pub struct PostgresConfig {
    pub url: String,
    /// From the password file or PGPASSWORD, when the URL has none.
    pub password: Option<String>,
    pub schema: String,
    pub columns: Vec<Column>,
    pub upsert: bool,
    /// The URL asks for TLS.
    pub tls: bool,
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let database = connection_config(&self.url, None).map(|c| describe(&c)).unwrap_or_default();
        f.debug_struct("PostgresConfig")
            .field("database", &database)
            .field("schema", &self.schema)
            .field("columns", &self.columns)
            .field("upsert", &self.upsert)
            .finish_non_exhaustive()
    }
}

impl PostgresConfig {
    /// The sink's settings, given each stream's key as its source declares
    /// it (empty for sources that declare none).
    pub fn settings(&self, keys: &[(String, Vec<String>)]) -> Result<PostgresSettings, String> {
        let mut upsert = std::collections::BTreeMap::new();
        if self.upsert {
            if keys.is_empty() {
                return Err("--postgres-upsert needs a source that declares its streams' keys: the singer source \
                            (key_properties in the tap's catalog)"
                    .into());
            }
            for (stream, key) in keys {
                if key.is_empty() {
                    return Err(format!(
                        "--postgres-upsert: the tap's catalog gives the stream '{stream}' no key_properties; \
                         declare them in the tap's settings or catalog (tap-jsonl: primary_keys), \
                         or leave --postgres-upsert off"
                    ));
                }
                upsert.insert(stream.clone(), key.clone());
            }
        }
        let tls = match (self.tls, &self.ca_file) {
            (false, _) => None,
            (true, ca) => {
                let pem = match ca {
                    Some(path) => Some(std::fs::read(path).map_err(|e| format!("--postgres-ca-file: {e}"))?),
                    None => None,
                };
                Some(tls_config(pem.as_deref()).map_err(|e| format!("the postgres sink's TLS: {e}"))?)
            }
        };
        Ok(PostgresSettings {
            config: connection_config(&self.url, self.password.as_deref()).expect("checked at resolve"),
            schema: self.schema.clone(),
            columns: self.columns.clone(),
            keys: upsert,
            tls,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum WalConfig {
    Disk,
    S3 { bucket: String, prefix: String },
    Clustered(ClusterSettings),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    pub node: u64,
    /// Every host's address by node id, this one's included.
    pub peers: BTreeMap<u64, String>,
    pub tls: skippr_io::peer::tls::TlsFiles,
}

#[derive(Debug, Clone, PartialEq)]
pub enum OffsetsConfig {
    Disk,
    Dynamodb { table: String },
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
    pub skip_reason: String,
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
}

/// A core duration as the seconds a setting is given in.
fn secs(d: skippr_core::Duration) -> f64 {
    d.as_micros() as f64 / 1e6
}

/// Resolves flags, environment, file and defaults into one configuration,
/// or says which value is wrong and what would be right.
/// Input an operator gives up (`--skip-input`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSkip {
    pub stream: String,
    pub partition: u32,
    pub at: u64,
    pub next: u64,
}

fn input_skip(text: &str) -> Result<InputSkip, String> {
    let bad = |why: &str| {
        format!(
            "--skip-input {text:?}: {why}; give STREAM:PARTITION:AT..NEXT exactly as the refusal message prints it \
             (for example events:3:1024..5120)"
        )
    };
    let mut parts = text.splitn(3, ':');
    let (Some(stream), Some(partition), Some(range)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("it has fewer than three parts"));
    };
    check_stream_name(stream).map_err(|e| bad(&format!("the stream name is not one a source may use ({e})")))?;
    let partition = partition.parse().map_err(|_| bad("the partition is not a number"))?;
    let (at, next) = range.split_once("..").ok_or_else(|| bad("the positions are not AT..NEXT"))?;
    let (Ok(at), Ok(next)) = (at.parse::<u64>(), next.parse::<u64>()) else {
        return Err(bad("the positions are not numbers"));
    };
    if at >= next {
        return Err(bad("NEXT must be past AT"));
    }
    Ok(InputSkip { stream: stream.into(), partition, at, next })
}

/// Every `--skip-input`, each once, none overlapping another.
fn input_skips(texts: &[String]) -> Result<Vec<InputSkip>, String> {
    let mut skips = texts.iter().map(|s| input_skip(s)).collect::<Result<Vec<_>, _>>()?;
    skips.sort_by_key(|k| (k.stream.clone(), k.partition, k.at, k.next));
    skips.dedup();
    for pair in skips.windows(2) {
        if (&pair[0].stream, pair[0].partition) == (&pair[1].stream, pair[1].partition) && pair[1].at < pair[0].next {
            return Err(format!(
                "--skip-input gives {}:{}:{}..{} and {}..{}, which overlap; give each refused input once",
                pair[0].stream, pair[0].partition, pair[0].at, pair[0].next, pair[1].at, pair[1].next
            ));
        }
    }
    Ok(skips)
}

fn skip_reason(reason: Option<&str>) -> Result<String, String> {
    let reason = reason.unwrap_or("given up by the operator (run --skip-input)");
    if reason.len() > skippr_core::config::SKIP_REASON_BYTES_MAX {
        return Err(format!(
            "--skip-reason is {} bytes; keep it under {}",
            reason.len(),
            skippr_core::config::SKIP_REASON_BYTES_MAX
        ));
    }
    Ok(reason.into())
}

pub fn resolve(args: &RunArgs) -> Result<RunConfig, String> {
    let file = match &args.config {
        Some(path) => load(path)?,
        None => RunArgs::default(),
    };
    let limits = Limits::default();
    let table = args.table.dynamodb_table.clone().or(file.table.dynamodb_table);
    if let Some(t) = &table {
        skippr_io::dynamo::check_table_name(t).map_err(|e| {
            format!("{e} ({})", named("--dynamodb-table", "SKIPPR_OFFSET_DYNAMODB_TABLE", "dynamodb_table"))
        })?;
    }
    let wal = wal_config(&args.wal.or(file.wal), &args.cluster.or(file.cluster))?;
    let lease_table = match (&wal, &table) {
        (WalConfig::Disk | WalConfig::Clustered(_), _) => None,
        (WalConfig::S3 { .. }, Some(t)) => Some(t.clone()),
        (WalConfig::S3 { .. }, None) => {
            return Err("WAL_STORAGE=s3 needs a DynamoDB table for the writer lease and offsets: set \
                        SKIPPR_OFFSET_DYNAMODB_TABLE and create the table with `skipprd offsets init-table`"
                .into())
        }
    };
    let default_store = if matches!(wal, WalConfig::S3 { .. }) { "dynamodb" } else { "disk" };
    let store = args.offsets.offset_store.clone().or(file.offsets.offset_store);
    let offsets = match store.as_deref().unwrap_or(default_store) {
        "disk" => OffsetsConfig::Disk,
        "dynamodb" => OffsetsConfig::Dynamodb {
            table: table.clone().ok_or(
                "SKIPPR_OFFSET_STORE=dynamodb needs a table: set SKIPPR_OFFSET_DYNAMODB_TABLE and create it with \
                 `skipprd offsets init-table`",
            )?,
        },
        other => return Err(format!("unknown SKIPPR_OFFSET_STORE '{other}': use disk or dynamodb")),
    };
    let lease_seconds = args.lease_seconds.or(file.lease_seconds).unwrap_or(secs(LeaseConfig::default().steal_after));
    let lease_name = || named("--lease-seconds", "SKIPPR_LEASE_SECONDS", "lease_seconds");
    positive(&lease_name(), lease_seconds)?;
    if lease_seconds < LEASE_SECONDS_MIN {
        return Err(format!(
            "{} must be at least {LEASE_SECONDS_MIN} (not {lease_seconds}): {LEASE_RULE}",
            lease_name()
        ));
    }
    let aws = AwsSettings {
        region: args.aws.aws_region.clone().or(file.aws.aws_region),
        endpoint: args.aws.aws_endpoint.clone().or(file.aws.aws_endpoint),
        operation_timeout: lease_table.as_ref().map(|_| operation_timeout(lease_seconds)),
    };
    let data_dir = args.data_dir.clone().or(file.data_dir).unwrap_or_else(|| PathBuf::from("./data"));
    let wal_bytes_per_file = args.wal_bytes_per_file.or(file.wal_bytes_per_file).unwrap_or(limits.segment_bytes);
    let segment_name = || named("--wal-bytes-per-file", "WAL_BYTES_PER_FILE", "wal_bytes_per_file");
    if wal_bytes_per_file > WAL_BYTES_PER_FILE_MAX {
        return Err(format!(
            "{} is {wal_bytes_per_file}; a segment may be at most {WAL_BYTES_PER_FILE_MAX} bytes (16 GiB)",
            segment_name()
        ));
    }
    let wal_max_delay_seconds =
        args.wal_max_delay_seconds.or(file.wal_max_delay_seconds).unwrap_or(secs(limits.segment_age_max));
    positive(
        &named("--wal-max-delay-seconds", "WAL_MAX_DELAY_SECONDS", "wal_max_delay_seconds"),
        wal_max_delay_seconds,
    )?;
    let wal_max_bytes = args.wal_max_bytes.or(file.wal_max_bytes).unwrap_or(limits.wal_bytes_max);
    if wal_max_bytes < wal_bytes_per_file.saturating_mul(2) {
        return Err(format!(
            "{} ({wal_max_bytes}) must be at least two WAL segments (2 x {} = {}): raise it, or lower the segment size",
            named("--wal-max-bytes", "WAL_MAX_BYTES", "wal_max_bytes"),
            segment_name(),
            wal_bytes_per_file.saturating_mul(2)
        ));
    }
    let record_cache_bytes = args.record_cache_bytes.or(file.record_cache_bytes).unwrap_or(limits.record_cache_bytes);
    let record_bytes_max =
        args.record_bytes_max.or(file.record_bytes_max).unwrap_or(record_bytes_max_for(wal_bytes_per_file));
    let record_name = || named("--record-bytes-max", "SKIPPR_RECORD_BYTES_MAX", "record_bytes_max");
    if !(RECORD_BYTES_MIN..=RECORD_BYTES_MAX_LIMIT).contains(&record_bytes_max) {
        return Err(format!(
            "{} is {record_bytes_max}; give a size between {RECORD_BYTES_MIN} and {RECORD_BYTES_MAX_LIMIT} bytes",
            record_name()
        ));
    }
    if record_bytes_max > segment_record_bytes_max(wal_bytes_per_file) {
        return Err(format!(
            "{} is {record_bytes_max}, more than half a WAL segment ({} is {wal_bytes_per_file}): a record must fit \
             a segment beside its snapshot; raise the segment size to at least {} or lower {}",
            record_name(),
            segment_name(),
            record_bytes_max * 2,
            record_name()
        ));
    }
    let drain_timeout_seconds = args.drain_timeout.or(file.drain_timeout).unwrap_or(secs(limits.drain_timeout));
    positive("--drain-timeout", drain_timeout_seconds)?;
    let stall_default = limits.stall_report_after.map(secs).expect("core reports stalls by default");
    let stall_seconds = args.stall_seconds.or(file.stall_seconds).unwrap_or(stall_default);
    positive(&named("--stall-seconds", "SKIPPR_STALL_SECONDS", "stall_seconds"), stall_seconds)?;
    let stall_exit_seconds = args.stall_exit_seconds.or(file.stall_exit_seconds).unwrap_or(STALL_EXIT_SECONDS);
    positive(&named("--stall-exit-seconds", "SKIPPR_STALL_EXIT_SECONDS", "stall_exit_seconds"), stall_exit_seconds)?;
    let json_logs = match args.log_format.clone().or(file.log_format).as_deref().unwrap_or("text") {
        "text" => false,
        "json" => true,
        other => return Err(format!("unknown log format '{other}': use text or json")),
    };
    let metrics_addr = match args.metrics_addr.clone().or(file.metrics_addr) {
        None => None,
        Some(a) => Some(metrics_addr(&a)?),
    };
    let plugin_timeout_seconds = args.plugin_timeout.or(file.plugin_timeout).unwrap_or(PLUGIN_TIMEOUT_SECONDS);
    positive("--plugin-timeout", plugin_timeout_seconds)?;
    let sink = sink_config(&args.sink, file.sink, &data_dir)?;
    if matches!(wal, WalConfig::Clustered(_)) && sink == SinkConfig::Stdout {
        return Err("the stdout sink cannot be used in clustered mode: whichever host leads applies the batches, so \
                    the sink must be one every host reaches (a shared directory with --sink dir, or a command)"
            .into());
    }
    Ok(RunConfig {
        sink,
        source: source_config(&args.source, file.source)?,
        data_dir,
        wal,
        offsets,
        lease_table,
        lease_seconds,
        aws,
        wal_bytes_per_file,
        wal_max_delay_seconds,
        wal_max_bytes,
        record_cache_bytes,
        record_bytes_max,
        skips: input_skips(&args.skip_input)?,
        skip_reason: skip_reason(args.skip_reason.as_deref())?,
        drain_timeout_seconds,
        stall_seconds,
        stall_exit_seconds: args.once.then_some(stall_exit_seconds),
        once: args.once,
        json_logs,
        pipeline: args.pipeline.clone().or(file.pipeline).unwrap_or_else(|| "main".into()),
        plugin_timeout_seconds,
        metrics_addr,
        schema_command: args.schema_command.clone().or(file.schema_command),
    })
}

/// Under `--once`, how long WAL or lease requests may fail before exit 15.
const STALL_EXIT_SECONDS: f64 = 300.0;

/// How long an external plugin may take to answer.
const PLUGIN_TIMEOUT_SECONDS: f64 = 30.0;

/// The generator's bounds: it keeps a position per partition in memory.
const GENERATOR_STREAMS_MAX: usize = 1024;
const GENERATOR_PARTITIONS_MAX: u32 = 65_536;

/// The largest WAL segment: 16 GiB (each is created at its full size).
const WAL_BYTES_PER_FILE_MAX: u64 = 16 << 30;

/// The smallest `--record-bytes-max`.
const RECORD_BYTES_MIN: u64 = 1024;

/// The longest duration any setting takes: a year, in seconds. Longer ones
/// are refused (they would overflow the clock's arithmetic).
pub const SECONDS_MAX: f64 = 365.0 * 24.0 * 3600.0;

fn wal_config(wal: &WalArgs, cluster: &ClusterArgs) -> Result<WalConfig, String> {
    match wal.storage() {
        "disk" => Ok(WalConfig::Disk),
        "s3" => Ok(WalConfig::S3 {
            bucket: wal.s3_bucket.clone().ok_or(
                "WAL_STORAGE=s3 needs a bucket: set SKIPPR_WAL_S3_BUCKET (or --s3-bucket, or s3_bucket in the file)",
            )?,
            prefix: wal.prefix(),
        }),
        "clustered" => cluster_settings(cluster).map(WalConfig::Clustered),
        other => Err(format!("unknown WAL_STORAGE '{other}': use one of disk, s3, clustered")),
    }
}

fn cluster_settings(c: &ClusterArgs) -> Result<ClusterSettings, String> {
    let node = c.cluster_node_id.ok_or(
        "WAL_STORAGE=clustered needs this host's node id: set SKIPPR_CLUSTER_NODE_ID (the id `skipprd cluster init` \
         or `cluster join` was given)",
    )?;
    let list = c.cluster_peers.as_deref().ok_or(
        "WAL_STORAGE=clustered needs every host's address: set SKIPPR_CLUSTER_PEERS, such as \
         1=10.0.0.1:7001,2=10.0.0.2:7001,3=10.0.0.3:7001",
    )?;
    let peers = parse_peers(list)?;
    if !peers.contains_key(&node) {
        return Err(format!(
            "SKIPPR_CLUSTER_NODE_ID is {node}, but SKIPPR_CLUSTER_PEERS has no entry for node {node}: add \
             {node}=HOST:PORT, the address this host listens on"
        ));
    }
    if peers.len() < 2 {
        return Err("SKIPPR_CLUSTER_PEERS names only this host: a cluster has 3 or 5 hosts".into());
    }
    let tls = match (&c.cluster_ca, &c.cluster_cert, &c.cluster_key) {
        (Some(ca), Some(cert), Some(key)) => {
            skippr_io::peer::tls::TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() }
        }
        _ => {
            return Err("WAL_STORAGE=clustered needs the cluster's TLS files: set SKIPPR_CLUSTER_CA, \
                        SKIPPR_CLUSTER_CERT and SKIPPR_CLUSTER_KEY (`skipprd cluster certs` makes a CA and one \
                        certificate per node)"
                .into())
        }
    };
    Ok(ClusterSettings { node, peers, tls })
}

/// `ID=HOST:PORT,...`: positive distinct ids, distinct addresses, each with
/// a host and a port.
pub fn parse_peers(list: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers: BTreeMap<u64, String> = BTreeMap::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| format!("SKIPPR_CLUSTER_PEERS entry '{entry}' {why}; each entry is ID=HOST:PORT");
        let (id, addr) = entry.split_once('=').ok_or_else(|| bad("has no '='"))?;
        let id: u64 = id.trim().parse().ok().filter(|id| *id > 0).ok_or_else(|| bad("has no positive node id"))?;
        let addr = addr.trim();
        let port_ok = addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(bad("has no HOST:PORT address"));
        }
        if let Some((other, _)) = peers.iter().find(|(_, a)| a.as_str() == addr) {
            return Err(format!("SKIPPR_CLUSTER_PEERS gives nodes {other} and {id} the same address {addr}"));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("SKIPPR_CLUSTER_PEERS names node {id} twice"));
        }
    }
    if peers.is_empty() {
        return Err("SKIPPR_CLUSTER_PEERS is empty; it lists ID=HOST:PORT for every host".into());
    }
    Ok(peers)
}

fn source_config(args: &SourceArgs, file: SourceArgs) -> Result<SourceConfig, String> {
    let source = match args.kind.clone().or(file.kind).as_deref().unwrap_or("generator") {
        "generator" => SourceConfig::Generator {
            streams: args.streams.clone().or(file.streams).unwrap_or_else(|| vec!["events".into()]),
            partitions: args.partitions.or(file.partitions).unwrap_or(2),
            records: args.records.or(file.records).unwrap_or(10_000),
            seed: args.seed.or(file.seed).unwrap_or(1),
            rate: args.rate.or(file.rate).unwrap_or(0),
        },
        "file" => SourceConfig::File {
            dir: args
                .dir
                .clone()
                .or(file.dir)
                .ok_or("the file source needs its directory: --file-dir DIR, or `dir` in [source]")?,
            stream: args.stream.clone().or(file.stream).unwrap_or_else(|| "lines".into()),
            follow: args.follow.or(file.follow).unwrap_or(true),
        },
        "command" => SourceConfig::Command {
            command: args
                .command
                .clone()
                .or(file.command)
                .ok_or("the command source needs its command: --source-command CMD, or `command` in [source]")?,
        },
        "singer" => {
            let interval = args.singer_interval.or(file.singer_interval).unwrap_or(60.0);
            if !interval.is_finite() || !(0.0..=SECONDS_MAX).contains(&interval) {
                return Err(format!(
                    "--singer-interval is {interval}; give seconds, 0 or more and at most {SECONDS_MAX} (a year)"
                ));
            }
            let catalog = args.singer_catalog.clone().or(file.singer_catalog);
            let properties = args.singer_properties.clone().or(file.singer_properties);
            if catalog.is_some() && properties.is_some() {
                return Err("give the Singer tap a catalog or a properties file, not both".into());
            }
            SourceConfig::Singer {
                command: args.singer_command.clone().or(file.singer_command).ok_or(
                    "the singer source needs its tap: --singer-command \"tap-x --config tap.json\", \
                     SKIPPR_SINGER_COMMAND, or `singer_command` in [source]",
                )?,
                catalog,
                properties,
                interval: (interval > 0.0).then_some(interval),
                buffer_bytes: args.singer_buffer_bytes.or(file.singer_buffer_bytes).unwrap_or(64 << 20),
            }
        }
        other => return Err(format!("unknown source '{other}': use generator, file, singer or command")),
    };
    if let SourceConfig::File { stream, .. } = &source {
        check_stream_name(stream).map_err(|why| format!("the file source's stream: {why}"))?;
    }
    if let SourceConfig::Generator { streams, partitions, .. } = &source {
        if streams.is_empty() || *partitions == 0 {
            return Err("the generator needs at least one stream and one partition".into());
        }
        if streams.len() > GENERATOR_STREAMS_MAX || *partitions > GENERATOR_PARTITIONS_MAX {
            return Err(format!(
                "the generator takes at most {GENERATOR_STREAMS_MAX} streams and {GENERATOR_PARTITIONS_MAX} \
                 partitions per stream"
            ));
        }
        for stream in streams {
            check_stream_name(stream).map_err(|why| format!("the generator's streams: {why}"))?;
        }
    }
    Ok(source)
}

fn sink_config(args: &SinkArgs, file: SinkArgs, data_dir: &Path) -> Result<SinkConfig, String> {
    match args.kind.clone().or(file.kind.clone()).as_deref().unwrap_or("dir") {
        "dir" => Ok(SinkConfig::Dir {
            dir: args.dir.clone().or(file.dir).unwrap_or_else(|| data_dir.join("sink")),
            mode: match args.dir_mode.clone().or(file.dir_mode) {
                None => skippr_io::plugin::dir_sink::FILE_MODE_DEFAULT,
                Some(text) => file_mode(&text)?,
            },
        }),
        "stdout" => Ok(SinkConfig::Stdout),
        "command" => Ok(SinkConfig::Command {
            command: args
                .command
                .clone()
                .or(file.command)
                .ok_or("the command sink needs its command: --sink-command CMD, or `command` in [sink]")?,
        }),
        "postgres" => postgres_config(args, file).map(SinkConfig::Postgres),
        "s3" => Ok(SinkConfig::S3 {
            bucket: args.s3_bucket.clone().or(file.s3_bucket).ok_or(
                "the s3 sink needs its bucket: --sink-s3-bucket BUCKET, SKIPPR_SINK_S3_BUCKET, or `s3_bucket` in [sink]",
            )?,
            prefix: args.s3_prefix.clone().or(file.s3_prefix).unwrap_or_default(),
            gzip: args.s3_gzip.or(file.s3_gzip).unwrap_or(false),
        }),
        other => Err(format!("unknown sink '{other}': use dir, stdout, command, postgres or s3")),
    }
}

fn postgres_config(args: &SinkArgs, file: SinkArgs) -> Result<PostgresConfig, String> {
    let url = args.postgres_url.clone().or(file.postgres_url).ok_or(
        "the postgres sink needs its database: --postgres-url postgresql://USER@HOST:PORT/DATABASE, \
         SKIPPR_POSTGRES_URL, or `postgres_url` in [sink]",
    )?;
    let password = match args.postgres_password_file.clone().or(file.postgres_password_file) {
        Some(path) => Some(password_file(&path)?),
        None => std::env::var("PGPASSWORD").ok().filter(|p| !p.is_empty()),
    };
    let ca_file = args.postgres_ca_file.clone().or(file.postgres_ca_file);
    let tls = asks_for_tls(&connection_config(&url, password.as_deref())?);
    if ca_file.is_some() && !tls {
        return Err("--postgres-ca-file is given but the URL does not ask for TLS: add sslmode=require to it".into());
    }
    if tls {
        // Checked now, so that a bad file stops start-up.
        let pem = match &ca_file {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| format!("--postgres-ca-file {}: cannot read it: {e}", path.display()))?,
            ),
            None => None,
        };
        tls_config(pem.as_deref()).map_err(|e| format!("the postgres sink's TLS: {e}"))?;
    }
    let schema = args.postgres_schema.clone().or(file.postgres_schema).unwrap_or_else(|| "public".into());
    if schema.is_empty() || schema.len() > 63 {
        return Err(format!("--postgres-schema '{schema}' must be 1 to 63 bytes"));
    }
    let columns = match args.postgres_columns.clone().or(file.postgres_columns) {
        Some(list) => postgres_columns(&list)?,
        None => Vec::new(),
    };
    let upsert = args.postgres_upsert.or(file.postgres_upsert).unwrap_or(false);
    Ok(PostgresConfig { url, password, schema, columns, upsert, tls, ca_file })
}

/// `FIELD:TYPE,...` into columns; each field once, none of the sink's own
/// column names.
fn postgres_columns(list: &str) -> Result<Vec<Column>, String> {
    let mut columns: Vec<Column> = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (field, ty) = entry.split_once(':').ok_or_else(|| {
            format!("--postgres-columns: '{entry}' is not FIELD:TYPE (for example id:bigint,name:text)")
        })?;
        let (field, ty) = (field.trim(), ty.trim());
        let sql_type = ColumnType::parse(ty).ok_or_else(|| {
            format!("--postgres-columns: '{ty}' is not a type here; use text, bigint, integer, numeric, double, boolean or jsonb")
        })?;
        if field.is_empty() || field.len() > 63 || ["data", "_skippr_seq", "_skippr_row"].contains(&field) {
            return Err(format!(
                "--postgres-columns: '{field}' cannot name a column (1 to 63 bytes, not data, _skippr_seq or _skippr_row)"
            ));
        }
        if columns.iter().any(|c| c.field == field) {
            return Err(format!("--postgres-columns: '{field}' is named twice"));
        }
        columns.push(Column { field: field.to_string(), sql_type });
    }
    Ok(columns)
}

/// The password in `path`, which must not be readable by group or others.
fn password_file(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the PostgreSQL password file {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "the PostgreSQL password file {} is readable by others (mode {:o}): chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the PostgreSQL password file {}: {e}", path.display()))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

fn load(path: &Path) -> Result<RunArgs, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the config file {}: {e}", path.display()))?;
    let file: RunArgs =
        toml::from_str(&text).map_err(|e| format!("the config file {} is not valid: {e}", path.display()))?;
    if let Some(key) = file.unknown.keys().next() {
        return Err(format!(
            "the config file {} is not valid: unknown field `{key}`; the settings are the flags of `skipprd run \
             --help` in snake_case, with [source] and [sink] tables",
            path.display()
        ));
    }
    Ok(file)
}

/// `PORT` (on 127.0.0.1) or `HOST:PORT`.
pub(crate) fn metrics_addr(a: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = a.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    a.parse().map_err(|_| format!("the metrics address '{a}' is neither a port nor HOST:PORT"))
}

/// The shortest lease span (its requests get 90 ms each): shorter spans
/// leave no time for any request to finish.
pub const LEASE_SECONDS_MIN: f64 = 0.2;

/// The lease's one rule, as the help, the errors and the README state it.
pub const LEASE_RULE: &str =
    "every S3 and DynamoDB request under the lease, its retries included, must end within 45 % \
                              of the span (at most 60 s), so that one sent while the lease was held ends before \
                              another writer may take it over";

/// Under a lease, a request (retries included) must end before half the
/// span has passed, so a delete or create sent while the lease was valid
/// cannot land after another writer took over: 45 % of the span, at most
/// 60 s. Derived, never clamped upwards, so the rule holds for every span.
pub fn operation_timeout(lease_seconds: f64) -> std::time::Duration {
    let span = skippr_core::Duration::from_micros((lease_seconds * 1e6) as u64);
    std::time::Duration::from_micros(LeaseConfig::from_span(span).requests_within.as_micros())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: Option<&str>, table: Option<&str>) -> RunArgs {
        RunArgs {
            wal: WalArgs { wal_storage: Some("s3".into()), s3_bucket: bucket.map(Into::into), s3_prefix: None },
            table: TableArgs { dynamodb_table: table.map(Into::into) },
            ..RunArgs::default()
        }
    }

    fn with_file(text: &str) -> (tempfile::NamedTempFile, RunArgs) {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), text).unwrap();
        let args = RunArgs { config: Some(tmp.path().to_path_buf()), ..RunArgs::default() };
        (tmp, args)
    }

    #[test]
    fn the_singer_source_needs_its_tap_and_takes_a_catalog_or_properties_not_both() {
        let singer = |text: &str| {
            let (_tmp, args) = with_file(&format!("[source]\nkind = \"singer\"\n{text}"));
            resolve(&args).map(|c| c.source)
        };
        assert!(singer("").unwrap_err().contains("--singer-command"));
        let c = singer("singer_command = \"tap-x --config t.json\"").unwrap();
        assert_eq!(
            c,
            SourceConfig::Singer {
                command: "tap-x --config t.json".into(),
                catalog: None,
                properties: None,
                interval: Some(60.0),
                buffer_bytes: 64 << 20,
            }
        );
        let once = singer("singer_command = \"t\"\nsinger_interval = 0").unwrap();
        assert!(matches!(once, SourceConfig::Singer { interval: None, .. }));
        assert!(singer("singer_command = \"t\"\nsinger_interval = -1").unwrap_err().contains("--singer-interval"));
        let both = "singer_command = \"t\"\nsinger_catalog = \"c.json\"\nsinger_properties = \"p.json\"";
        assert!(singer(both).unwrap_err().contains("not both"));
    }

    #[test]
    fn upserts_need_every_stream_keyed_by_its_source() {
        let pg = PostgresConfig {
            url: "postgresql://u@h/d".into(),
            password: None,
            schema: "public".into(),
            columns: vec![],
            upsert: true,
            tls: false,
            ca_file: None,
        };
        assert!(pg.settings(&[]).err().unwrap().contains("singer source"));
        let keys = vec![("a".to_string(), vec!["id".to_string()]), ("b".to_string(), vec![])];
        assert!(pg.settings(&keys).err().unwrap().contains("'b'"));
        let settings = pg.settings(&keys[..1]).unwrap();
        assert_eq!(settings.keys.get("a"), Some(&vec!["id".to_string()]));
        let off = PostgresConfig { upsert: false, ..pg };
        assert!(off.settings(&keys).unwrap().keys.is_empty(), "keys are ignored unless asked for");
    }

    #[test]
    fn defaults_serve_a_first_run() {
        let c = resolve(&RunArgs::default()).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert_eq!(c.sink, SinkConfig::Dir { dir: PathBuf::from("./data/sink"), mode: 0o640 });
        assert!(matches!(c.source, SourceConfig::Generator { records: 10_000, partitions: 2, .. }));
        assert_eq!((c.wal, c.offsets), (WalConfig::Disk, OffsetsConfig::Disk));
        assert_eq!(c.wal_bytes_per_file, Limits::default().segment_bytes, "core's default");
        assert_eq!((c.lease_seconds, c.drain_timeout_seconds, c.stall_seconds), (10.0, 30.0, 60.0));
    }

    #[test]
    fn the_help_states_the_defaults_core_gives() {
        let cmd = <RunArgs as Args>::augment_args(clap::Command::new("run"));
        let help = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no argument {id}"));
            arg.get_help().map(|h| h.to_string()).unwrap_or_default()
        };
        let limits = Limits::default();
        let cases = [
            ("wal_bytes_per_file", limits.segment_bytes.to_string()),
            ("wal_max_delay_seconds", secs(limits.segment_age_max).to_string()),
            ("wal_max_bytes", limits.wal_bytes_max.to_string()),
            ("record_cache_bytes", limits.record_cache_bytes.to_string()),
            ("record_bytes_max", skippr_core::admit::RECORD_BYTES_MAX_DEFAULT.to_string()),
            ("drain_timeout", secs(limits.drain_timeout).to_string()),
            ("stall_seconds", secs(limits.stall_report_after.unwrap()).to_string()),
            ("lease_seconds", secs(LeaseConfig::default().steal_after).to_string()),
            ("stall_exit_seconds", STALL_EXIT_SECONDS.to_string()),
            ("plugin_timeout", PLUGIN_TIMEOUT_SECONDS.to_string()),
        ];
        for (id, default) in cases {
            assert!(help(id).contains(&format!("[default: {default}]")), "--{id}: {}", help(id));
        }
    }

    #[test]
    fn the_sdk_timeout_stays_below_half_the_lease_span() {
        for span in [0.2, 0.5, 1.0, 1.5, 2.0, 3.9, 4.0, 10.0, 200.0, 1e6] {
            let timeout = operation_timeout(span).as_secs_f64();
            assert!(timeout > 0.0 && timeout < span / 2.0, "span {span} s: timeout {timeout} s");
        }
        let args = |lease: f64| RunArgs { lease_seconds: Some(lease), ..s3(Some("b"), Some("skipprd")) };
        let c = resolve(&args(3.0)).unwrap();
        assert!(c.aws.operation_timeout.unwrap().as_secs_f64() < 1.5);
        let e = resolve(&args(0.1)).unwrap_err();
        assert!(e.contains("at least 0.2"), "{e}");
        assert!(resolve(&args(-1.0)).unwrap_err().contains("positive"));
    }

    #[test]
    fn s3_mode_keeps_offsets_in_dynamodb_unless_told() {
        let mut args = s3(Some("wal-bucket"), Some("skipprd"));
        let c = resolve(&args).unwrap();
        assert_eq!(c.wal, WalConfig::S3 { bucket: "wal-bucket".into(), prefix: "skipprd/wal/".into() });
        assert_eq!(c.offsets, OffsetsConfig::Dynamodb { table: "skipprd".into() });
        assert_eq!(c.lease_table.as_deref(), Some("skipprd"));
        args.offsets.offset_store = Some("disk".into());
        assert_eq!(resolve(&args).unwrap().offsets, OffsetsConfig::Disk);
    }

    #[test]
    fn flags_win_over_the_file() {
        let (_tmp, mut args) = with_file("data_dir = \"/from-file\"\npipeline = \"p\"\n[source]\nrecords = 7\n");
        args.data_dir = Some("/from-flag".into());
        let c = resolve(&args).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/from-flag"));
        assert_eq!(c.pipeline, "p");
        assert!(matches!(c.source, SourceConfig::Generator { records: 7, .. }));
    }

    #[test]
    fn every_group_of_settings_is_read_from_the_file() {
        let text = "wal_storage = \"s3\"\ns3_bucket = \"b\"\ns3_prefix = \"p/\"\ndynamodb_table = \"tbl\"\n\
                    aws_endpoint = \"http://127.0.0.1:1\"\ndrain_timeout_seconds = 5.0\n\
                    plugin_timeout_seconds = 2.0\n[sink]\nkind = \"stdout\"\n";
        let (_tmp, args) = with_file(text);
        let c = resolve(&args).unwrap();
        assert_eq!(c.wal, WalConfig::S3 { bucket: "b".into(), prefix: "p/".into() });
        assert_eq!(c.offsets, OffsetsConfig::Dynamodb { table: "tbl".into() });
        assert_eq!(c.aws.endpoint.as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!((c.drain_timeout_seconds, c.plugin_timeout_seconds), (5.0, 2.0));
        assert_eq!(c.sink, SinkConfig::Stdout);
        let (_tmp, mut args) = with_file(text);
        args.wal.s3_prefix = Some("flag/".into());
        assert_eq!(resolve(&args).unwrap().wal, WalConfig::S3 { bucket: "b".into(), prefix: "flag/".into() });
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let args =
            RunArgs { wal: WalArgs { wal_storage: Some("tape".into()), ..WalArgs::default() }, ..RunArgs::default() };
        assert_eq!(resolve(&args).unwrap_err(), "unknown WAL_STORAGE 'tape': use one of disk, s3, clustered");
        assert!(resolve(&s3(None, None)).unwrap_err().contains("SKIPPR_WAL_S3_BUCKET"));
        assert!(resolve(&s3(Some("b"), None)).unwrap_err().contains("skipprd offsets init-table"));
        let offsets = OffsetsArgs { offset_store: Some("dynamodb".into()) };
        let args = RunArgs { offsets, ..RunArgs::default() };
        assert!(resolve(&args).unwrap_err().contains("SKIPPR_OFFSET_DYNAMODB_TABLE"));
        let (_tmp, args) = with_file("data_dirr = 1\n");
        assert!(resolve(&args).unwrap_err().contains("unknown field `data_dirr`"));
        let (_tmp, args) = with_file("[source]\nrecordz = 1\n");
        assert!(resolve(&args).unwrap_err().contains("unknown field `recordz`"));
        let (_tmp, args) = with_file("once = true\n");
        assert!(resolve(&args).unwrap_err().contains("unknown field `once`"), "a flag only");
    }
}

#[cfg(test)]
mod cluster_tests {
    use super::*;

    fn clustered(node: Option<u64>, peers: Option<&str>, tls: bool) -> RunArgs {
        let file = |name: &str| tls.then(|| PathBuf::from(name));
        RunArgs {
            wal: WalArgs { wal_storage: Some("clustered".into()), ..WalArgs::default() },
            cluster: ClusterArgs {
                cluster_node_id: node,
                cluster_peers: peers.map(Into::into),
                cluster_ca: file("ca.pem"),
                cluster_cert: file("node.pem"),
                cluster_key: file("node-key.pem"),
            },
            ..RunArgs::default()
        }
    }

    const PEERS: &str = "1=127.0.0.1:7001, 2=127.0.0.1:7002,3=127.0.0.1:7003";

    #[test]
    fn a_clustered_host_names_itself_its_peers_and_its_tls_files() {
        let c = resolve(&clustered(Some(2), Some(PEERS), true)).unwrap();
        let WalConfig::Clustered(s) = c.wal else { panic!("{:?}", c.wal) };
        assert_eq!(s.node, 2);
        assert_eq!(s.peers.get(&3).map(String::as_str), Some("127.0.0.1:7003"));
        assert_eq!(s.tls.key, PathBuf::from("node-key.pem"));
        assert_eq!((c.offsets, c.lease_table), (OffsetsConfig::Disk, None), "no AWS unless asked for");
        let err = |args: RunArgs| resolve(&args).unwrap_err();
        assert!(err(clustered(None, Some(PEERS), true)).contains("SKIPPR_CLUSTER_NODE_ID"));
        assert!(err(clustered(Some(4), Some(PEERS), true)).contains("has no entry for node 4"));
        assert!(err(clustered(Some(1), None, true)).contains("SKIPPR_CLUSTER_PEERS"));
        assert!(err(clustered(Some(1), Some(PEERS), false)).contains("SKIPPR_CLUSTER_CA"));
        let mut stdout = clustered(Some(1), Some(PEERS), true);
        stdout.sink.kind = Some("stdout".into());
        assert!(err(stdout).contains("stdout sink cannot be used in clustered mode"));
    }

    #[test]
    fn a_bad_peer_list_is_named() {
        let err = |list: &str| parse_peers(list).unwrap_err();
        assert!(err("1=127.0.0.1:7001,2=127.0.0.1:7001").contains("nodes 1 and 2 the same address 127.0.0.1:7001"));
        assert!(err("1=a:1,1=b:2").contains("names node 1 twice"));
        assert!(err("0=a:1").contains("no positive node id"));
        assert!(err("x=a:1").contains("no positive node id"));
        assert!(err("1=a").contains("no HOST:PORT"));
        assert!(err("1=:7001").contains("no HOST:PORT"));
        assert!(err("1 127.0.0.1:7001").contains("has no '='"));
        assert!(err(" , ").contains("empty"));
        assert_eq!(parse_peers("1=db-1:7001,2=[::1]:7002").unwrap().len(), 2);
    }
}
