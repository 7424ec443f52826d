//! Seeded fuzzing of what crosses into the daemon: random files for the
//! file source (valid records between random bytes, random JSON-looking
//! lines, injections, long lines, CRLF, unfinished last lines) and a sink
//! plugin that answers at random (twice, stale, garbage, too long, not at
//! all, exiting mid-batch). Whatever the input, the daemon must not panic
//! or hang, must never exit 0 with a record missing, and must never put
//! anything in a destination that is not one of the records sent, in the
//! stream it was sent to. A run that exits 10 must have met a line that
//! breaks a rule, and named its file and byte offset.
//!
//! `SKIPPR_FUZZ_SEEDS=A..B` sweeps other seeds (tests/scripts/fuzz-input.sh
//! runs a longer budget); a failure prints its seed and the command that
//! runs it alone.

use skippr_tests::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The seeds a test runs: `SKIPPR_FUZZ_SEEDS=A..B`, else `default`.
fn seeds(default: std::ops::Range<u64>) -> std::ops::Range<u64> {
    let Ok(text) = std::env::var("SKIPPR_FUZZ_SEEDS") else { return default };
    let (a, b) = text.split_once("..").expect("SKIPPR_FUZZ_SEEDS is A..B");
    a.parse().expect("A")..b.parse().expect("B")
}

/// Names a failing seed with the one command that runs it alone.
fn repro(kind: &str, seed: u64, test: &str) -> String {
    format!(
        "{kind} seed {seed} (SKIPPR_FUZZ_SEEDS={seed}..{} cargo test --release --workspace --test e2e -- fuzz_input::{test})",
        seed + 1
    )
}

/// splitmix64: the test's own small generator, so a seed means the same
/// input on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// How long one run may take before it counts as a hang.
const PATIENCE: Duration = Duration::from_secs(60);
/// The record limit the file runs use, small so that long lines are cheap.
const RECORD_BYTES_MAX: usize = 2048;

/// Runs `cmd`, killing it past `PATIENCE`: (exit code, stderr).
fn run_bounded(mut cmd: Command, what: &str) -> (Option<i32>, String) {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: HANG, killed after {PATIENCE:?}: {}", reader.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = reader.join().unwrap();
    assert_ne!(status.code(), Some(101), "{what}: PANIC: {log}");
    (status.code(), log)
}

/// A line of a random file: the record the file source makes of it (the
/// line without its `\n` and one `\r` before it), and whether that record
/// meets the rules, judged here independently of the daemon's own check.
struct Line {
    record: Vec<u8>,
    valid: bool,
}

/// The rules, as a test states them: at most the limit, UTF-8, one JSON
/// value (serde_json's `Value`, a different parse from the daemon's), no
/// CR or LF.
fn meets_rules(record: &[u8]) -> bool {
    record.len() <= RECORD_BYTES_MAX
        && std::str::from_utf8(record).is_ok()
        && serde_json::from_slice::<serde_json::Value>(record).is_ok()
        && !record.iter().any(|b| *b == b'\n' || *b == b'\r')
}

/// A line meant to be a record: JSON built by an encoder around strings
/// that look like protocol messages, paths and line breaks.
fn record_line(rng: &mut Rng, n: u64) -> Vec<u8> {
    let tricky = [
        r#""], "stream":"../../x","seq":7,"records":[{"#,
        "\n\r\t",
        "\u{2028}\u{2029}",
        "é漢字🙂",
        r#"{"type":"result","outcome":"applied"}"#,
        "",
    ];
    let s = serde_json::to_string(rng.pick(&tricky)).unwrap();
    let text = match rng.below(4) {
        0 => format!("{{\"n\":{n},\"s\":{s}}}"),
        1 => format!("  [ {n} , {s} ]\t"),
        2 => format!("{{\"n\":{n},\"deep\":{}{}}}", "[".repeat(40), "]".repeat(40)),
        _ => format!("{{\"n\":{n},\"pad\":\"{}\"}}", "p".repeat(rng.below(RECORD_BYTES_MAX as u64 - 40) as usize)),
    };
    text.into_bytes()
}

/// A line meant to break a rule (random bytes may happen to meet them).
fn bad_line(rng: &mut Rng) -> Vec<u8> {
    match rng.below(9) {
        0 => Vec::new(),
        8 => {
            format!("{{\"past the read window\":\"{}\"}}", "w".repeat((4 << 20) + rng.below(100) as usize)).into_bytes()
        }
        1 => b"{\"msg\":\"x\"}],\"stream\":\"../../elsewhere\",\"seq\":777,\"records\":[{\"injected\":true}".to_vec(),
        2 => b"{\"a\":\"\xff\xfe\"}".to_vec(),
        3 => b"{\"a\":1} {\"b\":2}".to_vec(),
        4 => format!("{{\"long\":\"{}\"}}", "l".repeat(RECORD_BYTES_MAX + rng.below(10_000) as usize)).into_bytes(),
        5 => (0..1 + rng.below(40)).map(|_| (rng.below(255) + 1) as u8).filter(|b| *b != b'\n').collect(),
        6 => b"{\"unterminated\":".to_vec(),
        _ => b"\"\x01 control\"".to_vec(),
    }
}

/// Writes 1 to 3 random files to `dir`; returns each file's lines.
fn random_files(rng: &mut Rng, dir: &Path) -> BTreeMap<String, Vec<Line>> {
    let mut files = BTreeMap::new();
    let mut n = 0;
    for f in 0..1 + rng.below(3) {
        let name = format!("f{f}.jsonl");
        let (mut lines, mut body) = (Vec::new(), Vec::new());
        let bad_share = *rng.pick(&[0, 0, 5, 20]);
        for _ in 0..rng.below(60) {
            n += 1;
            let mut line = if rng.below(100) < bad_share { bad_line(rng) } else { record_line(rng, n) };
            if rng.below(10) == 0 {
                line.push(b'\r');
            }
            body.extend_from_slice(&line);
            body.push(b'\n');
            let record = line.strip_suffix(b"\r").unwrap_or(&line).to_vec();
            let valid = meets_rules(&record);
            lines.push(Line { record, valid });
        }
        if rng.below(5) == 0 {
            // An unfinished last line: not read until a newline ends it.
            body.extend_from_slice(b"{\"unfinished\":");
        }
        std::fs::write(dir.join(&name), body).unwrap();
        files.insert(name, lines);
    }
    files
}

/// The file source over random files, into the directory sink or through
/// the sink plugin: the run's outcome must match what the files hold.
#[test]
fn random_files_are_ingested_exactly_once_or_refused_at_the_first_bad_line() {
    for seed in seeds(0..24) {
        let what = repro("file fuzz", seed, "random_files");
        let mut rng = Rng(seed);
        let tmp = tempfile::tempdir().unwrap();
        let (data, input, out) = (tmp.path().join("data"), tmp.path().join("in"), tmp.path().join("out"));
        std::fs::create_dir(&input).unwrap();
        let files = random_files(&mut rng, &input);
        let through_plugin = rng.below(2) == 0;
        let mut cmd = Command::new(skipprd_bin());
        cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap(), "--source", "file"])
            .args(["--file-dir", input.to_str().unwrap(), "--file-follow", "false"])
            .args(["--record-bytes-max", &RECORD_BYTES_MAX.to_string()]);
        let sink = if through_plugin {
            let plugin = format!("python3 {}", repo_root().join("tests/plugins/sink.py").display());
            cmd.args(["--sink", "command", "--sink-command", &plugin]).env("OUT_DIR", &out);
            out.clone()
        } else {
            data.join("sink")
        };
        let (code, log) = run_bounded(cmd, &what);
        // Records compared by value: the plugin sink re-encodes them.
        let value = |b: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(b).unwrap_or_else(|e| {
                panic!("{what}: not one JSON value in the destination ({e}): {:?}", String::from_utf8_lossy(b))
            })
        };
        let mut got: Vec<_> = destination(&sink, &what).iter().map(|s| value(s)).collect();
        got.sort_by_key(|v| v.to_string());
        let any_bad = files.values().flatten().any(|l| !l.valid);
        match code {
            Some(0) => {
                assert!(!any_bad, "{what}: exit 0 past a line that breaks a rule: {log}");
                let mut want: Vec<_> = files.values().flatten().map(|l| value(&l.record)).collect();
                want.sort_by_key(|v| v.to_string());
                assert_eq!(got, want, "{what}: exit 0 but the destination differs from the input: {log}");
            }
            Some(10) => {
                assert!(any_bad, "{what}: exit 10 on valid input: {log}");
                assert!(log.contains("byte offset"), "{what}: the refusal names no place: {log}");
                // Only records before a file's first bad line, each once
                // (every record of the input is distinct).
                let allowed: Vec<_> =
                    files.values().flat_map(|ls| ls.iter().take_while(|l| l.valid)).map(|l| value(&l.record)).collect();
                for v in &got {
                    assert!(allowed.contains(v), "{what}: {v} reached the destination: {log}");
                }
                let mut unique = got.clone();
                unique.dedup();
                assert_eq!(unique.len(), got.len(), "{what}: a record delivered twice: {log}");
            }
            other => panic!("{what}: exit {other:?}: {log}"),
        }
    }
}

/// Every line of a destination (directory sink or the plugin's), and that
/// only the configured stream is there.
fn destination(dir: &Path, what: &str) -> Vec<Vec<u8>> {
    let Ok(streams) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut lines = Vec::new();
    for stream in streams {
        let stream = stream.unwrap();
        // The directory sink's own folder (`.skippr/`) is hidden, as its
        // temporaries are.
        if stream.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        assert_eq!(stream.file_name(), "lines", "{what}: a stream outside the destination");
        let mut files: Vec<_> = std::fs::read_dir(stream.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        files.sort();
        for f in files {
            let bytes = std::fs::read(f).unwrap();
            lines.extend(bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec));
        }
    }
    lines
}

/// Generator records through a sink plugin that answers at random
/// (tests/plugins/fuzz_sink.py): every run must end with each record in the
/// plugin's destination exactly once.
#[test]
fn a_sink_plugin_answering_at_random_gets_every_record_exactly_once() {
    for seed in seeds(0..6) {
        let what = repro("reply fuzz", seed, "a_sink_plugin");
        let tmp = tempfile::tempdir().unwrap();
        let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
        let plugin = format!("python3 {}", repo_root().join("tests/plugins/fuzz_sink.py").display());
        let mut cmd = Command::new(skipprd_bin());
        // 5 s for an answer: a plugin that hangs costs that much, and the
        // hello at start (which must answer, or the run exits 11) is far
        // within it even on a loaded machine (1 s was not, once).
        cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap(), "--plugin-timeout", "5"])
            .args(["--generator-records", "3000", "--generator-rate", "20000"])
            .args(["--sink", "command", "--sink-command", &plugin])
            .env("OUT_DIR", &out)
            .env("FUZZ_SEED", seed.to_string())
            .env("FUZZ_STARTS", tmp.path().join("starts"));
        let (code, log) = run_bounded(cmd, &what);
        assert_eq!(code, Some(0), "{what}: {log}");
        let records = read_dir_sink(&out);
        for ((stream, partition), seqs) in &records {
            let want: Vec<u64> = (0..3000).collect();
            assert_eq!(seqs, &want, "{what}: {stream} partition {partition}: {log}");
        }
        assert_eq!(records.len(), 2, "{what}: both partitions: {log}");
    }
}
