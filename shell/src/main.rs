//! skipprd: an ingestion daemon with an exactly-once delivery contract.
//!
//! Commands: `sim` runs the deterministic simulator (one seed, a sweep, or a
//! replay of saved failures). The daemon's `run` command and the WAL and
//! offsets tools arrive with the disk driver.

mod exit;
mod sim;

use clap::{Parser, Subcommand};

// The simulator allocates a record buffer per record; mimalloc serves that
// pattern about a fifth faster than glibc's allocator (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "skipprd", version, about = "An ingestion daemon with an exactly-once delivery contract.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the deterministic simulator: one seed, a sweep of seeds, or a
    /// replay of saved failures. Exit 0 if every run passes, 1 if any fails.
    Sim(sim::SimArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Sim(args) => sim::main(args),
    };
    std::process::exit(code);
}
