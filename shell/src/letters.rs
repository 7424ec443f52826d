//! `skipprd dead-letters list`: the dead letters of this pipeline and WAL,
//! read from the destination the run's own settings name, one line each:
//! where the record came from, which batch held it, when and why it was
//! refused. `skipprd dead-letters replay` reads them the same way and runs
//! the engine with them as a source (`run::Mode::Replay`).

use crate::config::{resolve, DeadLetterConfig, DeadLetterTo, RunArgs, RunConfig, WalConfig};
use crate::exit;
use skippr_core::ledger::Scope;
use skippr_io::plugin::dir_sink::HeldBatch;
use std::io::Write;

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The daemon's settings (flags, environment, --config file): the same
    /// as it runs with, so that the same destination is read.
    #[command(flatten)]
    pub run: RunArgs,
    /// Only the dead letters of this stream.
    #[arg(long = "only-stream", value_name = "NAME")]
    pub only_stream: Option<String>,
    /// Print each dead letter as it is stored (one JSON object per line:
    /// the record's bytes, stream, source, partition, position,
    /// compaction_id, seq, reason, decided_at) instead of a table.
    #[arg(long = "raw")]
    pub raw: bool,
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The daemon's settings (flags, environment, --config file): the same
    /// as it runs with, so that the same WAL, sink and dead-letter
    /// destination are used.
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn list(args: ListArgs) -> i32 {
    let fail = |code: i32, e: String| {
        eprintln!("skipprd dead-letters list: {e}");
        code
    };
    let cfg = match resolve(&args.run) {
        Ok(cfg) => cfg,
        Err(e) => return fail(exit::CONFIG, e),
    };
    let Some(DeadLetterConfig { to, .. }) = &cfg.dead_letter else {
        return fail(
            exit::CONFIG,
            "--dead-letter is off in these settings, so nothing was ever sent to dead letters: give the settings the \
             daemon runs with (--dead-letter dir, postgres or s3, and where)"
                .into(),
        );
    };
    let Some(identity) = wal_identity(&cfg) else {
        // A WAL never made has no dead letters.
        return print(&[], &args);
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    match runtime.block_on(read_held(&cfg, to, &identity)) {
        Ok(batches) => print(&batches, &args),
        Err(e) => fail(exit::REMOTE, e),
    }
}

/// Every dead-letter batch of this pipeline and WAL (`identity`) that the
/// destination `to` holds, in stream and number order.
pub async fn read_held(cfg: &RunConfig, to: &DeadLetterTo, identity: &str) -> Result<Vec<HeldBatch>, String> {
    let scope = Scope::new(&cfg.pipeline, identity);
    match to {
        DeadLetterTo::Dir(dir) => skippr_io::plugin::dir_sink::read_scope(dir, &scope)
            .map_err(|e| format!("reading the dead letters under {}: {e}", dir.display())),
        DeadLetterTo::Postgres(p) => {
            let settings = p.settings(&[])?;
            // The client blocks on a runtime of its own: not on this one's thread.
            std::thread::scope(|s| {
                s.spawn(|| skippr_io::plugin::postgres_sink::read_schema(&settings, &cfg.pipeline, identity)).join()
            })
            .expect("reading the postgres dead letters panicked")
            .map_err(|e| format!("reading the dead letters in schema {}: {e}", settings.schema))
        }
        DeadLetterTo::S3(t) => {
            let sdk = cfg.aws.load().await?;
            let target = skippr_io::plugin::s3_sink::S3SinkTarget::connect(&sdk, &t.bucket, &t.prefix, t.gzip).await?;
            target.read_scope(&scope).await
        }
    }
}

/// The WAL's identity, as the daemon names it in its destinations; `None`
/// for a disk WAL that was never made (read only: nothing is created).
fn wal_identity(cfg: &RunConfig) -> Option<String> {
    match &cfg.wal {
        WalConfig::S3 { bucket, prefix } => {
            Some(skippr_io::dynamo::wal_identity(Some((bucket, prefix)), &cfg.data_dir))
        }
        WalConfig::Disk => skippr_io::disk_wal::read_wal_identity(&cfg.data_dir).ok().flatten(),
        WalConfig::Clustered(_) => crate::cluster::wal_identity(&cfg.data_dir).ok(),
    }
}

fn print(batches: &[HeldBatch], args: &ListArgs) -> i32 {
    let mut out = std::io::stdout().lock();
    if !args.raw {
        let _ = writeln!(out, "STREAM\tSOURCE\tPARTITION\tPOSITION\tDEAD-LETTER BATCH\tDECIDED AT\tREASON");
    }
    let mut count = 0;
    for (stream, seq, bytes) in batches {
        if args.only_stream.as_ref().is_some_and(|s| s != stream) {
            continue;
        }
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            count += 1;
            if args.raw {
                let _ = out.write_all(line);
                let _ = out.write_all(b"\n");
                continue;
            }
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
                let _ = writeln!(out, "{stream}\t?\t?\t?\t{seq}\t?\t(not a dead letter: {} bytes)", line.len());
                continue;
            };
            let text =
                |k: &str| v[k].as_str().map(|s| s.escape_debug().to_string()).unwrap_or_else(|| v[k].to_string());
            let _ = writeln!(
                out,
                "{stream}\t{}\t{}\t{}\t{seq}\t{}\t{}",
                text("source"),
                v["partition"],
                v["position"],
                text("decided_at"),
                text("reason")
            );
        }
    }
    if !args.raw {
        let _ = writeln!(out, "{count} dead letter(s)");
    }
    exit::OK
}
