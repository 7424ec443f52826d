//! `skipprd bench recovery`: a restart after a sink lagged until the WAL
//! filled up. For each WAL size, the daemon runs with the built-in
//! generator and a sink plugin that answers `retryable` until the WAL
//! reaches its size limit; it is then SIGKILLed (a crash) or SIGTERMed (a
//! clean stop whose drain times out), and started again with the built-in
//! directory sink. Measured on each restart: the time to the `recovered`
//! line and to the first batch file in the sink, and the peak RSS (the
//! process's `VmHWM`, sampled every few milliseconds until the first
//! delivery, when it is killed so that the next round finds the WAL still
//! full). Beside them, a plain sequential read of the same segment files,
//! warm and cold (`posix_fadvise(DONTNEED)` first), and one with
//! `O_DIRECT` as recovery reads (4 MiB blocks, one at a time). A clean stop leaves a
//! stop record whenever its WAL was consistent, and the restart after it
//! says whether the record spared the scan. With `--wal-storage
//! clustered` the daemon is a cluster of three hosts on 127.0.0.1 (their
//! certificates and `cluster init` made here), all stopped and started
//! together; the figures are the slowest host's, and each host's use of
//! its stop record is named. With `--wal-storage s3` the WAL is in the
//! bucket the environment names (`SKIPPR_WAL_S3_BUCKET`, the lease and
//! offsets table, the endpoint and credentials, as the daemon takes them),
//! under a prefix of its own per size; there is no plain read of files
//! beside it (`tests/scripts/bench-recovery-s3.sh` runs it against the
//! suite's local server).

use super::{median, prepare_dir};
use crate::exit;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct BenchRecoveryArgs {
    /// Where the WALs are built (never tmpfs; each size keeps its DATA_DIR
    /// there, reused by later runs).
    #[arg(long, value_name = "DIR", default_value = "./data/bench-recovery")]
    dir: PathBuf,
    /// WAL sizes, in MiB: `WAL_MAX_BYTES` of each run.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    sizes: Vec<u64>,
    /// Restarts of each kind (after a crash, after a clean stop) per size.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// How long one start may take to fill the WAL or to deliver, in seconds.
    #[arg(long, default_value_t = 600)]
    patience: u64,
    /// Where the WAL lives: `disk`, `clustered` (a cluster of three hosts
    /// on 127.0.0.1, their DATA_DIRs under `clustered-<MiB>MiB`), or `s3`
    /// (the bucket and table the environment names, as for `skipprd run`;
    /// each size under the prefix `<SKIPPR_WAL_S3_PREFIX>bench-<MiB>MiB/`,
    /// its pipeline `bench-<MiB>MiB`).
    #[arg(long, value_name = "KIND", default_value = "disk", value_parser = ["disk", "clustered", "s3"])]
    wal_storage: String,
    /// The `skipprd` binary whose restarts are measured (another build,
    /// for a before-and-after table); this one by default.
    #[arg(long, value_name = "PATH")]
    daemon: Option<PathBuf>,
}

/// What one restart took.
struct Restart {
    recovered: Option<f64>,
    /// The daemon's own count: MB/s of WAL scanned, from its listing to the
    /// last byte read (`scanned_bytes` over `scan_seconds`).
    scan_mb_s: Option<f64>,
    /// The restart used the stop record the stop left (no scan).
    stop_record_used: bool,
    /// Then, seconds from the listing to the last of the record's checks
    /// (the slowest host's).
    checked_s: Option<f64>,
    /// What each host did with its stop record (`used`, `none`, `set
    /// aside` and why), for a cluster.
    stop_records: Vec<String>,
    first_delivery: f64,
    peak_rss_mib: f64,
}

/// Answers `hello`, then `retryable` to every batch.
const LAGGING_SINK: &str = "#!/bin/sh\nread hello\necho '{\"type\":\"hello\",\"protocol\":1}'\nwhile read request; do \
                            echo '{\"type\":\"result\",\"outcome\":\"retryable\",\"rows\":0}'; done\n";

pub fn recovery(args: BenchRecoveryArgs) -> i32 {
    if let Err(code) = prepare_dir("recovery", &args.dir) {
        return code;
    }
    let me = match args.daemon.clone().map_or_else(std::env::current_exe, Ok) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipprd bench recovery: cannot find this program's path: {e}");
            return exit::FAILED;
        }
    };
    let sink = args.dir.join("lagging-sink.sh");
    if let Err(e) = write_script(&sink) {
        eprintln!("skipprd bench recovery: cannot write {}: {e}", sink.display());
        return exit::FAILED;
    }
    let patience = Duration::from_secs(args.patience);
    let cluster = match args.wal_storage.as_str() {
        "clustered" => match Cluster::new(&me, &args.dir) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("skipprd bench recovery: {e}");
                return exit::FAILED;
            }
        },
        _ => None,
    };
    let s3 = args.wal_storage == "s3";
    for &mib in &args.sizes {
        let name = match (&cluster, s3) {
            (Some(_), _) => format!("clustered-{mib}MiB"),
            (None, true) => format!("s3-{mib}MiB"),
            (None, false) => format!("wal-{mib}MiB"),
        };
        let data = args.dir.join(name);
        let s3 = s3.then(|| format!("bench-{mib}MiB"));
        let bench = Bench { me: &me, data, bytes: mib << 20, sink: &sink, patience, cluster: cluster.as_ref(), s3 };
        if let Err(e) = bench.size(args.rounds) {
            eprintln!("skipprd bench recovery: {mib} MiB: {e}");
            return exit::FAILED;
        }
    }
    exit::OK
}

struct Bench<'a> {
    me: &'a Path,
    data: PathBuf,
    bytes: u64,
    sink: &'a Path,
    patience: Duration,
    cluster: Option<&'a Cluster>,
    /// S3 mode: the pipeline, and the name under the WAL's prefix.
    s3: Option<String>,
}

/// A cluster of three hosts on 127.0.0.1: their certificates and ports.
struct Cluster {
    me: PathBuf,
    certs: PathBuf,
    ports: [u16; 3],
}

impl Cluster {
    fn new(me: &Path, dir: &Path) -> Result<Cluster, String> {
        let certs = dir.join("cluster-certs");
        if !certs.join("ca.pem").exists() {
            run(Command::new(me).args(["cluster", "certs", "--nodes", "1,2,3", "--dir"]).arg(&certs))?;
        }
        let mut listeners = Vec::new();
        for _ in 0..3 {
            listeners.push(std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no loopback port: {e}"))?);
        }
        let port = |i: usize| listeners[i].local_addr().map(|a| a.port()).map_err(|e| e.to_string());
        Ok(Cluster { me: me.to_path_buf(), certs, ports: [port(0)?, port(1)?, port(2)?] })
    }

    /// Gives each host's DATA_DIR its place in a new cluster, unless the
    /// first one has its place already.
    fn init(&self, hosts: &[PathBuf]) -> Result<(), String> {
        if hosts[0].join("raft-state").exists() {
            return Ok(());
        }
        let init = |node: usize, id: Option<&str>| {
            let mut c = Command::new(&self.me);
            c.args(["cluster", "init", "--node-id", &node.to_string(), "--voters", "1,2,3"]);
            if let Some(id) = id {
                c.args(["--cluster-id", id]);
            }
            run(c.arg(&hosts[node - 1]))
        };
        // `cluster <ID>: node 1 in DIR`
        let first = init(1, None)?;
        let id = first.split_whitespace().nth(1).map(|w| w.trim_end_matches(':').to_string());
        let id = id.ok_or_else(|| format!("`cluster init` printed no cluster id: {first}"))?;
        init(2, Some(&id))?;
        init(3, Some(&id))?;
        Ok(())
    }

    /// Host `node` (1 to 3) of the cluster.
    fn configure(&self, c: &mut Command, node: usize) {
        let peers: Vec<String> =
            self.ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect();
        c.env("WAL_STORAGE", "clustered")
            .env("SKIPPR_CLUSTER_NODE_ID", node.to_string())
            .env("SKIPPR_CLUSTER_PEERS", peers.join(","))
            .env("SKIPPR_CLUSTER_CA", self.certs.join("ca.pem"))
            .env("SKIPPR_CLUSTER_CERT", self.certs.join(format!("node-{node}.pem")))
            .env("SKIPPR_CLUSTER_KEY", self.certs.join(format!("node-{node}-key.pem")));
    }
}

/// Runs a `skipprd` command to its end; its standard output.
fn run(c: &mut Command) -> Result<String, String> {
    let out = c.output().map_err(|e| format!("cannot run {c:?}: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(format!("{c:?} failed: {}", String::from_utf8_lossy(&out.stderr))),
    }
}

impl Bench<'_> {
    /// Each host's DATA_DIR: the one, or each of a cluster's three.
    fn hosts(&self) -> Vec<PathBuf> {
        match self.cluster {
            Some(_) => (1..=3).map(|n| self.data.join(format!("node-{n}"))).collect(),
            None => vec![self.data.clone()],
        }
    }

    /// The first host's WAL directory.
    fn wal(&self) -> PathBuf {
        self.hosts()[0].join("wal")
    }

    fn size(&self, rounds: u32) -> Result<(), String> {
        if let Some(cluster) = self.cluster {
            cluster.init(&self.hosts())?;
        }
        let mib = self.bytes >> 20;
        for (kind, signal) in [("crash", Signal::SIGKILL), ("clean stop", Signal::SIGTERM)] {
            let (mut recovered, mut first, mut rss) = (Vec::new(), Vec::new(), Vec::new());
            let (mut ratios, mut direct_ratios) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let filled = self.fill(signal)?;
                let plain = if self.s3.is_some() { None } else { Some(self.plain_read()?) };
                let r = self.restart()?;
                println!(
                    "{mib} MiB, after a {kind}, round {round}: WAL {} filled in {filled:.1} s; recovered after {} s, \
                     first delivery after {:.2} s, peak RSS {:.0} MiB; {}; {}",
                    match self.s3 {
                        Some(_) => "in S3".to_string(),
                        None => format!("{:.0} MiB", wal_bytes(&self.wal()) as f64 / (1 << 20) as f64),
                    },
                    r.recovered.map_or("?".into(), |s| format!("{s:.2}")),
                    r.first_delivery,
                    r.peak_rss_mib,
                    match (r.stop_record_used, r.scan_mb_s) {
                        (true, _) => format!(
                            "the stop record spared the scan (checked {} s after the listing)",
                            r.checked_s.map_or("?".into(), |s| format!("{s:.3}"))
                        ),
                        (false, Some(s)) => format!("scanned at {s:.0} MB/s"),
                        (false, None) => "scanned at ? MB/s".to_string(),
                    },
                    match plain {
                        Some((warm, cold, direct)) => format!(
                            "a plain read of the segments {warm:.0} MB/s warm, {cold:.0} MB/s cold, {direct:.0} MB/s \
                             direct"
                        ),
                        None => "no plain read beside it (S3)".to_string(),
                    },
                );
                if r.stop_records.len() > 1 {
                    println!("  each host's stop record: {}", r.stop_records.join("; "));
                }
                recovered.extend(r.recovered);
                if let (Some(s), Some((_, cold, direct))) = (r.scan_mb_s, plain) {
                    ratios.push(s / cold);
                    direct_ratios.push(s / direct);
                }
                first.push(r.first_delivery);
                rss.push(r.peak_rss_mib);
            }
            println!(
                "{mib} MiB, after a {kind}, median: recovered after {} s, first delivery after {:.2} s, peak RSS {:.0} \
                 MiB, scan rate over the cold plain read {}, over the direct one {}",
                if recovered.is_empty() { "?".into() } else { format!("{:.2}", median(&mut recovered)) },
                median(&mut first),
                median(&mut rss),
                if ratios.is_empty() { "- (no scan)".into() } else { format!("{:.2}", median(&mut ratios)) },
                if direct_ratios.is_empty() { "-".into() } else { format!("{:.2}", median(&mut direct_ratios)) },
            );
        }
        Ok(())
    }

    /// Every host, started with `sink` arguments; their stderr lines, each
    /// with its host's index, on one channel.
    fn start(&self, sink: &[&std::ffi::OsStr]) -> Result<(Vec<Child>, Lines), String> {
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        for (i, data) in self.hosts().iter().enumerate() {
            let mut c = Command::new(self.me);
            c.arg("run").arg("--data-dir").arg(data).args(sink);
            c.args(["--wal-max-bytes", &self.bytes.to_string(), "--generator-records", "0", "--drain-timeout", "1"]);
            c.env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
            if let Some(cluster) = self.cluster {
                cluster.configure(&mut c, i + 1);
            }
            if let Some(name) = &self.s3 {
                let prefix = std::env::var("SKIPPR_WAL_S3_PREFIX").unwrap_or_else(|_| "skipprd/wal/".into());
                c.env("WAL_STORAGE", "s3").env("SKIPPR_WAL_S3_PREFIX", format!("{prefix}{name}/"));
                c.args(["--pipeline", name]);
            }
            let mut child = match c.spawn() {
                Ok(child) => child,
                Err(e) => {
                    children.iter_mut().for_each(|c| stop(c, Signal::SIGKILL));
                    return Err(format!("cannot start {}: {e}", self.me.display()));
                }
            };
            stderr_lines(&mut child, i, tx.clone());
            children.push(child);
        }
        Ok((children, rx))
    }

    /// Runs the daemon (every host) with the lagging sink until the WAL is
    /// full, then stops it with `signal`. Returns how long the filling took.
    fn fill(&self, signal: Signal) -> Result<f64, String> {
        let started = Instant::now();
        let (mut children, lines) =
            self.start(&["--sink".as_ref(), "command".as_ref(), "--sink-command".as_ref(), self.sink.as_os_str()])?;
        let full = wait_for_line(&lines, "reached its size limit", self.patience);
        let seconds = started.elapsed().as_secs_f64();
        children.iter_mut().for_each(|c| stop(c, signal));
        if !full {
            return Err(format!("the WAL did not fill up within {:?}", self.patience));
        }
        Ok(seconds)
    }

    /// Starts the daemon (every host) with the directory sink and measures
    /// it until the first batch file appears (peak RSS until then) and
    /// every host has recovered; then kills it. A cluster's figures are its
    /// slowest host's: the latest `recovered` line, the slowest scan, the
    /// highest peak RSS.
    fn restart(&self) -> Result<Restart, String> {
        let sink = self.data.join("sink");
        let _ = std::fs::remove_dir_all(&sink);
        let started = Instant::now();
        let (mut children, lines) = self.start(&["--sink-dir".as_ref(), sink.as_os_str()])?;
        let n = children.len();
        let (mut recovered, mut peak, mut scan_mb_s) = (vec![None; n], vec![0u64; n], vec![None; n]);
        let mut checked_s: Vec<Option<f64>> = vec![None; n];
        let mut stop_record_used = vec![false; n];
        let mut stop_records = vec![String::from("?"); n];
        let mut first_delivery = None;
        let kill_all = |children: &mut Vec<Child>| children.iter_mut().for_each(|c| stop(c, Signal::SIGKILL));
        loop {
            for (i, child) in children.iter().enumerate().filter(|_| first_delivery.is_none()) {
                peak[i] = peak[i].max(vm_hwm_kib(child.id()).unwrap_or(0));
            }
            while let Ok((i, line)) = lines.try_recv() {
                // Logged before the recovery line, when a record is set aside.
                if let Some(why) = line.split("why=\"").nth(1).and_then(|t| t.split('"').next()) {
                    stop_records[i] = format!("set aside: {why}");
                }
                // A clustered host's own recovery ends when it has restored
                // raft's log (serving waits for an election).
                let done = line.contains("recovered") || line.contains("restored raft's log");
                if recovered[i].is_none() && done {
                    recovered[i] = Some(started.elapsed().as_secs_f64());
                    let field = |name: &str| -> Option<f64> {
                        let at = line.find(&format!("{name}="))? + name.len() + 1;
                        line[at..].split(|c: char| c.is_whitespace()).next()?.parse().ok()
                    };
                    stop_record_used[i] = line.contains("stop_record=\"used\"");
                    let used = line.split("stop_record=\"").nth(1).and_then(|t| t.split('"').next());
                    if used != Some("set aside") {
                        stop_records[i] = used.unwrap_or("?").to_string();
                    }
                    if let (Some(bytes), Some(seconds), false) =
                        (field("scanned_bytes"), field("scan_seconds"), stop_record_used[i])
                    {
                        scan_mb_s[i] = Some(bytes / 1e6 / seconds.max(1e-6));
                    }
                    if stop_record_used[i] {
                        checked_s[i] = field("scan_seconds");
                    }
                }
            }
            if first_delivery.is_none() && any_file(&sink) {
                first_delivery = Some(started.elapsed().as_secs_f64());
                for (i, child) in children.iter().enumerate() {
                    peak[i] = peak[i].max(vm_hwm_kib(child.id()).unwrap_or(0));
                }
            }
            // A cluster delivers once a majority has recovered: the slowest
            // host's own recovery is waited for (its RSS counted up to the
            // first delivery only).
            if let Some(first_delivery) = first_delivery.filter(|_| recovered.iter().all(Option::is_some)) {
                kill_all(&mut children);
                let recovered = recovered.iter().copied().collect::<Option<Vec<f64>>>();
                return Ok(Restart {
                    recovered: recovered.map(|r| r.into_iter().fold(0.0, f64::max)),
                    scan_mb_s: scan_mb_s
                        .iter()
                        .copied()
                        .collect::<Option<Vec<f64>>>()
                        .map(|s| s.into_iter().fold(f64::INFINITY, f64::min)),
                    stop_record_used: stop_record_used.iter().all(|u| *u),
                    checked_s: checked_s
                        .iter()
                        .copied()
                        .collect::<Option<Vec<f64>>>()
                        .map(|s| s.into_iter().fold(0.0, f64::max)),
                    stop_records,
                    first_delivery,
                    peak_rss_mib: *peak.iter().max().unwrap_or(&0) as f64 / 1024.0,
                });
            }
            for child in &mut children {
                if let Ok(Some(status)) = child.try_wait() {
                    kill_all(&mut children);
                    return Err(format!("a restarted daemon exited ({status}) before delivering"));
                }
            }
            if started.elapsed() > self.patience {
                kill_all(&mut children);
                return Err(format!("nothing delivered within {:?} of a restart", self.patience));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// MB/s of reading every segment file once, warm (a second read) and
    /// cold (the page cache dropped for each file first), through the page
    /// cache as `cat` does (the kernel reading ahead); then as recovery
    /// reads, `O_DIRECT` in 4 MiB blocks one at a time (what the device
    /// gives a reader that must see what it holds).
    fn plain_read(&self) -> Result<(f64, f64, f64), String> {
        let files = segment_files(&self.wal()).map_err(|e| format!("cannot list the WAL: {e}"))?;
        let read_all = |drop_cache: bool| -> std::io::Result<f64> {
            let started = Instant::now();
            let mut total = 0u64;
            let mut buf = vec![0u8; 1 << 20];
            for path in &files {
                let mut f = std::fs::File::open(path)?;
                if drop_cache {
                    f.sync_all()?;
                    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).map_err(std::io::Error::from)?;
                }
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
            }
            Ok(total as f64 / 1e6 / started.elapsed().as_secs_f64())
        };
        let err = |e: std::io::Error| format!("a plain read of the WAL failed: {e}");
        read_all(false).map_err(err)?;
        let warm = read_all(false).map_err(err)?;
        let cold = read_all(true).map_err(err)?;
        let direct = direct_read(&files).map_err(err)?;
        Ok((warm, cold, direct))
    }
}

/// MB/s of reading `files` with `O_DIRECT`, 4 MiB at a time.
fn direct_read(files: &[PathBuf]) -> std::io::Result<f64> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const BLOCK: usize = 4 << 20;
    let mut raw = vec![0u8; BLOCK + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[start..start + BLOCK];
    let started = Instant::now();
    let mut total = 0u64;
    for path in files {
        let f = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_DIRECT).open(path)?;
        let mut offset = 0u64;
        loop {
            let n = f.read_at(buf, offset)?;
            (offset, total) = (offset + n as u64, total + n as u64);
            if n < BLOCK {
                break;
            }
        }
    }
    Ok(total as f64 / 1e6 / started.elapsed().as_secs_f64())
}

fn write_script(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, LAGGING_SINK)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// The hosts' stderr lines, each with its host's index.
type Lines = mpsc::Receiver<(usize, String)>;

/// The child's stderr, a line at a time, on `tx` with `host`.
fn stderr_lines(child: &mut Child, host: usize, tx: mpsc::Sender<(usize, String)>) {
    let stderr = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send((host, line)).is_err() {
                break;
            }
        }
    });
}

fn wait_for_line(lines: &Lines, needle: &str, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok((_, line)) if line.contains(needle) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Sends `signal` and reaps the child.
fn stop(child: &mut Child, signal: Signal) {
    let _ = kill(Pid::from_raw(child.id() as i32), signal);
    let _ = child.wait();
}

/// The peak resident set of process `pid` so far, in KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn any_file(dir: &Path) -> bool {
    let Ok(streams) = std::fs::read_dir(dir) else { return false };
    let hidden = |e: &std::fs::DirEntry| e.file_name().to_string_lossy().starts_with('.');
    streams
        .flatten()
        .filter(|s| !hidden(s))
        .any(|s| std::fs::read_dir(s.path()).map(|files| files.flatten().any(|f| !hidden(&f))).unwrap_or(false))
}

fn segment_files(wal: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(wal)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    Ok(files)
}

fn wal_bytes(wal: &Path) -> u64 {
    segment_files(wal).map_or(0, |files| files.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum())
}
