//! The PostgreSQL sink's answers against the local server `./test.sh`
//! starts (SKIPPR_TEST_POSTGRES_URL): replays, another id under a number,
//! two appliers at once, a connection the server drops mid-run.

use skippr_core::{CompactionId, Records, SinkOutcome};
use skippr_io::plugin::postgres_sink::{connection_config, tls_config, PostgresSettings, PostgresSink};
use skippr_io::plugin::Sink;

fn url() -> String {
    std::env::var("SKIPPR_TEST_POSTGRES_URL").expect(
        "SKIPPR_TEST_POSTGRES_URL is not set: run the suite with ./test.sh, which starts the local PostgreSQL server",
    )
}

fn client() -> postgres::Client {
    postgres::Client::connect(&url(), postgres::NoTls).unwrap()
}

fn fresh(name: &str) -> (String, PostgresSettings) {
    let schema = format!("io_{name}_{}", std::process::id());
    client().batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).unwrap();
    // Each test's connections carry its name, so that one test can drop
    // its own without touching another's.
    let mut config = connection_config(&url(), None).unwrap();
    config.application_name(&format!("skipprd-{name}"));
    let settings = PostgresSettings::plain(config, &schema);
    (schema, settings)
}

fn open(settings: &PostgresSettings) -> PostgresSink {
    PostgresSink::open(settings.clone(), "main", "disk://test/wal/", &["s".to_string()]).unwrap()
}

fn batch(seq: u64) -> Records {
    (0..3)
        .map(|i| format!("{{\"seq\":{seq},\"i\":{i}}}").into_bytes())
        .collect::<Vec<_>>()
        .iter()
        .map(|r| &r[..])
        .collect()
}

fn count(schema: &str) -> i64 {
    client().query_one(&format!("SELECT count(*) FROM \"{schema}\".s"), &[]).unwrap().get(0)
}

#[test]
fn a_replay_is_already_applied_without_touching_the_data_and_another_id_is_fatal() {
    let (schema, settings) = fresh("replay");
    let mut sink = open(&settings);
    assert_eq!(sink.apply("s", 0, CompactionId(7), &batch(0)).unwrap(), SinkOutcome::Applied);
    assert_eq!(sink.apply("s", 1, CompactionId(8), &batch(1)).unwrap(), SinkOutcome::Applied);
    assert_eq!(count(&schema), 6);
    // A new process (a new connection) replays with the same ids.
    let mut again = open(&settings);
    assert_eq!(again.apply("s", 0, CompactionId(7), &batch(0)).unwrap(), SinkOutcome::AlreadyApplied);
    assert_eq!(again.apply("s", 1, CompactionId(9), &batch(1)).unwrap(), SinkOutcome::Fatal);
    assert_eq!(count(&schema), 6, "neither touched the data");
    assert_eq!(again.progress(&["s".to_string(), "other".to_string()]).unwrap(), vec![("s".to_string(), 1)]);
    // The same id with other records.
    assert_eq!(again.apply("s", 0, CompactionId(7), &batch(5)).unwrap(), SinkOutcome::Fatal);
    // Another pipeline (or WAL) sharing the database has its own numbers,
    // but never writes into the first's tables.
    let refused = PostgresSink::open(settings.clone(), "second", "disk://test/wal/", &["s".to_string()]).err().unwrap();
    assert!(refused.0.contains("belongs to pipeline 'main' of the WAL disk://test/wal/"), "{}", refused.0);
    assert!(refused.0.contains("another --postgres-schema"), "{}", refused.0);
    let mut other = PostgresSink::open(settings.clone(), "second", "disk://test/wal/", &["u".to_string()]).unwrap();
    assert!(other.progress(&["u".to_string()]).unwrap().is_empty());
    assert_eq!(other.apply("u", 0, CompactionId(70), &batch(0)).unwrap(), SinkOutcome::Applied);
}

#[test]
fn tables_and_progress_rows_of_an_earlier_version_keep_working() {
    // What the sink of before table claims and digests created: a progress
    // table without a digest column, a stream table, one applied batch.
    let (schema, settings) = fresh("upgrade");
    client()
        .batch_execute(&format!(
            "CREATE SCHEMA \"{schema}\";
             CREATE TABLE \"{schema}\".skippr_progress (
                pipeline text NOT NULL, wal text NOT NULL, stream text NOT NULL, seq bigint NOT NULL,
                compaction_id text NOT NULL, records bigint NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (pipeline, wal, stream, seq));
             CREATE TABLE \"{schema}\".s (_skippr_seq bigint NOT NULL, _skippr_row integer NOT NULL, data jsonb NOT NULL);
             INSERT INTO \"{schema}\".skippr_progress (pipeline, wal, stream, seq, compaction_id, records)
                VALUES ('main', 'disk://test/wal/', 's', 0, '0000000000000007', 3);
             INSERT INTO \"{schema}\".s SELECT 0, i, jsonb_build_object('seq', 0, 'i', i) FROM generate_series(0, 2) i;"
        ))
        .unwrap();
    // Another pipeline may not take the old table: its rows are main's.
    let refused = PostgresSink::open(settings.clone(), "second", "disk://test/wal/", &["s".to_string()]).err().unwrap();
    assert!(refused.0.contains("belongs to pipeline 'main'"), "{}", refused.0);
    let mut sink = open(&settings);
    assert_eq!(sink.progress(&["s".to_string()]).unwrap(), vec![("s".to_string(), 0)]);
    // A row without a digest compares the id alone.
    assert_eq!(sink.apply("s", 0, CompactionId(7), &batch(0)).unwrap(), SinkOutcome::AlreadyApplied);
    assert_eq!(sink.apply("s", 0, CompactionId(8), &batch(0)).unwrap(), SinkOutcome::Fatal);
    assert_eq!(sink.apply("s", 1, CompactionId(9), &batch(1)).unwrap(), SinkOutcome::Applied);
    assert_eq!(sink.apply("s", 1, CompactionId(9), &batch(2)).unwrap(), SinkOutcome::Fatal, "digests kept now");
    assert_eq!(count(&schema), 6);
}

#[test]
fn two_appliers_at_once_apply_each_batch_once() {
    let (schema, settings) = fresh("race");
    open(&settings); // the tables
    for round in 0..10u64 {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let settings = settings.clone();
                std::thread::spawn(move || {
                    let mut sink = open(&settings);
                    (0..20u64)
                        .map(|i| {
                            let seq = round * 20 + i;
                            sink.apply("s", seq, CompactionId(1000 + seq), &batch(seq)).unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let answers: Vec<Vec<SinkOutcome>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for (i, (a, b)) in answers[0].iter().zip(&answers[1]).enumerate() {
            let pair = [a.clone(), b.clone()];
            assert!(
                pair.contains(&SinkOutcome::Applied) && pair.contains(&SinkOutcome::AlreadyApplied),
                "round {round} batch {i}: {pair:?}"
            );
        }
    }
    assert_eq!(count(&schema), 10 * 20 * 3);
}

#[test]
fn a_connection_the_server_drops_is_retried_on_a_new_one() {
    let (schema, settings) = fresh("dropped");
    let mut sink = open(&settings);
    assert_eq!(sink.apply("s", 0, CompactionId(1), &batch(0)).unwrap(), SinkOutcome::Applied);
    client()
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'skipprd-dropped' AND pid <> pg_backend_pid()",
        )
        .unwrap();
    // The first try may find the connection gone (an error: retried); the
    // next one connects again. Nothing is applied twice.
    let first = sink.apply("s", 1, CompactionId(2), &batch(1));
    let outcome = match first {
        Ok(o) => o,
        Err(e) => {
            assert!(!e.0.contains("skippr-test"), "the password reached an error: {e}");
            sink.apply("s", 1, CompactionId(2), &batch(1)).unwrap()
        }
    };
    assert_eq!(outcome, SinkOutcome::Applied);
    assert_eq!(count(&schema), 6);
}

#[test]
fn a_table_dropped_under_the_sink_is_created_again_and_a_bad_record_is_refused() {
    let (schema, settings) = fresh("dropped_table");
    let mut sink = open(&settings);
    assert_eq!(sink.apply("s", 0, CompactionId(1), &batch(0)).unwrap(), SinkOutcome::Applied);
    client().batch_execute(&format!("DROP TABLE \"{schema}\".s")).unwrap();
    let err = sink.apply("s", 1, CompactionId(2), &batch(1)).unwrap_err();
    assert!(err.0.contains("42P01"), "{err}");
    assert_eq!(sink.apply("s", 1, CompactionId(2), &batch(1)).unwrap(), SinkOutcome::Applied);
    assert_eq!(count(&schema), 3);
    // Not JSON: the server refuses it, and the sink names that record.
    let bad: Records = [&b"{\"ok\":1}"[..], b"not json"].into_iter().collect();
    let SinkOutcome::Refused(refused) = sink.apply("s", 2, CompactionId(3), &bad).unwrap() else { panic!() };
    assert_eq!(refused.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1]);
    assert!(refused[0].reason.starts_with("SQLSTATE 22P02: invalid input syntax for type json"), "{refused:?}");
    assert_eq!(count(&schema), 3, "nothing of the refused batch");
    // Its progress row went with it: the batch can be applied once fixed.
    let good: Records = [&b"{\"ok\":1}"[..], b"{\"ok\":2}"].into_iter().collect();
    assert_eq!(sink.apply("s", 2, CompactionId(3), &good).unwrap(), SinkOutcome::Applied);
}

#[test]
fn upserted_streams_keep_one_row_per_key_the_latest_and_a_record_without_its_key_is_refused() {
    let (schema, mut settings) = fresh("upsert");
    settings.keys.insert("s".into(), vec!["id".into(), "region".into()]);
    let mut sink = open(&settings);
    let records = |rows: &[&str]| -> Records { rows.iter().map(|r| r.as_bytes()).collect() };
    let first = records(&[
        r#"{"id":1,"region":"eu","v":"a"}"#,
        r#"{"id":2,"region":"eu","v":"b"}"#,
        r#"{"id":2,"region":"eu","v":"b2"}"#,
        r#"{"id":2,"region":"us","v":"c"}"#,
    ]);
    assert_eq!(sink.apply("s", 0, CompactionId(1), &first).unwrap(), SinkOutcome::Applied);
    let second = records(&[r#"{"id":1,"region":"eu","v":"a2"}"#, r#"{"id":3,"region":"eu","v":"d"}"#]);
    assert_eq!(sink.apply("s", 1, CompactionId(2), &second).unwrap(), SinkOutcome::Applied);
    // A replay of the first batch is caught by its progress row and does
    // not bring the older values back.
    assert_eq!(sink.apply("s", 0, CompactionId(1), &first).unwrap(), SinkOutcome::AlreadyApplied);
    let rows: Vec<(String, String, i64)> = client()
        .query(
            &format!(
                "SELECT data->>'id' || '/' || (data->>'region'), data->>'v', _skippr_seq FROM \"{schema}\".s ORDER BY 1"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want = [("1/eu", "a2", 1), ("2/eu", "b2", 0), ("2/us", "c", 0), ("3/eu", "d", 1)];
    assert_eq!(rows, want.iter().map(|(k, v, s)| (k.to_string(), v.to_string(), *s)).collect::<Vec<_>>());
    let keyless = records(&[r#"{"region":"eu","v":"no id"}"#]);
    let SinkOutcome::Refused(refused) = sink.apply("s", 2, CompactionId(3), &keyless).unwrap() else { panic!() };
    assert_eq!(refused.len(), 1);
    assert!(refused[0].reason.starts_with("SQLSTATE 23514: "), "{refused:?}");
    assert_eq!(count(&schema), 4);
}

fn tls_settings(name: &str, ca: Option<&[u8]>) -> (String, PostgresSettings) {
    let (schema, mut settings) = fresh(name);
    let url = format!("{}?sslmode=require", url());
    let mut config = connection_config(&url, None).unwrap();
    config.application_name(&format!("skipprd-{name}"));
    settings.config = config;
    settings.tls = Some(tls_config(ca).unwrap());
    (schema, settings)
}

#[test]
fn with_sslmode_require_the_session_is_tls_verified_against_the_ca_and_an_unknown_ca_is_refused() {
    let ca = std::fs::read(std::env::var("SKIPPR_TEST_POSTGRES_CA").expect("set by ./test.sh")).unwrap();
    let (schema, settings) = tls_settings("tls", Some(&ca));
    let mut sink = open(&settings);
    assert_eq!(sink.apply("s", 0, CompactionId(1), &batch(0)).unwrap(), SinkOutcome::Applied);
    let ssl: bool = client()
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'skipprd-tls'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(ssl, "the sink's session is not encrypted");
    assert_eq!(count(&schema), 3);
    // Another CA does not vouch for the server: start-up is refused,
    // naming TLS, not retried as if the server were down.
    let other_key = rcgen::KeyPair::generate().unwrap();
    let mut other = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    other.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other_ca = other.self_signed(&other_key).unwrap().pem();
    let (_, unknown) = tls_settings("tls_unknown", Some(other_ca.as_bytes()));
    let refused = PostgresSink::open(unknown, "main", "disk://test/wal/", &["s".to_string()]).err().unwrap();
    assert!(refused.0.contains("TLS refused the server"), "{}", refused.0);
}
