//! Singer taps as a source. A tap that resumes faithfully (tests/plugins/
//! singer_tap.py) lands every record exactly once in the directory sink
//! across chaos runs with real SIGKILLs, and across a run that prints
//! garbage, exits non-zero or hangs. The real tap-jsonl from PyPI (pinned,
//! started by ./test.sh through tests/scripts/singer.sh) re-sends every
//! record on every run, which its second run shows; with `--postgres-upsert`
//! by its `key_properties`, PostgreSQL still holds each record once after
//! chaos runs that re-run it.

use skippr_tests::*;
use std::path::Path;
use std::process::Command;

fn fake_tap() -> String {
    format!("python3 {}", repo_root().join("tests/plugins/singer_tap.py").display())
}

fn daemon(data: &Path, tap: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(skipprd_bin());
    c.args(["run", "--data-dir", data.to_str().unwrap(), "--source", "singer", "--singer-command", tap])
        .args(["--sink-dir", data.join("sink").to_str().unwrap()])
        .args(extra);
    c
}

#[test]
fn a_faithful_tap_sigkilled_mid_sync_lands_every_record_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let tap = fake_tap();
    // 8 KiB commit groups and 350-byte records: a window's records of a
    // stream (about 87 KiB) go in some twenty batches, each in a group of
    // its own, and the WAL is the bottleneck, so many kills land between
    // the groups of one window.
    let env = [("STREAMS", "events,orders"), ("RECORDS", "40000"), ("EVERY", "250"), ("PAD", "300")];
    let small = ["--once", "--wal-bytes-per-file", "65536"];
    // At most 10,000 records a second and kills within 0.6 s: the twelve
    // runs cannot send the 80,000 records between them.
    let killed = chaos_runs(12, "0.3", "0.6", Work::Paced { rate: 10_000, total: 80_000 }, || {
        let mut c = daemon(&data, &tap, &small);
        c.envs(env).env("RATE", "10000");
        c
    });
    assert_eq!(killed, 12, "every run was killed mid-sync");
    let out = daemon(&data, &tap, &small).envs(env).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming from the committed state"), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events", "orders"], 1, 40_000);
}

#[test]
fn a_tap_that_prints_garbage_exits_non_zero_or_hangs_is_run_again_from_its_last_state() {
    for (mode, says) in [("garbage", "not a Singer message"), ("exit", "exit status: 3"), ("hang", "sent nothing for")]
    {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let marker = tmp.path().join("marker");
        let out = daemon(&data, &fake_tap(), &["--once", "--plugin-timeout", "2"])
            .envs([("RECORDS", "3000"), ("EVERY", "100"), ("MISBEHAVE", mode), ("MISBEHAVE_AT", "1050")])
            .env("MARKER", &marker)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", stderr(&out));
        assert!(marker.exists(), "{mode}: the tap misbehaved");
        assert!(stderr(&out).contains(says), "{mode}: {says}: {}", stderr(&out));
        assert!(stderr(&out).contains("after its last STATE is void"), "{mode}: {}", stderr(&out));
        assert_exactly_once(&data.join("sink"), &["events"], 1, 3000);
    }
}

/// The pinned tap-jsonl's executable, installed by ./test.sh.
fn tap_jsonl() -> String {
    std::env::var("SKIPPR_TEST_TAP_JSONL")
        .expect("SKIPPR_TEST_TAP_JSONL is not set: run the suite with ./test.sh, which installs tap-jsonl")
}

/// tap-jsonl's config and input: `lines` records {"id", "v"} in one file.
fn jsonl_input(dir: &Path, lines: u64) -> std::path::PathBuf {
    let input = dir.join("input");
    std::fs::create_dir_all(&input).unwrap();
    let body: String = (0..lines).map(|i| format!("{{\"id\": {i}, \"v\": \"value-{i}\"}}\n")).collect();
    std::fs::write(input.join("items.jsonl"), body).unwrap();
    let config = dir.join("tap.json");
    let settings = serde_json::json!({
        "path": format!("{}/*.jsonl", input.display()),
        "stream_name": "items",
        "primary_keys": ["id"],
    });
    std::fs::write(&config, settings.to_string()).unwrap();
    config
}

/// Lines in the directory sink's files of stream `items`.
fn items_in_dir_sink(data: &Path) -> u64 {
    let lines: usize = std::fs::read_dir(data.join("sink").join("items"))
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .map(|p| std::fs::read_to_string(p).unwrap().lines().count())
        .sum();
    lines as u64
}

/// tap-jsonl bookmarks on its file's modification time, inclusively: its
/// next run sends every line of an unchanged file again, byte for byte,
/// under the same bookmark. The bookmark rule keeps each once in the
/// directory sink, which does not upsert.
#[test]
fn tap_jsonl_sends_everything_again_on_its_next_run_and_the_bookmark_rule_keeps_each_line_once() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = jsonl_input(tmp.path(), 500);
    let tap = format!("{} --config {}", tap_jsonl(), config.display());
    for run in 1..=2u64 {
        let out = daemon(&data, &tap, &["--once"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(items_in_dir_sink(&data), 500, "run {run}: the lines sent again were recognised");
    }
}

#[test]
fn tap_jsonl_re_run_through_chaos_into_postgres_upserted_by_its_key_holds_each_record_once() {
    let schema = pg::fresh_schema("singer");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = jsonl_input(tmp.path(), 20_000);
    let tap = format!("{} --config {}", tap_jsonl(), config.display());
    let pg_daemon = |extra: &[&str]| {
        let mut c = daemon(&data, &tap, extra);
        c.args(["--sink", "postgres", "--postgres-schema", &schema, "--postgres-upsert", "true"])
            .env("SKIPPR_POSTGRES_URL", pg::url());
        c
    };
    // Each run re-syncs every 0.2 s, re-sending all 20,000 records; kills
    // land within 1 to 4 s, during a sync or between two.
    let killed = chaos_runs(6, "1.0", "4.0", Work::Endless, || pg_daemon(&["--singer-interval", "0.2"]));
    assert_eq!(killed, 6, "an endless source: every run was killed");
    let out = pg_daemon(&["--once"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let row = pg::client()
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT data->>'id'), \
                 count(*) FILTER (WHERE data->>'v' = 'value-' || (data->>'id')) FROM \"{schema}\".items"
            ),
            &[],
        )
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)), (20_000, 20_000, 20_000));
    let batches: i64 = pg::client()
        .query_one(&format!("SELECT sum(records)::bigint FROM \"{schema}\".skippr_progress"), &[])
        .unwrap()
        .get(0);
    assert!(batches > 20_000, "the tap re-sent records ({batches} applied) that the upsert kept once");
}

#[test]
fn a_taps_schema_goes_to_the_schema_plugin_once_per_stream_and_a_refusal_stops_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("asks.log");
    let schema_plugin = format!("python3 {}", repo_root().join("tests/plugins/schema.py").display());
    let run = |schema: &str, records: &str| {
        daemon(&data, &fake_tap(), &["--once", "--schema-command", &schema_plugin])
            .envs([("STREAMS", "events,orders"), ("RECORDS", records), ("SCHEMA", schema)])
            .env("ASK_LOG", &log)
            .output()
            .unwrap()
    };
    let out = run(r#"{"type": "object", "properties": {"seq": {"type": "integer"}}}"#, "500");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 2, "asked once per stream");
    assert_exactly_once(&data.join("sink"), &["events", "orders"], 1, 500);
    // A schema the plugin refuses stops the daemon before anything under it
    // commits; the tap's state stays where it was.
    let out = run(r#"{"reject": true}"#, "800");
    assert_eq!(out.status.code(), Some(12), "{}", stderr(&out));
    assert!(stderr(&out).contains("this schema is refused on purpose"), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events", "orders"], 1, 500);
}

#[test]
fn a_window_larger_than_the_wal_stops_the_daemon_naming_its_limit_and_a_larger_wal_takes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // A STATE only at the end of 5,000 records of about 140 bytes: some
    // 700 KB in one window.
    let env = [("RECORDS", "5000"), ("EVERY", "1000000"), ("PAD", "100")];
    let small = ["--once", "--wal-bytes-per-file", "65536", "--wal-max-bytes", "262144"];
    let out = daemon(&data, &fake_tap(), &small).envs(env).output().unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    assert!(stderr(&out).contains("Raise --wal-max-bytes (WAL_MAX_BYTES)"), "{}", stderr(&out));
    assert!(read_dir_sink(&data.join("sink")).is_empty(), "nothing of the open window was delivered");
    let large = ["--once", "--wal-bytes-per-file", "65536", "--wal-max-bytes", "4194304"];
    let out = daemon(&data, &fake_tap(), &large).envs(env).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&data.join("sink"), &["events"], 1, 5000);
    // The setting that bounded a window in memory before is gone, and
    // says so.
    let out = daemon(&data, &fake_tap(), &["--once", "--singer-buffer-bytes", "1000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("--singer-buffer-bytes (singer_buffer_bytes) is gone"), "{}", stderr(&out));
}

fn tap_postgres() -> String {
    std::env::var("SKIPPR_TEST_TAP_POSTGRES")
        .expect("SKIPPR_TEST_TAP_POSTGRES is not set: run the suite with ./test.sh, which installs tap-postgres")
}

/// Where the SDK tap's rows go.
enum TapSink {
    Postgres,
    Dir,
    S3,
}

/// MeltanoLabs' tap-postgres, a Singer SDK tap, reading table `items` of
/// a fresh schema in the suite's PostgreSQL incrementally on its integer
/// `id` (resumed inclusively, `id >= bookmark`, as SDK taps do), through
/// three syncs with new rows between them and SIGKILLs during the second,
/// into `sink`: the `id` of every row the sink holds, and how many records
/// it was sent (PostgreSQL's progress table says; `None` elsewhere).
fn sdk_tap_three_syncs(sink: TapSink) -> (Vec<u64>, Option<i64>) {
    let _cores = both_cores();
    let (source, schema) = (pg::fresh_schema("tap_src"), pg::fresh_schema("tap_sink"));
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let insert = |from: u64, to: u64| {
        let sql =
            format!("INSERT INTO \"{source}\".items SELECT i, 'value-' || i FROM generate_series({from}, {to}) AS i;");
        pg::client().batch_execute(&sql).unwrap();
    };
    let create =
        format!("CREATE SCHEMA \"{source}\"; CREATE TABLE \"{source}\".items (id bigint PRIMARY KEY, v text);");
    pg::client().batch_execute(&create).unwrap();
    let config = tmp.path().join("tap.json");
    let tap_config = serde_json::json!({ "sqlalchemy_url": pg::url(), "filter_schemas": [source] });
    std::fs::write(&config, tap_config.to_string()).unwrap();
    let tap = format!("{} --config {}", tap_postgres(), config.display());
    // The catalog: the tap's discovery, `items` selected, replicated
    // incrementally on `id`.
    let discovered = Command::new("sh").args(["-c", &format!("{tap} --discover")]).output().unwrap();
    assert!(discovered.status.success(), "{}", stderr(&discovered));
    let mut catalog: serde_json::Value = serde_json::from_slice(&discovered.stdout).unwrap();
    let stream_id = format!("{source}-items");
    let streams = catalog["streams"].as_array_mut().unwrap();
    streams.retain(|s| s["tap_stream_id"] == stream_id.as_str());
    assert_eq!(streams.len(), 1, "{catalog}");
    for m in streams[0]["metadata"].as_array_mut().unwrap() {
        if m["breadcrumb"].as_array().is_some_and(Vec::is_empty) {
            let meta = m["metadata"].as_object_mut().unwrap();
            meta.insert("selected".into(), true.into());
            meta.insert("replication-key".into(), "id".into());
            meta.insert("replication-method".into(), "INCREMENTAL".into());
            meta.remove("forced-replication-method");
        }
    }
    let catalog_file = tmp.path().join("catalog.json");
    std::fs::write(&catalog_file, catalog.to_string()).unwrap();
    let bucket = match sink {
        TapSink::S3 => aws::runtime().block_on(aws::bucket("tap")),
        _ => String::new(),
    };
    let run = |extra: &[&str]| {
        let mut c = daemon(&data, &tap, extra);
        c.args(["--singer-catalog", catalog_file.to_str().unwrap()]);
        match sink {
            TapSink::Postgres => {
                c.args(["--sink", "postgres", "--postgres-schema", &schema, "--postgres-upsert", "true"])
                    .env("SKIPPR_POSTGRES_URL", pg::url());
            }
            TapSink::Dir => {}
            TapSink::S3 => {
                c.args(["--sink", "s3", "--sink-s3-bucket", &bucket, "--sink-s3-prefix", "rows/"]).envs(aws::env());
            }
        }
        c
    };
    // Keys start at 1: the SDK takes a bookmark of 0 for none.
    insert(1, 3_000);
    let out = run(&["--once"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    insert(3_001, 6_000);
    // Each run syncs again every 0.2 s (resuming at the bookmark each
    // time); kills land within 1 to 3 s, during a sync or between two.
    let killed = chaos_runs(3, "1.0", "3.0", Work::Endless, || run(&["--singer-interval", "0.2"]));
    assert_eq!(killed, 3, "an endless source: every run was killed");
    insert(6_001, 9_000);
    let out = run(&["--once"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = |line: &[u8]| serde_json::from_slice::<serde_json::Value>(line).unwrap()["id"].as_u64().unwrap();
    let lines = |body: &[u8]| body.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(id).collect::<Vec<u64>>();
    match sink {
        TapSink::Postgres => {
            let table = format!("\"{schema}\".\"{stream_id}\"");
            let query = format!("SELECT (data->>'id')::bigint, data->>'v' FROM {table}");
            let mut ids = Vec::new();
            for row in pg::client().query(&query, &[]).unwrap() {
                let (i, v): (i64, String) = (row.get(0), row.get(1));
                assert_eq!(v, format!("value-{i}"), "the row as the table holds it");
                ids.push(i as u64);
            }
            let sent: i64 = pg::client()
                .query_one(&format!("SELECT sum(records)::bigint FROM \"{schema}\".skippr_progress"), &[])
                .unwrap()
                .get(0);
            (ids, Some(sent))
        }
        TapSink::Dir => {
            let dir = data.join("sink").join(&stream_id);
            let mut ids = Vec::new();
            for f in std::fs::read_dir(&dir).unwrap() {
                let path = f.unwrap().path();
                if path.extension().is_some_and(|x| x == "jsonl") {
                    ids.extend(lines(&std::fs::read(path).unwrap()));
                }
            }
            (ids, None)
        }
        TapSink::S3 => {
            let objects = crate::s3_sink::objects(&bucket, "rows/");
            (objects.iter().flat_map(|(_, body, _)| lines(body)).collect(), None)
        }
    }
}

/// Each of 1..=9,000 exactly once.
fn assert_each_row_once(mut ids: Vec<u64>, sink: &str) {
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(n, ids.len(), "{sink}: {} rows twice", n - ids.len());
    assert_eq!((ids.len(), ids.first(), ids.last()), (9_000, Some(&1), Some(&9_000)), "{sink}: every row");
}

#[test]
fn an_sdk_tap_resuming_its_bookmark_inclusively_lands_each_row_once_in_postgres_sent_once() {
    let (ids, sent) = sdk_tap_three_syncs(TapSink::Postgres);
    assert_each_row_once(ids, "postgres");
    assert_eq!(sent, Some(9_000), "the bookmark rule dropped the row each resumed sync sent again");
}

#[test]
fn an_sdk_tap_resuming_its_bookmark_inclusively_lands_each_row_once_in_the_directory_sink() {
    let (ids, _) = sdk_tap_three_syncs(TapSink::Dir);
    assert_each_row_once(ids, "dir");
}

#[test]
fn an_sdk_tap_resuming_its_bookmark_inclusively_lands_each_row_once_in_the_s3_sink() {
    let (ids, _) = sdk_tap_three_syncs(TapSink::S3);
    assert_each_row_once(ids, "s3");
}
