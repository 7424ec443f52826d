//! `skipprd cluster init` and `cluster join`: give a DATA_DIR its cluster
//! identity (the raft hard-state file's first state). A clustered host
//! whose DATA_DIR has none refuses to start. The daemon itself does not run
//! clustered mode yet (issue #13); these write what it will read.

use crate::exit;
use skippr_core::replication::hard_state::{first_file, Members};
use skippr_core::Limits;
use skippr_io::hard_state_file::HardStateFile;
use std::io::Read;
use std::path::{Path, PathBuf};

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
}

fn parse_cluster_id(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s, 16)
        .map_err(|_| format!("'{s}' is not a cluster id: 16 hex digits, as `cluster init` printed"))
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
    println!("cluster {cluster:016x}: node {} in {}", args.node_id, args.data_dir.display());
    if join {
        println!("start it, then ask the leader to let node {} in (clustered daemons: issue #13)", args.node_id);
    }
    exit::OK
}

/// The DATA_DIR exists (created 0700) and holds no WAL of its own.
fn prepare(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
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
