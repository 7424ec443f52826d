//! Destinations written before names carried a pipeline tag keep working.
//!
//! `tests/fixtures/dir-sink-v1.tgz` is a data directory written by the
//! daemon before this rule (`skipprd run --once --wal-bytes-per-file 1048576
//! --generator-records 2000 --generator-rate 2000`, SIGKILLed after about
//! 1.5 s), its directory sink under `data/sink` in the old names
//! (`<seq>-<id>.jsonl`). Its last batch, 14, was planned in the WAL and is
//! in the sink, but its application was never acknowledged: the daemon
//! was killed between the two. (Made so on purpose: the sink's stream
//! folder was replaced by a file while the daemon ran, so batch 14 stayed
//! planned; after the kill the folder came back, and the same old daemon,
//! run on a copy, applied batch 14 there; that one file was copied in.)
//! So the next start must find batch 14 already applied, under its old
//! name, and not write it again.

use skippr_tests::*;
use std::path::Path;
use std::process::Command;

fn unpack(into: &Path) -> std::path::PathBuf {
    let fixture = repo_root().join("tests/fixtures/dir-sink-v1.tgz");
    let untar = Command::new("tar").args(["xzf", fixture.to_str().unwrap(), "-C"]).arg(into).status().unwrap();
    assert!(untar.success());
    into.join("data")
}

fn resume(data: &Path) -> std::process::Output {
    Command::new(skipprd_bin())
        .args(["run", "--once", "--data-dir", data.to_str().unwrap()])
        .args(["--wal-bytes-per-file", "1048576", "--generator-records", "2000"])
        .output()
        .unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn a_directory_sink_of_before_pipeline_tags_is_resumed_without_a_batch_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let data = unpack(tmp.path());
    let sink = data.join("sink");
    let before = names(&sink.join("events"));
    assert_eq!(before.len(), 15, "batches 0..=14 in the old names: {before:?}");
    let out = resume(&data);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("open_compactions=1"), "batch 14 is open at recovery: {}", stderr(&out));
    assert_exactly_once(&sink, &["events"], 2, 2000);
    // The old batches stay as they were; new ones carry the tag, numbered on.
    let after = names(&sink.join("events"));
    assert_eq!(after[..15], before[..], "the old names untouched");
    let owner = std::fs::read_to_string(sink.join(".skippr/legacy-owner")).unwrap();
    let tag = owner.trim();
    assert!(tag.starts_with("main-"), "{owner}");
    assert!(after.len() > 15, "new batches: {after:?}");
    for name in &after[15..] {
        assert!(name.starts_with(&format!("{tag}.")), "{name}");
    }
    assert!(after[15].starts_with(&format!("{tag}.00000000000000000015-")), "numbered on: {after:?}");
}

/// The same directory claimed by another pipeline: batch 14 is not this
/// one's, so it is written again under its tag, and the exactly-once check
/// above would name the duplicate. Shows that check can fail here.
#[test]
fn without_the_old_batches_the_replay_would_be_a_duplicate() {
    let tmp = tempfile::tempdir().unwrap();
    let data = unpack(tmp.path());
    let sink = data.join("sink");
    std::fs::create_dir(sink.join(".skippr")).unwrap();
    std::fs::write(sink.join(".skippr/legacy-owner"), "another-0123456789abcdef\n").unwrap();
    let out = resume(&data);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let failed = std::panic::catch_unwind(|| assert_exactly_once(&sink, &["events"], 2, 2000));
    let why = failed.expect_err("batch 14 twice passed the check");
    let why = why.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(why.contains("repeated"), "{why}");
}
