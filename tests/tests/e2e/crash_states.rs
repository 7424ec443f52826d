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
use skippr_tests::forgetfs::{crash_states, write_view, Model, Op, View};
use skippr_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

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

/// The changes one run made to an empty file system, in order, and that
/// file system.
fn traced_run(planted: Option<&str>) -> (Model, Vec<Op>) {
    Mount::available().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let m = Mount::new(&dir).unwrap();
    let start = m.record();
    let out = output_within(
        &mut daemon(&dir.join("data"), &dir.join("sink"), &dir.join("acked"), planted),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(0), "the traced run: {}", stderr(&out));
    (start, m.take_trace())
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
fn check_all(start: Model, trace: &[Op]) -> Found {
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
    let states = crash_states(start, trace, |at, _, view| {
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
    let _one = both_cores();
    let (start, trace) = traced_run(None);
    let syncs = trace.iter().filter(|o| o.is_durability_call()).count();
    let found = check_all(start, &trace);
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
    let _one = both_cores();
    for fault in ["skip-segment-dir-sync", "ack-before-durable", "sink-link-unsynced"] {
        let (start, trace) = traced_run(Some(fault));
        let found = check_all(start, &trace);
        let (at, why) = found.failed.unwrap_or_else(|| panic!("{fault}: all {} crash states passed", found.states));
        println!("{fault}: caught at the crash state after op {at} of {}: {why}", trace.len());
    }
}

/// A leader's segment 3 and the manifest of a snapshot through it: a
/// snapshot group at LSN 11 (term 2), a fence at 12 (term 3), and a group
/// past the snapshot at 13.
fn leader_segment() -> (Vec<u8>, skippr_core::cluster::Manifest) {
    use skippr_core::cluster::Members;
    use skippr_core::cluster::{Manifest, ManifestSegment};
    use skippr_core::format::{encode_group, encode_header, Frame};
    use skippr_core::{Epoch, Lsn, SegmentId};
    let id = SegmentId(3);
    let mut bytes = encode_header(id, Epoch(2));
    let snap = Frame::Snapshot(skippr_core::testing::CommittedState::default().snapshot(false, &Default::default()));
    bytes.extend(encode_group(id, Epoch(2), Lsn(11), &[&snap]));
    bytes.extend(encode_group(id, Epoch(3), Lsn(12), &[&Frame::Fence]));
    let end = bytes.len() as u64;
    bytes.extend(encode_group(id, Epoch(3), Lsn(13), &[&Frame::Fence]));
    bytes.resize(8192, 0);
    let members = Members { cluster: 7, node: 2, segment_bytes: 8192, ..Members::default() };
    let segments = vec![ManifestSegment { id, bytes: end, size: 8192 }];
    (bytes, Manifest { index: 12, term: 3, sealed: false, segments, members })
}

/// A snapshot's install (clustered mode: a follower too far behind takes
/// the leader's segments and a new hard state in place of its own), traced
/// through the file system that forgets: every crash state it could leave
/// opens (finishing an install that was committed) to the old WAL and hard
/// state, or to the new ones, whole; never a mix, never an error.
#[test]
fn every_crash_state_of_a_snapshot_install_opens_to_the_old_wal_or_the_new_one_whole() {
    use skippr_core::cluster::{FILE_BYTES, SLOT_BYTES};
    use skippr_core::SegmentId;
    use skippr_io::disk_wal::{create_dir_durably, sync_dir, DiskWal};
    use skippr_io::hard_state_file::FILE_NAME;
    use std::io::Write;
    let _one = both_cores();
    Mount::available().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = Mount::new(&mnt).unwrap();
    // The follower, durably: an old segment 0 and a hard state of 0xaa.
    let data = mnt.join("data");
    create_dir_durably(&data, 0o700).unwrap();
    let wal = DiskWal::open(&data).unwrap();
    wal.create(SegmentId(0), b"old", 4096).unwrap();
    let mut state = std::fs::File::create(data.join(FILE_NAME)).unwrap();
    state.write_all(&vec![0xaa; FILE_BYTES]).unwrap();
    state.sync_all().unwrap();
    // Nothing stays open on the mount: it could not be unmounted.
    drop(state);
    sync_dir(&data).unwrap();
    let start = m.record();
    let (leader, manifest) = leader_segment();
    let end = manifest.segments[0].bytes as usize;
    let staging = wal.stage(&manifest).unwrap();
    for (segment, have, bytes) in staging.missing().unwrap() {
        let mut at = have as usize;
        while at < bytes as usize {
            let n = 100.min(bytes as usize - at);
            staging.write(segment, at as u64, &leader[at..at + n]).unwrap();
            at += n;
        }
    }
    wal.install(staging, &(SLOT_BYTES as u64, vec![0x55; 64])).unwrap();
    drop(wal);
    let trace = m.take_trace();
    drop(m);
    let (mut old, mut new) = (0, 0);
    let mut failed = None;
    let states = crash_states(start, &trace, |at, state, _| {
        if failed.is_some() {
            return;
        }
        // Opened on the model itself: a directory a cut left under two
        // names is one directory, as it would be on a disk.
        let dir = tmp.path().join(format!("state-{at}-{}", old + new));
        std::fs::create_dir(&dir).unwrap();
        let mount = Mount::with_model(&dir, state).unwrap();
        let data = dir.join("data");
        let opened = DiskWal::open(&data).and_then(|wal| {
            let (ids, strays) = wal.list()?;
            let first = match ids.first() {
                Some(id) => wal.read(*id)?.to_vec(),
                None => Vec::new(),
            };
            Ok((ids, strays, first, std::fs::read(data.join(FILE_NAME))?))
        });
        let verdict = match opened {
            Err(e) => Err(format!("opening it: {e}")),
            Ok((ids, strays, first, state)) if strays.is_empty() => {
                if ids == [SegmentId(0)] && first.starts_with(b"old") && state == vec![0xaa; FILE_BYTES] {
                    old += 1;
                    Ok(())
                } else if ids == [SegmentId(3)]
                    && first[..end] == leader[..end]
                    && state[..SLOT_BYTES] == vec![0xaa; SLOT_BYTES][..]
                    && state[SLOT_BYTES..SLOT_BYTES + 64] == [0x55; 64]
                {
                    new += 1;
                    Ok(())
                } else {
                    Err(format!("segments {ids:?}, hard state starting {:?}, a mix", &state.get(..4)))
                }
            }
            Ok((_, strays, ..)) => Err(format!("strays in the WAL: {strays:?}")),
        };
        match verdict {
            Ok(()) if dir.join("data/install.ready").exists() => {
                failed = Some((at, "the install was not finished at the open".to_string()))
            }
            Ok(()) => {}
            Err(why) => failed = Some((at, why)),
        }
        drop(mount);
    })
    .unwrap();
    if let Some((at, why)) = failed {
        panic!("the crash state after op {at} of {} ({:?}): {why}", trace.len(), trace.get(at.wrapping_sub(1)));
    }
    println!(
        "a snapshot install: {} changes, {states} crash states: {old} open to the old WAL, {new} to the new",
        trace.len()
    );
    assert!(old > 0 && new > 0, "both sides reached");
}
