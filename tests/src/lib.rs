//! Helpers for the end-to-end tests: find the `skipprd` binary built by the
//! same `cargo` profile and run it as a real child process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `skipprd` binary: `$SKIPPRD_BIN`, or `skipprd` in the profile
/// directory this test binary was built into (`target/release/`).
pub fn skipprd_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SKIPPRD_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("skipprd");
    assert!(
        bin.exists(),
        "{} is missing: build it with the same profile first (`cargo build --release -p skipprd`; ./test.sh does)",
        bin.display()
    );
    bin
}

/// Runs `skipprd` with `args` and returns its output.
pub fn skipprd(args: &[&str]) -> Output {
    Command::new(skipprd_bin()).args(args).output().expect("skipprd starts")
}

/// The repository root (where `seeds/` lives).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the repo root").to_path_buf()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The summary line a sweep ends its stdout with:
/// `seeds: <count>, failed: <count>, seeds/s: <rate>`. Returns (count, failed).
pub fn sweep_summary(out: &Output) -> (u64, u64) {
    let text = stdout(out);
    let last = text.lines().last().unwrap_or_default().to_string();
    let parts: Vec<&str> = last.split(", ").collect();
    let field = |i: usize, name: &str| -> u64 {
        let p = parts.get(i).unwrap_or_else(|| panic!("last line '{last}' lacks '{name}'"));
        let v = p.strip_prefix(name).unwrap_or_else(|| panic!("last line '{last}' lacks '{name}'"));
        v.parse().unwrap_or_else(|_| panic!("'{v}' in '{last}' is not a number"))
    };
    assert_eq!(parts.len(), 3, "last line is `seeds: N, failed: N, seeds/s: R`, got '{last}'");
    let (count, failed) = (field(0, "seeds: "), field(1, "failed: "));
    let _rate = field(2, "seeds/s: ");
    (count, failed)
}

/// The `failures by invariant: a=1, b=2` line of a sweep, as pairs.
pub fn failures_by_invariant(out: &Output) -> Vec<(String, u64)> {
    let text = stdout(out);
    let Some(line) = text.lines().find_map(|l| l.strip_prefix("failures by invariant: ")) else {
        return Vec::new();
    };
    line.split(", ")
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("name=count");
            (k.to_string(), v.parse().expect("count"))
        })
        .collect()
}

/// Every record in a directory sink, per (stream, partition), in file order:
/// files sorted by sequence number, lines in order.
pub fn read_dir_sink(dir: &Path) -> std::collections::BTreeMap<(String, u64), Vec<u64>> {
    let mut out: std::collections::BTreeMap<(String, u64), Vec<u64>> = Default::default();
    let Ok(streams) = std::fs::read_dir(dir) else { return out };
    for stream in streams {
        let stream = stream.unwrap().path();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&stream)
            .unwrap()
            .map(|e| e.unwrap().path())
            // Temporary files (".tmp-...") are batches still being written.
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
            .collect();
        files.sort();
        for file in files {
            for line in std::fs::read_to_string(&file).unwrap().lines() {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{}: a line that is not JSON ({e}): {line}", file.display()));
                let key = (v["stream"].as_str().unwrap().to_string(), v["partition"].as_u64().unwrap());
                out.entry(key).or_default().push(v["seq"].as_u64().unwrap());
            }
        }
    }
    out
}

/// Asserts that the sink holds every generator record exactly once, in order:
/// `partitions` partitions of each stream, seq `0..records`.
pub fn assert_exactly_once(dir: &Path, streams: &[&str], partitions: u64, records: u64) {
    let got = read_dir_sink(dir);
    let mut expected_keys = Vec::new();
    for s in streams {
        for p in 0..partitions {
            expected_keys.push((s.to_string(), p));
        }
    }
    let keys: Vec<_> = got.keys().cloned().collect();
    assert_eq!(keys, expected_keys, "partitions in the sink");
    for (key, seqs) in &got {
        if seqs.len() as u64 != records || seqs.iter().enumerate().any(|(i, s)| *s != i as u64) {
            let dupes = seqs.windows(2).filter(|w| w[1] <= w[0]).count();
            panic!(
                "{key:?}: {} records, {dupes} out of order or repeated, expected 0..{records} once each",
                seqs.len()
            );
        }
    }
}
