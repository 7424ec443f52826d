//! Dead letters end to end: an external sink speaking protocol version 2
//! refuses the records that carry `"bad": true`; with `--dead-letter dir`
//! each refused record lands once in the dead-letter directory, with its
//! reason, and every other record once in the sink, through SIGKILLs at any
//! moment. Without dead letters the same refusal stops the daemon (exit 8)
//! naming the record. The PostgreSQL sink the same way, into the
//! `postgres` dead-letter destination: a typed column refuses the records
//! whose value it cannot hold, both tables checked by SQL. And
//! `dead-letters replay` sends them back once.

use skippr_tests::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const RECORDS: u64 = 60_000;
const BAD_EVERY: u64 = 997;

fn plugin(name: &str) -> String {
    format!("python3 {}", repo_root().join("tests").join("plugins").join(name).display())
}

/// The daemon with the test source (every `BAD_EVERY`-th record bad) into
/// the sink `sink` names.
fn with_sink(data: &Path, sink: &[&str], extra: &[&str], rate: Option<u64>) -> Command {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--once", "--data-dir", data.to_str().unwrap()])
        .args(["--source", "command", "--source-command", &plugin("source.py")])
        .args(sink)
        .args(["--wal-bytes-per-file", "4194304"])
        .args(extra)
        .env("RECORDS", RECORDS.to_string())
        .env("BAD_EVERY", BAD_EVERY.to_string());
    if let Some(rate) = rate {
        cmd.env("RATE", rate.to_string());
    }
    cmd
}

/// `skipprd dead-letters list` with the daemon's settings (as `with_sink`
/// gives them): the number of dead letters it counts, after checking that
/// `--raw` prints as many lines, each a dead letter of a bad record.
fn listed(data: &Path, sink: &[&str], extra: &[&str], envs: &[(&str, String)]) -> usize {
    let run = |raw: bool| {
        let mut cmd = Command::new(skipprd_bin());
        cmd.args(["dead-letters", "list", "--data-dir", data.to_str().unwrap()])
            .args(["--source", "command", "--source-command", &plugin("source.py")])
            .args(sink)
            .args(extra)
            .envs(envs.iter().map(|(k, v)| (k, v)));
        if raw {
            cmd.arg("--raw");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    };
    let table = run(false);
    let last = table.lines().last().unwrap_or_default();
    let n: usize = last.strip_suffix(" dead letter(s)").and_then(|n| n.parse().ok()).expect(&table);
    assert_eq!(table.lines().count(), n + 2, "a header, a line per dead letter, a count: {table}");
    let raw = run(true);
    assert_eq!(raw.lines().count(), n, "{raw}");
    for line in raw.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["record"]["bad"], true, "{line}");
    }
    n
}

/// Into the test's external sink, speaking version 2, refusing bad records.
fn daemon(data: &Path, out: &Path, extra: &[&str], rate: Option<u64>) -> Command {
    let sink = plugin("sink.py");
    let mut cmd = with_sink(data, &["--sink", "command", "--sink-command", &sink], extra, rate);
    cmd.env("PROTOCOL", "2").env("REFUSE_FIELD", "bad").env("OUT_DIR", out);
    cmd
}

/// Eight runs of `daemon` (given the source's pace) SIGKILLed mid-ingest,
/// then one unpaced to the end, exit 0. Killed within 0.4 s each, at 30,000
/// records/s, the runs send at most 96,000 of the 120,000 records: every
/// one is killed with work in flight, whatever the machine's speed.
fn killed_then_finished(daemon: impl Fn(Option<u64>) -> Command) {
    const RATE: u64 = 30_000;
    let work = Work::Paced { rate: RATE, total: 2 * RECORDS };
    let killed = chaos_runs(8, "0.1", "0.4", work, || daemon(Some(RATE)));
    assert_eq!(killed, 8, "every run was killed with work in flight");
    let done = daemon(None).output().unwrap();
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
}

/// Dead letters, tallied: (partition, the record's seq) → (reason, how
/// many times).
type Tally = BTreeMap<(u64, u64), (String, usize)>;

/// Adds the dead letters of one dead-letter batch (JSON lines) to `out`.
fn tally(batch: &str, out: &mut Tally) {
    for line in batch.lines() {
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

/// The dead-letter batches of stream `orders` under `dir` (the `dir`
/// destination), each file's text: none where nothing was written yet, and
/// never a batch being written (hidden, `.tmp`).
fn letter_batches(dir: &Path) -> Vec<String> {
    let Ok(files) = std::fs::read_dir(dir.join("orders")) else { return Vec::new() };
    let files = files.map(|e| e.unwrap().path());
    let whole = |file: &std::path::PathBuf| {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        !name.starts_with('.') && name.ends_with(".jsonl")
    };
    files.filter(whole).map(|file| std::fs::read_to_string(&file).unwrap()).collect()
}

/// Every dead letter under `dir` (the `dir` destination).
fn dead_letters(dir: &Path) -> Tally {
    let mut out = Tally::new();
    for batch in letter_batches(dir) {
        tally(&batch, &mut out);
    }
    out
}

/// The sink and the dead letters hold every record exactly once between
/// them: the bad ones as dead letters with their reason, the rest in the
/// sink.
fn assert_each_record_once(out: &Path, dead: &Tally) {
    assert_each_record_once_for(out, dead, "bad is set", BAD_EVERY);
}

/// As `assert_each_record_once`, each dead letter with `why`, every
/// `bad_every`-th record bad.
fn assert_each_record_once_for(out: &Path, dead: &Tally, why: &str, bad_every: u64) {
    let sink = read_dir_sink(out);
    for p in 0..2u64 {
        let got = sink.get(&("orders".to_string(), p)).cloned().unwrap_or_default();
        let good: Vec<u64> = (0..RECORDS).filter(|s| s % bad_every != bad_every - 1).collect();
        assert_eq!(got.len(), good.len(), "partition {p}: records in the sink");
        assert_eq!(got, good, "partition {p}: the sink holds every good record once, in order, and no bad one");
        let bad: Vec<u64> = (0..RECORDS).filter(|s| s % bad_every == bad_every - 1).collect();
        let lettered: Vec<u64> = dead.keys().filter(|(q, _)| *q == p).map(|(_, s)| *s).collect();
        assert_eq!(lettered, bad, "partition {p}: every bad record is a dead letter");
    }
    for ((p, s), (reason, n)) in dead {
        assert_eq!((reason.as_str(), *n), (why, 1), "partition {p} record {s}: once, with its reason");
    }
}

#[test]
fn refused_records_go_to_the_dead_letters_once_and_the_rest_to_the_sink_through_sigkills() {
    let _cores = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let letters = data.join("dead-letters");
    let args = ["--dead-letter", "dir"];
    killed_then_finished(|rate| daemon(&data, &out, &args, rate));
    assert_each_record_once(&out, &dead_letters(&letters));
    let bad = (2 * (RECORDS / BAD_EVERY)) as usize;
    assert_eq!(listed(&data, &[], &args, &[]), bad, "dead-letters list shows each once");
}

/// A version 1 sink cannot name a record it cannot take: it answers
/// `fatal` for the whole batch. With dead letters on, the daemon splits
/// such a batch (each split committed to the WAL) down to the record, which
/// becomes a dead letter; the rest reaches the sink, each record once,
/// through SIGKILLs. Each bad record costs about 2·log2(batch) round trips
/// to the sink and commits, so bad records are five times rarer here.
#[test]
fn a_version_1_sinks_fatal_batches_are_split_down_to_the_bad_records_once_through_sigkills() {
    let _cores = both_cores();
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let letters = data.join("dead-letters");
    let sink = plugin("sink.py");
    let args = ["--dead-letter", "dir"];
    const RARE: u64 = 5 * BAD_EVERY;
    killed_then_finished(|rate| {
        let mut cmd = with_sink(&data, &["--sink", "command", "--sink-command", &sink], &args, rate);
        cmd.env("FATAL_FIELD", "bad").env("OUT_DIR", &out).env("BAD_EVERY", RARE.to_string());
        cmd
    });
    let why = "the sink answered fatal for a batch of this record alone";
    assert_each_record_once_for(&out, &dead_letters(&letters), why, RARE);
    let bad = (2 * (RECORDS / RARE)) as usize;
    assert_eq!(listed(&data, &[], &args, &[]), bad, "dead-letters list shows each once");
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
    assert_each_record_once(&out, &dead_letters(&data.join("dead-letters")));
}

/// The same through the `s3` dead-letter destination: an object per
/// dead-letter batch in the local S3 server, keys dense from 0.
#[test]
fn refused_records_go_to_s3_dead_letters_once_through_sigkills() {
    use skippr_tests::aws;
    let _cores = both_cores();
    let bucket = aws::runtime().block_on(aws::bucket("letters"));
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let args = ["--dead-letter", "s3", "--dead-letter-s3-bucket", &bucket];
    let s3 = |rate: Option<u64>| {
        let mut cmd = daemon(&data, &out, &args, rate);
        cmd.envs(aws::env());
        cmd
    };
    killed_then_finished(s3);
    let mut dead = Tally::new();
    let objects = crate::s3_sink::objects(&bucket, "dead-letters/orders/");
    for (i, (key, body, _)) in objects.iter().enumerate() {
        assert!(key.ends_with(&format!(".{i:020}.jsonl")), "{key}: dead-letter batches dense from 0");
        tally(std::str::from_utf8(body).unwrap(), &mut dead);
    }
    assert_each_record_once(&out, &dead);
    let bad = (2 * (RECORDS / BAD_EVERY)) as usize;
    assert_eq!(listed(&data, &[], &args, &aws::env()), bad, "dead-letters list shows each once");
    // Replayed from S3 into a sink that takes them: every record once.
    let replayed = replay_from(&data, &out, false, &args, &aws::env());
    assert_eq!(replayed.status.code(), Some(0), "{}", stderr(&replayed));
    assert!(stdout(&replayed).starts_with(&format!("records: {bad}, committed: {bad},")), "{}", stdout(&replayed));
    let sink = read_dir_sink(&out);
    for p in 0..2u64 {
        let mut got = sink.get(&("orders".to_string(), p)).cloned().unwrap_or_default();
        got.sort_unstable();
        assert_eq!(got, (0..RECORDS).collect::<Vec<_>>(), "partition {p}: every record in the sink once");
    }
}

/// The PostgreSQL sink with a `bigint` column for `amount`, which the bad
/// records give as "n/a": through SIGKILLs, each good record is in the
/// stream's table once and each bad one in the dead-letter table once,
/// with the server's reason, checked by SQL.
#[test]
fn a_record_jsonb_cannot_hold_reaches_the_postgres_dead_letters_as_written() {
    let (schema, letters) = (pg::fresh_schema("dl_nul"), pg::fresh_schema("dl_nul_letters"));
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("input");
    std::fs::create_dir(&input).unwrap();
    // `jsonb` takes no `\u0000` in a string: the sink refuses the record,
    // and the dead-letter destination must hold it all the same, as written.
    let nul = r#"{"n":2, "note":"a\u0000b",  "z":1, "a":0}"#;
    std::fs::write(input.join("a.jsonl"), format!("{{\"n\":1}}\n{nul}\n{{\"n\":3}}\n")).unwrap();
    let out = Command::new(skipprd_bin())
        .args(["run", "--once", "--data-dir", tmp.path().join("data").to_str().unwrap()])
        .args(["--source", "file", "--file-dir", input.to_str().unwrap(), "--file-follow", "false"])
        .args(["--file-stream", "notes", "--sink", "postgres", "--postgres-schema", &schema])
        .args(["--dead-letter", "postgres", "--dead-letter-schema", &letters])
        .env("SKIPPR_POSTGRES_URL", pg::url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut client = pg::client();
    let rows = client.query(&format!("SELECT data->>'n' FROM \"{schema}\".notes ORDER BY 1"), &[]).unwrap();
    let kept: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(kept, ["1", "3"], "the other records in the table");
    let rows = client.query(&format!("SELECT data::text FROM \"{letters}\".notes"), &[]).unwrap();
    assert_eq!(rows.len(), 1, "one dead letter");
    let letter: String = rows[0].get(0);
    assert!(letter.ends_with(&format!(",\"record\":{nul}}}")), "the record's bytes as written: {letter}");
    let letter: serde_json::Value = serde_json::from_str(&letter).unwrap();
    let reason = letter["reason"].as_str().unwrap();
    assert!(reason.starts_with("SQLSTATE 22P05"), "{reason}");
}

#[test]
fn postgres_refuses_bad_values_into_the_postgres_dead_letters_once_through_sigkills() {
    let _cores = both_cores();
    let (schema, letters) = (pg::fresh_schema("dl_rows"), pg::fresh_schema("dl_letters"));
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let sink = [
        "--sink",
        "postgres",
        "--postgres-schema",
        &schema,
        "--postgres-columns",
        "amount:bigint",
        "--dead-letter",
        "postgres",
        "--dead-letter-schema",
        &letters,
    ];
    let postgres = |rate: Option<u64>| {
        let mut cmd = with_sink(&data, &sink, &[], rate);
        cmd.env("SKIPPR_POSTGRES_URL", pg::url());
        cmd
    };
    killed_then_finished(postgres);
    let bad_each = RECORDS / BAD_EVERY;
    let url = [("SKIPPR_POSTGRES_URL", pg::url())];
    assert_eq!(listed(&data, &sink, &[], &url), 2 * bad_each as usize, "dead-letters list shows each once");
    let mut client = pg::client();
    for p in 0..2i64 {
        // The table: every good record once (count = distinct = all good
        // ones, none bad, each within range), its amount in the column.
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*), count(DISTINCT data->>'seq'), count(*) FILTER (WHERE data ? 'bad'), \
                     count(*) FILTER (WHERE amount = (data->>'seq')::bigint AND amount < $2) \
                     FROM \"{schema}\".orders WHERE (data->>'partition')::bigint = $1"
                ),
                &[&p, &(RECORDS as i64)],
            )
            .unwrap();
        let good = (RECORDS - bad_each) as i64;
        let got: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(got, (good, good, 0, good), "partition {p}: (rows, distinct, bad, amount = seq)");
        // The dead letters: each bad record once, with the server's reason.
        let rows = client
            .query(
                &format!(
                    "SELECT (data->'record'->>'seq')::bigint, count(*), min(data->>'reason'), \
                     bool_and((data->>'position')::bigint = (data->'record'->>'seq')::bigint) \
                     FROM \"{letters}\".orders WHERE (data->>'partition')::bigint = $1 GROUP BY 1 ORDER BY 1"
                ),
                &[&p],
            )
            .unwrap();
        let seqs: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let want: Vec<i64> = (0..RECORDS as i64).filter(|s| *s as u64 % BAD_EVERY == BAD_EVERY - 1).collect();
        assert_eq!(seqs, want, "partition {p}: the dead letters are exactly the bad records");
        for r in &rows {
            let (seq, n, reason, placed): (i64, i64, String, bool) = (r.get(0), r.get(1), r.get(2), r.get(3));
            assert_eq!(n, 1, "partition {p} record {seq}: one dead letter");
            assert!(placed, "partition {p} record {seq}: its position");
            assert!(
                reason.starts_with("SQLSTATE 22P02: invalid input syntax for type bigint"),
                "partition {p} record {seq}: {reason}"
            );
        }
    }
    // The column fixed, the dead letters replayed from PostgreSQL (records
    // as written, from a `json` column): every record in the table once.
    client
        .batch_execute(&format!(
            "ALTER TABLE \"{schema}\".orders DROP COLUMN amount; ALTER TABLE \"{schema}\".orders ADD COLUMN amount \
             bigint GENERATED ALWAYS AS (CASE WHEN data->>'amount' ~ '^[0-9]+$' THEN (data->>'amount')::bigint END) \
             STORED"
        ))
        .unwrap();
    let replay = || {
        let mut cmd = Command::new(skipprd_bin());
        cmd.args(["dead-letters", "replay", "--data-dir", data.to_str().unwrap()])
            .args(["--source", "command", "--source-command", &plugin("source.py")])
            .args(sink)
            .env("SKIPPR_POSTGRES_URL", pg::url());
        cmd.output().unwrap()
    };
    let replayed = replay();
    assert_eq!(replayed.status.code(), Some(0), "{}", stderr(&replayed));
    let n = 2 * bad_each;
    assert!(stdout(&replayed).starts_with(&format!("records: {n}, committed: {n},")), "{}", stdout(&replayed));
    assert!(stdout(&replay()).starts_with("records: 0,"), "a second replay sends nothing");
    for p in 0..2i64 {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*), count(DISTINCT data->>'seq'), count(*) FILTER (WHERE data ? 'bad') FROM \
                     \"{schema}\".orders WHERE (data->>'partition')::bigint = $1"
                ),
                &[&p],
            )
            .unwrap();
        let got: (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(got, (RECORDS as i64, RECORDS as i64, bad_each as i64), "partition {p}: (rows, distinct, bad)");
    }
}

/// A version 1 sink answers `fatal` for every batch that holds a bad
/// record: each stop (exit 8) prints the `--skip-batch` that gives that
/// batch up, and starting again with it (the options accumulating, as in a
/// unit file) goes on. In the end the sink holds every record of the
/// batches not given up exactly once, in order, and none of a batch given
/// up; `wal verify` lists each skip with its reason.
#[test]
fn a_batch_the_sink_refuses_as_fatal_is_given_up_by_the_operators_skip_batch() {
    const RECORDS_HERE: u64 = 3_000;
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let sink = plugin("sink.py");
    let mut skips: Vec<String> = Vec::new();
    let mut stops = 0;
    loop {
        let mut args: Vec<&str> = vec!["--sink", "command", "--sink-command", &sink];
        for s in &skips {
            args.extend(["--skip-batch", s]);
        }
        if !skips.is_empty() {
            args.extend(["--skip-reason", "ticket 7: the destination will not take it"]);
        }
        let mut cmd = with_sink(&data, &args, &[], None);
        cmd.env("FATAL_FIELD", "bad").env("OUT_DIR", &out).env("RECORDS", RECORDS_HERE.to_string());
        let run = cmd.output().unwrap();
        if run.status.code() == Some(0) {
            break;
        }
        let text = stderr(&run);
        assert_eq!(run.status.code(), Some(8), "{text}");
        let option = text.split("--skip-batch ").nth(1).and_then(|t| t.split_whitespace().next()).expect(&text);
        assert!(option.starts_with("orders:"), "{text}");
        assert!(!skips.contains(&option.to_string()), "a batch given up is never sent again: {text}");
        skips.push(option.to_string());
        stops += 1;
        assert!(stops <= 6, "one stop per batch holding a bad record, at most six such: {skips:?}");
    }
    assert!(stops >= 1, "the bad records stopped the sink at least once");
    // Every record the sink holds is good, once, in order; what it lacks
    // are whole spans, each holding a bad record.
    let held = read_dir_sink(&out);
    for p in 0..2u64 {
        let got = held.get(&("orders".to_string(), p)).cloned().unwrap_or_default();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "partition {p}: once, in order");
        let bad: Vec<u64> = (0..RECORDS_HERE).filter(|s| s % BAD_EVERY == BAD_EVERY - 1).collect();
        assert_eq!(bad.len(), 3);
        assert!(bad.iter().all(|b| !got.contains(b)), "partition {p}: no bad record reached the sink");
        let mut gaps = Vec::new();
        let mut next = 0;
        for &s in got.iter().chain(std::iter::once(&RECORDS_HERE)) {
            if s > next {
                gaps.push(next..s);
            }
            next = s + 1;
        }
        for gap in &gaps {
            assert!(bad.iter().any(|b| gap.contains(b)), "partition {p}: {gap:?} missing without a bad record in it");
        }
        assert!(!gaps.is_empty(), "partition {p}: the given-up batches held records of it");
    }
    let verify = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    let text = stdout(&verify);
    for s in &skips {
        let (_, seq) = s.split_once(':').unwrap();
        let line = format!("stream orders, batch {seq} ");
        assert!(text.contains(&line) && text.contains("ticket 7"), "{line} in: {text}");
    }
}

/// `dead-letters replay` with the test pipeline's settings into the
/// external sink, which refuses bad records while `refusing`, the dead
/// letters in the `dir` destination.
fn replay(data: &Path, out: &Path, refusing: bool, envs: &[(&str, &str)]) -> std::process::Output {
    let envs: Vec<(&str, String)> = envs.iter().map(|(k, v)| (*k, v.to_string())).collect();
    replay_from(data, out, refusing, &["--dead-letter", "dir"], &envs)
}

/// `replay`, the dead letters where `letters` says.
fn replay_from(
    data: &Path,
    out: &Path,
    refusing: bool,
    letters: &[&str],
    envs: &[(&str, String)],
) -> std::process::Output {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["dead-letters", "replay", "--data-dir", data.to_str().unwrap()])
        .args(["--source", "command", "--source-command", &plugin("source.py")])
        .args(["--sink", "command", "--sink-command", &plugin("sink.py")])
        .args(letters)
        .args(["--dead-letter-max", "1000"])
        .env("PROTOCOL", "2")
        .env("OUT_DIR", out)
        .envs(envs.iter().map(|(k, v)| (k, v)));
    if refusing {
        cmd.env("REFUSE_FIELD", "bad");
    }
    cmd.output().unwrap()
}

/// The dead letters under `dir` by the source that sent the record: for
/// each, the records (partition, seq) and how many letters each has.
fn letters_by_source(dir: &Path) -> BTreeMap<String, BTreeMap<(u64, u64), usize>> {
    let mut out: BTreeMap<String, BTreeMap<(u64, u64), usize>> = BTreeMap::new();
    assert!(dir.join("orders").is_dir(), "dead letters under {}", dir.display());
    for batch in letter_batches(dir) {
        for line in batch.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(
                (&v["record"]["bad"], &v["reason"]),
                (&serde_json::json!(true), &serde_json::json!("bad is set"))
            );
            let record = (v["record"]["partition"].as_u64().unwrap(), v["record"]["seq"].as_u64().unwrap());
            *out.entry(v["source"].as_str().unwrap().to_string()).or_default().entry(record).or_default() += 1;
        }
    }
    out
}

/// `dead-letters replay` in its three cases. The sink still refusing: each
/// letter is sent once and refused again (a new letter, of the replay's own
/// source). The cause fixed: the daemon SIGKILLed once the sink applied
/// the replay's first batch, before it answered, then the replay run again.
/// Nothing new: a replay sends nothing. In the end the sink holds every
/// record exactly once, and the dead letters are each refusal once.
#[test]
fn dead_letters_replayed_reach_the_sink_once_through_a_kill() {
    use std::os::unix::process::ExitStatusExt;
    const HERE: u64 = 20_000;
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("data"), tmp.path().join("out"));
    let letters = data.join("dead-letters");
    let mut first = daemon(&data, &out, &["--dead-letter", "dir"], None);
    let first = first.env("RECORDS", HERE.to_string()).output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let bad: BTreeMap<(u64, u64), usize> =
        (0..2).flat_map(|p| (0..HERE).filter(|s| s % BAD_EVERY == BAD_EVERY - 1).map(move |s| ((p, s), 1))).collect();
    assert_eq!(bad.len(), 40);
    let held = |out: &Path| -> Vec<Vec<u64>> {
        let sink = read_dir_sink(out);
        (0..2).map(|p| sink.get(&("orders".to_string(), p)).cloned().unwrap_or_default()).collect()
    };
    let before = held(&out);

    // Still refused: the sink unchanged, each letter refused once more.
    let again = replay(&data, &out, true, &[]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(held(&out), before, "nothing reached the sink");
    let by_source = letters_by_source(&letters);
    assert_eq!(by_source.get("source"), Some(&bad), "the first refusals, once each");
    assert_eq!(by_source.get("dead-letters"), Some(&bad), "each letter sent again once, refused again once");

    // Fixed: killed after the sink applied and before it answered.
    let killed = replay(&data, &out, false, &[("KILL_DAEMON_AFTER", "1")]);
    assert_eq!(killed.status.signal(), Some(9), "{}", stderr(&killed));
    let done = replay(&data, &out, false, &[]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    for (p, got) in held(&out).into_iter().enumerate() {
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..HERE).collect::<Vec<_>>(), "partition {p}: every record in the sink exactly once");
    }
    assert_eq!(letters_by_source(&letters), by_source, "no letter was added");

    // Nothing new: nothing is sent.
    let idle = replay(&data, &out, false, &[]);
    assert_eq!(idle.status.code(), Some(0), "{}", stderr(&idle));
    assert!(stdout(&idle).starts_with("records: 0,"), "{}", stdout(&idle));
    assert_eq!(held(&out).iter().map(Vec::len).sum::<usize>(), 2 * HERE as usize);
}

/// A replay that cannot do what it is asked says so before it touches
/// anything: without dead letters there is nothing to read, and `--once`
/// is what it does anyway.
#[test]
fn a_replay_without_dead_letters_or_with_once_is_refused_naming_why() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let run = |extra: &[&str]| {
        let out = skipprd(&[&["dead-letters", "replay", "--data-dir", data.to_str().unwrap()], extra].concat());
        (out.status.code(), stderr(&out))
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("--dead-letter is off") && text.contains("no dead letters to replay"), "{text}");
    let (code, text) = run(&["--dead-letter", "dir", "--once"]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.starts_with("skipprd dead-letters replay: --once"), "{text}");
    assert!(!data.exists(), "nothing was created");
}

/// Line `s` of the file source's file `p`: `{"stream","partition","seq"}`,
/// or, every `BAD_EVERY`-th, broken in turn three ways (cut JSON, a byte
/// that is not UTF-8 in a string, a carriage return between two fields;
/// one at the end of a line is the file source's line ending).
fn input_line(p: u64, s: u64, out: &mut Vec<u8>) {
    let whole = format!(r#"{{"stream":"orders","partition":{p},"seq":{s}}}"#);
    match (s / BAD_EVERY) % 3 {
        _ if s % BAD_EVERY != BAD_EVERY - 1 => out.extend_from_slice(whole.as_bytes()),
        0 => out.extend_from_slice(&whole.as_bytes()[..whole.len() - 1]),
        1 => {
            out.extend_from_slice(format!(r#"{{"partition":{p},"seq":{s},"x":""#).as_bytes());
            out.extend_from_slice(b"\xff\"}");
        }
        _ => out.extend_from_slice(whole.replacen(',', ",\r", 1).as_bytes()),
    }
    out.push(b'\n');
}

/// Appends `lines` lines to each of the file source's two files under
/// `dir`, `per_tick` to each every 10 ms (an upstream writing as the
/// daemon reads).
fn write_input(dir: &Path, lines: u64, per_tick: u64) {
    use std::io::Write as _;
    std::fs::create_dir_all(dir).unwrap();
    let mut files: Vec<std::fs::File> = (0..2)
        .map(|p| std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("p{p}.jsonl"))).unwrap())
        .collect();
    let mut chunk = Vec::new();
    for from in (0..lines).step_by(per_tick as usize) {
        for (p, file) in files.iter_mut().enumerate() {
            chunk.clear();
            (from..(from + per_tick).min(lines)).for_each(|s| input_line(p as u64, s, &mut chunk));
            file.write_all(&chunk).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The daemon reading `input` with the file source into the directory
/// sink at `out`, dead letters in the `dir` destination.
fn file_daemon(data: &Path, input: &Path, out: &Path, follow: bool) -> Command {
    let mut cmd = Command::new(skipprd_bin());
    cmd.args(["run", "--data-dir", data.to_str().unwrap()])
        .args(["--source", "file", "--file-dir", input.to_str().unwrap(), "--file-stream", "orders"])
        .args(["--file-follow", if follow { "true" } else { "false" }])
        .args(["--sink", "dir", "--sink-dir", out.to_str().unwrap()])
        .args(["--dead-letter", "dir", "--dead-letter-max", "1000"])
        .args(["--wal-bytes-per-file", "4194304"]);
    if !follow {
        cmd.arg("--once");
    }
    cmd
}

/// The dead letters under `dir` by the source that sent the record: for
/// each broken record (partition, seq, read from its bytes), its letters'
/// reasons.
fn intake_letters(dir: &Path) -> BTreeMap<String, BTreeMap<(u64, u64), Vec<String>>> {
    use base64::Engine as _;
    let mut out: BTreeMap<String, BTreeMap<(u64, u64), Vec<String>>> = BTreeMap::new();
    for batch in letter_batches(dir) {
        for line in batch.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v.get("record"), None, "a record refused at intake is no JSON value: {line}");
            let bytes = match (v["record_text"].as_str(), v["record_base64"].as_str()) {
                (Some(text), None) => text.as_bytes().to_vec(),
                (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap(),
                _ => panic!("one of record_text and record_base64: {line}"),
            };
            let text = String::from_utf8_lossy(&bytes);
            let field = |name: &str| -> u64 {
                let at = text.find(&format!("\"{name}\":")).expect(name) + name.len() + 3;
                text[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
            };
            let record = (field("partition"), field("seq"));
            let reason = v["reason"].as_str().unwrap().to_string();
            out.entry(v["source"].as_str().unwrap().to_string()).or_default().entry(record).or_default().push(reason);
        }
    }
    out
}

/// Lines a file source reads that are not one JSON value on one line go to
/// the dead letters, with dead letters on, instead of stopping the daemon:
/// through SIGKILLs, every whole line is in the sink once and every broken
/// one a dead letter once, its bytes as read (as text, or base64 where
/// they are not UTF-8) and the rule it broke. A replay sends each back
/// through intake, where it is refused again, once.
#[test]
fn broken_lines_go_to_the_dead_letters_once_through_sigkills() {
    let _cores = both_cores();
    // Written at up to 20,000 lines a second to each file, for at least
    // 6 s, while six runs are each killed within 0.8 s of their start: on a
    // machine of usual speed every run reads while lines arrive (the
    // assertions hold whatever the speed).
    const LINES: u64 = 120_000;
    let tmp = tempfile::tempdir().unwrap();
    let (data, input, out) = (tmp.path().join("data"), tmp.path().join("input"), tmp.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    let writer = std::thread::spawn({
        let input = input.clone();
        move || write_input(&input, LINES, 200)
    });
    // The file source follows its files here: a run ends only by its kill.
    let killed = chaos_runs(6, "0.2", "0.8", Work::Endless, || file_daemon(&data, &input, &out, true));
    assert_eq!(killed, 6);
    writer.join().unwrap();
    let done = file_daemon(&data, &input, &out, false).output().unwrap();
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    let sink = read_dir_sink(&out);
    let broken = |s: &u64| s % BAD_EVERY == BAD_EVERY - 1;
    let bad: BTreeMap<(u64, u64), Vec<String>> = (0..2u64)
        .flat_map(|p| (0..LINES).filter(broken).map(move |s| (p, s)))
        .map(|(p, s)| {
            let why = match (s / BAD_EVERY) % 3 {
                0 => "refused at intake: it is not exactly one JSON value",
                1 => "refused at intake: it is not valid UTF-8",
                _ => "refused at intake: it holds a line break outside a string",
            };
            ((p, s), vec![why.to_string()])
        })
        .collect();
    for p in 0..2u64 {
        let got = sink.get(&("orders".to_string(), p)).cloned().unwrap_or_default();
        let good: Vec<u64> = (0..LINES).filter(|s| !broken(s)).collect();
        let first_off = got.iter().zip(&good).position(|(a, b)| a != b);
        assert!(
            got == good,
            "partition {p}: every whole line once, in order, and no broken one: {} records, {} wanted, first \
             difference at index {first_off:?}: {:?}",
            got.len(),
            good.len(),
            first_off.map(|i| (&got[i..(i + 5).min(got.len())], &good[i..(i + 5).min(good.len())]))
        );
    }
    let cut = |letters: BTreeMap<(u64, u64), Vec<String>>| -> BTreeMap<(u64, u64), Vec<String>> {
        let short =
            |r: &String| bad.values().flatten().find(|w| r.starts_with(w.as_str())).cloned().unwrap_or(r.clone());
        letters.into_iter().map(|(k, rs)| (k, rs.iter().map(short).collect())).collect()
    };
    let letters = intake_letters(&data.join("dead-letters"));
    assert_eq!(letters.keys().collect::<Vec<_>>(), ["source"], "{letters:?}");
    assert_eq!(cut(letters["source"].clone()), bad, "every broken line a dead letter once, with the rule it broke");

    // A replay: each letter goes back through intake, refused again once.
    let replay = Command::new(skipprd_bin())
        .args(["dead-letters", "replay", "--data-dir", data.to_str().unwrap()])
        .args(["--source", "file", "--file-dir", input.to_str().unwrap(), "--file-stream", "orders"])
        .args(["--sink", "dir", "--sink-dir", out.to_str().unwrap()])
        .args(["--dead-letter", "dir", "--dead-letter-max", "1000"])
        .output()
        .unwrap();
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    let letters = intake_letters(&data.join("dead-letters"));
    assert_eq!(cut(letters["dead-letters"].clone()), bad, "each letter refused again once, its bytes intact");
    assert_eq!(read_dir_sink(&out), sink, "nothing of it reached the sink");
}
