//! `skipprd bench e2e`: the daemon's whole pipeline (built-in generator →
//! disk WAL → compaction → directory sink, `skipprd run --once` on a fresh
//! data directory, as a child process) against a plain program that writes
//! the same bytes with the same number of syncs: the WAL's bytes appended to
//! one file in as many `fdatasync`ed writes as the daemon made commits, and
//! the sink's bytes in as many files as it wrote, each written, fsynced,
//! renamed and its directory fsynced, the two writers in two threads as the
//! daemon's are. Rounds alternate; a `--baseline` build runs beside them.

use super::{median, prepare_dir};
use crate::exit;
use clap::Args;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchE2eArgs {
    /// Where to write (never tmpfs).
    #[arg(long, value_name = "DIR", default_value = "./data/bench-e2e")]
    dir: PathBuf,
    /// Records per round, over two streams of two partitions each.
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Rounds of each kind, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Another skipprd binary (an earlier build) whose pipeline runs beside
    /// this one's in every round.
    #[arg(long, value_name = "PATH")]
    baseline: Option<PathBuf>,
}

/// What one pipeline run did, from its last line and its sink directory.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    records: u64,
    commits: u64,
    wal_bytes: u64,
    files: u64,
    sink_bytes: u64,
    seconds: f64,
}

pub fn e2e(args: BenchE2eArgs) -> i32 {
    if let Err(code) = prepare_dir("e2e", &args.dir) {
        return code;
    }
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipprd bench e2e: cannot find this program's path: {e}");
            return exit::FAILED;
        }
    };
    println!("{} records of the built-in generator a round, two streams of two partitions", args.records);
    let (mut ratios, mut pipeline, mut plain, mut against) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let result = (|| -> Result<String, String> {
            let run = pipeline_round(&me, &args.dir, args.records)?;
            let base = match &args.baseline {
                Some(b) => Some(pipeline_round(b, &args.dir, args.records)?),
                None => None,
            };
            let plain_s = plain_round(&args.dir, &run).map_err(|e| format!("the plain program failed: {e}"))?;
            let (p, q) = (run.records as f64 / run.seconds, run.records as f64 / plain_s);
            pipeline.push(p);
            plain.push(q);
            ratios.push(p / q);
            let mut line = format!(
                "round {round}: pipeline {p:.0} records/s ({} commits, {} WAL bytes, {} sink files), plain {q:.0} \
                 records/s, ratio {:.2}",
                run.commits,
                run.wal_bytes,
                run.files,
                p / q
            );
            if let Some(b) = base {
                let r = b.records as f64 / b.seconds;
                against.push(p / r);
                line.push_str(&format!(", baseline {r:.0} records/s, pipeline/baseline {:.2}", p / r));
            }
            Ok(line)
        })();
        match result {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("skipprd bench e2e: round {round} under {}: {e}", args.dir.display());
                return exit::FAILED;
            }
        }
    }
    let mut summary = format!(
        "median: pipeline {:.0} records/s, plain {:.0} records/s, ratio {:.2}",
        median(&mut pipeline),
        median(&mut plain),
        median(&mut ratios)
    );
    if !against.is_empty() {
        summary.push_str(&format!(", pipeline/baseline {:.2}", median(&mut against)));
    }
    println!("{summary}");
    exit::OK
}

/// Runs `bin run --once` on a fresh data directory and reads what it did.
fn pipeline_round(bin: &Path, dir: &Path, records: u64) -> Result<Run, String> {
    let data = dir.join("pipeline");
    let _ = std::fs::remove_dir_all(&data);
    let per_partition = (records / 4).max(1).to_string();
    let out = Command::new(bin)
        .args(["run", "--once", "--generator-streams", "a,b", "--generator-partitions", "2"])
        .args(["--generator-records", &per_partition, "--data-dir"])
        .arg(&data)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!("{} run exited with {}", bin.display(), out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let field = |name: &str| -> Option<f64> {
        let at = line.find(&format!("{name}: "))? + name.len() + 2;
        line[at..].split([',', 's']).next()?.trim().parse().ok()
    };
    let mut run = Run {
        records: field("records").ok_or_else(|| format!("no record count in its last line: {line}"))? as u64,
        commits: field("commits").unwrap_or(0.0) as u64,
        // An earlier build may not print it; only this build's run feeds the plain program.
        wal_bytes: field("wal bytes").unwrap_or(0.0) as u64,
        seconds: field("elapsed").ok_or_else(|| format!("no elapsed time in its last line: {line}"))?,
        ..Run::default()
    };
    for stream in ["a", "b"] {
        let entries = std::fs::read_dir(data.join("sink").join(stream)).map_err(|e| format!("no sink files: {e}"))?;
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with('.') {
                run.files += 1;
                run.sink_bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    std::fs::remove_dir_all(&data).map_err(|e| format!("cannot remove {}: {e}", data.display()))?;
    Ok(run)
}

/// Seconds for the plain program to write what `run` wrote.
fn plain_round(dir: &Path, run: &Run) -> std::io::Result<f64> {
    let work = dir.join("plain");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("a"))?;
    std::fs::create_dir_all(work.join("b"))?;
    let started = Instant::now();
    let (commits, wal_bytes) = (run.commits.max(1), run.wal_bytes);
    let wal_dir = work.clone();
    let wal = std::thread::spawn(move || -> std::io::Result<()> {
        let mut f = OpenOptions::new().create_new(true).append(true).mode(0o600).open(wal_dir.join("wal"))?;
        let chunk = vec![b'x'; (wal_bytes / commits) as usize];
        for _ in 0..commits {
            f.write_all(&chunk)?;
            f.sync_data()?;
        }
        Ok(())
    });
    let files = run.files.max(1);
    let body = vec![b'y'; (run.sink_bytes / files) as usize];
    for i in 0..files {
        let dir = work.join(if i % 2 == 0 { "a" } else { "b" });
        let tmp = dir.join(format!(".tmp-{i}"));
        let mut f = OpenOptions::new().create(true).write(true).truncate(true).mode(0o644).open(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(format!("{i:020}.jsonl")))?;
        File::open(&dir)?.sync_all()?;
    }
    wal.join().expect("the WAL writer does not panic")?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&work)?;
    Ok(seconds)
}
