//! The README's walk-throughs, run as written (issue #28): every code block
//! marked ```` ```sh walkthrough=NAME ```` is extracted and run by bash in an
//! empty directory, with the built binary first on the `PATH` and only the
//! substitutions listed here (ports, and the suite's own binary for `cargo
//! run`). Each substitution must find its text, so a walk-through that
//! drifts from what the test runs fails it.

use skippr_tests::*;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The blocks marked `walkthrough=name`, in order, joined.
fn walkthrough(name: &str) -> String {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let marker = format!("```sh walkthrough={name}\n");
    let mut blocks = Vec::new();
    let mut rest = readme.as_str();
    while let Some(at) = rest.find(&marker) {
        let body = &rest[at + marker.len()..];
        let end = body.find("\n```").expect("a block ends");
        blocks.push(body[..end + 1].to_string());
        rest = &body[end..];
    }
    assert!(!blocks.is_empty(), "the README has no walk-through {name}");
    blocks.concat()
}

/// `text` with each substitution made; each must find its text.
fn substituted(name: &str, text: &str, subs: &[(&str, String)]) -> String {
    let mut text = text.to_string();
    for (from, to) in subs {
        assert!(text.contains(from), "walk-through {name} no longer holds {from:?}: update the README or this test");
        text = text.replace(from, to);
    }
    text
}

/// bash running `script` in `dir`, the suite's binary first on the PATH, in
/// a process group of its own (so that what it starts in the background
/// can be signalled with it).
fn bash(dir: &Path, script: &str) -> Command {
    let bin = Path::new(&skipprd_bin()).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("bash");
    // `-e`: a command of the walk-through that fails fails the test.
    cmd.args(["-e", "-u", "-c", script]).current_dir(dir).env("PATH", path);
    cmd.env_remove("DATA_DIR").env_remove("WAL_STORAGE").env_remove("RUST_LOG");
    cmd.process_group(0);
    cmd
}

fn run_bash(dir: &Path, script: &str) -> Output {
    output_within(&mut bash(dir, script), Duration::from_secs(120))
}

fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| skippr_tests::free_port()).collect()
}

#[test]
fn the_quick_start_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let subs = [
        ("cargo run --release -p skipprd --", "skipprd".to_string()),
        // The suite does not run itself.
        ("./test.sh", "true".to_string()),
    ];
    let script = substituted("quick-start", &walkthrough("quick-start"), &subs);
    let out = run_bash(tmp.path(), &script);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("records: 20000, committed: 20000, commits: "), "{}", stdout(&out));
    assert!(tmp.path().join("data").join("sink").join("events").is_dir());
    let again = run_bash(tmp.path(), &script);
    assert!(stdout(&again).starts_with("records: 0,"), "it resumes: {}", stdout(&again));
}

#[test]
fn giving_up_refused_input_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_bash(tmp.path(), &walkthrough("skip-input"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("refused: exit 10"), "{text}");
    assert!(text.contains("{\"n\":1}\n{\"n\":2}\n{\"n\":4}\n"), "{text}");
    assert!(text.contains("positions 16..25: export bug 42"), "{text}");
    assert!(
        stderr(&out).contains("--skip-input lines:2067654532:16..25"),
        "the refusal prints the option the README gives"
    );
}

/// The clustered quick start's hosts on free ports: the script that starts
/// them, the one that prints each one's status line, and node `n`'s
/// metrics port (`n` in 1..=4; node 4 joins in the disk-loss walk-through).
struct ClusterPorts {
    peers: Vec<u16>,
    metrics: Vec<u16>,
}

impl ClusterPorts {
    fn new() -> ClusterPorts {
        let ports = free_ports(8);
        ClusterPorts { peers: ports[..4].to_vec(), metrics: ports[4..].to_vec() }
    }

    /// Sets `P` to node `$var`'s metrics port: `910N` is node N's in the
    /// README, each mapped to a free one.
    fn map(&self, var: &str) -> String {
        let m = &self.metrics;
        format!("case ${var} in 1) P={};; 2) P={};; 3) P={};; 4) P={};; esac; ", m[0], m[1], m[2], m[3])
    }

    fn start(&self) -> String {
        let mut subs: Vec<(String, String)> =
            (0..3).map(|i| (format!("127.0.0.1:700{}", i + 1), format!("127.0.0.1:{}", self.peers[i]))).collect();
        let head = "host() {  # host N: node N in the background, its process id in pid-N\n";
        subs.push((head.to_string(), format!("{head}  {}\n", self.map("1"))));
        subs.push(("127.0.0.1:910$1".to_string(), "127.0.0.1:$P".to_string()));
        let subs: Vec<(&str, String)> = subs.iter().map(|(a, b)| (a.as_str(), b.clone())).collect();
        substituted("cluster", &walkthrough("cluster"), &subs)
    }

    fn find_leader(&self) -> String {
        let subs =
            [("do skipprd", format!("do {} skipprd", self.map("n"))), ("127.0.0.1:910$n", "127.0.0.1:$P".to_string())];
        substituted("cluster-leader", &walkthrough("cluster-leader"), &subs)
    }

    fn status(&self, dir: &Path, node: u64) -> String {
        let script = format!("skipprd cluster status --metrics-addr 127.0.0.1:{}", self.metrics[node as usize - 1]);
        stdout(&run_bash(dir, &script))
    }
}

/// SIGTERM to every host the walk-through started (its process group);
/// waits until all have exited and returns what they logged.
fn stop_all(hosts: &std::process::Child, log: &Path) -> String {
    let group = nix::unistd::Pid::from_raw(-(hosts.id() as i32));
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while nix::sys::signal::kill(group, None).is_ok() {
        assert!(Instant::now() < deadline, "the hosts did not stop: {}", std::fs::read_to_string(log).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(log).unwrap()
}

fn stopped_cleanly(text: &str, node: u64) -> bool {
    text.lines().any(|l| l.starts_with(&format!("[node {node}] ")) && l.contains("stopped cleanly"))
}

#[test]
fn the_clustered_quick_start_runs_as_written_and_finds_its_leader() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = ClusterPorts::new();
    let log = tmp.path().join("terminal");
    let mut hosts = bash(tmp.path(), &ports.start())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let find = ports.find_leader();
    // One leader, two followers of it, within the patience of a slow machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(done) = hosts.try_wait().unwrap() {
            let terminal = std::fs::read_to_string(&log).unwrap();
            assert_eq!(done.code(), Some(0), "a command of the walk-through failed: {terminal}");
        }
        let out = run_bash(tmp.path(), &find);
        let text = stdout(&out);
        let leaders = text.lines().filter(|l| l.contains(": leader,")).count();
        let followers = text.lines().filter(|l| l.contains(": follower of node ")).count();
        if leaders == 1 && followers == 2 {
            break text;
        }
        assert!(Instant::now() < deadline, "no leader found: {text}{}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(200));
    };
    let leader = status.lines().find(|l| l.contains(": leader,")).unwrap();
    let leader_id = &leader["node ".len()..leader.find(':').unwrap()];
    assert!(status.contains(&format!("follower of node {leader_id}")), "{status}");
    assert_eq!(hosts.wait().unwrap().code(), Some(0), "the walk-through's own commands succeed");
    // The three hosts stop cleanly on SIGTERM; each line names its host.
    let text = stop_all(&hosts, &log);
    for n in 1..=3 {
        assert!(text.contains(&format!("[node {n}] ")), "{text}");
        assert!(stopped_cleanly(&text, n), "node {n} stopped cleanly: {text}");
    }
    // The leader at the SIGTERM (the one found, unless an election came
    // between) says why it may outlive the others by a couple of seconds.
    assert!(text.lines().any(|l| l.contains("it stops once it has handed")), "{text}");
    assert!(tmp.path().join("shared-sink").join("events").is_dir(), "the leader delivered to the shared sink");
}

#[test]
fn the_disk_loss_walkthrough_brings_a_lost_host_back_as_node_4() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = ClusterPorts::new();
    let log = tmp.path().join("terminal");
    // The quick start, a leader elected, then the walk-through in the same shell.
    let elected = "for i in $(seq 600); do grep -q 'this host leads the cluster' terminal && break; sleep 0.1; done\n";
    let node4 = [("127.0.0.1:7004", format!("127.0.0.1:{}", ports.peers[3]))];
    let lost = substituted("cluster-disk-loss", &walkthrough("cluster-disk-loss"), &node4);
    let script = format!("{}{elected}{lost}", ports.start());
    let mut hosts = bash(tmp.path(), &script)
        .stdout(std::fs::File::create(tmp.path().join("said")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let code = loop {
        if let Some(done) = hosts.try_wait().unwrap() {
            break done.code();
        }
        assert!(
            Instant::now() < deadline,
            "the walk-through's commands did not end: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let terminal = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(0), "a command of the walk-through failed: {terminal}");
    let said = std::fs::read_to_string(tmp.path().join("said")).unwrap();
    assert!(said.contains("node 3 on an empty disk: exit 3"), "{said}");
    assert!(!tmp.path().join("d3").exists(), "the refused start wrote nothing");
    let voter = |text: &str| text.lines().any(|l| l.starts_with("[node 4] ") && l.contains("a voter of the cluster"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !voter(&std::fs::read_to_string(&log).unwrap()) {
        assert!(Instant::now() < deadline, "node 4 is no voter: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(200));
    }
    // The leader (1, 2 or 4) lists node 4 among its peers, and node 3 no longer.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let leading = [1, 2, 4].map(|n| ports.status(tmp.path(), n)).into_iter().find(|s| s.contains(": leader,"));
        if let Some(s) = leading.filter(|s| s.contains("peer 4: match index ")) {
            break s;
        }
        assert!(Instant::now() < deadline, "no leader lists node 4: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!status.contains("peer 3:"), "{status}");
    let text = stop_all(&hosts, &log);
    for n in [1, 2, 4] {
        assert!(stopped_cleanly(&text, n), "node {n} stopped cleanly: {text}");
    }
}

/// The suite's PostgreSQL URL without its password, and the password.
fn postgres_url_and_password() -> (String, String) {
    let url = pg::url();
    let rest = url.strip_prefix("postgresql://").expect("a postgresql:// URL");
    let (creds, host) = rest.split_once('@').expect("credentials in the URL");
    let (user, password) = creds.split_once(':').expect("a password in the URL");
    (format!("postgresql://{user}@{host}"), password.to_string())
}

#[test]
fn the_postgresql_walkthrough_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (url, password) = postgres_url_and_password();
    let pgpass = tmp.path().join("pgpass");
    std::fs::write(&pgpass, format!("{password}\n")).unwrap();
    std::fs::set_permissions(&pgpass, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // The walk-through writes into the database's `public` schema.
    pg::client().batch_execute("DROP TABLE IF EXISTS public.events").unwrap();
    let subs =
        [("postgresql://loader@db.internal/warehouse", url), ("/etc/skipprd/pgpass", pgpass.display().to_string())];
    let script = substituted("postgres", &walkthrough("postgres"), &subs);
    let out = run_bash(tmp.path(), &script);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("records: 20000, committed: 20000,"), "{}", stdout(&out));
    pg::assert_exactly_once("public", "events", 2, 10_000);
    let columns = pg::client()
        .query_one(
            "SELECT count(*) FROM public.events WHERE seq = (data->>'seq')::bigint AND value = data->>'value'",
            &[],
        )
        .unwrap();
    assert_eq!(columns.get::<_, i64>(0), 20_000, "the columns computed from each record");
}

/// Dead letters by hand: a record the typed column refuses goes to the dead
/// letters and is listed; the column fixed, the replay brings it into the
/// table once (a second replay sends nothing); a batch the table refuses
/// whole is given up by the option the stop message prints.
#[test]
fn the_dead_letters_walkthrough_lists_replays_and_gives_up_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = "DROP TABLE IF EXISTS public.orders; DROP FUNCTION IF EXISTS public.hold()";
    pg::client().batch_execute(clean).unwrap();
    let subs = [("postgresql://loader@db.internal/warehouse", pg::url())];
    let script = substituted("dead-letters", &walkthrough("dead-letters"), &subs);
    let out = run_bash(tmp.path(), &script);
    let rows = pg::client().query("SELECT data->>'id', amount::text FROM public.orders ORDER BY 1", &[]).unwrap();
    pg::client().batch_execute(clean).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("SQLSTATE 22P02: invalid input syntax for type bigint: \\\"n/a\\\""), "{text}");
    assert!(text.contains("1 dead letter(s)"), "{text}");
    let summaries: Vec<&str> = text.lines().filter(|l| l.starts_with("records: ")).collect();
    assert_eq!(summaries.len(), 5, "{text}");
    assert!(summaries[1].starts_with("records: 1, committed: 1,"), "the replay: {text}");
    assert!(summaries[2].starts_with("records: 0,"), "the replay again: {text}");
    assert!(text.contains("stopped: exit 8"), "{text}");
    assert!(stderr(&out).contains("--skip-batch orders:2 "), "the stop names the option: {}", stderr(&out));
    assert!(text.contains("stream orders, batch 2 ") && text.contains("ticket 7: orders frozen"), "{text}");
    let rows: Vec<(String, Option<String>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let want = [("1", Some("12")), ("2", None), ("3", Some("7"))].map(|(i, a)| (i.to_string(), a.map(String::from)));
    assert_eq!(rows, want, "each record once, id 4 given up");
}

#[test]
fn the_singer_walkthrough_runs_as_written_and_its_tap_re_run_keeps_one_row_per_id() {
    let tmp = tempfile::tempdir().unwrap();
    let tap = std::env::var("SKIPPR_TEST_TAP_JSONL")
        .expect("SKIPPR_TEST_TAP_JSONL is not set: run the suite with ./test.sh, which installs tap-jsonl");
    let venv = Path::new(&tap).parent().unwrap().display().to_string();
    pg::client().batch_execute("DROP TABLE IF EXISTS public.items").unwrap();
    let subs = [("postgresql://loader@db.internal/warehouse", pg::url())];
    let script = substituted("singer", &walkthrough("singer"), &subs);
    for run in 1..=2 {
        let mut cmd = bash(tmp.path(), &script);
        let bin = Path::new(&skipprd_bin()).parent().unwrap().display().to_string();
        cmd.env("PATH", format!("{bin}:{venv}:{}", std::env::var("PATH").unwrap_or_default()));
        let out = output_within(&mut cmd, Duration::from_secs(120));
        assert_eq!(out.status.code(), Some(0), "run {run}: {}", stderr(&out));
        let rows = pg::client().query("SELECT data->>'id', data->>'v' FROM public.items ORDER BY 1", &[]).unwrap();
        let rows: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let want = [("1", "one"), ("2", "two")].map(|(a, b)| (a.to_string(), b.to_string()));
        assert_eq!(rows, want, "run {run}: the tap sends both lines again, the upsert keeps one row each");
    }
}

#[test]
fn the_s3_walkthroughs_run_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (bucket, table) = aws::bucket_and_table("readme-wal");
    let out_bucket = aws::runtime().block_on(aws::bucket("readme-out"));
    let with_aws = |script: &str| {
        let mut cmd = bash(tmp.path(), script);
        cmd.envs(aws::env());
        output_within(&mut cmd, Duration::from_secs(120))
    };
    // S3 mode: the table created by the walk-through itself, on a fresh name.
    let fresh_table = format!("{table}-walk");
    let subs = [
        ("SKIPPR_OFFSET_DYNAMODB_TABLE=skipprd ", format!("SKIPPR_OFFSET_DYNAMODB_TABLE={fresh_table} ")),
        ("SKIPPR_WAL_S3_BUCKET=my-wal", format!("SKIPPR_WAL_S3_BUCKET={bucket}")),
    ];
    let out = with_aws(&substituted("s3-mode", &walkthrough("s3-mode"), &subs));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("records: 20000, committed: 20000,"), "{}", stdout(&out));
    // The S3 sink: one object per destination batch under the prefix.
    let subs = [("--sink-s3-bucket out", format!("--sink-s3-bucket {out_bucket}"))];
    let out = with_aws(&substituted("s3-sink", &walkthrough("s3-sink"), &subs));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let keys = aws::runtime().block_on(async {
        let sdk = aws::sdk(&aws::endpoint()).await;
        let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true).build());
        let listed = s3.list_objects_v2().bucket(&out_bucket).prefix("orders/events/").send().await.unwrap();
        listed.contents().iter().map(|o| o.key().unwrap().to_string()).collect::<Vec<_>>()
    });
    assert!(!keys.is_empty(), "no objects under orders/events/");
    let named = |k: &String| {
        let n = k.strip_prefix("orders/events/main-").and_then(|n| n.strip_suffix(".jsonl"));
        let n = n.and_then(|n| n.split_once('.')).filter(|(hash, _)| hash.len() == 16).map(|(_, n)| n);
        n.is_some_and(|n| n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()))
    };
    assert!(keys.iter().all(named), "{keys:?}");
}
