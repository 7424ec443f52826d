//! External plugins over the runtime protocol: small Python plugins in
//! `tests/plugins/` as sources and sinks, misbehaving plugins, and plugins
//! that die with a SIGKILLed daemon.

use skippr_tests::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn plugin(name: &str) -> String {
    format!("python3 {}", repo_root().join("tests").join("plugins").join(name).display())
}

fn daemon(data: &Path, extra: &[&str], env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--data-dir", data.to_str().unwrap()]).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn external_source(data: &Path, records: u64, env: &[(&str, String)]) -> Output {
    let cmd = plugin("source.py");
    let mut env = env.to_vec();
    env.push(("RECORDS", records.to_string()));
    daemon(data, &["--once", "--source", "command", "--source-command", &cmd, "--plugin-timeout", "2"], &env)
        .output()
        .unwrap()
}

#[test]
fn an_external_source_delivers_its_exact_bytes_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let raw = [("RAW_DATA", "1".to_string())];
    let out = external_source(&data, 3000, &raw);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 3000);
    let first = std::fs::read_dir(data.join("sink").join("orders"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().contains(".00000000000000000000-"))
        .expect("the batch with sequence number 0");
    let line = std::fs::read_to_string(first).unwrap().lines().next().unwrap().to_string();
    assert_eq!(line, r#"{ "seq":0,  "partition" :0,"stream":"orders", "note":"x" }"#, "the bytes the plugin emitted");
    let again = external_source(&data, 3000, &raw);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stdout(&again).starts_with("records: 0,"), "resumes from host state: {}", stdout(&again));
    let shown = stdout(&skipprd(&["offsets", "show", data.to_str().unwrap()]));
    assert!(shown.contains("checkpoint=cp-0-3000"), "checkpoints are materialized: {shown}");
}

#[test]
fn an_external_sink_receives_every_batch_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out_dir = tmp.path().join("out");
    let cmd = plugin("sink.py");
    let out = daemon(
        &data,
        &["--once", "--sink", "command", "--sink-command", &cmd],
        &[("OUT_DIR", out_dir.to_str().unwrap().to_string())],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&out_dir, &["events"], 2, 10_000);
}

#[test]
fn a_sink_that_is_down_fills_the_wal_to_its_limit_then_every_record_arrives_once() {
    // Two 1 MiB segments of WAL and nothing held in memory: the sources
    // pause at the limit while the sink refuses, and every record the sink
    // then gets is read back from the WAL.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out_dir = tmp.path().join("out");
    let cmd = plugin("sink.py");
    let limits = ["--wal-bytes-per-file", "1048576", "--wal-max-bytes", "2097152", "--record-cache-bytes", "0"];
    let mut args = vec!["--once", "--sink", "command", "--sink-command", &cmd, "--generator-records", "100000"];
    args.extend(limits);
    let env = [("OUT_DIR", out_dir.to_str().unwrap().to_string()), ("LAG_SECONDS", "5".to_string())];
    let out = daemon(&data, &args, &env).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("the WAL reached its size limit (WAL_MAX_BYTES): sources are paused"), "{log}");
    assert!(log.contains("the WAL is below its size limit again; sources resume"), "{log}");
    assert_exactly_once(&out_dir, &["events"], 2, 100_000);
}

fn misbehaving(mode: &str) -> (PathBuf, Output, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let env = [("MISBEHAVE", mode.to_string()), ("MARKER", tmp.path().join("marker").to_str().unwrap().to_string())];
    let out = external_source(&data, 2000, &env);
    (data, out, tmp)
}

#[test]
fn a_source_printing_garbage_is_named_restarted_and_loses_nothing() {
    let (data, out, _tmp) = misbehaving("garbage");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("plugin 'source': sent a line that is not protocol JSON"), "{err}");
    assert!(err.contains("this is not json"), "the line is quoted: {err}");
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 2000);
}

#[test]
fn a_source_that_exits_is_restarted_from_host_state() {
    let (data, out, _tmp) = misbehaving("exit");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("exited (exit status: 3)"), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 2000);
}

#[test]
fn a_source_that_hangs_is_killed_after_its_timeout_and_restarted() {
    let (data, out, _tmp) = misbehaving("hang");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("no answer within 2s"), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 2000);
}

#[test]
fn a_plugin_that_cannot_start_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = daemon(&data, &["--once", "--source", "command", "--source-command", "exit 7"], &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(11), "{}", stderr(&out));
    assert!(stderr(&out).contains("plugin 'source'"), "{}", stderr(&out));
}

#[test]
fn plugins_die_with_a_sigkilled_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let pidfile = tmp.path().join("plugin.pid");
    let cmd = plugin("source.py");
    let mut child = daemon(
        &data,
        &["--source", "command", "--source-command", &cmd],
        &[("RECORDS", "0".into()), ("PIDFILE", pidfile.to_str().unwrap().into())],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_dir_sink(&data.join("sink")).is_empty() {
        assert!(Instant::now() < deadline, "the daemon delivers something");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    child.kill().unwrap(); // SIGKILL
    assert_eq!(child.wait().unwrap().signal(), Some(9));
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "plugin {pid} outlived its daemon");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Running and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn twenty_five_chaos_runs_with_an_external_source_all_sigkilled_then_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cmd = plugin("source.py");
    let args = ["--once", "--source", "command", "--source-command", &cmd, "--wal-bytes-per-file", "4194304"];
    let env = [("RECORDS", "500000".to_string())];
    // The source sends at most 50,000 records a second, so the 25 runs
    // (killed within 0.4 s each) hold at most half of the million between
    // them whatever the machine's speed: every run is killed mid-ingest.
    let paced = [env[0].clone(), ("RATE", "50000".to_string())];
    let work = Work::Paced { rate: 50_000, total: 1_000_000 };
    let killed = chaos_runs(25, "0.1", "0.4", work, || daemon(&data, &args, &paced));
    assert_eq!(killed, 25, "every run was killed with work in flight");
    let out = daemon(&data, &args, &env).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 500_000);
}

#[test]
fn a_drain_that_cannot_finish_exits_nine_after_the_drain_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cmd = plugin("sink.py");
    let env = [("OUT_DIR", tmp.path().join("out").to_str().unwrap().to_string()), ("REFUSE", "retryable".into())];
    let child = daemon(&data, &["--sink", "command", "--sink-command", &cmd, "--drain-timeout", "1"], &env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Committed records that the sink refuses: the drain cannot finish.
    wait_until("records committed to the WAL", PATIENCE, || wal_holds_records(&data));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let started = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(900), "it waited for the drain");
    assert!(stderr(&out).contains("drain timed out"), "{}", stderr(&out));
}

#[test]
fn a_fatal_sink_answer_stops_with_exit_eight_and_replays_next_time() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out_dir = tmp.path().join("out");
    let cmd = plugin("sink.py");
    let mut env = vec![("OUT_DIR", out_dir.to_str().unwrap().to_string()), ("REFUSE", "fatal".into())];
    let out = daemon(&data, &["--once", "--sink", "command", "--sink-command", &cmd], &env).output().unwrap();
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(stderr(&out).contains("refused compaction"), "{}", stderr(&out));
    env.pop();
    let out = daemon(&data, &["--once", "--sink", "command", "--sink-command", &cmd], &env).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&out_dir, &["events"], 2, 10_000);
}

#[test]
fn a_schema_plugin_is_asked_once_per_new_schema_and_can_refuse() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("asks.log");
    let source = plugin("source.py");
    let schema = plugin("schema.py");
    let args = ["--once", "--source", "command", "--source-command", &source, "--schema-command", &schema];
    let env = |schema: &str| {
        vec![
            ("RECORDS", "500".to_string()),
            ("SCHEMA", schema.to_string()),
            ("ASK_LOG", log.to_str().unwrap().to_string()),
        ]
    };
    let out = daemon(&data, &args, &env(r#"{"fields":["id"]}"#)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1, "asked once");
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 500);
    // The decision is in the WAL: a restart under the same schema asks nothing.
    let out = daemon(&data, &args, &[env(r#"{"fields":["id"]}"#), vec![("RECORDS", "800".into())]].concat())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1, "not asked again");
    // A refused schema stops the daemon before anything under it commits.
    let out =
        daemon(&data, &args, &[env(r#"{"reject":true}"#), vec![("RECORDS", "900".into())]].concat()).output().unwrap();
    assert_eq!(out.status.code(), Some(12), "{}", stderr(&out));
    assert!(stderr(&out).contains("this schema is refused on purpose"), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 800);
    // With dead letters on, the records under it go there instead, each
    // once with the plugin's reason, and the daemon goes on.
    let letters = [&args[..], &["--dead-letter", "dir", "--dead-letter-max", "1000"]].concat();
    let out = daemon(&data, &letters, &[env(r#"{"reject":true}"#), vec![("RECORDS", "900".into())]].concat())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 800);
    let mut lettered = Vec::new();
    for file in std::fs::read_dir(data.join("dead-letters").join("orders")).unwrap().map(|e| e.unwrap().path()) {
        for line in std::fs::read_to_string(&file).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let reason = v["reason"].as_str().unwrap();
            assert!(reason.starts_with("refused at intake: the schema plugin refused its schema: "), "{line}");
            assert!(reason.contains("this schema is refused on purpose"), "{line}");
            let record: serde_json::Value = serde_json::from_str(v["record_text"].as_str().unwrap()).unwrap();
            lettered.push((record["partition"].as_u64().unwrap(), record["seq"].as_u64().unwrap()));
        }
    }
    lettered.sort_unstable();
    let want: Vec<(u64, u64)> = (0..2).flat_map(|p| (800..900).map(move |s| (p, s))).collect();
    assert_eq!(lettered, want, "each record under the refused schema a dead letter once");
}

#[test]
fn a_restarted_source_whose_open_fails_is_never_read_before_it_is_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let env = [
        ("MISBEHAVE", "exit".to_string()),
        ("MARKER", tmp.path().join("marker").to_str().unwrap().to_string()),
        ("OPEN_ERROR_MARKER", tmp.path().join("open-error").to_str().unwrap().to_string()),
        ("UNOPENED_START", "1990".to_string()),
    ];
    let out = external_source(&data, 2000, &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("upstream not reachable yet"), "{}", stderr(&out));
    assert!(tmp.path().join("open-error").exists(), "the restarted process refused its first open");
    assert_exactly_once(&data.join("sink"), &["orders"], 2, 2000);
}
