//! S3 mode against a real local S3 and DynamoDB server (moto, started by
//! ./test.sh), through the real AWS SDK: conditional creates racing, puts
//! whose responses are lost, offsets that must not move backwards, the
//! writer lease between two daemons, and a frozen writer fenced out.

use skippr_core::{
    IoError, LeaseRow, Lsn, OffsetEntry, OffsetValue, PartitionKey, Position, SegmentId, SourceId, WalListing,
};
use skippr_io::dynamo::Dynamo;
use skippr_io::s3_wal::S3Wal;
use skippr_tests::aws::{self, Proxy};
use skippr_tests::*;
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Retries a put while its outcome is unknown, as the engine does.
async fn settle(wal: &S3Wal, segment: SegmentId, offset: u64, bytes: &[u8]) -> Result<(), IoError> {
    loop {
        match wal.put(segment, offset, bytes).await {
            Err(IoError::Ambiguous) => tokio::time::sleep(Duration::from_millis(5)).await,
            other => return other,
        }
    }
}

#[test]
fn two_writers_creating_the_same_key_exactly_one_wins() {
    aws::runtime().block_on(async {
        let bucket = aws::bucket("race").await;
        let sdk = aws::sdk(&aws::endpoint()).await;
        let a = S3Wal::connect(&sdk, &bucket, "wal").await.unwrap();
        let b = S3Wal::connect(&sdk, &bucket, "wal").await.unwrap();
        for offset in 0..20u64 {
            let (bytes_a, bytes_b) = (vec![b'a'; 100 + offset as usize], vec![b'b'; 100 + offset as usize]);
            let (ra, rb) = tokio::join!(
                settle(&a, SegmentId(1), offset * 1000, &bytes_a),
                settle(&b, SegmentId(1), offset * 1000, &bytes_b)
            );
            let winner = match (ra, rb) {
                (Ok(()), Err(IoError::Conflict)) => bytes_a,
                (Err(IoError::Conflict), Ok(())) => bytes_b,
                other => panic!("offset {offset}: expected one winner and one conflict, got {other:?}"),
            };
            // The loser's retry of its own bytes still conflicts; the
            // winner's is a success; the object holds the winner's bytes.
            assert_eq!(settle(&a, SegmentId(1), offset * 1000, &winner).await, Ok(()));
            let read = a.read(SegmentId(1)).await.unwrap();
            assert_eq!(&read[(offset * 1000) as usize..], &winner[..]);
        }
    });
}

#[test]
fn a_put_whose_response_is_lost_resolves_by_sending_the_same_bytes_again() {
    aws::runtime().block_on(async {
        let bucket = aws::bucket("ambiguous").await;
        let proxy = Proxy::start(&aws::endpoint());
        let sdk = aws::sdk(&proxy.endpoint()).await;
        let wal = S3Wal::connect(&sdk, &bucket, "wal").await.unwrap();
        let direct = S3Wal::connect(&aws::sdk(&aws::endpoint()).await, &bucket, "wal").await.unwrap();
        let group = b"a commit group".to_vec();
        proxy.drop_responses.store(true, Ordering::SeqCst);
        assert_eq!(wal.put(SegmentId(3), 32, &group).await, Err(IoError::Ambiguous), "the response was dropped");
        assert!(proxy.dropped.load(Ordering::SeqCst) > 0);
        assert_eq!(direct.read(SegmentId(3)).await.unwrap()[32..], group[..], "the put took effect regardless");
        proxy.drop_responses.store(false, Ordering::SeqCst);
        assert_eq!(wal.put(SegmentId(3), 32, &group).await, Ok(()), "412, same bytes: created after all");
        assert_eq!(
            wal.put(SegmentId(3), 32, b"other bytes").await,
            Err(IoError::Conflict),
            "different bytes never replace a group"
        );
        assert_eq!(direct.read(SegmentId(3)).await.unwrap()[32..], group[..]);
    });
}

#[test]
fn the_start_up_probe_sends_a_put_again_whose_response_was_lost() {
    aws::runtime().block_on(async {
        let bucket = aws::bucket("probe").await;
        let proxy = Proxy::start(&aws::endpoint());
        let wal = S3Wal::connect(&aws::sdk(&proxy.endpoint()).await, &bucket, "wal").await.unwrap();
        // The first create's answer lost (it landed: the next create of it
        // is refused, as ours), then the second create's.
        for lost in 1..=2 {
            proxy.drop_next.store(lost, Ordering::SeqCst);
            let before = proxy.dropped.load(Ordering::SeqCst);
            assert_eq!(wal.probe_conditional_puts(lost).await, Ok(()), "{lost} answer(s) lost");
            assert_eq!(proxy.dropped.load(Ordering::SeqCst), before + lost, "the answers were dropped");
        }
        // A store that ignores If-None-Match is still found out through a lost answer.
        proxy.strip_conditions.store(true, Ordering::SeqCst);
        proxy.drop_next.store(1, Ordering::SeqCst);
        let found = wal.probe_conditional_puts(7).await.unwrap_err();
        assert!(found.contains("ignores If-None-Match"), "{found}");
    });
}

#[test]
fn wal_objects_lay_out_as_a_segment_and_a_listing_deletes_nothing() {
    aws::runtime().block_on(async {
        let bucket = aws::bucket("layout").await;
        let wal = S3Wal::connect(&aws::sdk(&aws::endpoint()).await, &bucket, "p/wal").await.unwrap();
        for segment in [SegmentId(4), SegmentId(5)] {
            wal.put(segment, 0, b"header").await.unwrap();
            wal.put(segment, 6, b"g1").await.unwrap();
            wal.put(segment, 10, b"g3").await.unwrap();
        }
        assert_eq!(wal.read(SegmentId(4)).await.unwrap(), b"headerg1\0\0g3", "zeros in the gap");
        // Recovery's windows: listed at offset 0, then the objects each
        // window covers (one cut by a window's end is kept for the next),
        // short at the last object's end, empty past it.
        let whole = b"headerg1\0\0g3";
        for len in 1..=13 {
            let mut read = Vec::new();
            loop {
                let window = wal.read_at(SegmentId(4), read.len() as u64, len).await.unwrap();
                read.extend_from_slice(&window);
                if window.len() < len {
                    break;
                }
            }
            assert_eq!(read, whole, "in windows of {len}");
        }
        assert_eq!(wal.read_at(SegmentId(4), 3, 6).await.unwrap(), b"derg1\0");
        assert!(wal.read_at(SegmentId(4), 12, 6).await.unwrap().is_empty());
        let objects = |four: Vec<u64>| {
            let mut listed = BTreeMap::from([(SegmentId(5), vec![0, 6, 10])]);
            listed.insert(SegmentId(4), four);
            WalListing::Objects(listed)
        };
        assert_eq!(wal.list().await.unwrap(), objects(vec![0, 6, 10]));
        // A delete interrupted after the header: the listing reports the
        // groups left behind and deletes nothing (the engine decides and
        // deletes them under its lease); read-only tools skip them.
        let sdk = aws::sdk(&aws::endpoint()).await;
        let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build());
        s3.delete_object().bucket(&bucket).key(wal.key(SegmentId(4), 0)).send().await.unwrap();
        assert_eq!(wal.list().await.unwrap(), objects(vec![6, 10]));
        assert_eq!(wal.list_segments().await.unwrap(), vec![SegmentId(5)]);
        let left = s3.list_objects_v2().bucket(&bucket).send().await.unwrap();
        assert_eq!(left.contents().len(), 5, "nothing deleted by listing");
        wal.delete(SegmentId(4)).await.unwrap();
        let left = s3.list_objects_v2().bucket(&bucket).send().await.unwrap();
        assert_eq!(left.contents().len(), 3, "the engine's delete of a leftover takes its groups");
        wal.put(SegmentId(5), 8, b"overlap").await.unwrap();
        assert_eq!(wal.read(SegmentId(5)).await, Err(IoError::Failed), "overlapping objects cannot be laid out");
    });
}

#[test]
fn offsets_in_dynamodb_never_move_backwards_and_the_lease_is_conditional() {
    aws::runtime().block_on(async {
        let sdk = aws::sdk(&aws::endpoint()).await;
        let table = format!("offsets-{}", std::process::id());
        assert!(Dynamo::create_table(&sdk, &table).await.unwrap(), "created");
        assert!(!Dynamo::create_table(&sdk, &table).await.unwrap(), "a second init-table leaves it alone");
        let store = Dynamo::connect(&sdk, &table, "main", vec!["source".into()], "s3://b/wal/").await.unwrap();
        let key = PartitionKey { source: SourceId(0), partition: 7 };
        let entry = |position: u64, lsn: u64| OffsetEntry {
            key,
            value: OffsetValue { position: Position(position), lsn: Lsn(lsn), records: position },
            checkpoint: Some(format!("cp{position}").into_bytes()),
        };
        // LSN 300 is above 9 as a number but below it byte by byte in
        // little-endian order: only a Number condition gets this right.
        store.write(&[entry(10, 9)]).await.unwrap();
        store.write(&[entry(50, 300)]).await.unwrap();
        store.write(&[entry(20, 12)]).await.unwrap();
        let rows = store.read().await.unwrap();
        assert_eq!(rows.len(), 1);
        let (k, value, checkpoint) = &rows[0];
        assert_eq!(*k, key);
        assert_eq!(OffsetValue::decode(value).unwrap(), entry(50, 300).value, "the late, lower write lost");
        assert_eq!(checkpoint.as_deref(), Some(&b"cp50"[..]));
        assert_eq!(value.len(), 24);

        assert_eq!(store.lease_read().await, Ok(None));
        let row = |version| LeaseRow { generation: 1, holder: 42, version };
        assert_eq!(store.lease_write(Some(1), row(1)).await, Err(IoError::Conflict), "no row yet");
        assert_eq!(store.lease_write(None, row(1)).await, Ok(()));
        assert_eq!(store.lease_write(None, row(2)).await, Err(IoError::Conflict), "taken");
        assert_eq!(store.lease_write(Some(1), row(2)).await, Ok(()));
        assert_eq!(store.lease_read().await, Ok(Some(row(2))));
    });
}

/// A daemon in S3 mode on `bucket` and `table`, writing to `sink`.
fn daemon(bucket: &str, table: &str, sink: &std::path::Path, records: u64, rate: u64, once: bool) -> Command {
    let mut c = Command::new(skipprd_bin());
    c.args(["run", "--generator-partitions", "2"])
        .args(["--generator-records", &records.to_string(), "--generator-rate", &rate.to_string()])
        .args(["--data-dir", sink.parent().unwrap().to_str().unwrap()])
        .args(["--sink-dir", sink.to_str().unwrap()])
        .env("WAL_STORAGE", "s3")
        .env("SKIPPR_WAL_S3_BUCKET", bucket)
        .env("SKIPPR_OFFSET_DYNAMODB_TABLE", table)
        .env("SKIPPR_LEASE_SECONDS", "1.5")
        .envs(aws::env());
    if once {
        c.arg("--once");
    }
    c
}

fn setup(name: &str) -> (String, String, tempfile::TempDir) {
    let (bucket, table) = aws::bucket_and_table(name);
    (bucket, table, tempfile::tempdir().unwrap())
}

#[test]
fn s3_mode_runs_once_resumes_and_names_a_missing_table_or_bucket() {
    let (bucket, table, tmp) = setup("once");
    let sink = tmp.path().join("sink");
    let out = daemon(&bucket, "no-such-table", &sink, 10, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(stderr(&out).contains("skipprd offsets init-table"), "{}", stderr(&out));
    let out = daemon("no-such-bucket", &table, &sink, 10, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(stderr(&out).contains("'no-such-bucket' does not exist"), "{}", stderr(&out));

    // A store that ignores If-None-Match cannot fence writers: refused.
    let proxy = Proxy::start(&aws::endpoint());
    proxy.strip_conditions.store(true, Ordering::SeqCst);
    let out =
        daemon(&bucket, &table, &sink, 10, 0, true).env("SKIPPR_AWS_ENDPOINT", proxy.endpoint()).output().unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(stderr(&out).contains("ignores If-None-Match"), "{}", stderr(&out));

    let out = daemon(&bucket, &table, &sink, 3000, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("records: 6000,"), "{}", stdout(&out));
    let out = daemon(&bucket, &table, &sink, 3000, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("records: 0,"), "a second run resumes: {}", stdout(&out));
    assert!(stderr(&out).contains("stop_record=\"used\""), "from the first run's stop record: {}", stderr(&out));
    assert_exactly_once(&sink, &["events"], 2, 3000);

    // The tools read the same places the daemon wrote.
    let tool = |args: &[&str]| {
        Command::new(skipprd_bin())
            .args(args)
            .env("WAL_STORAGE", "s3")
            .env("SKIPPR_WAL_S3_BUCKET", &bucket)
            .env("SKIPPR_OFFSET_DYNAMODB_TABLE", &table)
            .envs(aws::env())
            .output()
            .unwrap()
    };
    let verify = tool(&["wal", "verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}{}", stdout(&verify), stderr(&verify));
    assert!(stdout(&verify).contains(" segments, 6000 records"), "{}", stdout(&verify));
    // Segments are named by where their objects are: s3://BUCKET/PREFIX<id>/.
    let listed = stdout(&verify);
    let first = listed.lines().next().unwrap();
    assert!(first.starts_with(&format!("s3://{bucket}/")) && !first.contains(".seg"), "{listed}");
    let show = tool(&["offsets", "show"]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    let text = stdout(&show);
    assert!(text.contains("main source 0: position=3000") && text.contains("main source 1: position=3000"), "{text}");
    assert!(text.ends_with("2 entries\n"), "{text}");
    assert_eq!(tool(&["offsets", "reset"]).status.code(), Some(2), "reset wants --yes");
    let reset = tool(&["offsets", "reset", "--yes"]);
    assert!(stdout(&reset).contains("removed 2 offsets entries"), "{}", stdout(&reset));
    let out = daemon(&bucket, &table, &sink, 3000, 0, true).output().unwrap();
    assert!(stdout(&out).starts_with("records: 0,"), "the WAL, not the offsets, is the truth: {}", stdout(&out));
    assert!(stdout(&tool(&["offsets", "show"])).ends_with("2 entries\n"), "rebuilt from the WAL");
}

#[test]
fn with_no_record_cache_compactions_read_records_back_from_the_bucket() {
    let (bucket, table, tmp) = setup("readback");
    let sink = tmp.path().join("sink");
    let out = daemon(&bucket, &table, &sink, 3000, 0, true).env("SKIPPR_RECORD_CACHE_BYTES", "0").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&sink, &["events"], 2, 3000);
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn a_second_daemon_waits_for_the_lease_and_takes_over_when_the_holder_dies() {
    let (bucket, table, tmp) = setup("contend");
    let sink = tmp.path().join("sink");
    let log = tmp.path().join("b.log");
    let mut a =
        daemon(&bucket, &table, &sink, 4000, 1000, false).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until("the first daemon to deliver", PATIENCE, || !read_dir_sink(&sink).is_empty());
    let mut b = daemon(&bucket, &table, &sink, 4000, 0, true)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let waiting = "another writer holds the WAL's lease";
    wait_until("the second daemon to wait for the lease", PATIENCE, || file_contains(&log, waiting));
    // Two lease spans of waiting: the holder keeps renewing.
    std::thread::sleep(Duration::from_millis(3000));
    assert!(b.try_wait().unwrap().is_none(), "the second daemon waits while the first renews its lease");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("recovered"), "it has not recovered, let alone committed: {text}");
    // A waiting daemon stops at once on SIGTERM: it has nothing to drain.
    let c_log = tmp.path().join("c.log");
    let mut c = daemon(&bucket, &table, &sink, 4000, 0, true)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&c_log).unwrap())
        .spawn()
        .unwrap();
    wait_until("the third daemon to wait for the lease", PATIENCE, || file_contains(&c_log, waiting));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = wait_for(&mut c, Duration::from_secs(5)).expect("a waiting daemon obeys SIGTERM");
    assert_eq!(status.code(), Some(0));
    a.kill().unwrap();
    a.wait().unwrap();
    let status = wait_for(&mut b, Duration::from_secs(60)).expect("the second daemon takes over and finishes");
    assert_eq!(status.code(), Some(0), "{}", std::fs::read_to_string(&log).unwrap());
    assert_exactly_once(&sink, &["events"], 2, 4000);
}

#[test]
fn a_frozen_writer_wakes_up_fenced_out_and_acknowledges_nothing_more() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let (bucket, table, tmp) = setup("frozen");
    let sink = tmp.path().join("sink");
    let mut a = daemon(&bucket, &table, &sink, 3000, 1000, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the first daemon to deliver", PATIENCE, || !read_dir_sink(&sink).is_empty());
    let pid = Pid::from_raw(a.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // The replacement waits out the lease, fences, and delivers the rest.
    let out = daemon(&bucket, &table, &sink, 3000, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    kill(pid, Signal::SIGCONT).unwrap();
    let status = wait_for(&mut a, Duration::from_secs(30)).expect("the woken writer stops by itself");
    let mut err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(14), "fenced out or lease lost: {err}");
    assert!(err.contains("another writer") || err.contains("lease was taken over"), "{err}");
    // Its last line tells what it read from what it committed.
    let mut out = String::new();
    std::io::Read::read_to_string(a.stdout.as_mut().unwrap(), &mut out).unwrap();
    let field = |name: &str| -> u64 {
        let at = out.find(&format!("{name}: ")).unwrap_or_else(|| panic!("{name} in {out}")) + name.len() + 2;
        out[at..].split(',').next().unwrap().parse().unwrap_or_else(|_| panic!("{name} in {out}"))
    };
    assert!(field("committed") > 0 && field("committed") <= field("records"), "{out}");
    // Whatever it had in flight is either in the WAL or was never
    // acknowledged: a last run finds everything exactly once.
    let out = daemon(&bucket, &table, &sink, 3000, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&sink, &["events"], 2, 3000);
}

#[test]
fn two_wals_sharing_one_table_keep_their_own_offsets() {
    let (bucket, table, tmp) = setup("shared");
    let run = |prefix: &str, records: u64| {
        let sink = tmp.path().join(prefix).join("sink");
        let out =
            daemon(&bucket, &table, &sink, records, 0, true).env("SKIPPR_WAL_S3_PREFIX", prefix).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{prefix}: {}", stderr(&out));
        (stdout(&out), sink)
    };
    // Different WALs, the same default pipeline, one table.
    let (first, _) = run("wal-a/", 500);
    assert!(first.starts_with("records: 1000,"), "{first}");
    let (second, _) = run("wal-b/", 300);
    assert!(second.starts_with("records: 600,"), "{second}");
    let (again, sink_a) = run("wal-a/", 500);
    assert!(again.starts_with("records: 0,"), "wal-a resumes from its own offsets: {again}");
    let (again, sink_b) = run("wal-b/", 300);
    assert!(again.starts_with("records: 0,"), "wal-b resumes from its own offsets: {again}");
    assert_exactly_once(&sink_a, &["events"], 2, 500);
    assert_exactly_once(&sink_b, &["events"], 2, 300);
    let show = Command::new(skipprd_bin())
        .args(["offsets", "show"])
        .env("WAL_STORAGE", "s3")
        .env("SKIPPR_WAL_S3_BUCKET", &bucket)
        .env("SKIPPR_WAL_S3_PREFIX", "wal-b/")
        .env("SKIPPR_OFFSET_DYNAMODB_TABLE", &table)
        .envs(aws::env())
        .output()
        .unwrap();
    let text = stdout(&show);
    assert!(text.contains("main source 0: position=300") && text.ends_with("2 entries\n"), "{text}");
}

#[test]
fn a_dead_endpoint_is_a_visible_stall_and_once_gives_up_with_exit_fifteen() {
    let (bucket, table, tmp) = setup("stall");
    let sink = tmp.path().join("sink");
    let log = tmp.path().join("daemon.log");
    let proxy = Proxy::start(&aws::endpoint());
    let port = skippr_tests::free_port();
    let mut child = daemon(&bucket, &table, &sink, 20000, 4000, true)
        .env("SKIPPR_AWS_ENDPOINT", proxy.endpoint())
        .env("SKIPPR_LEASE_SECONDS", "2")
        .args(["--stall-seconds", "2", "--stall-exit-seconds", "8", "--metrics-addr", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until("the daemon to deliver", PATIENCE, || !read_dir_sink(&sink).is_empty());
    assert!(scrape_metrics(port).contains("skippr_wal_stalled 0"), "not stalled while it works");
    // The endpoint stops answering: every request fails from here on.
    proxy.drop_responses.store(true, Ordering::SeqCst);
    let stalled = "has made no progress for";
    wait_until("the stall to be reported", PATIENCE, || file_contains(&log, stalled));
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains(stalled)).unwrap();
    assert!(line.contains("ERROR") && line.contains(&proxy.endpoint()), "names the endpoint: {line}");
    assert!(line.contains("last_error="), "names the last error: {line}");
    eprintln!("the stall report: {line}");
    assert!(scrape_metrics(port).contains("skippr_wal_stalled 1"), "the metric shows the stall");
    let status = wait_for(&mut child, PATIENCE).expect("--once gives up after the stall limit");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(15), "{text}");
    assert!(text.contains("SKIPPR_STALL_EXIT_SECONDS"), "{text}");
    // Retrying was safe: once the endpoint answers, a run finishes the job.
    proxy.drop_responses.store(false, Ordering::SeqCst);
    let out = daemon(&bucket, &table, &sink, 20000, 0, true).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_exactly_once(&sink, &["events"], 2, 20000);
}
