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
    let held: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
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

#[test]
fn the_clustered_quick_start_runs_as_written_and_finds_its_leader() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = free_ports(6);
    let subs: Vec<(String, String)> = ports[..3]
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("127.0.0.1:700{}", i + 1), format!("127.0.0.1:{p}")))
        .collect();
    // The metrics ports: `910$n` is node n's; each is mapped to a free one.
    let map = format!("case $n in 1) P={};; 2) P={};; 3) P={};; esac; ", ports[3], ports[4], ports[5]);
    let start_subs: Vec<(&str, String)> = subs
        .iter()
        .map(|(a, b)| (a.as_str(), b.clone()))
        .chain([
            ("for n in 1 2 3; do\n", format!("for n in 1 2 3; do\n  {map}\n")),
            ("127.0.0.1:910$n", "127.0.0.1:$P".to_string()),
        ])
        .collect();
    let start = substituted("cluster", &walkthrough("cluster"), &start_subs);
    let log = tmp.path().join("terminal");
    let mut hosts =
        bash(tmp.path(), &start).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    let group = nix::unistd::Pid::from_raw(-(hosts.id() as i32));
    let leader_subs = [("do skipprd", format!("do {map} skipprd")), ("127.0.0.1:910$n", "127.0.0.1:$P".to_string())];
    let find = substituted("cluster-leader", &walkthrough("cluster-leader"), &leader_subs);
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
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while nix::sys::signal::kill(group, None).is_ok() {
        assert!(Instant::now() < deadline, "the hosts did not stop: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    for n in 1..=3 {
        assert!(text.contains(&format!("[node {n}] ")), "{text}");
        let stopped = text.lines().any(|l| l.starts_with(&format!("[node {n}] ")) && l.contains("stopped cleanly"));
        assert!(stopped, "node {n} stopped cleanly: {text}");
    }
    assert!(tmp.path().join("shared-sink").join("events").is_dir(), "the leader delivered to the shared sink");
}
