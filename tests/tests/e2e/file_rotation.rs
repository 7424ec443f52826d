//! The file source through what happens to log files: rename-and-recreate
//! rotation, `copytruncate`, files that vanish, and a data directory written
//! by the file source's earlier form. Every line reaches the sink once.

use skippr_tests::*;
use std::path::Path;
use std::process::Command;

fn run_once(data: &Path, input: &Path) -> std::process::Output {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap(), "--wal-bytes-per-file", "65536"]).args([
        "--source",
        "file",
        "--file-dir",
        input.to_str().unwrap(),
        "--file-follow",
        "false",
    ]);
    output_within(&mut cmd, PATIENCE)
}

fn ok(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    stderr(out)
}

/// Every line in the sink, sorted.
fn sink_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for stream in std::fs::read_dir(dir).into_iter().flatten() {
        for file in std::fs::read_dir(stream.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if path.extension().is_some_and(|x| x == "jsonl") && !hidden {
                lines.extend(std::fs::read_to_string(&path).unwrap().lines().map(str::to_string));
            }
        }
    }
    lines.sort();
    lines
}

fn numbered(prefix: &str, range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("{{\"{prefix}\":{i}}}\n")).collect()
}

fn expected(parts: &[(&str, std::ops::Range<u32>)]) -> Vec<String> {
    let mut all: Vec<String> =
        parts.iter().flat_map(|(p, r)| r.clone().map(move |i| format!("{{\"{p}\":{i}}}"))).collect();
    all.sort();
    all
}

fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (data, input) = (tmp.path().join("data"), tmp.path().join("input"));
    std::fs::create_dir_all(&input).unwrap();
    (tmp, data, input)
}

#[test]
fn rename_and_recreate_rotation_loses_and_repeats_nothing() {
    let (_tmp, data, input) = setup();
    let log = input.join("app.jsonl");
    std::fs::write(&log, numbered("a", 0..100)).unwrap();
    ok(&run_once(&data, &input));
    // More lines reach the old file, logrotate renames it (out of the
    // `*.jsonl` pattern) and the writer starts a new one.
    std::fs::write(&log, numbered("a", 0..150)).unwrap();
    std::fs::rename(&log, input.join("app.jsonl.1")).unwrap();
    std::fs::write(&log, numbered("b", 0..40)).unwrap();
    ok(&run_once(&data, &input));
    // The next run: the new file grew, the rotated one is removed.
    std::fs::write(&log, numbered("b", 0..60)).unwrap();
    std::fs::remove_file(input.join("app.jsonl.1")).unwrap();
    ok(&run_once(&data, &input));
    assert_eq!(sink_lines(&data.join("sink")), expected(&[("a", 0..150), ("b", 0..60)]));
}

#[test]
fn a_truncated_file_is_read_again_from_its_start_with_a_warning() {
    let (_tmp, data, input) = setup();
    let log = input.join("app.jsonl");
    std::fs::write(&log, numbered("a", 0..100)).unwrap();
    ok(&run_once(&data, &input));
    // copytruncate: the file is emptied in place, and the writer goes on.
    std::fs::write(&log, numbered("b", 0..30)).unwrap();
    let text = ok(&run_once(&data, &input));
    assert!(text.contains("the file was truncated") && text.contains("may be lost"), "{text}");
    assert_eq!(sink_lines(&data.join("sink")), expected(&[("a", 0..100), ("b", 0..30)]));
}

#[test]
fn a_vanished_file_is_logged_and_forgotten() {
    let (_tmp, data, input) = setup();
    std::fs::write(input.join("gone.jsonl"), numbered("g", 0..10)).unwrap();
    std::fs::write(input.join("kept.jsonl"), numbered("k", 0..10)).unwrap();
    ok(&run_once(&data, &input));
    std::fs::remove_file(input.join("gone.jsonl")).unwrap();
    std::fs::write(input.join("kept.jsonl"), numbered("k", 0..20)).unwrap();
    let text = ok(&run_once(&data, &input));
    assert!(text.contains("vanished"), "{text}");
    assert_eq!(sink_lines(&data.join("sink")), expected(&[("g", 0..10), ("k", 0..20)]));
}

/// `tests/fixtures/file-source-v1.tgz` is a data directory and its input
/// written by the file source's earlier form (positions that are plain
/// byte offsets, checkpoints that are bare names): `app.jsonl` with lines
/// `{"n":0..100}` and `other.jsonl` with `{"m":0..50}`, read by
/// `skipprd run --once --source file --file-follow false
/// --wal-bytes-per-file 65536`.
#[test]
fn a_data_directory_of_the_earlier_file_source_keeps_working() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = repo_root().join("tests/fixtures/file-source-v1.tgz");
    let untar = Command::new("tar").args(["xzf", fixture.to_str().unwrap(), "-C"]).arg(tmp.path()).status().unwrap();
    assert!(untar.success());
    let (data, input) = (tmp.path().join("data"), tmp.path().join("input"));
    assert_eq!(sink_lines(&data.join("sink")), expected(&[("m", 0..50), ("n", 0..100)]));
    let mut more = std::fs::read_to_string(input.join("app.jsonl")).unwrap();
    more.push_str(&numbered("n", 100..120));
    std::fs::write(input.join("app.jsonl"), more).unwrap();
    ok(&run_once(&data, &input));
    assert_eq!(sink_lines(&data.join("sink")), expected(&[("m", 0..50), ("n", 0..120)]), "nothing read twice");
}
