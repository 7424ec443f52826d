//! Input from outside, distrusted where it crosses into the daemon (issue
//! #27): records are checked at intake (one JSON value, UTF-8, one line,
//! within `--record-bytes-max`) and refused naming the file and byte offset;
//! what reaches a plugin is built by an encoder, so no record can rewrite
//! the message around it; a plugin's reply answers the request in flight and
//! no other; plugins and everything they start die with the daemon; lines
//! from plugins and taps, names, durations and file-name partitions are
//! bounded; DATA_DIR and the files the daemon writes have deliberate modes;
//! plugin logs reach the daemon's log with control characters escaped.

use skippr_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn plugin(name: &str) -> String {
    format!("python3 {}", repo_root().join("tests").join("plugins").join(name).display())
}

fn daemon(data: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--data-dir", data.to_str().unwrap()]).args(extra);
    // A known umask, so that the modes below are the ones asked for.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
            Ok(())
        });
    }
    cmd
}

/// `--once` over the `*.jsonl` files of `input` (not followed).
fn read_files(data: &Path, input: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["--once", "--source", "file", "--file-dir", input.to_str().unwrap(), "--file-follow", "false"];
    args.extend(extra);
    daemon(data, &args).output().unwrap()
}

/// `read_files` into the suite's sink plugin, which writes under `out_dir`.
fn read_files_into_plugin(data: &Path, input: &Path, out_dir: &Path) -> Output {
    let sink = plugin("sink.py");
    let mut args = vec!["--once", "--source", "file", "--file-dir", input.to_str().unwrap(), "--file-follow", "false"];
    args.extend(["--sink", "command", "--sink-command", &sink]);
    daemon(data, &args).env("OUT_DIR", out_dir).output().unwrap()
}

/// Every line of every batch file of a directory sink's `stream`, in order.
fn sink_lines(sink: &Path, stream: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(sink.join(stream)) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| std::fs::read_to_string(f).unwrap().lines().map(String::from).collect::<Vec<_>>())
        .collect()
}

#[test]
fn a_line_longer_than_the_record_limit_stops_the_file_source_naming_the_file_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, input) = (tmp.path().join("data"), tmp.path().join("in"));
    std::fs::create_dir(&input).unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(5 << 20));
    std::fs::write(input.join("app.jsonl"), format!("{{\"n\":1}}\n{big}\n{{\"n\":3}}\n")).unwrap();
    let out = read_files(&data, &input, &[]);
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    let says = stderr(&out);
    assert!(says.contains("app.jsonl") && says.contains("at byte offset 8"), "{says}");
    assert!(says.contains("--record-bytes-max (4194304 bytes)"), "{says}");
    // The same again: never skipped, whatever the restarts.
    let again = read_files(&data, &input, &[]);
    assert_eq!(again.status.code(), Some(10), "{}", stderr(&again));
    // A line that fits the read window but not the limit: refused by the
    // intake check, naming the line.
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    std::fs::write(small.join("app.jsonl"), format!("{{\"n\":1}}\n\"{}\"\n", "y".repeat(2000))).unwrap();
    let out = read_files(&tmp.path().join("d2"), &small, &["--record-bytes-max", "1024"]);
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains("the line at byte offset 8"), "{}", stderr(&out));
    assert!(stderr(&out).contains("more than --record-bytes-max (1024)"), "{}", stderr(&out));
}

#[test]
fn lines_that_are_not_one_json_value_are_refused_at_intake_and_never_reach_a_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 4] = [
        (
            "injection",
            b"{\"msg\":\"x\"}],\"stream\":\"../../elsewhere\",\"seq\":777,\"records\":[{\"injected\":true}",
            "not exactly one JSON value",
        ),
        ("empty", b"", "not exactly one JSON value"),
        ("not-utf8", b"{\"a\":\"\xff\"}", "not valid UTF-8"),
        ("two-values", b"{\"a\":1} {\"b\":2}", "not exactly one JSON value"),
    ];
    for (name, line, says) in cases {
        let (data, input, out_dir) =
            (tmp.path().join(name), tmp.path().join(format!("{name}-in")), tmp.path().join(format!("{name}-out")));
        std::fs::create_dir(&input).unwrap();
        let mut body = b"{\"n\":1}\n".to_vec();
        body.extend_from_slice(line);
        body.extend_from_slice(b"\n{\"n\":3}\n");
        std::fs::write(input.join("app.jsonl"), body).unwrap();
        let out = read_files_into_plugin(&data, &input, &out_dir);
        assert_eq!(out.status.code(), Some(10), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("app.jsonl") && stderr(&out).contains("byte offset 8"),
            "{name}: {}",
            stderr(&out)
        );
        assert!(!tmp.path().join("elsewhere").exists() && !out_dir.join("../../elsewhere").exists(), "{name}");
        for stream in std::fs::read_dir(&out_dir).into_iter().flatten() {
            let stream = stream.unwrap().file_name();
            assert_eq!(stream, "lines", "{name}: only the configured stream");
        }
    }
}

#[test]
fn json_that_looks_like_the_message_around_it_reaches_the_sink_plugin_as_it_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, input, out_dir) = (tmp.path().join("data"), tmp.path().join("in"), tmp.path().join("out"));
    std::fs::create_dir(&input).unwrap();
    let lines = [
        r#"{"msg":"x\"}],\"stream\":\"../../elsewhere\",\"seq\":777,\"records\":[{\"injected\":true}"}"#,
        r#"["]}", "\n", "\u2028", {"type":"result","outcome":"applied"}]"#,
        r#""just a string""#,
        "  {\"spaced\" :  1 }\t",
        "{\"crlf\":true}",
    ];
    let mut body = lines.join("\n");
    body.push_str("\r\n");
    std::fs::write(input.join("app.jsonl"), body).unwrap();
    let out = read_files_into_plugin(&data, &input, &out_dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let streams: Vec<_> = std::fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(streams, ["lines"], "one stream, where it belongs");
    // sink.py writes each record re-encoded by Python's json: compare values.
    let got: Vec<serde_json::Value> =
        sink_lines(&out_dir, "lines").iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let want: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(got, want);
}

/// The sink echoes `seq` and `compaction_id` (as PROTOCOL.md recommends):
/// its stale second answer is found either as a line that came while no
/// request was in flight, or as an answer for another batch. A version 1
/// sink that does not echo is caught only by the first check, which depends
/// on the stale line arriving before the next request goes out.
#[test]
fn a_stale_reply_from_a_sink_is_a_protocol_violation_and_the_batch_is_applied_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, out_dir) = (tmp.path().join("data"), tmp.path().join("out"));
    let sink = plugin("sink.py");
    let out = daemon(&data, &["--once", "--sink", "command", "--sink-command", &sink])
        .args(["--generator-records", "15000"])
        .env("OUT_DIR", &out_dir)
        .env("DOUBLE_FIRST", "1")
        .env("RETRYABLE_SECOND", "1")
        .env("MARKER", tmp.path().join("marker"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(tmp.path().join("marker").exists(), "the sink misbehaved");
    assert!(stderr(&out).contains("broke the protocol"), "{}", stderr(&out));
    assert_exactly_once(&out_dir, &["events"], 2, 15_000);
}

/// Live processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
            .unwrap_or(true);
        let cmdline = String::from_utf8_lossy(&cmdline);
        // The daemon names the command in its own arguments (and so do the
        // watchdogs it forks): only the plugin's processes count.
        if !zombie && cmdline.contains(marker) && !cmdline.contains("--source-command") {
            found.push(pid);
        }
    }
    found
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_plugin_its_children_and_every_restarted_one_die_with_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let starts = tmp.path().join("starts");
    let marker = format!("orphan-check-{}", std::process::id());
    // `; true` makes the shell fork instead of exec: the plugin is the
    // shell's child, and it starts a child of its own.
    let cmd = format!("{} {marker}; true", plugin("source.py"));
    let mut child = daemon(&data, &["--source", "command", "--source-command", &cmd, "--plugin-timeout", "1"])
        .env("CHILD", "1")
        .env("HANG_READS", "1")
        .env("STARTS", &starts)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = || std::fs::read_to_string(&starts).map(|s| s.lines().count()).unwrap_or(0);
    // Each hangs on its first read and is killed after a second.
    wait_until("the hanging source is restarted three times", Duration::from_secs(60), || started() >= 4);
    // The running plugin, its child, and the shell above it at most (the
    // last one killed may take a moment to die).
    wait_until("no process of an earlier plugin lives on", Duration::from_secs(5), || {
        processes_with(&marker).len() <= 3
    });
    child.kill().unwrap(); // SIGKILL
    assert_eq!(child.wait().unwrap().signal(), Some(9));
    wait_until("every plugin process dies with the SIGKILLed daemon", Duration::from_secs(5), || {
        processes_with(&marker).is_empty()
    });
}

#[test]
// The child is reaped by wait4, which also gives its peak RSS.
#[allow(clippy::zombie_processes)]
fn a_source_line_past_the_bound_stops_the_daemon_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let source = plugin("source.py");
    let mut child = daemon(&data, &["--once", "--source", "command", "--source-command", &source])
        .env("LONG_LINE", (300u64 << 20).to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).unwrap();
        s
    });
    let pid = child.id() as i32;
    let (status, peak_kib) = wait_with_peak_rss(pid);
    let says = reader.join().unwrap();
    assert_eq!(status.code(), Some(10), "{says}");
    assert!(says.contains("a line longer than 67108864 bytes"), "{says}");
    // A 64 MiB line held while reading it, and the daemon's own: far below
    // the 300 MiB the plugin sent.
    assert!(peak_kib < 200 << 10, "peak RSS {peak_kib} KiB");
}

/// Waits for child `pid` and returns its status and peak RSS (KiB).
fn wait_with_peak_rss(pid: i32) -> (std::process::ExitStatus, i64) {
    let mut status = 0;
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    let got = unsafe { nix::libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid);
    (std::process::ExitStatus::from_raw(status), usage.ru_maxrss)
}

#[test]
fn a_taps_line_past_the_bound_stops_the_daemon_naming_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let tap = format!("python3 {}", repo_root().join("tests/plugins/singer_tap.py").display());
    let out = daemon(&data, &["--once", "--source", "singer", "--singer-command", &tap, "--record-bytes-max", "1024"])
        .envs([("RECORDS", "10"), ("PAD", "2000000")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains("longer than 1049600 bytes"), "{}", stderr(&out));
    assert!(stderr(&out).contains("--record-bytes-max (1024)"), "{}", stderr(&out));
    // A line within the bound whose record is past the limit: refused at
    // intake, naming the tap's stream and the record.
    let out = daemon(&tmp.path().join("d2"), &["--once", "--source", "singer", "--singer-command", &tap])
        .args(["--record-bytes-max", "1024"])
        .envs([("RECORDS", "10"), ("PAD", "1500")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains(r#"record number 0 (from 0) the tap sent of stream "events""#), "{}", stderr(&out));
}

#[test]
fn stream_names_that_are_empty_too_long_unsafe_or_reserved_are_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let tap = format!("python3 {}", repo_root().join("tests/plugins/singer_tap.py").display());
    let long = "s".repeat(300);
    for (name, says) in [
        ("", "may not be empty"),
        (&long[..], "more than 63"),
        ("skippr_progress", "is reserved"),
        ("-x", "is refused"),
    ] {
        let catalog = tmp.path().join("catalog.json");
        std::fs::write(&catalog, serde_json::json!({"streams": [{"tap_stream_id": name}]}).to_string()).unwrap();
        let out = daemon(&tmp.path().join("d"), &["--once", "--source", "singer", "--singer-command", &tap])
            .args(["--singer-catalog", catalog.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(11), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{name}: {}", stderr(&out));
    }
    let out = daemon(&tmp.path().join("d"), &["--once", "--generator-streams", "../up"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("is refused"), "{}", stderr(&out));
}

#[test]
fn two_file_names_with_one_partition_leave_one_unread_and_every_other_file_is_ingested() {
    use skippr_io::plugin::FileSource;
    let (a, b) = ("app-368724.jsonl", "app-798200.jsonl");
    assert_eq!(FileSource::partition_of(a), FileSource::partition_of(b), "the names collide");
    let tmp = tempfile::tempdir().unwrap();
    let (data, input) = (tmp.path().join("data"), tmp.path().join("in"));
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join(a), "{\"f\":\"a\"}\n").unwrap();
    std::fs::write(input.join(b), "{\"f\":\"b\"}\n").unwrap();
    std::fs::write(input.join("other.jsonl"), "{\"f\":\"other\"}\n{\"f\":\"other\"}\n").unwrap();
    let out = read_files(&data, &input, &[]);
    // The run cannot end as if every file were read: exit 10, naming it.
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("but {b}")), "{}", stderr(&out));
    std::fs::rename(input.join(b), input.join("renamed.jsonl")).unwrap();
    let out = read_files(&data, &input, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut got = sink_lines(&data.join("sink"), "lines");
    got.sort();
    assert_eq!(got, ["{\"f\":\"a\"}", "{\"f\":\"b\"}", "{\"f\":\"other\"}", "{\"f\":\"other\"}"]);
}

#[test]
fn durations_past_a_year_and_counts_past_their_bounds_are_refused_with_exit_three() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for flags in [
        &["--plugin-timeout", "1e300"][..],
        &["--drain-timeout", "1e19"],
        &["--source", "singer", "--singer-command", "true", "--singer-interval", "1e19"],
        &["--wal-max-delay-seconds", "inf"],
    ] {
        let out = daemon(&data, flags).arg("--once").output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{flags:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("a year"), "{flags:?}: {}", stderr(&out));
    }
    let toml = tmp.path().join("c.toml");
    std::fs::write(&toml, "plugin_timeout_seconds = 1e300\n").unwrap();
    let out = daemon(&data, &["--once", "--config", toml.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // Counts past their bounds, too.
    for flags in [
        &["--record-bytes-max", "99999999999"][..],
        &["--generator-partitions", "4294967295"],
        &["--wal-bytes-per-file", "18446744073709551615"],
    ] {
        let out = daemon(&data, flags).arg("--once").output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{flags:?}: {}", stderr(&out));
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn data_dir_is_the_owners_and_sink_files_take_the_documented_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = daemon(&data, &["--once", "--generator-records", "100"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode(&data), 0o700, "DATA_DIR");
    assert_eq!(mode(&data.join("wal")), 0o700, "the WAL's directory");
    for file in ["LOCK", "offsets.redb"] {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
    for segment in std::fs::read_dir(data.join("wal")).unwrap() {
        let segment = segment.unwrap().path();
        if segment.is_file() {
            assert_eq!(mode(&segment), 0o600, "{}", segment.display());
        }
    }
    let batches: Vec<PathBuf> =
        std::fs::read_dir(data.join("sink/events")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!batches.is_empty());
    for batch in &batches {
        assert_eq!(mode(batch), 0o640, "{}", batch.display());
    }
    assert_eq!(mode(&data.join("sink/events")), 0o750);
    let other = tmp.path().join("strict");
    let out = daemon(&other, &["--once", "--generator-records", "100", "--sink-dir-mode", "0600"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for batch in std::fs::read_dir(other.join("sink/events")).unwrap() {
        assert_eq!(mode(&batch.unwrap().path()), 0o600);
    }
    let out = daemon(&other, &["--once", "--sink-dir-mode", "0444"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn a_plugins_control_characters_reach_the_log_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let source = plugin("source.py");
    let out = daemon(&data, &["--once", "--source", "command", "--source-command", &source])
        .env("RECORDS", "10")
        .env("STDERR_TEXT", "over\rwritten \u{1b}[2J cleared")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains(r"over\rwritten \u{1b}[2J cleared"), "{log}");
    assert!(!log.contains('\r') && !log.contains('\u{1b}'), "raw control characters in the log");
}

#[test]
fn records_larger_than_a_commit_group_land_whole_up_to_the_limit_and_the_limit_fits_a_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, input) = (tmp.path().join("data"), tmp.path().join("in"));
    std::fs::create_dir(&input).unwrap();
    // A commit group holds 1 MiB; these records take 5 and 12 MiB, between
    // small ones.
    let big = |n: usize, c: char| format!("{{\"pad\":\"{}\"}}", c.to_string().repeat(n << 20));
    let lines = ["{\"n\":1}".to_string(), big(5, 'a'), "{\"n\":3}".into(), big(12, 'b'), "{\"n\":5}".into()];
    std::fs::write(input.join("app.jsonl"), lines.join("\n") + "\n").unwrap();
    let out = read_files(&data, &input, &["--record-bytes-max", &(16u64 << 20).to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(sink_lines(&data.join("sink"), "lines"), lines, "every record whole, once, in order");
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    // Run again: nothing new, nothing twice.
    let again = read_files(&data, &input, &["--record-bytes-max", &(16u64 << 20).to_string()]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(sink_lines(&data.join("sink"), "lines"), lines);
    // A record limit past half a segment is refused, naming both settings.
    let out =
        read_files(&tmp.path().join("d2"), &input, &["--record-bytes-max", "40000", "--wal-bytes-per-file", "65536"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("(--wal-bytes-per-file is 65536)"), "{}", stderr(&out));
}

/// The WAL's last source batch damaged (one bit), with nothing after it:
/// `wal verify` and `run` make the same judgement of the active segment's
/// end and say it in the same words; neither delivers anything.
#[test]
fn a_damaged_last_group_is_reported_alike_by_wal_verify_and_run() {
    use skippr_core::format::{scan, Frame, UNREADABLE_TAIL};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = daemon(&data, &["--once", "--generator-records", "500"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The segment holding the last group with a source batch: everything
    // after that group is zeroed (as if never written), and one bit inside
    // it flipped.
    let wal = data.join("wal");
    let mut files: Vec<_> = std::fs::read_dir(&wal).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let ids: Vec<_> = files
        .iter()
        .map(|p| skippr_core::SegmentId(p.file_stem().unwrap().to_string_lossy().parse().unwrap()))
        .collect();
    let bytes: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let view: Vec<_> = ids.iter().copied().zip(bytes.iter().map(|b| b.as_slice())).collect();
    let scanned = scan(&view, false).unwrap();
    let (i, group) = scanned
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.groups.iter().map(move |g| (i, g)))
        .rfind(|(_, g)| g.frames.iter().any(|f| matches!(f, Frame::SourceBatch(_))))
        .expect("a source batch was committed");
    let mut damaged = bytes[i].clone();
    damaged[group.end as usize..].fill(0);
    damaged[(group.offset + group.end) as usize / 2] ^= 0x10;
    std::fs::write(&files[i], &damaged).unwrap();
    for later in &files[i + 1..] {
        std::fs::remove_file(later).unwrap();
    }
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0), "{}", stdout(&verify));
    assert!(stdout(&verify).contains(UNREADABLE_TAIL), "{}", stdout(&verify));
    assert!(stdout(&verify).contains(&format!("at byte {}", group.offset)), "{}", stdout(&verify));
    let before = sink_lines(&data.join("sink"), "events").len();
    let run = daemon(&data, &["--once", "--generator-records", "500"]).output().unwrap();
    assert_eq!(run.status.code(), Some(6), "{}", stderr(&run));
    assert!(stderr(&run).contains(UNREADABLE_TAIL), "{}", stderr(&run));
    assert_eq!(sink_lines(&data.join("sink"), "events").len(), before, "nothing more delivered");
}

/// The `--skip-input` option a refusal message prints, as its two words.
fn printed_skip(out: &Output) -> [String; 2] {
    let says = stderr(out);
    let at = says.find("`--skip-input ").unwrap_or_else(|| panic!("the refusal prints a skip: {says}"));
    let option = &says[at + 1..];
    let option = &option[..option.find('`').unwrap()];
    let (flag, value) = option.split_once(' ').unwrap();
    [flag.to_string(), value.to_string()]
}

#[test]
fn an_operator_gives_up_exactly_the_refused_lines_with_the_printed_option_recorded_in_the_wal() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, input) = (tmp.path().join("data"), tmp.path().join("in"));
    std::fs::create_dir(&input).unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(5 << 20));
    let body = format!("{{\"n\":1}}\n{{\"n\":2}}\nnot json\n{{\"n\":4}}\n{big}\n{{\"n\":6}}\n");
    std::fs::write(input.join("app.jsonl"), body).unwrap();
    // First the line that is not JSON (inside a read), then the line too
    // long to read: each refused, each given up with the option printed.
    let mut skips: Vec<String> = Vec::new();
    for (n, says) in [(1, "not exactly one JSON value"), (2, "longer than --record-bytes-max")] {
        let mut extra: Vec<&str> = Vec::new();
        for value in &skips {
            extra.extend(["--skip-input", value.as_str()]);
        }
        let out = read_files(&data, &input, &extra);
        assert_eq!(out.status.code(), Some(10), "refusal {n}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "refusal {n}: {}", stderr(&out));
        let [flag, value] = printed_skip(&out);
        assert_eq!(flag, "--skip-input");
        skips.push(value);
    }
    let sink = data.join("sink");
    let mut extra: Vec<&str> = vec!["--skip-reason", "export bug 42"];
    for value in &skips {
        extra.extend(["--skip-input", value.as_str()]);
    }
    let out = read_files(&data, &input, &extra);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("giving up input on the operator's command"), "{}", stderr(&out));
    let want = ["{\"n\":1}", "{\"n\":2}", "{\"n\":4}", "{\"n\":6}"];
    assert_eq!(sink_lines(&sink, "lines"), want);
    // The WAL says what was given up, where and why: the first skip was
    // recorded by the run that then met the long line, with the default
    // reason.
    let verify = Command::new(skipprd_bin()).args(["wal", "verify", data.to_str().unwrap()]).output().unwrap();
    let listed = String::from_utf8_lossy(&verify.stdout).into_owned();
    for (value, why) in skips.iter().zip(["given up by the operator (run --skip-input)", "export bug 42"]) {
        let (_, rest) = value.split_once(':').unwrap();
        let (partition, span) = rest.split_once(':').unwrap();
        let line = format!("stream lines, partition {partition}, positions {span}: {why}");
        assert_eq!(listed.matches(&line).count(), 1, "{line} in {listed}");
    }
    // Given again, the option does nothing; without it nothing is refused.
    let again = read_files(&data, &input, &extra);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stderr(&again).contains("nothing to skip"), "{}", stderr(&again));
    assert_eq!(read_files(&data, &input, &[]).status.code(), Some(0));
    assert_eq!(sink_lines(&sink, "lines"), want, "nothing twice");
    // A skip over input already delivered is refused, and changes nothing.
    let (stream_partition, _) = skips[0].rsplit_once(':').unwrap();
    let across = format!("{stream_partition}:1..999999999");
    let out = read_files(&data, &input, &["--skip-input", &across]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("already delivered"), "{}", stderr(&out));
    let mistyped = read_files(&data, &input, &["--skip-input", "lines:1:9..3"]);
    assert_eq!(mistyped.status.code(), Some(3), "{}", stderr(&mistyped));
    assert!(stderr(&mistyped).contains("NEXT must be past AT"), "{}", stderr(&mistyped));
}

#[test]
fn a_batch_of_a_stream_the_source_never_declared_stops_the_daemon_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let sink = tmp.path().join("sink");
    let out = daemon(
        &tmp.path().join("data"),
        &[
            "--once",
            "--source",
            "command",
            "--source-command",
            &plugin("source.py"),
            "--sink-dir",
            sink.to_str().unwrap(),
        ],
    )
    .env("STREAM", "orders")
    .env("UNDECLARED_STREAM", "refunds")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "partition 0 sent records of stream \"refunds\", which the source did not declare (it declared orders)"
        ),
        "{}",
        stderr(&out)
    );
    assert!(sink_lines(&sink, "refunds").is_empty() && sink_lines(&sink, "orders").is_empty());
}
