//! Every crash state of one run (issue #29): the real binary is not
//! deterministic, so one short `run --once` is traced through the file
//! system that forgets (`skippr_tests::forgetfs`), every change it made in
//! order, and from that trace every state a power cut could have left is
//! built (`forgetfs::crash_states`: after each change, with nothing unsynced
//! kept and with everything kept). On each, as ALICE did for real stores:
//! `wal verify` is clean, and a run started there finishes the input with
//! every record in the sink exactly once and every acknowledged record
//! among them. The source's acknowledgement log lives on the same mount,
//! written with `O_DSYNC`, so each crash state holds exactly the
//! acknowledgements made before it, and the source started on it never
//! sends below them. The same with a fault planted in a driver must fail.

use skippr_tests::forgetfs::mount::Mount;
use skippr_tests::forgetfs::{crash_states, write_view, Op, Rules, View};
use skippr_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// One enumeration at a time: each checks two states at once.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const PARTITIONS: u64 = 2;
const RECORDS: u64 = 400;

/// One `run --once` of the acknowledging source over DATA_DIR `data` into
/// the directory sink `sink`, acknowledgements logged to `acks`.
fn daemon(data: &Path, sink: &Path, acks: &Path, planted: Option<&str>) -> Command {
    let mut c = Command::new(skipprd_bin());
    let source = format!("python3 {}", repo_root().join("tests/plugins/source.py").display());
    c.args(["run", "--once", "--source", "command", "--source-command", &source])
        .args(["--data-dir", data.to_str().unwrap(), "--sink-dir", sink.to_str().unwrap()])
        .args(["--wal-bytes-per-file", "65536"])
        .env("STREAM", "events")
        .env("PARTITIONS", PARTITIONS.to_string())
        .env("RECORDS", RECORDS.to_string())
        .env("ACK_LOG", acks);
    if let Some(fault) = planted {
        c.env("SKIPPR_PLANTED_DRIVER_FAULTS", fault);
    }
    c
}

/// The changes one run made to an empty file system, in order.
fn traced_run(planted: Option<&str>) -> Vec<Op> {
    Mount::available().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let m = Mount::new(&dir).unwrap();
    m.record();
    let out = output_within(
        &mut daemon(&dir.join("data"), &dir.join("sink"), &dir.join("acked"), planted),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(0), "the traced run: {}", stderr(&out));
    m.take_trace()
}

/// What is wrong with crash state `view`, if anything: written out under
/// `dir`, checked, and run to the end.
fn check(view: &View, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).unwrap();
    write_view(view, dir).unwrap();
    let (data, sink) = (dir.join("data"), dir.join("sink"));
    // The acknowledgements made before the cut, where the source keeps them.
    let acks = dir.with_extension("acked");
    let _ = std::fs::remove_file(&acks);
    if let Some(Some(bytes)) = view.get("/acked") {
        std::fs::write(&acks, bytes).unwrap();
    }
    std::fs::remove_file(dir.join("acked")).ok();
    if data.join("wal").exists() {
        let out = skipprd(&["wal", "verify", data.to_str().unwrap()]);
        if out.status.code() != Some(0) {
            return Err(format!("wal verify: {}{}", stdout(&out), stderr(&out)));
        }
    }
    let out = output_within(&mut daemon(&data, &sink, &acks, None), Duration::from_secs(120));
    if out.status.code() != Some(0) {
        let text = stderr(&out);
        let why = text.lines().rev().find(|l| l.starts_with("skipprd run:")).unwrap_or(&text);
        return Err(format!("the run from it ended with {:?}: {why}", out.status.code()));
    }
    let lost = lost_acknowledgements(&acks, &sink, "events");
    if !lost.is_empty() {
        return Err(format!("acknowledgements lost: {}", lost.join("; ")));
    }
    std::panic::catch_unwind(|| assert_exactly_once(&sink, &["events"], PARTITIONS, RECORDS))
        .map_err(|e| format!("the sink: {}", e.downcast_ref::<String>().cloned().unwrap_or_default()))?;
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

struct Found {
    states: u64,
    checked: u64,
    /// The first state that failed: the op it follows, and why.
    failed: Option<(usize, String)>,
}

/// Every crash state of `trace`, checked two at a time; stops at the first
/// that fails.
fn check_all(trace: &[Op]) -> Found {
    let tmp = tempfile::tempdir().unwrap();
    let failed: Arc<Mutex<Option<(usize, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::sync_channel::<(usize, View, PathBuf)>(2);
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (rx, failed, stop, checked) = (rx.clone(), failed.clone(), stop.clone(), checked.clone());
            std::thread::spawn(move || loop {
                let Ok((at, view, dir)) = rx.lock().unwrap().recv() else { return };
                if stop.load(Ordering::Relaxed) {
                    continue;
                }
                let result = check(&view, &dir);
                checked.fetch_add(1, Ordering::Relaxed);
                if let Err(why) = result {
                    stop.store(true, Ordering::Relaxed);
                    let mut f = failed.lock().unwrap();
                    if f.as_ref().is_none_or(|(first, _)| at < *first) {
                        *f = Some((at, why));
                    }
                }
            })
        })
        .collect();
    let mut k = 0;
    let states = crash_states(trace, Rules::POSIX, |at, view| {
        if !stop.load(Ordering::Relaxed) {
            k += 1;
            tx.send((at, view, tmp.path().join(format!("state-{k}")))).unwrap();
        }
    })
    .unwrap();
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    let failed = failed.lock().unwrap().take();
    Found { states, checked: checked.load(Ordering::Relaxed), failed }
}

#[test]
fn every_crash_state_of_a_traced_run_recovers_with_every_record_once_and_no_acknowledgement_lost() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let trace = traced_run(None);
    let syncs = trace.iter().filter(|o| o.is_durability_call()).count();
    let found = check_all(&trace);
    println!(
        "{} changes traced ({syncs} durability calls): {} crash states, {} checked",
        trace.len(),
        found.states,
        found.checked
    );
    if let Some((at, why)) = found.failed {
        panic!("the crash state after op {at} ({:?}): {why}", trace.get(at.wrapping_sub(1)));
    }
    assert_eq!(found.checked, found.states);
    assert!(found.states > 100, "a run of {RECORDS} records per partition leaves many crash states");
}

#[test]
fn each_fault_planted_in_a_driver_is_caught_by_the_crash_states() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for fault in ["skip-segment-dir-sync", "ack-before-durable", "sink-link-unsynced"] {
        let trace = traced_run(Some(fault));
        let found = check_all(&trace);
        let (at, why) = found.failed.unwrap_or_else(|| panic!("{fault}: all {} crash states passed", found.states));
        println!("{fault}: caught at the crash state after op {at} of {}: {why}", trace.len());
    }
}
