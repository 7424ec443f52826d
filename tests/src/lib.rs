//! Helpers for the end-to-end tests: find the `skipprd` binary built by the
//! same `cargo` profile and run it as a real child process.

pub mod cluster;
pub mod forgetfs;

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

/// Taken by the tests that keep both of CI's two cores busy on their own (a
/// cluster of three daemons, a sweep with `--jobs 2`, an enumeration of crash
/// states): the suite is one test binary whose tests run two at a time, and
/// two of these side by side would each run at half speed and stretch the
/// timeouts of the daemons they wait for. A test that panics while holding
/// it does not stop the others.
pub fn both_cores() -> std::sync::MutexGuard<'static, ()> {
    static BOTH_CORES: std::sync::Mutex<()> = std::sync::Mutex::new(());
    BOTH_CORES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A loopback port for a child process to listen on: free now, never handed
/// out before in this test process, and below the kernel's ephemeral range
/// (32768 and up on Linux), so no outgoing connection and no other port
/// asked of the kernel with `:0` can take it between this call and the
/// child's bind. Binding `:0` and dropping the listener gave the same port
/// twice in one test (a host's metrics and peer port; CI failed on it).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    // Each test process starts at its own place in the range, so two test
    // binaries run side by side rarely try the same ports.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
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
        // Only folders are streams.
        if !stream.is_dir() {
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&stream)
            .unwrap()
            .map(|e| e.unwrap().path())
            // Temporary files (hidden, ".tmp") are batches being written.
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

/// Acknowledgements the sink does not bear out: for each partition of
/// `stream` in an acknowledgement log (`tests/plugins/source.py`'s
/// `ACK_LOG`: "partition position" lines, a position being the next one to
/// read), the records below the highest position acknowledged that the
/// directory sink at `sink` lacks. Empty when every acknowledged record was
/// delivered: a source that released what it was acknowledged can send
/// none of them again, so each one missing is a lost acknowledgement.
pub fn lost_acknowledgements(acks: &Path, sink: &Path, stream: &str) -> Vec<String> {
    let mut acked: std::collections::BTreeMap<u64, u64> = Default::default();
    for line in std::fs::read_to_string(acks).unwrap_or_default().lines() {
        if let Some((p, pos)) = line.split_once(' ') {
            let (p, pos) = (p.parse().expect("a partition"), pos.parse().expect("a position"));
            let at = acked.entry(p).or_default();
            *at = (*at).max(pos);
        }
    }
    let got = read_dir_sink(sink);
    let mut lost = Vec::new();
    for (p, through) in acked {
        let seqs: std::collections::BTreeSet<u64> =
            got.get(&(stream.to_string(), p)).into_iter().flatten().copied().collect();
        let missing: Vec<u64> = (0..through).filter(|s| !seqs.contains(s)).collect();
        if let Some(first) = missing.first() {
            lost.push(format!(
                "partition {p} was acknowledged through position {through}, but the sink lacks {} of the records \
                 below it (the first at {first})",
                missing.len()
            ));
        }
    }
    lost
}

/// How much work a chaos loop's source holds, which decides whether a kill
/// can land in every run whatever the machine's speed.
pub enum Work {
    /// A source that never ends: every run is killed.
    Endless,
    /// `total` records sent at no more than `rate` a second (counted from
    /// each run's start): runs killed within `max` seconds each cannot send
    /// them all between them if `runs * max * rate < total`, however fast
    /// the machine, so no run can finish before its kill.
    Paced { rate: u64, total: u64 },
}

/// Runs `runs` chaos runs of the daemon `command` builds, each SIGKILLing
/// itself at a moment drawn from its seed between `min` and `max` seconds;
/// each must be killed or finish cleanly. Returns how many were killed.
///
/// The loop refuses to start unless `work` is more than the runs can finish
/// between them: a loop whose later runs find nothing left to do would pass
/// or fail by the machine's speed (the later runs resume from what the
/// earlier ones committed). A caller asserts that every run was killed.
pub fn chaos_runs(runs: u64, min: &str, max: &str, work: Work, command: impl Fn() -> std::process::Command) -> u64 {
    use std::os::unix::process::ExitStatusExt;
    if let Work::Paced { rate, total } = work {
        let max_seconds: f64 = max.parse().expect("max is seconds");
        let most = runs as f64 * max_seconds * rate as f64;
        assert!(
            most < total as f64,
            "{runs} runs of at most {max} s at {rate} records/s could send {most} records, not less than the \
             {total} the source holds: give the runs more work than the kills let them finish"
        );
    }
    let mut killed = 0;
    for seed in 0..runs {
        let out = command()
            .env("SKIPPR_CHAOS_MODE", "yes")
            .env("SKIPPR_CHAOS_SEED", seed.to_string())
            .env("SKIPPR_CHAOS_MIN_SECONDS", min)
            .env("SKIPPR_CHAOS_MAX_SECONDS", max)
            .output()
            .unwrap();
        assert!(stderr(&out).contains("chaos mode: SIGKILL in"), "the chosen moment is logged");
        match (out.status.signal(), out.status.code()) {
            (Some(9), _) => killed += 1,
            (_, Some(0)) => {}
            other => panic!("run {seed} ended with {other:?}: {}", stderr(&out)),
        }
    }
    killed
}

/// The local PostgreSQL server that `./test.sh` starts (tests/scripts/postgres.sh).
pub mod pg {
    /// The server's URL (user, password, database). A test of the
    /// PostgreSQL sink without one fails: it is never skipped.
    pub fn url() -> String {
        std::env::var("SKIPPR_TEST_POSTGRES_URL").expect(
            "SKIPPR_TEST_POSTGRES_URL is not set: run the suite with ./test.sh, which starts the local PostgreSQL \
             server these tests use",
        )
    }

    pub fn client() -> postgres::Client {
        postgres::Client::connect(&url(), postgres::NoTls).unwrap()
    }

    /// A schema of its own for one test, dropped first if an earlier run
    /// left it.
    pub fn fresh_schema(name: &str) -> String {
        let schema = format!("t_{name}_{}", std::process::id());
        client().batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).unwrap();
        schema
    }

    /// Every record of `stream`'s table in `schema`, in the order the sink
    /// applied them: (partition, seq) of each generator record.
    pub fn records(schema: &str, stream: &str) -> Vec<(u64, u64)> {
        let rows = client()
            .query(
                &format!(
                    "SELECT (data->>'partition')::bigint, (data->>'seq')::bigint FROM \"{schema}\".\"{stream}\" \
                     ORDER BY _skippr_seq, _skippr_row"
                ),
                &[],
            )
            .unwrap();
        rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64)).collect()
    }

    /// Every source record is in the table exactly once and in source order
    /// per partition, checked with SQL (count and distinct per partition)
    /// and by reading the rows in the order they were applied.
    pub fn assert_exactly_once(schema: &str, stream: &str, partitions: u64, records_each: u64) {
        let rows = client()
            .query(
                &format!(
                    "SELECT (data->>'partition')::bigint, count(*), count(DISTINCT data->>'seq'), \
                     min((data->>'seq')::bigint), max((data->>'seq')::bigint) \
                     FROM \"{schema}\".\"{stream}\" GROUP BY 1 ORDER BY 1"
                ),
                &[],
            )
            .unwrap();
        let got: Vec<(i64, i64, i64, i64, i64)> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
        let n = records_each as i64;
        let want: Vec<_> = (0..partitions as i64).map(|p| (p, n, n, 0, n - 1)).collect();
        assert_eq!(got, want, "(partition, count, distinct seq, min, max) in {schema}.{stream}");
        let mut next = vec![0u64; partitions as usize];
        for (p, seq) in records(schema, stream) {
            assert_eq!(seq, next[p as usize], "partition {p} out of source order in {schema}.{stream}");
            next[p as usize] += 1;
        }
    }
}

/// The local S3 and DynamoDB server (moto) that `./test.sh` starts, and what
/// the tests of S3 mode need from it.
pub mod aws {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The server's endpoint. A test of S3 mode without one fails: it is
    /// never skipped.
    pub fn endpoint() -> String {
        std::env::var("SKIPPR_TEST_AWS_ENDPOINT").expect(
            "SKIPPR_TEST_AWS_ENDPOINT is not set: run the suite with ./test.sh, which installs and starts the \
             local S3 and DynamoDB server (moto) these tests use",
        )
    }

    /// Dummy credentials and the endpoint, for the daemon and the SDK.
    pub fn env() -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ("SKIPPR_AWS_REGION", "us-east-1".into()),
            ("SKIPPR_AWS_ENDPOINT", endpoint()),
        ]
    }

    /// Sets the same variables in this process, for the SDK clients a test
    /// builds itself.
    pub fn set_env() {
        for (k, v) in env() {
            std::env::set_var(k, v);
        }
    }

    pub fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    /// A fresh bucket and a fresh offsets table (created by
    /// `skipprd offsets init-table`), named after `name` and this process.
    pub fn bucket_and_table(name: &str) -> (String, String) {
        let bucket = runtime().block_on(bucket(name));
        let table = format!("{name}-{}", std::process::id());
        let out = std::process::Command::new(crate::skipprd_bin())
            .args(["offsets", "init-table"])
            .env("SKIPPR_OFFSET_DYNAMODB_TABLE", &table)
            .envs(env())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", crate::stderr(&out));
        (bucket, table)
    }

    /// A fresh bucket with a name no other test uses.
    pub async fn bucket(name: &str) -> String {
        set_env();
        let sdk = sdk(&endpoint()).await;
        let client =
            aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build());
        let bucket = format!("{name}-{}", std::process::id());
        client.create_bucket().bucket(&bucket).send().await.expect("the local server creates a bucket");
        bucket
    }

    pub async fn sdk(endpoint: &str) -> aws_config::SdkConfig {
        set_env();
        skippr_io::aws::AwsSettings {
            region: Some("us-east-1".into()),
            endpoint: Some(endpoint.into()),
            operation_timeout: None,
        }
        .load()
        .await
        .expect("a region is set")
    }

    /// A TCP proxy in front of the server that forwards every request and,
    /// while `drop_responses` is set, throws the response away and closes
    /// the connection: the request took effect, the client cannot know.
    /// While `strip_conditions` is set it deletes `If-None-Match: *` from
    /// requests, like a store that ignores the header. `drop_next` drops
    /// that many responses, then none; `slow_next` holds that many back for
    /// a second each before passing them on.
    pub struct Proxy {
        pub port: u16,
        pub drop_responses: Arc<AtomicBool>,
        pub drop_next: Arc<std::sync::atomic::AtomicU64>,
        pub slow_next: Arc<std::sync::atomic::AtomicU64>,
        pub strip_conditions: Arc<AtomicBool>,
        pub dropped: Arc<std::sync::atomic::AtomicU64>,
    }

    impl Proxy {
        pub fn start(upstream: &str) -> Proxy {
            let upstream = upstream.trim_start_matches("http://").to_string();
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let drop_responses = Arc::new(AtomicBool::new(false));
            let strip_conditions = Arc::new(AtomicBool::new(false));
            let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let drop_next = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let slow_next = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let (flag, count) = (Arc::clone(&drop_responses), Arc::clone(&dropped));
            let (next, slow) = (Arc::clone(&drop_next), Arc::clone(&slow_next));
            let strip = Arc::clone(&strip_conditions);
            std::thread::spawn(move || {
                for client in listener.incoming().flatten() {
                    let Ok(server) = TcpStream::connect(&upstream) else { continue };
                    let (flag, count, strip) = (Arc::clone(&flag), Arc::clone(&count), Arc::clone(&strip));
                    let (next, slow) = (Arc::clone(&next), Arc::clone(&slow));
                    let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match c_read.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let mut chunk = buf[..n].to_vec();
                            if strip.load(Ordering::SeqCst) {
                                let header = b"if-none-match: *\r\n";
                                while let Some(at) =
                                    chunk.windows(header.len()).position(|w| w.eq_ignore_ascii_case(header))
                                {
                                    chunk.drain(at..at + header.len());
                                }
                            }
                            if s_write.write_all(&chunk).is_err() {
                                break;
                            }
                        }
                        let _ = s_write.shutdown(std::net::Shutdown::Write);
                    });
                    std::thread::spawn(move || {
                        let (mut server, mut client) = (server, client);
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            let n = match server.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let one_of = |n: &std::sync::atomic::AtomicU64| {
                                n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
                            };
                            if one_of(&slow) {
                                std::thread::sleep(std::time::Duration::from_secs(1));
                            }
                            if flag.load(Ordering::SeqCst) || one_of(&next) {
                                count.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            if client.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = client.shutdown(std::net::Shutdown::Both);
                        let _ = server.shutdown(std::net::Shutdown::Both);
                    });
                }
            });
            Proxy { port, drop_responses, drop_next, slow_next, strip_conditions, dropped }
        }

        pub fn endpoint(&self) -> String {
            format!("http://127.0.0.1:{}", self.port)
        }
    }
}

/// Waits until `ready` holds, polling every 20 ms, and panics naming `what`
/// after `limit`. Tests wait for the state they need (a log line, a file,
/// a WAL holding records), never for a fixed time: a slow or busy machine
/// then makes the suite slower, not red.
pub fn wait_until(what: &str, limit: std::time::Duration, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A generous deadline for a state a test waits for.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Has the disk WAL under `data` committed at least one record? (`skipprd
/// wal verify` is safe beside a running daemon.)
pub fn wal_holds_records(data: &Path) -> bool {
    let out = skipprd(&["wal", "verify", data.to_str().unwrap()]);
    stdout(&out).lines().any(|l| l.starts_with("ok: ") && !l.ends_with(", 0 records"))
}

/// Does the file at `path` (a daemon's log) contain `needle` yet?
pub fn file_contains(path: &Path, needle: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.contains(needle))
}

/// Runs `cmd` to completion, but kills it and fails the test after `limit`
/// (a daemon that hangs must not hang the suite).
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("skipprd starts");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut text).map(|_| text).unwrap_or_default()
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut text).map(|_| text).unwrap_or_default()
    });
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
            panic!("{cmd:?} did not finish within {limit:?}:\n{err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output { status, stdout: reader.join().unwrap(), stderr: err_reader.join().unwrap() }
}

/// The daemon's `/metrics` page on loopback `port`, or "" while nothing
/// answers there (yet, or within a second).
pub fn scrape_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let limit = std::time::Duration::from_secs(1);
    // A stopped (SIGSTOP) daemon's kernel still accepts: never wait long.
    let Ok(mut conn) = std::net::TcpStream::connect_timeout(&addr, limit) else { return String::new() };
    let _ = conn.set_read_timeout(Some(limit));
    let _ = conn.set_write_timeout(Some(limit));
    if conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").is_err() {
        return String::new();
    }
    let mut body = String::new();
    let _ = conn.read_to_string(&mut body);
    body
}
