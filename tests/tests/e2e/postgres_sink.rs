//! The PostgreSQL sink against the local server `./test.sh` starts: the
//! daemon's generator into a table per stream, every batch in one
//! transaction with its progress row; chaos runs with real SIGKILLs end with
//! every record in the table exactly once (checked with SQL); settings the
//! server refuses stop start-up with exit 3 and say what to fix.

use skippr_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn daemon(data: &Path, schema: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(skipprd_bin());
    c.args(["run", "--data-dir", data.to_str().unwrap(), "--sink", "postgres", "--postgres-schema", schema])
        .args(extra)
        .env("SKIPPR_POSTGRES_URL", pg::url());
    c
}

#[test]
fn once_lands_every_record_once_with_a_progress_row_per_batch_and_a_rerun_resumes() {
    let schema = pg::fresh_schema("once");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let args = ["--once", "--postgres-columns", "seq:bigint,partition:integer,value:text"];
    let out = daemon(&data, &schema, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    pg::assert_exactly_once(&schema, "events", 2, 10_000);
    let mut client = pg::client();
    let progress = client
        .query_one(
            &format!("SELECT count(*), sum(records)::bigint, count(DISTINCT seq), max(seq) FROM \"{schema}\".skippr_progress"),
            &[],
        )
        .unwrap();
    let (batches, rows, distinct, max): (i64, i64, i64, i64) =
        (progress.get(0), progress.get(1), progress.get(2), progress.get(3));
    assert_eq!(rows, 20_000, "progress rows count every record");
    assert_eq!((distinct, max), (batches, batches - 1), "one row per sequence number, dense from 0");
    // The mapped columns hold the fields, computed by the server.
    let mapped = client
        .query_one(
            &format!(
                "SELECT count(*) FROM \"{schema}\".events WHERE seq = (data->>'seq')::bigint \
                 AND partition = (data->>'partition')::int AND value = data->>'value'"
            ),
            &[],
        )
        .unwrap();
    assert_eq!(mapped.get::<_, i64>(0), 20_000);
    let again = daemon(&data, &schema, &args).output().unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stdout(&again).starts_with("records: 0,"), "{}", stdout(&again));
    pg::assert_exactly_once(&schema, "events", 2, 10_000);
    assert!(!stderr(&out).contains("skippr-test"), "the password reached a log: {}", stderr(&out));
}

#[test]
fn twenty_chaos_runs_sigkilled_mid_ingest_then_every_record_is_in_postgres_exactly_once() {
    let schema = pg::fresh_schema("chaos");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let args = ["--once", "--generator-partitions", "3", "--generator-records", "100000"];
    // At most 25,000 records a second and kills within 0.45 s: the 20 runs
    // cannot deliver the 300,000 records between them.
    let killed = chaos_runs(20, "0.15", "0.45", Work::Paced { rate: 25_000, total: 300_000 }, || {
        let mut c = daemon(&data, &schema, &args);
        c.args(["--generator-rate", "25000"]);
        c
    });
    assert_eq!(killed, 20, "every run was killed with work in flight");
    let out = daemon(&data, &schema, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    pg::assert_exactly_once(&schema, "events", 3, 100_000);
}

#[test]
fn without_dead_letters_a_record_the_table_refuses_stops_the_stream_with_exit_eight_and_the_servers_message() {
    let schema = pg::fresh_schema("refused");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // `value` is a string of letters: not a bigint.
    let args = ["--once", "--postgres-columns", "value:bigint", "--generator-records", "100"];
    let out = daemon(&data, &schema, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("invalid input syntax for type bigint"), "the server's message: {err}");
    assert!(err.contains("record(s) of compaction") && err.contains("--dead-letter dir"), "{err}");
    let rows = pg::client().query_one(&format!("SELECT count(*) FROM \"{schema}\".events"), &[]).unwrap();
    assert_eq!(rows.get::<_, i64>(0), 0, "nothing of a refused batch is visible");
}

#[test]
fn settings_the_server_refuses_stop_start_up_with_exit_three_and_say_what_to_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let url = pg::url();
    let wrong_password = url.replace(":skippr-test@", ":not-the-password@");
    let no_database = format!("{}_missing", url);
    for (bad, expect) in [(&wrong_password, "password authentication failed"), (&no_database, "does not exist")] {
        let out = Command::new(skipprd_bin())
            .args(["run", "--once", "--data-dir", tmp.path().join("d").to_str().unwrap(), "--sink", "postgres"])
            .env("SKIPPR_POSTGRES_URL", bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(stderr(&out).contains(expect), "{expect}: {}", stderr(&out));
        assert!(!stderr(&out).contains("not-the-password"), "the password reached a log: {}", stderr(&out));
    }
    // A password file others can read is refused before anything connects.
    let file = tmp.path().join("pw");
    std::fs::write(&file, "skippr-test\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let without = url.replace(":skippr-test@", "@");
    let run = |file: &Path| {
        Command::new(skipprd_bin())
            .args(["run", "--once", "--data-dir", tmp.path().join("d2").to_str().unwrap(), "--sink", "postgres"])
            .args(["--postgres-schema", &pg::fresh_schema("pwfile"), "--generator-records", "10"])
            .env("SKIPPR_POSTGRES_URL", &without)
            .env("SKIPPR_POSTGRES_PASSWORD_FILE", file)
            .env_remove("PGPASSWORD")
            .output()
            .unwrap()
    };
    let out = run(&file);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(&file);
    assert_eq!(out.status.code(), Some(0), "the password from the file: {}", stderr(&out));
    // No URL at all.
    let out = Command::new(skipprd_bin())
        .args(["run", "--once", "--sink", "postgres", "--data-dir", tmp.path().join("d3").to_str().unwrap()])
        .env_remove("SKIPPR_POSTGRES_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("--postgres-url"), "{}", stderr(&out));
}

/// The SQL checker itself: a duplicate, a missing record and two records
/// out of source order each fail it.
#[test]
fn the_checker_fails_on_a_duplicate_a_gap_and_records_out_of_order() {
    let schema = pg::fresh_schema("checker");
    let mut client = pg::client();
    let mut table = |rows: &[(i64, i64, u64, u64)]| {
        let mut sql = format!(
            "DROP TABLE IF EXISTS \"{schema}\".events; CREATE SCHEMA IF NOT EXISTS \"{schema}\"; \
             CREATE TABLE \"{schema}\".events (_skippr_seq bigint, _skippr_row int, data jsonb);"
        );
        for (batch, row, p, seq) in rows {
            sql.push_str(&format!(
                "INSERT INTO \"{schema}\".events VALUES ({batch}, {row}, '{{\"partition\":{p},\"seq\":{seq}}}');"
            ));
        }
        client.batch_execute(&sql).unwrap();
    };
    let fails = || std::panic::catch_unwind(|| pg::assert_exactly_once(&schema, "events", 2, 2)).is_err();
    table(&[(0, 0, 0, 0), (0, 1, 1, 0), (1, 0, 0, 1), (1, 1, 1, 1)]);
    assert!(!fails(), "a correct table passes");
    table(&[(0, 0, 0, 0), (0, 1, 1, 0), (1, 0, 0, 1), (1, 1, 1, 1), (2, 0, 1, 1)]);
    assert!(fails(), "a duplicate");
    table(&[(0, 0, 0, 0), (0, 1, 1, 0), (1, 0, 0, 1)]);
    assert!(fails(), "a gap");
    table(&[(0, 0, 0, 1), (0, 1, 1, 0), (1, 0, 0, 0), (1, 1, 1, 1)]);
    assert!(fails(), "out of source order");
}

/// `--help` shows which environment variable sets the URL, never its value.
#[test]
fn help_names_the_url_variable_but_never_shows_its_password() {
    let out = Command::new(skipprd_bin())
        .args(["run", "--help"])
        .env("SKIPPR_POSTGRES_URL", "postgresql://app:hunter2-secret@db/warehouse")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("SKIPPR_POSTGRES_URL"), "{}", stdout(&out));
    assert!(!stdout(&out).contains("hunter2-secret"), "the password is shown by --help");
}

#[test]
fn over_tls_the_daemon_verifies_the_server_against_its_ca_file_and_lands_every_record_once() {
    let schema = pg::fresh_schema("tls");
    let tmp = tempfile::tempdir().unwrap();
    let ca = std::env::var("SKIPPR_TEST_POSTGRES_CA").expect("SKIPPR_TEST_POSTGRES_CA is set by ./test.sh");
    let tls_url = format!("{}?sslmode=verify-full", pg::url());
    let out = daemon(&tmp.path().join("data"), &schema, &["--once", "--postgres-ca-file", &ca])
        .env("SKIPPR_POSTGRES_URL", &tls_url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    pg::assert_exactly_once(&schema, "events", 2, 10_000);
    // Without the CA, the system's roots do not vouch for the test server.
    let out = daemon(&tmp.path().join("data2"), &pg::fresh_schema("tls2"), &["--once"])
        .env("SKIPPR_POSTGRES_URL", &tls_url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("TLS"), "{}", stderr(&out));
    // A CA file for a URL that does not ask for TLS is a mistake to name.
    let out = daemon(&tmp.path().join("data3"), &schema, &["--once", "--postgres-ca-file", &ca]).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("sslmode=require"), "{}", stderr(&out));
}

/// A role given a schema of its own (USAGE and CREATE on it, nothing on the
/// database beyond what every role has) is all the sink needs: it creates
/// the schema only where it is missing.
#[test]
fn a_role_with_only_usage_and_create_on_an_existing_schema_is_enough() {
    let schema = pg::fresh_schema("least");
    let role = format!("skippr_least_{}", std::process::id());
    let mut admin = pg::client();
    admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}")).unwrap();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'least-secret'; CREATE SCHEMA \"{schema}\"; \
             GRANT USAGE, CREATE ON SCHEMA \"{schema}\" TO {role}"
        ))
        .unwrap();
    let url = pg::url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (_, place) = rest.split_once('@').unwrap();
    let as_role = format!("{scheme}://{role}:least-secret@{place}");
    let tmp = tempfile::tempdir().unwrap();
    let out = daemon(&tmp.path().join("data"), &schema, &["--once", "--generator-records", "500"])
        .env("SKIPPR_POSTGRES_URL", &as_role)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    pg::assert_exactly_once(&schema, "events", 2, 500);
    admin.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE; DROP ROLE {role}")).unwrap();
}

/// A server that cannot be reached is named with the cause, not only
/// "error connecting to server".
#[test]
fn an_unreachable_server_is_logged_with_its_cause() {
    let port = skippr_tests::free_port();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    let mut child = daemon(&tmp.path().join("data"), "public", &["--once"])
        .env("SKIPPR_POSTGRES_URL", format!("postgresql://nobody@127.0.0.1:{port}/nothing"))
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !file_contains(&log, "Connection refused") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("error connecting to server: Connection refused"), "{text}");
}

/// The sink, driven directly: a batch with records the table cannot hold
/// (a value its typed column cannot take, a record without its upsert key)
/// is answered `refused`, naming exactly those records with their
/// SQLSTATE, and nothing of it takes effect (no row, no progress row); the
/// rest, sent again under the same number, is applied; asked again about
/// that number with any records, the sink answers from its ledger, never
/// `refused`.
#[test]
fn the_sink_refuses_exactly_the_records_its_table_cannot_hold_and_nothing_else_takes_effect() {
    use skippr_core::{CompactionId, Records, RefusedIndex, SinkOutcome};
    use skippr_io::plugin::postgres_sink::{connection_config, Column, ColumnType, PostgresSettings, PostgresSink};
    use skippr_io::plugin::Sink;
    for upsert in [false, true] {
        let schema = pg::fresh_schema(if upsert { "refuse_keyed" } else { "refuse_plain" });
        let keys = match upsert {
            true => [("orders".to_string(), vec!["id".to_string()])].into(),
            false => Default::default(),
        };
        let settings = PostgresSettings {
            config: connection_config(&pg::url(), None).unwrap(),
            schema: schema.clone(),
            columns: vec![Column { field: "amount".into(), sql_type: ColumnType::Bigint }],
            keys,
            tls: None,
            verbatim: false,
        };
        let mut sink = PostgresSink::open(settings, "main", "wal-a", &["orders".to_string()]).unwrap();
        let mut lines: Vec<String> = (0..40).map(|i| format!(r#"{{"id":{i},"amount":{i}}}"#)).collect();
        lines[3] = r#"{"id":3,"amount":"n/a"}"#.into();
        lines[17] = r#"{"id":17,"amount":99999999999999999999}"#.into();
        lines[38] = r#"{"amount":38}"#.into();
        let records: Records = lines.iter().map(|l| l.as_bytes()).collect();
        let outcome = sink.apply("orders", 0, CompactionId(1), &records).unwrap();
        let SinkOutcome::Refused(refused) = outcome else { panic!("upsert {upsert}: {outcome:?}") };
        let indices: Vec<u32> = refused.iter().map(|r: &RefusedIndex| r.index).collect();
        // Without a key, the record without one is a record like any other.
        let want: Vec<u32> = if upsert { vec![3, 17, 38] } else { vec![3, 17] };
        assert_eq!(indices, want, "upsert {upsert}: {refused:?}");
        assert!(refused[0].reason.starts_with("SQLSTATE 22P02: invalid input syntax for type bigint"), "{refused:?}");
        assert!(refused[1].reason.starts_with("SQLSTATE 22003: "), "{refused:?}");
        if upsert {
            assert!(refused[2].reason.starts_with("SQLSTATE 23514: "), "{refused:?}");
        }
        let mut client = pg::client();
        let count = |client: &mut postgres::Client, table: &str| -> i64 {
            client.query_one(&format!("SELECT count(*) FROM \"{schema}\".{table}"), &[]).unwrap().get(0)
        };
        assert_eq!(
            (count(&mut client, "orders"), count(&mut client, "skippr_progress")),
            (0, 0),
            "nothing took effect"
        );
        let rest: Records =
            lines.iter().enumerate().filter(|(i, _)| !want.contains(&(*i as u32))).map(|(_, l)| l.as_bytes()).collect();
        assert_eq!(sink.apply("orders", 0, CompactionId(2), &rest).unwrap(), SinkOutcome::Applied);
        assert_eq!(count(&mut client, "orders"), rest.len() as i64);
        // The number is held: the ledger answers, whatever the records.
        assert_eq!(sink.apply("orders", 0, CompactionId(2), &rest).unwrap(), SinkOutcome::AlreadyApplied);
        assert_eq!(sink.apply("orders", 0, CompactionId(1), &records).unwrap(), SinkOutcome::Fatal);
        assert_eq!(count(&mut client, "orders"), rest.len() as i64);
    }
}
