//! skipprd: an ingestion daemon with an exactly-once delivery contract.
//!
//! Commands: `run` (the daemon), `sim` (the deterministic simulator), the
//! operator tools `wal verify`, `offsets show`, `offsets reset` and
//! `offsets init-table`, and
//! `bench wal`.

mod alloc;
mod bench;
mod chaos;
mod cluster;
mod config;
mod exit;
mod explain;
mod letters;
mod logging;
mod run;
mod signals;
mod sim;
mod tools;

use clap::{Parser, Subcommand};
use config::WalStorage;
use std::path::PathBuf;

// glibc's allocator for the daemon, mimalloc for the simulator (alloc.rs).
#[global_allocator]
static GLOBAL: alloc::Allocator = alloc::Allocator;

#[derive(Parser)]
#[command(name = "skipprd", version, about = "An ingestion daemon with an exactly-once delivery contract.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: sources into a durable WAL, compacted batches out to
    /// sinks, exactly once. SIGTERM or SIGINT drains and exits 0.
    Run(Box<config::RunArgs>),
    /// Run the deterministic simulator: one seed, a sweep of seeds, or a
    /// replay of saved failures. Exit 0 if every run passes, 1 if any fails.
    Sim(sim::SimArgs),
    /// Inspect the WAL.
    #[command(subcommand)]
    Wal(WalCommand),
    /// Inspect or reset the offsets store.
    #[command(subcommand)]
    Offsets(OffsetsCommand),
    /// Benchmarks (see BENCHMARKS.md).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Clustered mode: give a DATA_DIR its cluster identity.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The records sinks refused, in the dead-letter destination.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
}

#[derive(Subcommand)]
enum DeadLettersCommand {
    /// List the dead letters of this pipeline and WAL, read from the
    /// destination the daemon's settings name (give the same flags, or
    /// --config): stream, source, partition and position of each refused
    /// record, its dead-letter batch, when and why it was refused.
    List(Box<letters::ListArgs>),
    /// Send the dead letters back through the pipeline, once their cause is
    /// fixed: the daemon's settings (the same flags, or --config; the daemon
    /// stopped), its own source paused, the letters the destination holds
    /// now as a source of their own. Each letter goes in once, through any
    /// crash: the WAL keeps how far the replay got, and a replay run again
    /// sends only the letters written since. A record refused again becomes
    /// a new dead letter. Stops when every letter is delivered.
    Replay(Box<letters::ReplayArgs>),
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Make an empty DATA_DIR one of a new cluster's first voters: writes
    /// the cluster id, this node's id and the first voters into its raft
    /// hard-state file, and prints the cluster id.
    Init(cluster::IdentityArgs),
    /// Make an empty DATA_DIR a host that joins an existing cluster under a
    /// new node id (a host whose data was lost): it starts as a learner, and
    /// the leader promotes it once it has caught up, removing the id it
    /// replaces for good.
    Join(cluster::IdentityArgs),
    /// Make a cluster CA and one TLS certificate per node for a quick
    /// start (keys at mode 0600); production clusters may use their own CA,
    /// with each node's certificate issued for `skippr-node-<ID>`.
    Certs(cluster::CertsArgs),
    /// Print what a running host knows of its cluster: its role, term,
    /// commit index and last index, and on the leader each other member's
    /// match index and lag (asked of the host's metrics address).
    Status(cluster::StatusArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The disk WAL's commit path against a plain append + fdatasync loop.
    Wal(bench::BenchWalArgs),
    /// The daemon's pipeline (generator, disk WAL, compaction, directory
    /// sink) against a plain program writing the same bytes with the same
    /// number of syncs.
    E2e(bench::BenchE2eArgs),
    /// A restart after a sink lagged until the WAL filled up (after a crash
    /// and after a clean stop): time to recovery and to the first delivery,
    /// peak RSS, and the rate the daemon scanned at (none when the stop
    /// record spared the scan), beside a plain read of the same segment
    /// files, through the page cache and with O_DIRECT.
    Recovery(bench::BenchRecoveryArgs),
}

#[derive(Subcommand)]
enum WalCommand {
    /// Check every segment, list what was found; exit 5 on corruption.
    /// With WAL_STORAGE=s3, the WAL in the bucket (read only).
    Verify {
        /// The daemon's DATA_DIR.
        #[arg(env = "DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        #[command(flatten)]
        wal: config::WalArgs,
        #[command(flatten)]
        aws: config::AwsArgs,
        /// Clustered mode: the digest starts at this LSN [default: the
        /// oldest group this host holds].
        #[arg(long, value_name = "LSN")]
        from: Option<u64>,
        /// Clustered mode: the digest ends at this LSN [default: the last
        /// group this host's saved commit index covers].
        #[arg(long, value_name = "LSN")]
        through: Option<u64>,
    },
}

#[derive(Subcommand)]
enum OffsetsCommand {
    /// Print every offsets entry: pipeline, source, partition, value, checkpoint.
    Show {
        #[arg(env = "DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        #[command(flatten)]
        store: tools::StoreArgs,
    },
    /// Forget stored offsets, so sources resume from what the WAL holds: the
    /// deliberate way out when the store is ahead of the WAL.
    Reset {
        #[arg(env = "DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
        /// Only this pipeline's entries.
        #[arg(long)]
        pipeline: Option<String>,
        /// Really do it.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        store: tools::StoreArgs,
    },
    /// Create the DynamoDB table that holds offsets and the S3 WAL's writer
    /// lease (string keys `pk` and `sk`, billed per request), and wait until
    /// it is active. An existing table is left alone.
    InitTable {
        #[command(flatten)]
        table: config::TableArgs,
        #[command(flatten)]
        aws: config::AwsArgs,
    },
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run(_)) {
        end_quietly_on_a_closed_pipe();
    }
    let code = match cli.command {
        Command::Run(args) => run::main(*args, run::Mode::Daemon),
        Command::DeadLetters(DeadLettersCommand::Replay(args)) => run::main(args.run, run::Mode::Replay),
        Command::DeadLetters(DeadLettersCommand::List(args)) => letters::list(*args),
        Command::Sim(args) => sim::main(args),
        Command::Wal(WalCommand::Verify { data_dir, wal, aws, from, through }) => match wal.storage() {
            Ok(WalStorage::Disk) => tools::wal_verify(&data_dir),
            Ok(WalStorage::Clustered) => tools::wal_verify_clustered(&data_dir, from, through),
            Ok(WalStorage::S3) => match &wal.s3_bucket {
                Some(bucket) => tools::wal_verify_s3(bucket, &wal.prefix(), &aws.settings()),
                None => {
                    eprintln!("skipprd wal verify: WAL_STORAGE=s3 needs the bucket: set SKIPPR_WAL_S3_BUCKET");
                    exit::CONFIG
                }
            },
            Err(e) => {
                eprintln!("skipprd wal verify: {e}");
                exit::CONFIG
            }
        },
        Command::Cluster(ClusterCommand::Init(args)) => cluster::identity(args, false),
        Command::Cluster(ClusterCommand::Join(args)) => cluster::identity(args, true),
        Command::Cluster(ClusterCommand::Certs(args)) => cluster::certs(args),
        Command::Cluster(ClusterCommand::Status(args)) => cluster::status(args),
        Command::Bench(BenchCommand::Wal(args)) => bench::wal(args),
        Command::Bench(BenchCommand::E2e(args)) => bench::e2e(args),
        Command::Bench(BenchCommand::Recovery(args)) => bench::recovery(args),
        Command::Offsets(OffsetsCommand::Show { data_dir, store }) => match store.table() {
            Some(table) => tools::dynamo_offsets(&table, &store, &data_dir, None),
            None => tools::offsets_show(&data_dir),
        },
        Command::Offsets(OffsetsCommand::Reset { data_dir, pipeline, yes, store }) => match store.table() {
            Some(table) => tools::dynamo_offsets(&table, &store, &data_dir, Some((pipeline.as_deref(), yes))),
            None => tools::offsets_reset(&data_dir, pipeline.as_deref(), yes),
        },
        Command::Offsets(OffsetsCommand::InitTable { table, aws }) => match table.dynamodb_table {
            Some(name) => tools::init_table(&name, &aws.settings()),
            None => {
                eprintln!("skipprd offsets init-table: say which table: set SKIPPR_OFFSET_DYNAMODB_TABLE");
                exit::USAGE
            }
        },
    };
    std::process::exit(code);
}

/// The tools and the simulator print for a reader that may go away
/// (`skipprd wal verify | head`): like other Unix tools they then end at
/// once, by SIGPIPE, instead of panicking on a failed print. The daemon
/// keeps Rust's default (SIGPIPE ignored), so a plugin that closes its
/// pipe is an error it handles, never its death.
fn end_quietly_on_a_closed_pipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: this runs first thing in main, before any other thread exists,
    // and installs the default disposition, which runs no handler code.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }.expect("SIGPIPE's default disposition can be restored");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// clap checks its definitions (ids unique, flags not declared twice)
    /// only in debug builds, and the suite runs optimized: check the two
    /// rules that flattened groups of settings can break, on every command.
    #[test]
    fn no_command_declares_an_id_or_a_flag_twice() {
        fn check(cmd: &clap::Command, path: &str) {
            let mut ids = std::collections::BTreeSet::new();
            let mut longs = std::collections::BTreeSet::new();
            for arg in cmd.get_arguments() {
                assert!(ids.insert(arg.get_id().to_string()), "{path}: the id {} twice", arg.get_id());
                if let Some(long) = arg.get_long() {
                    assert!(longs.insert(long.to_string()), "{path}: --{long} twice");
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&Cli::command(), "skipprd");
    }
}
