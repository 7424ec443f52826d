//! `skipprd bench wal`: the disk WAL's durable commit path against a plain
//! append + `fdatasync` loop, in alternating rounds in one process, 100-byte
//! records, a commit every 64 records. Prints each round, the median ratio
//! and the file system it ran on; refuses tmpfs, where fsync costs nothing.

use super::{median, prepare_dir};
use crate::exit;
use clap::Args;
use skippr_core::format::{encode_group, encode_header, Frame, Record, SourceBatch, SEGMENT_HEADER_BYTES};
use skippr_core::{Epoch, Lsn, PartitionKey, Position, SegmentId, SourceId, StreamId};
use skippr_io::DiskWal;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const RECORD_BYTES: usize = 100;
const RECORDS_PER_COMMIT: usize = 64;

#[derive(Args, Debug)]
pub struct BenchWalArgs {
    /// Where to write (never tmpfs).
    #[arg(long, value_name = "DIR", default_value = "./data/bench")]
    dir: PathBuf,
    /// Rounds of each kind, alternating.
    #[arg(long, default_value_t = 7)]
    rounds: u32,
    /// Commits per round.
    #[arg(long, default_value_t = 300)]
    commits: u32,
}

pub fn wal(args: BenchWalArgs) -> i32 {
    if let Err(code) = prepare_dir("wal", &args.dir) {
        return code;
    }
    println!(
        "{RECORD_BYTES}-byte records, a commit every {RECORDS_PER_COMMIT} records, {} commits a round",
        args.commits
    );
    let mut ratios = Vec::new();
    let mut wal_rates = Vec::new();
    let mut plain_rates = Vec::new();
    for round in 0..args.rounds {
        // Alternate which goes first, so neither always finds a warm disk.
        let (w, p) = if round % 2 == 0 {
            let w = wal_round(&args.dir, args.commits);
            (w, plain_round(&args.dir, args.commits))
        } else {
            let p = plain_round(&args.dir, args.commits);
            (wal_round(&args.dir, args.commits), p)
        };
        let (w, p) = match (w, p) {
            (Ok(w), Ok(p)) => (w, p),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("skipprd bench wal: a round failed under {}: {e}", args.dir.display());
                return exit::FAILED;
            }
        };
        println!("round {round}: wal {w:.0} commits/s, plain {p:.0} commits/s, ratio {:.2}", w / p);
        ratios.push(w / p);
        wal_rates.push(w);
        plain_rates.push(p);
    }
    println!(
        "median: wal {:.0} commits/s, plain {:.0} commits/s, ratio {:.2}",
        median(&mut wal_rates),
        median(&mut plain_rates),
        median(&mut ratios)
    );
    exit::OK
}

/// Commits per second through the disk WAL: encode a group of 64 records,
/// then one positioned write into a preallocated segment that returns once
/// the bytes are durable (`RWF_DSYNC`, as the daemon appends).
fn wal_round(dir: &Path, commits: u32) -> std::io::Result<f64> {
    let records: Vec<Record> = (0..RECORDS_PER_COMMIT)
        .map(|i| Record { position: Position(i as u64), bytes: vec![b'x'; RECORD_BYTES] })
        .collect();
    let group_bytes = 16 * 1024;
    let segment_bytes = SEGMENT_HEADER_BYTES as u64 + commits as u64 * group_bytes;
    let wal = DiskWal::open(&dir.join("wal-round"))?;
    let segment = SegmentId(0);
    // Created ahead of need, as the daemon does: not timed.
    wal.create(segment, &encode_header(segment, Epoch(1)), segment_bytes)?;
    let mut offset = SEGMENT_HEADER_BYTES as u64;
    let started = Instant::now();
    for i in 0..commits {
        let frame = Frame::SourceBatch(SourceBatch {
            key: PartitionKey { source: SourceId(0), partition: 0 },
            stream: StreamId(0),
            end: Position((i as u64 + 1) * RECORDS_PER_COMMIT as u64),
            checkpoint: None,
            records: records.clone(),
            counted: None,
            provisional: false,
        });
        let bytes = encode_group(segment, Epoch(1), Lsn(i as u64), &[&frame]);
        wal.append(segment, offset, &bytes)?;
        offset += bytes.len() as u64;
    }
    let rate = commits as f64 / started.elapsed().as_secs_f64();
    wal.delete(segment)?;
    Ok(rate)
}

/// Commits per second of the plain loop: append 64 records' bytes to a file,
/// `fdatasync`.
fn plain_round(dir: &Path, commits: u32) -> std::io::Result<f64> {
    let path = dir.join("plain-round");
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new().create_new(true).append(true).mode(0o600).open(&path)?;
    let chunk = vec![b'x'; RECORD_BYTES * RECORDS_PER_COMMIT];
    let started = Instant::now();
    for _ in 0..commits {
        file.write_all(&chunk)?;
        file.sync_data()?;
    }
    let rate = commits as f64 / started.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(rate)
}
