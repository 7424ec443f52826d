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
//! clustered` the daemon is a cluster of one host (its raft log the WAL,
//! on this disk; certificates and `cluster init` made here): a clustered
//! host always scans, since raft's state is not the engine's to summarize.

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
    /// Where the WAL lives: `disk`, or `clustered` (a cluster of one host
    /// on 127.0.0.1, its DATA_DIRs named `clustered-<MiB>MiB`).
    #[arg(long, value_name = "KIND", default_value = "disk", value_parser = ["disk", "clustered"])]
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
    for &mib in &args.sizes {
        let name = match cluster {
            Some(_) => format!("clustered-{mib}MiB"),
            None => format!("wal-{mib}MiB"),
        };
        let data = args.dir.join(name);
        if let Some(Err(e)) = cluster.as_ref().map(|c| c.init(&data)) {
            eprintln!("skipprd bench recovery: {mib} MiB: {e}");
            return exit::FAILED;
        }
        let bench = Bench { me: &me, data, bytes: mib << 20, sink: &sink, patience, cluster: cluster.as_ref() };
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
}

/// A cluster of one host: its certificates and the address it listens on.
struct Cluster {
    me: PathBuf,
    certs: PathBuf,
    port: u16,
}

impl Cluster {
    fn new(me: &Path, dir: &Path) -> Result<Cluster, String> {
        let certs = dir.join("cluster-certs");
        if !certs.join("ca.pem").exists() {
            let out = Command::new(me)
                .args(["cluster", "certs", "--nodes", "1", "--dir"])
                .arg(&certs)
                .output()
                .map_err(|e| format!("cannot run `cluster certs`: {e}"))?;
            if !out.status.success() {
                return Err(format!("`cluster certs` failed: {}", String::from_utf8_lossy(&out.stderr)));
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        Ok(Cluster { me: me.to_path_buf(), certs, port })
    }

    /// Gives `data` its place in the cluster, unless it has one.
    fn init(&self, data: &Path) -> Result<(), String> {
        if data.join("raft-state").exists() {
            return Ok(());
        }
        let out = Command::new(&self.me)
            .args(["cluster", "init", "--node-id", "1", "--voters", "1"])
            .arg(data)
            .output()
            .map_err(|e| format!("cannot run `cluster init`: {e}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("`cluster init` failed: {}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    fn configure(&self, c: &mut Command) {
        c.env("WAL_STORAGE", "clustered")
            .env("SKIPPR_CLUSTER_NODE_ID", "1")
            .env("SKIPPR_CLUSTER_PEERS", format!("1=127.0.0.1:{}", self.port))
            .env("SKIPPR_CLUSTER_CA", self.certs.join("ca.pem"))
            .env("SKIPPR_CLUSTER_CERT", self.certs.join("node-1.pem"))
            .env("SKIPPR_CLUSTER_KEY", self.certs.join("node-1-key.pem"));
    }
}

impl Bench<'_> {
    fn size(&self, rounds: u32) -> Result<(), String> {
        let mib = self.bytes >> 20;
        for (kind, signal) in [("crash", Signal::SIGKILL), ("clean stop", Signal::SIGTERM)] {
            let (mut recovered, mut first, mut rss) = (Vec::new(), Vec::new(), Vec::new());
            let (mut ratios, mut direct_ratios) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let filled = self.fill(signal)?;
                let (warm, cold, direct) = self.plain_read()?;
                let r = self.restart()?;
                println!(
                    "{mib} MiB, after a {kind}, round {round}: WAL {:.0} MiB filled in {filled:.1} s; recovered after \
                     {} s, first delivery after {:.2} s, peak RSS {:.0} MiB; {}; a plain read of the segments \
                     {warm:.0} MB/s warm, {cold:.0} MB/s cold, {direct:.0} MB/s direct",
                    wal_bytes(&self.data) as f64 / (1 << 20) as f64,
                    r.recovered.map_or("?".into(), |s| format!("{s:.2}")),
                    r.first_delivery,
                    r.peak_rss_mib,
                    match (r.stop_record_used, r.scan_mb_s) {
                        (true, _) => "the stop record spared the scan".to_string(),
                        (false, Some(s)) => format!("scanned at {s:.0} MB/s"),
                        (false, None) => "scanned at ? MB/s".to_string(),
                    },
                );
                recovered.extend(r.recovered);
                ratios.extend(r.scan_mb_s.map(|s| s / cold));
                direct_ratios.extend(r.scan_mb_s.map(|s| s / direct));
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

    fn command(&self) -> Command {
        let mut c = Command::new(self.me);
        c.arg("run").arg("--data-dir").arg(&self.data);
        c.args(["--wal-max-bytes", &self.bytes.to_string(), "--generator-records", "0", "--drain-timeout", "1"]);
        c.env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        if let Some(cluster) = self.cluster {
            cluster.configure(&mut c);
        }
        c
    }

    /// Runs the daemon with the lagging sink until the WAL is full, then
    /// stops it with `signal`. Returns how long the filling took.
    fn fill(&self, signal: Signal) -> Result<f64, String> {
        let started = Instant::now();
        let mut command = self.command();
        command.args(["--sink", "command", "--sink-command"]).arg(self.sink);
        let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", self.me.display()))?;
        let lines = stderr_lines(&mut child);
        let full = wait_for_line(&lines, "reached its size limit", self.patience);
        let seconds = started.elapsed().as_secs_f64();
        stop(&mut child, signal);
        if !full {
            return Err(format!("the WAL did not fill up within {:?}", self.patience));
        }
        Ok(seconds)
    }

    /// Starts the daemon with the directory sink and measures it until its
    /// first batch file appears; then kills it.
    fn restart(&self) -> Result<Restart, String> {
        let sink = self.data.join("sink");
        let _ = std::fs::remove_dir_all(&sink);
        let started = Instant::now();
        let mut child = self.command().spawn().map_err(|e| format!("cannot start {}: {e}", self.me.display()))?;
        let pid = child.id();
        let lines = stderr_lines(&mut child);
        let (mut recovered, mut peak, mut scan_mb_s, mut stop_record_used) = (None, 0u64, None, false);
        loop {
            peak = peak.max(vm_hwm_kib(pid).unwrap_or(0));
            while let Ok(line) = lines.try_recv() {
                if recovered.is_none() && line.contains("recovered") {
                    recovered = Some(started.elapsed().as_secs_f64());
                    let field = |name: &str| -> Option<f64> {
                        let at = line.find(&format!("{name}="))? + name.len() + 1;
                        line[at..].split(|c: char| c.is_whitespace()).next()?.parse().ok()
                    };
                    stop_record_used = line.contains("stop_record=\"used\"");
                    if let (Some(bytes), Some(seconds), false) =
                        (field("scanned_bytes"), field("scan_seconds"), stop_record_used)
                    {
                        scan_mb_s = Some(bytes / 1e6 / seconds.max(1e-6));
                    }
                }
            }
            if any_file(&sink) {
                let first_delivery = started.elapsed().as_secs_f64();
                peak = peak.max(vm_hwm_kib(pid).unwrap_or(0));
                stop(&mut child, Signal::SIGKILL);
                let peak_rss_mib = peak as f64 / 1024.0;
                return Ok(Restart { recovered, scan_mb_s, stop_record_used, first_delivery, peak_rss_mib });
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the restarted daemon exited ({status}) before delivering"));
            }
            if started.elapsed() > self.patience {
                stop(&mut child, Signal::SIGKILL);
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
        let files = segment_files(&self.data.join("wal")).map_err(|e| format!("cannot list the WAL: {e}"))?;
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

/// The child's stderr, a line at a time, on a channel.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return true,
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

fn wal_bytes(data: &Path) -> u64 {
    segment_files(&data.join("wal"))
        .map_or(0, |files| files.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum())
}
