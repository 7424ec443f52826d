//! Dead letters end to end: an external sink speaking protocol version 2
//! refuses the records that carry `"bad": true`; with `--dead-letter dir`
//! each refused record lands once in the dead-letter directory, with its
//! reason, and every other record once in the sink, through SIGKILLs at any
//! moment. Without dead letters the same refusal stops the daemon (exit 8)
//! naming the record.

use skippr_tests::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const RECORDS: u64 = 60_000;
const BAD_EVERY: u64 = 997;

fn plugin(name: &str) -> String {
    format!("python3 {}", repo_root().join("tests").join("plugins").join(name).display())
}

fn daemon(data: &Path, out: &Path, extra: &[&str], rate: Option<u64>) -> Command {
    let (source, sink) = (plugin("source.py"), plugin("sink.py"));
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap()])
        .args(["--source", "command", "--source-command", &source, "--sink", "command", "--sink-command", &sink])
        .args(["--wal-bytes-per-file", "4194304"])
        .args(extra)
        .env("RECORDS", RECORDS.to_string())
        .env("BAD_EVERY", BAD_EVERY.to_string())
        .env("PROTOCOL", "2")
        .env("REFUSE_FIELD", "bad")
        .env("OUT_DIR", out);
    if let Some(rate) = rate {
        cmd.env("RATE", rate.to_string());
    }
    cmd
}

/// Every dead letter under `dir`: (partition, the record's seq) → (reason,
/// how many times).
fn dead_letters(dir: &Path) -> BTreeMap<(u64, u64), (String, usize)> {
    let mut out: BTreeMap<(u64, u64), (String, usize)> = BTreeMap::new();
    let Ok(files) = std::fs::read_dir(dir.join("orders")) else { return out };
    for file in files.map(|e| e.unwrap().path()) {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with('.') || !name.ends_with(".jsonl") {
            continue;
        }
        for line in std::fs::read_to_string(&file).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["record"]["bad"], true, "only refused records are dead letters: {line}");
            assert_eq!(v["partition"], v["record"]["partition"], "{line}");
            assert_eq!(v["position"], v["record"]["seq"], "{line}");
            assert!(v["compaction_id"].as_str().is_some_and(|c| c.len() == 16), "{line}");
            assert!(v["decided_at"].as_str().is_some_and(|t| t.starts_with("20") && t.ends_with('Z')), "{line}");
            let key = (v["partition"].as_u64().unwrap(), v["position"].as_u64().unwrap());
            let entry = out.entry(key).or_insert((v["reason"].as_str().unwrap().to_string(), 0));
            entry.1 += 1;
        }
    }
    out
}

/// The sink and the dead letters hold every record exactly once between
/// them: the bad ones as dead letters with their reason, the rest in the
/// sink.
fn assert_each_record_once(out: &Path, letters: &Path) {
    let sink = read_dir_sink(out);
    let dead = dead_letters(letters);
    for p in 0..2u64 {
        let got = sink.get(&("orders".to_string(), p)).cloned().unwrap_or_default();
        let good: Vec<u64> = (0..RECORDS).filter(|s| s % BAD_EVERY != BAD_EVERY - 1).collect();
        assert_eq!(got.len(), good.len(), "partition {p}: records in the sink");
        assert_eq!(got, good, "partition {p}: the sink holds every good record once, in order, and no bad one");
        let bad: Vec<u64> = (0..RECORDS).filter(|s| s % BAD_EVERY == BAD_EVERY - 1).collect();
        let lettered: Vec<u64> = dead.keys().filter(|(q, _)| *q == p).map(|(_, s)| *s).collect();
        assert_eq!(lettered, bad, "partition {p}: every bad record is a dead letter");
    }
    for ((p, s), (reason, n)) in &dead {
        assert_eq!((reason.as_str(), *n), ("bad is set", 1), "partition {p} record {s}: once, with its reason");
    }
}

#[test]
fn refused_records_go_to_the_dead_letters_once_and_the_rest_to_the_sink_through_sigkills() {
    let _cores = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let letters = data.join("dead-letters");
    let args = ["--dead-letter", "dir"];
    // Eight runs killed within 0.4 s each, at 30,000 records/s, send at
    // most 96,000 of the 120,000 records: every run is killed mid-ingest,
    // whatever the machine's speed.
    let work = Work::Paced { rate: 30_000, total: 2 * RECORDS };
    let killed = chaos_runs(8, "0.1", "0.4", work, || daemon(&data, &out, &args, Some(30_000)));
    assert_eq!(killed, 8, "every run was killed with work in flight");
    let done = daemon(&data, &out, &args, None).output().unwrap();
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_each_record_once(&out, &letters);
}

#[test]
fn without_dead_letters_a_refused_record_stops_the_daemon_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let run = daemon(&data, &out, &[], None).output().unwrap();
    assert_eq!(run.status.code(), Some(8), "{}", stderr(&run));
    let text = stderr(&run);
    assert!(text.contains("bad is set") && text.contains("--dead-letter dir"), "{text}");
    // The cause fixed (dead letters on), the next start goes on from the
    // WAL: nothing was lost, nothing is applied twice.
    let again = daemon(&data, &out, &["--dead-letter", "dir"], None).output().unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_each_record_once(&out, &data.join("dead-letters"));
}
