//! Clustered mode in the shell: `skipprd cluster init` and `cluster join`
//! give a DATA_DIR its cluster identity (the raft hard-state file's first
//! state), `cluster certs` makes a CA and node certificates for a quick
//! start, and `start_peers` reads the identity and starts the peer
//! transport for `skipprd run`. A clustered host whose DATA_DIR has no
//! identity refuses to start.

use crate::config::{ClusterSettings, OffsetsConfig, RunConfig};
use crate::exit;
use skippr_core::cluster::{first_file, Members};
use skippr_core::ClusterConfig;
use skippr_core::Limits;
use skippr_io::hard_state_file::HardStateFile;
use skippr_io::peer::tls::Tls;
use skippr_io::peer::{Incoming, PeerConfig, Peers, TokioNet};
use skippr_io::DiskWal;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The raft tick of every daemon: elections after 10 ticks (1 s) without a
/// leader, heartbeats every 3. Part of the settings fingerprint peers
/// compare.
pub const TICK: skippr_core::Duration = skippr_core::Duration::from_micros(100_000);

/// A running host's part in the cluster.
pub struct ClusterRun {
    pub config: ClusterConfig,
    pub peers: Arc<Peers>,
    pub incoming: mpsc::Receiver<Incoming>,
}

/// The cluster identity in DATA_DIR's hard-state file.
fn members(data_dir: &Path) -> Result<Members, (i32, String)> {
    let none = || {
        format!(
            "{} holds no cluster identity: run `skipprd cluster init` on every host of a new cluster, or, if this \
             host's data was lost, `skipprd cluster join` under a new node id",
            data_dir.display()
        )
    };
    match HardStateFile::open(data_dir) {
        Ok((_, Some(saved))) => Ok(saved.members),
        Ok((_, None)) => Err((exit::CONFIG, none())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err((exit::CONFIG, none())),
        Err(e) => {
            Err((exit::WAL_CORRUPT, format!("this host's raft state cannot be trusted, so it will not vote: {e}")))
        }
    }
}

/// Before anything is written: DATA_DIR holds a cluster identity.
pub fn check_identity(data_dir: &Path) -> Result<(), (i32, String)> {
    members(data_dir).map(|_| ())
}

/// The WAL's identity in a shared offsets store: the cluster's, the same on
/// every host.
pub fn wal_identity(data_dir: &Path) -> Result<String, String> {
    members(data_dir).map(|m| format!("cluster://{:016x}/", m.cluster)).map_err(|(_, e)| e)
}

/// Checks the identity against the settings, loads the TLS files and
/// starts the peer transport on this host's address.
pub async fn start_peers(
    cfg: &RunConfig,
    c: &ClusterSettings,
    wal: &Arc<DiskWal>,
) -> Result<ClusterRun, (i32, String)> {
    let members = members(&cfg.data_dir)?;
    if members.node != c.node {
        return Err((
            exit::CONFIG,
            format!(
                "{} belongs to node {} of cluster {:016x}, but SKIPPR_CLUSTER_NODE_ID is {}: give each host its own \
                 DATA_DIR and id",
                cfg.data_dir.display(),
                members.node,
                members.cluster,
                c.node
            ),
        ));
    }
    let tls = Tls::load(&c.tls, c.node).map_err(|e| (exit::CONFIG, e))?;
    let fingerprint = skippr_core::cluster::settings_fingerprint(members.segment_bytes, TICK);
    let peer_config = PeerConfig::new(c.node, members.cluster, c.peers.clone(), fingerprint);
    let reader = Arc::clone(wal) as Arc<dyn skippr_io::peer::SegmentReader>;
    let (peers, incoming) = Peers::start(TokioNet, peer_config, tls, reader)
        .await
        .map_err(|e| (exit::CONFIG, format!("the peer transport cannot start: {e}")))?;
    let peers = Arc::new(peers);
    if let Some(replaces) = read_join(&cfg.data_dir)? {
        tokio::spawn(ask_to_join(Arc::clone(&peers), cfg.data_dir.clone(), c.node, replaces));
    }
    tracing::info!(
        node = c.node,
        cluster = format!("{:016x}", members.cluster),
        listen = %c.peers[&c.node],
        peers = c.peers.len() - 1,
        "clustered mode: peer transport started (mutual TLS)"
    );
    let config = ClusterConfig {
        node: c.node,
        voters: c.peers.keys().copied().collect(),
        tick: TICK,
        shared_offsets: matches!(cfg.offsets, OffsetsConfig::Dynamodb { .. }),
    };
    Ok(ClusterRun { config, peers, incoming })
}

/// The id a joining host replaces, from its `cluster-join` file.
fn read_join(data_dir: &Path) -> Result<Option<u64>, (i32, String)> {
    let path = data_dir.join(JOIN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            (exit::CONFIG, format!("{} does not hold a node id: run `skipprd cluster join` again", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err((exit::CONFIG, format!("{}: {e}", path.display()))),
    }
}

/// A joining host asks its peers once a second to let it in, until its own
/// saved configuration has it as a voter; then the join file goes.
async fn ask_to_join(peers: Arc<Peers>, data_dir: PathBuf, node: u64, replaces: u64) {
    tracing::info!(node, replaces, "joining the cluster in place of node {replaces}: asking the leader to let it in");
    loop {
        let voter = HardStateFile::open(&data_dir)
            .ok()
            .and_then(|(_, saved)| saved)
            .is_some_and(|s| s.conf.voters.contains(&node) && s.conf.voters_outgoing.is_empty());
        if voter {
            // Said before the file goes: whoever waits for the file to go
            // then finds the line in the log.
            tracing::info!(node, "this host is a voter of the cluster; node {replaces} is removed for good");
            if let Err(e) = std::fs::remove_file(data_dir.join(JOIN_FILE)) {
                tracing::warn!(error = %e, "cannot remove {}", data_dir.join(JOIN_FILE).display());
            }
            return;
        }
        peers.ask_to_join(node, replaces);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The host's metrics address (`skipprd run --metrics-addr`): a port on
    /// 127.0.0.1, or HOST:PORT.
    #[arg(long, env = "SKIPPR_METRICS_ADDR", value_name = "ADDR")]
    metrics_addr: String,
}

/// `skipprd cluster status`: `GET /cluster` from a running host, printed.
pub fn status(args: StatusArgs) -> i32 {
    use std::io::Write;
    let fail = |code: i32, what: String| {
        eprintln!("skipprd cluster status: {what}");
        code
    };
    let addr = match crate::config::metrics_addr(&args.metrics_addr) {
        Ok(a) => a,
        Err(e) => return fail(exit::CONFIG, e),
    };
    let timeout = std::time::Duration::from_secs(5);
    let answer = (|| -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        write!(stream, "GET /cluster HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    })();
    let text = match answer {
        Ok(t) => t,
        Err(e) => {
            return fail(
                exit::FAILED,
                format!("no skipprd answers at {addr} ({e}): is `skipprd run` running with --metrics-addr {addr}?"),
            )
        }
    };
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return fail(exit::FAILED, format!("the host at {addr} answered: {}", body.trim()));
    }
    print!("{body}");
    exit::OK
}

#[derive(clap::Args)]
pub struct CertsArgs {
    /// Where to write `ca.pem`, `ca-key.pem` and `node-<ID>.pem`,
    /// `node-<ID>-key.pem` for each node (created, mode 0700). Where it
    /// holds `ca.pem` and `ca-key.pem` already (made here before), only the
    /// nodes' files are written, issued by that CA: for a host that joins.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// The node ids to make certificates for, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<u64>,
}

/// `skipprd cluster certs`: a new CA and a certificate per node, keys at
/// mode 0600; or, in a directory holding the CA already, certificates for
/// more nodes from it. Refuses to overwrite anything.
pub fn certs(args: CertsArgs) -> i32 {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |what: String| {
        eprintln!("skipprd cluster certs: {what}");
        exit::CONFIG
    };
    if args.nodes.contains(&0) {
        return fail("node ids must be positive".into());
    }
    let (ca_path, ca_key_path) = (args.dir.join("ca.pem"), args.dir.join("ca-key.pem"));
    let (mut files, nodes) = match (ca_path.exists(), ca_key_path.exists()) {
        (true, true) => {
            let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
            let issued = read(&ca_path)
                .and_then(|ca| Ok((ca, read(&ca_key_path)?)))
                .and_then(|(ca, key)| skippr_io::peer::tls::issue(&ca, &key, &args.nodes));
            match issued {
                Ok(nodes) => (Vec::new(), nodes),
                Err(e) => return fail(format!("cannot issue from the CA in {}: {e}", args.dir.display())),
            }
        }
        (false, false) => match skippr_io::peer::tls::generate(&args.nodes) {
            Ok((ca, ca_key, nodes)) => {
                (vec![("ca.pem".to_string(), ca, 0o644), ("ca-key.pem".to_string(), ca_key, 0o600)], nodes)
            }
            Err(e) => return fail(format!("cannot make the certificates: {e}")),
        },
        _ => {
            return fail(format!(
                "{} holds one of ca.pem and ca-key.pem but not the other: give the directory that holds both, or \
                 an empty one for a new CA",
                args.dir.display()
            ))
        }
    };
    for (node, cert, key) in nodes {
        files.push((format!("node-{node}.pem"), cert, 0o644));
        files.push((format!("node-{node}-key.pem"), key, 0o600));
    }
    if let Err(e) = skippr_io::disk_wal::create_dir_durably(&args.dir, 0o700) {
        return fail(format!("{}: {e}", args.dir.display()));
    }
    if let Some((name, ..)) = files.iter().find(|(name, ..)| args.dir.join(name).exists()) {
        return fail(format!(
            "{} exists already; nothing is overwritten (give another node id, or an empty --dir for a new CA)",
            args.dir.join(name).display()
        ));
    }
    for (name, pem, mode) in &files {
        let path = args.dir.join(name);
        let written = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(*mode)
            .open(&path)
            .and_then(|mut f| f.write_all(pem.as_bytes()).and_then(|()| f.sync_all()));
        if let Err(e) = written {
            return fail(format!("{}: {e}", path.display()));
        }
    }
    // The files' entries, made durable with their bytes.
    if let Err(e) = skippr_io::disk_wal::sync_dir(&args.dir) {
        return fail(format!("{}: {e}", args.dir.display()));
    }
    println!("wrote {} files to {}", files.len(), args.dir.display());
    println!("every host needs ca.pem and its own node-<ID>.pem and node-<ID>-key.pem; keep ca-key.pem off the hosts");
    exit::OK
}

#[derive(clap::Args)]
pub struct IdentityArgs {
    /// The host's DATA_DIR (created, mode 0700, if missing).
    #[arg(env = "DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    /// This host's raft node id (positive, never used before in the cluster).
    #[arg(long, env = "SKIPPR_CLUSTER_NODE_ID")]
    node_id: u64,
    /// The node ids `cluster init` was given, comma-separated: the
    /// cluster's first voters (the same list on every host).
    #[arg(long, value_delimiter = ',', required = true)]
    voters: Vec<u64>,
    /// The cluster's id (16 hex digits). `init` draws one when it is not
    /// given and prints it: pass it to `init` on the other hosts and to
    /// every later `join`.
    #[arg(long, value_parser = parse_cluster_id)]
    cluster_id: Option<u64>,
    /// The cluster's WAL segment size, the same on every host.
    #[arg(long, env = "WAL_BYTES_PER_FILE", value_name = "BYTES")]
    wal_bytes_per_file: Option<u64>,
    /// `join` only, required: the id of the host whose data was lost, which
    /// this one replaces (removed for good once this one is a voter).
    #[arg(long, value_name = "OLD_ID")]
    replaces: Option<u64>,
}

/// In a joining host's DATA_DIR until it is a voter: the id it replaces.
/// `run` asks the cluster to let it in while the file is there.
pub const JOIN_FILE: &str = "cluster-join";

/// Exactly the 16 hex digits `cluster init` printed: a shortened id would
/// name another cluster.
fn parse_cluster_id(s: &str) -> Result<u64, String> {
    let bad = || format!("'{s}' is not a cluster id: give all 16 hex digits, as `cluster init` printed them");
    if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    u64::from_str_radix(s, 16).map_err(|_| bad())
}

/// `join`: false for `init` (the host is one of the first voters).
pub fn identity(args: IdentityArgs, join: bool) -> i32 {
    let cmd = if join { "cluster join" } else { "cluster init" };
    let fail = |what: String| {
        eprintln!("skipprd {cmd}: {what}");
        exit::CONFIG
    };
    let mut voters = args.voters.clone();
    voters.sort_unstable();
    voters.dedup();
    if args.node_id == 0 || voters.contains(&0) || voters.len() != args.voters.len() {
        return fail("node ids must be positive and the voters distinct".into());
    }
    if join == voters.contains(&args.node_id) {
        return fail(match join {
            true => format!(
                "node {} was one of the first voters: a host whose data is gone joins under a new id",
                args.node_id
            ),
            false => format!("node {} is not among --voters {voters:?}", args.node_id),
        });
    }
    let cluster = match (args.cluster_id, join) {
        (Some(id), _) => id,
        (None, true) => return fail("--cluster-id is required: the id `cluster init` printed".into()),
        (None, false) => match random_id() {
            Ok(id) => id,
            Err(e) => return fail(format!("cannot draw a cluster id: {e}")),
        },
    };
    let replaces = match (args.replaces, join) {
        (Some(_), false) => return fail("--replaces is for `cluster join`".into()),
        (None, true) => return fail("--replaces is required: the id of the host whose data was lost".into()),
        (Some(old), true) if old == 0 || old == args.node_id => {
            return fail(format!("--replaces {old} must be another, positive node id"))
        }
        (r, _) => r,
    };
    let segment_bytes = args.wal_bytes_per_file.unwrap_or(Limits::default().segment_bytes);
    let members = Members { cluster, node: args.node_id, segment_bytes, ..Members::default() };
    let file = match first_file(&members, &voters) {
        Ok(f) => f,
        Err(e) => return fail(e.to_string()),
    };
    if let Err(what) =
        prepare(&args.data_dir).and_then(|()| HardStateFile::init(&args.data_dir, &file).map_err(|e| e.to_string()))
    {
        return fail(what);
    }
    if let Some(old) = replaces {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = args.data_dir.join(JOIN_FILE);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{old}\n").as_bytes()).and_then(|()| f.sync_all()))
            .and_then(|()| skippr_io::disk_wal::sync_dir(&args.data_dir));
        if let Err(e) = written {
            return fail(format!("{}: {e}", path.display()));
        }
    }
    println!("cluster {cluster:016x}: node {} in {}", args.node_id, args.data_dir.display());
    if let Some(old) = replaces {
        println!(
            "start it with node {} in SKIPPR_CLUSTER_PEERS (on every host): it asks the leader to let it in, and once \
             it has caught up it becomes a voter and node {old} is removed for good",
            args.node_id
        );
    }
    exit::OK
}

/// The DATA_DIR exists (created 0700) and holds no WAL of its own.
fn prepare(dir: &Path) -> Result<(), String> {
    skippr_io::disk_wal::create_dir_durably(dir, 0o700).map_err(|e| format!("{}: {e}", dir.display()))?;
    let wal = dir.join(skippr_io::disk_wal::WAL_DIR);
    let holds_segments = std::fs::read_dir(&wal).is_ok_and(|mut d| d.next().is_some());
    if holds_segments {
        return Err(format!(
            "{} already holds WAL segments: initialize an empty DATA_DIR (a host whose data is gone joins on a new one)",
            wal.display()
        ));
    }
    Ok(())
}

fn random_id() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b) | 1)
}
