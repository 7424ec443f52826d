//! `skipprd run` on a real disk: the embedded default, resuming, the lock,
//! signals, and bad input that must fail clearly without losing data.

use skippr_tests::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn run(data: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", "--once", "--data-dir", data.to_str().unwrap()];
    args.extend_from_slice(extra);
    skipprd(&args)
}

fn summary_records(out: &std::process::Output) -> u64 {
    let text = stdout(out);
    let line = text.lines().find(|l| l.starts_with("records: ")).unwrap_or_else(|| panic!("no summary: {text}"));
    line["records: ".len()..].split(',').next().unwrap().parse().unwrap()
}

#[test]
fn once_with_defaults_delivers_everything_exactly_once_and_a_rerun_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = run(&data, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary = stdout(&out);
    for field in ["records: 20000", "commits: ", "compactions: ", "elapsed: ", "records/s: ", "ack p99: "] {
        assert!(summary.contains(field), "{field} missing from {summary}");
    }
    // Every batch waited for a commit: a measured, positive ack latency.
    let p50: f64 = summary.split("ack p50: ").nth(1).and_then(|r| r.split("ms").next()).unwrap().parse().unwrap();
    assert!(p50 > 0.0, "{summary}");
    assert_exactly_once(&data.join("sink"), &["events"], 2, 10_000);
    let again = run(&data, &[]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(summary_records(&again), 0, "a second run resumes instead of re-ingesting");
    assert!(
        stdout(&again).contains("ack p50: -, ack p99: -, acked in: -"),
        "nothing read, nothing measured: {}",
        stdout(&again)
    );
    assert_exactly_once(&data.join("sink"), &["events"], 2, 10_000);
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    assert!(stdout(&verify).contains("ok: "), "{}", stdout(&verify));
}

#[test]
fn a_wal_size_limit_under_two_segments_is_refused_naming_both_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = run(&data, &["--wal-bytes-per-file", "1048576", "--wal-max-bytes", "2097151"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = stderr(&out);
    // Named as they were set: by their flags here.
    assert!(text.contains("--wal-max-bytes (2097151) must be at least two WAL segments"), "{text}");
    assert!(text.contains("2 x --wal-bytes-per-file"), "{text}");
    assert!(!data.join("wal").exists(), "nothing is written");
}

#[test]
fn with_no_record_cache_every_record_is_read_back_from_the_wal_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out =
        run(&data, &["--generator-records", "30000", "--wal-bytes-per-file", "1048576", "--record-cache-bytes", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events"], 2, 30_000);
}

#[test]
fn segments_roll_and_old_ones_are_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = run(&data, &["--generator-records", "50000", "--wal-bytes-per-file", "1048576"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events"], 2, 50_000);
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    let text = stdout(&verify);
    assert!(text.lines().all(|l| !l.starts_with("00000000000000000000.seg")), "segment 0 was deleted: {text}");
}

#[test]
fn deleting_the_offsets_store_is_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    assert_eq!(run(&data, &[]).status.code(), Some(0));
    let before = stdout(&skipprd(&["offsets", "show", data.to_str().unwrap()]));
    std::fs::remove_file(data.join("offsets.redb")).unwrap();
    let out = run(&data, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(summary_records(&out), 0);
    let after = stdout(&skipprd(&["offsets", "show", data.to_str().unwrap()]));
    assert_eq!(before, after, "rebuilt from the WAL");
    assert!(after.contains("position=10000"), "{after}");
    assert_exactly_once(&data.join("sink"), &["events"], 2, 10_000);
}

#[test]
fn offsets_ahead_of_the_wal_stop_and_reset_is_the_way_out() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    assert_eq!(run(&a, &[]).status.code(), Some(0));
    std::fs::create_dir_all(&b).unwrap();
    std::fs::copy(a.join("offsets.redb"), b.join("offsets.redb")).unwrap();
    let out = run(&b, &[]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("skipprd offsets reset"), "{}", stderr(&out));
    let refused = skipprd(&["offsets", "reset", b.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2), "reset asks for --yes");
    let reset = skipprd(&["offsets", "reset", b.to_str().unwrap(), "--yes"]);
    assert_eq!(reset.status.code(), Some(0), "{}", stderr(&reset));
    let out = run(&b, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&b.join("sink"), &["events"], 2, 10_000);
}

#[test]
fn a_bit_flip_in_a_committed_segment_fails_closed_naming_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    assert_eq!(run(&data, &["--generator-records", "3000"]).status.code(), Some(0));
    let seg = data.join("wal").join("00000000000000000000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[40] ^= 0x04; // inside the first group (snapshot and fence); later groups follow
    std::fs::write(&seg, &bytes).unwrap();
    // The run stopped cleanly and left a stop record, which checks headers
    // and last groups only: a start from it would not read this group (no
    // sink needs it). Without the record, as after a crash, the scan finds
    // the flip.
    std::fs::remove_file(data.join("stop-record")).unwrap();
    let out = run(&data, &["--generator-records", "3000"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("00000000000000000000.seg at byte 32"), "{err}");
    assert!(err.contains("skipprd wal verify"), "says what to do: {err}");
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(5));
    assert!(stdout(&verify).contains("CORRUPT"), "{}", stdout(&verify));
}

#[test]
fn a_torn_final_group_is_dropped_and_its_records_read_again() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    assert_eq!(run(&data, &["--generator-records", "3000"]).status.code(), Some(0));
    // Tear the last group: zero its final bytes (the commit record).
    let verify = stdout(&skipprd(&["wal", "verify", data.to_str().unwrap()]));
    let used: usize = verify
        .lines()
        .find(|l| l.starts_with("00000000000000000000.seg"))
        .and_then(|l| l.split(", ").find_map(|f| f.strip_suffix(" bytes used")))
        .unwrap()
        .parse()
        .unwrap();
    let seg = data.join("wal").join("00000000000000000000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[used - 10..used].fill(0);
    std::fs::write(&seg, &bytes).unwrap();
    let out = run(&data, &["--generator-records", "3000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events"], 2, 3000);
}

#[test]
fn a_stray_file_in_the_wal_directory_is_reported_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("wal")).unwrap();
    std::fs::write(data.join("wal").join("notes.txt"), b"not a segment").unwrap();
    let out = run(&data, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a segment"), "{}", stderr(&out));
    assert!(data.join("wal").join("notes.txt").exists());
    assert_exactly_once(&data.join("sink"), &["events"], 2, 10_000);
}

#[test]
fn configuration_errors_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = Command::new(skipprd_bin())
        .args(["run", "--once", "--data-dir", data.to_str().unwrap()])
        .env("WAL_STORAGE", "tape")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("unknown WAL_STORAGE 'tape'"), "{}", stderr(&out));
    // A data directory that cannot exist: its parent is a file.
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let out = run(&file.join("data"), &[]);
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("cannot create DATA_DIR"), "{}", stderr(&out));
}

#[test]
fn a_second_daemon_refuses_and_sigterm_drains_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut first = Command::new(skipprd_bin())
        .args(["run", "--data-dir", data.to_str().unwrap(), "--generator-records", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_dir_sink(&data.join("sink")).is_empty() {
        assert!(Instant::now() < deadline, "the first daemon delivers something");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = run(&data, &[]);
    assert_eq!(second.status.code(), Some(4));
    assert!(stderr(&second).contains("another skipprd is running"), "{}", stderr(&second));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = first.wait().unwrap();
    assert_eq!(status.code(), Some(0), "SIGTERM drains and exits 0");
    // Everything read was delivered: each partition is a gapless prefix.
    for (key, seqs) in read_dir_sink(&data.join("sink")) {
        assert!(seqs.iter().enumerate().all(|(i, s)| *s == i as u64), "{key:?} is a gapless prefix");
    }
    // It left a stop record, readable by its owner only, and the next start
    // uses it instead of scanning the WAL, then goes on as after any stop.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(data.join("stop-record")).expect("a stop record").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let next = run(&data, &[]);
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    let log = stderr(&next);
    assert!(log.contains("stop_record=\"used\""), "{log}");
    for (key, seqs) in read_dir_sink(&data.join("sink")) {
        assert!(seqs.iter().enumerate().all(|(i, s)| *s == i as u64), "{key:?} is a gapless prefix");
    }
}

#[test]
fn the_file_source_delivers_each_complete_line_once_across_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let input = tmp.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    let line = |p: u64, s: u64| format!("{{\"stream\":\"lines\",\"partition\":{p},\"seq\":{s}}}\n");
    let write = |name: &str, p: u64, seqs: std::ops::Range<u64>, tail: &str| {
        let body: String = seqs.map(|s| line(p, s)).collect::<String>() + tail;
        std::fs::write(input.join(name), body).unwrap();
    };
    // Partition numbers in the lines are for the checker; the source knows
    // files only. The last line of b.jsonl is not complete yet.
    write("a.jsonl", 0, 0..300, "");
    write("b.jsonl", 1, 0..200, "{\"stream\":\"lines\",\"part");
    let args = ["--source", "file", "--file-dir", input.to_str().unwrap(), "--file-follow", "false"];
    let out = run(&data, &args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(summary_records(&out), 500);
    // The files grow; the next run reads only what is new.
    write("a.jsonl", 0, 0..450, "");
    write("b.jsonl", 1, 0..260, "");
    let out = run(&data, &args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(summary_records(&out), 210);
    let got = read_dir_sink(&data.join("sink"));
    let by_partition: Vec<(u64, Vec<u64>)> = got.into_iter().map(|((_, p), seqs)| (p, seqs)).collect();
    assert_eq!(by_partition, vec![(0, (0..450).collect()), (1, (0..260).collect())]);
}

#[test]
fn metrics_are_served_on_loopback_when_asked() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let port = skippr_tests::free_port();
    let mut child = Command::new(skipprd_bin())
        .args(["run", "--data-dir", data.to_str().unwrap(), "--generator-records", "0"])
        .args(["--metrics-addr", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        assert!(Instant::now() < deadline, "metrics never showed a compaction");
        std::thread::sleep(Duration::from_millis(100));
        let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else { continue };
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).unwrap();
        if body.contains("skippr_compactions_total{outcome=\"applied\"}") {
            break body;
        }
    };
    for metric in [
        "skippr_commits_total",
        "skippr_commit_seconds_bucket",
        "skippr_wal_written_bytes_total",
        "skippr_records_total",
        "skippr_recovery_seconds",
        "skippr_compaction_lag{sink=\"sink\",stream=\"events\"}",
        "skippr_wal_bytes",
    ] {
        assert!(body.contains(metric), "{metric} missing from:\n{body}");
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(path: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(path).unwrap();
        let out =
            Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(path).output();
        let out = out.expect("mount runs");
        assert!(out.status.success(), "this test mounts a small tmpfs as root: {}", stderr(&out));
        SmallDisk { path: path.to_path_buf() }
    }

    fn read_only(&self) {
        let out = Command::new("mount").args(["-o", "remount,ro"]).arg(&self.path).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }

    fn grow(&self, size: &str) {
        let out = Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.path).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

#[test]
fn a_full_data_directory_stalls_with_a_clear_error_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&tmp.path().join("small"), "3m");
    let data = tmp.path().join("small").join("data");
    let log = tmp.path().join("daemon.log");
    let mut child = Command::new(skipprd_bin())
        .args(["run", "--once", "--data-dir", data.to_str().unwrap(), "--generator-records", "40000"])
        .args(["--wal-bytes-per-file", "1048576"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The log says why it waits...
    wait_until("the daemon to report the full disk", PATIENCE, || file_contains(&log, "No space left on device"));
    // ...and it is still running: it waits for space rather than dropping
    // anything.
    let still_running = child.try_wait().unwrap().is_none();
    disk.grow("256m");
    let out = child.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(still_running, "it stopped on a full disk: {text}");
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_exactly_once(&data.join("sink"), &["events"], 2, 40_000);
}

#[test]
fn json_logs_are_one_object_a_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(&tmp.path().join("data"), &["--log-format", "json", "--generator-records", "100"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<String> = stderr(&out).lines().map(str::to_string).collect();
    assert!(lines.len() >= 2, "{lines:?}");
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }
}

#[test]
fn an_unwritable_data_directory_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&tmp.path().join("ro"), "4m");
    let data = tmp.path().join("ro").join("data");
    std::fs::create_dir_all(&data).unwrap();
    disk.read_only();
    let out = run(&data, &[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("is DATA_DIR writable?"), "{}", stderr(&out));
}

#[test]
fn renaming_or_reordering_streams_is_refused_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = run(&data, &["--generator-streams", "a,b", "--generator-records", "100"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&data, &["--generator-streams", "b,a", "--generator-records", "100"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("the WAL knows stream #0 as 'a'"), "{}", stderr(&out));
    let out = run(&data, &["--generator-streams", "a,b,c", "--generator-records", "100"]);
    assert_eq!(out.status.code(), Some(0), "a new stream at the end is fine: {}", stderr(&out));
}
