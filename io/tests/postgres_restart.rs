//! The PostgreSQL sink across a server restart in the middle of a batch's
//! COPY. A test binary of its own: the restart ends every session on the
//! server, which would fail the other sink tests if they ran beside it.

use skippr_core::{CompactionId, Records, SinkOutcome};
use skippr_io::plugin::postgres_sink::{connection_config, PostgresSettings, PostgresSink};
use skippr_io::plugin::Sink;
use std::time::{Duration, Instant};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the suite with ./test.sh, which starts the local PostgreSQL server")
    })
}

fn client() -> postgres::Client {
    postgres::Client::connect(&env("SKIPPR_TEST_POSTGRES_URL"), postgres::NoTls).unwrap()
}

/// A batch large enough that its COPY is still running when the server
/// goes down.
fn rows() -> Records {
    let mut records = Records::default();
    for i in 0..300_000 {
        records.push(format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(64)).as_bytes());
    }
    records
}

#[test]
fn a_server_restart_mid_copy_is_retried_and_the_batch_lands_once() {
    let schema = format!("io_restart_{}", std::process::id());
    client().batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).unwrap();
    let mut config = connection_config(&env("SKIPPR_TEST_POSTGRES_URL"), None).unwrap();
    config.application_name("skipprd-restart");
    let settings = PostgresSettings::plain(config, &schema);
    let streams = ["s".to_string()];
    let mut sink = PostgresSink::open(settings, "main", "disk://test/wal/", &streams).unwrap();

    let applier = std::thread::spawn(move || {
        let first = sink.apply("s", 0, CompactionId(7), &rows());
        (sink, first)
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let active: i64 = client()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'skipprd-restart' \
                 AND state = 'active' AND query LIKE 'COPY%'",
                &[],
            )
            .unwrap()
            .get(0);
        if active > 0 {
            break;
        }
        assert!(!applier.is_finished(), "the batch was applied before the restart could land; make it larger");
        assert!(Instant::now() < deadline, "the sink's COPY never showed in pg_stat_activity");
        std::thread::sleep(Duration::from_millis(5));
    }
    let restart = std::process::Command::new("sh")
        .arg("-c")
        .arg(env("SKIPPR_TEST_POSTGRES_RESTART"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .status()
        .unwrap();
    assert!(restart.success(), "the restart command failed");

    let (mut sink, first) = applier.join().unwrap();
    let err = first.expect_err("a batch whose COPY the server cut cannot have been applied");
    assert!(!err.0.contains("skippr-test"), "the password reached an error: {err}");
    // The next try connects again and applies the whole batch once.
    let records = rows();
    let again = sink.apply("s", 0, CompactionId(7), &records).unwrap();
    assert_eq!(again, SinkOutcome::Applied);
    assert_eq!(sink.apply("s", 0, CompactionId(7), &records).unwrap(), SinkOutcome::AlreadyApplied);
    let row =
        client().query_one(&format!("SELECT count(*), count(DISTINCT data->>'i') FROM \"{schema}\".s"), &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (300_000, 300_000));
}
