//! Two processes apply the same destination batches into one directory
//! sink at once (a deposed clustered leader and its successor), many
//! times: every batch lands once with its bytes, exactly one of them is
//! told `applied`, the other `already_applied`, and another id under a
//! taken number is `fatal` for everyone.
//!
//! The test binary runs itself as the two children (`SKIPPR_DIR_SINK_CHILD`).

use skippr_core::ledger::Scope;
use skippr_core::{CompactionId, Records, SinkOutcome};
use skippr_io::plugin::{DirSink, Sink};
use std::path::Path;
use std::process::{Command, Stdio};

const BATCHES: u64 = 40;
const ROUNDS: usize = 25;

fn batch(seq: u64) -> Records {
    (0..50).map(|i| format!("{{\"seq\":{seq},\"i\":{i}}}")).collect::<Vec<_>>().iter().map(|s| s.as_bytes()).collect()
}

fn id(seq: u64) -> CompactionId {
    CompactionId(0xc0de_0000 + seq)
}

fn scope() -> Scope {
    Scope::new("main", "disk://race/wal/")
}

/// As the driver applies: an error is retried. The writer of the higher
/// epoch removes the other's temporary files at its first apply, and the
/// other's link of one then fails once.
fn apply(sink: &mut DirSink, seq: u64, id: CompactionId) -> SinkOutcome {
    for _ in 0..100 {
        if let Ok(outcome) = sink.apply("events", seq, id, &batch(seq)) {
            return outcome;
        }
    }
    panic!("batch {seq}: a hundred errors in a row")
}

/// A child: applies every batch, in order, printing each outcome.
fn child(dir: &Path) {
    let mut sink = DirSink::open(dir, &scope()).unwrap();
    // Both start together, once the parent has seen both ready.
    std::fs::write(dir.join(format!("ready-{}", std::process::id())), b"").unwrap();
    while !dir.join("go").exists() {
        std::thread::yield_now();
    }
    let mut out = String::new();
    for seq in 0..BATCHES {
        let outcome = apply(&mut sink, seq, id(seq));
        out.push_str(&format!("{seq} {outcome:?}\n"));
    }
    // Another id under a taken number is refused.
    let outcome = apply(&mut sink, 0, CompactionId(1));
    out.push_str(&format!("other {outcome:?}\n"));
    std::fs::write(dir.join(format!("outcomes-{}", std::process::id())), out).unwrap();
}

#[test]
fn two_processes_applying_the_same_batches_at_once_land_each_once() {
    if let Some(dir) = std::env::var_os("SKIPPR_DIR_SINK_CHILD") {
        return child(Path::new(&dir));
    }
    let exe = std::env::current_exe().unwrap();
    for round in 0..ROUNDS {
        let tmp = tempfile::tempdir().unwrap();
        let spawn = || {
            Command::new(&exe)
                .args(["--exact", "two_processes_applying_the_same_batches_at_once_land_each_once", "--nocapture"])
                .env("SKIPPR_DIR_SINK_CHILD", tmp.path())
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        };
        let (mut a, mut b) = (spawn(), spawn());
        let ready = || {
            let entries = std::fs::read_dir(tmp.path()).unwrap();
            entries.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("ready-")).count()
        };
        while ready() < 2 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::fs::write(tmp.path().join("go"), b"").unwrap();
        assert!(a.wait().unwrap().success() && b.wait().unwrap().success(), "round {round}");
        let mut applied = vec![0; BATCHES as usize];
        let mut outcomes = 0;
        for entry in std::fs::read_dir(tmp.path()).unwrap() {
            let path = entry.unwrap().path();
            if !path.is_file() || !path.file_name().unwrap().to_string_lossy().starts_with("outcomes-") {
                continue;
            }
            outcomes += 1;
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let (what, outcome) = line.split_once(' ').unwrap();
                match (what, outcome) {
                    ("other", o) => assert_eq!(o, format!("{:?}", SinkOutcome::Fatal), "round {round}"),
                    (seq, "Applied") => applied[seq.parse::<usize>().unwrap()] += 1,
                    (_, "AlreadyApplied") => {}
                    other => panic!("round {round}: {other:?}"),
                }
            }
        }
        assert_eq!(outcomes, 2);
        assert!(applied.iter().all(|n| *n == 1), "round {round}: applied counts {applied:?}");
        let files: Vec<String> = std::fs::read_dir(tmp.path().join("events"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files.len() as u64, BATCHES, "round {round}: no temporaries left, one file a batch: {files:?}");
        for seq in 0..BATCHES {
            let name = format!("{}.{seq:020}-{}.jsonl", scope().tag(), id(seq));
            let bytes = std::fs::read(tmp.path().join("events").join(&name)).unwrap();
            let expected: Vec<u8> = batch(seq).iter().flat_map(|r| r.iter().copied().chain([b'\n'])).collect();
            assert_eq!(bytes, expected, "round {round}: {name}");
        }
    }
}
