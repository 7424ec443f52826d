//! Where the WAL, the lease and the offsets live: the flags of `run` that
//! the tools (`wal verify`, `offsets`) share, and their checks.

use super::{named, positive, secs, Settings};
use clap::Args;
use serde::{Deserialize, Serialize};
use skippr_core::LeaseConfig;
use skippr_io::aws::AwsSettings;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where the WAL lives. `run`, `wal verify` and `offsets` share these.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone)]
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

/// The kinds of WAL storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalStorage {
    Disk,
    S3,
    Clustered,
}

const STORAGES: &[(&str, WalStorage)] =
    &[("disk", WalStorage::Disk), ("s3", WalStorage::S3), ("clustered", WalStorage::Clustered)];

impl WalArgs {
    /// The storage asked for, or which ones there are.
    pub fn storage(&self) -> Result<WalStorage, String> {
        let name = self.wal_storage.as_deref().unwrap_or("disk");
        match STORAGES.iter().find(|(n, _)| *n == name) {
            Some((_, kind)) => Ok(*kind),
            None => {
                let names: Vec<&str> = STORAGES.iter().map(|(n, _)| *n).collect();
                Err(format!("unknown WAL_STORAGE '{name}': use one of {}", names.join(", ")))
            }
        }
    }

    pub fn prefix(&self) -> String {
        self.s3_prefix.clone().unwrap_or_else(|| "skipprd/wal/".into())
    }
}

/// Clustered mode: who this host is, where its peers are, and the TLS
/// files that prove it.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone)]
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

/// The DynamoDB table of offsets and the writer lease.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone)]
pub struct TableArgs {
    /// The DynamoDB table for offsets and the writer lease (required in S3
    /// mode); create it with `skipprd offsets init-table`.
    #[arg(long, env = "SKIPPR_OFFSET_DYNAMODB_TABLE", value_name = "TABLE")]
    pub dynamodb_table: Option<String>,
}

/// Where offsets are materialized.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone)]
pub struct OffsetsArgs {
    /// Where offsets are materialized: `disk` (DATA_DIR/offsets.redb) or
    /// `dynamodb` [default: dynamodb in S3 mode, disk otherwise].
    #[arg(long, env = "SKIPPR_OFFSET_STORE", value_name = "KIND")]
    pub offset_store: Option<String>,
}

/// How the AWS services are reached.
#[derive(Args, Serialize, Deserialize, Debug, Default, Clone)]
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

/// The stores a run opens, checked against each other.
pub(super) struct Stores {
    pub wal: WalConfig,
    pub offsets: OffsetsConfig,
    pub lease_table: Option<String>,
    pub lease_seconds: f64,
    pub aws: AwsSettings,
}

pub(super) fn stores(s: &Settings) -> Result<Stores, String> {
    let table = s.table.dynamodb_table.clone();
    if let Some(t) = &table {
        skippr_io::dynamo::check_table_name(t).map_err(|e| {
            format!("{e} ({})", named("--dynamodb-table", "SKIPPR_OFFSET_DYNAMODB_TABLE", "dynamodb_table"))
        })?;
    }
    let wal = wal_config(&s.wal, &s.cluster)?;
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
    let offsets = match s.offsets.offset_store.as_deref().unwrap_or(default_store) {
        "disk" => OffsetsConfig::Disk,
        "dynamodb" => OffsetsConfig::Dynamodb {
            table: table.clone().ok_or(
                "SKIPPR_OFFSET_STORE=dynamodb needs a table: set SKIPPR_OFFSET_DYNAMODB_TABLE and create it with \
                 `skipprd offsets init-table`",
            )?,
        },
        other => return Err(format!("unknown SKIPPR_OFFSET_STORE '{other}': use disk or dynamodb")),
    };
    let lease_seconds = s.lease_seconds.unwrap_or(secs(LeaseConfig::default().steal_after));
    let lease_name = || named("--lease-seconds", "SKIPPR_LEASE_SECONDS", "lease_seconds");
    positive(&lease_name(), lease_seconds)?;
    if lease_seconds < LEASE_SECONDS_MIN {
        return Err(format!(
            "{} must be at least {LEASE_SECONDS_MIN} (not {lease_seconds}): {LEASE_RULE}",
            lease_name()
        ));
    }
    let aws = AwsSettings {
        region: s.aws.aws_region.clone(),
        endpoint: s.aws.aws_endpoint.clone(),
        operation_timeout: lease_table.as_ref().map(|_| operation_timeout(lease_seconds)),
    };
    Ok(Stores { wal, offsets, lease_table, lease_seconds, aws })
}

fn wal_config(wal: &WalArgs, cluster: &ClusterArgs) -> Result<WalConfig, String> {
    match wal.storage()? {
        WalStorage::Disk => Ok(WalConfig::Disk),
        WalStorage::S3 => Ok(WalConfig::S3 {
            bucket: wal.s3_bucket.clone().ok_or(
                "WAL_STORAGE=s3 needs a bucket: set SKIPPR_WAL_S3_BUCKET (or --s3-bucket, or s3_bucket in the file)",
            )?,
            prefix: wal.prefix(),
        }),
        WalStorage::Clustered => cluster_settings(cluster).map(WalConfig::Clustered),
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
