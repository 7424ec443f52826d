//! The forgetful file system (issue #29) under real system calls: what a
//! power cut keeps and drops when a process writes, syncs and renames
//! through the kernel, as the daemon will. Needs FUSE (`/dev/fuse`) and
//! root, as CI has: it fails, never skips, without them.

use skippr_tests::forgetfs::mount::Mount;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

fn mounted() -> (tempfile::TempDir, Mount) {
    Mount::available().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = Mount::new(&dir).unwrap();
    (tmp, mount)
}

fn sync_dir(dir: &std::path::Path) {
    skippr_io::disk_wal::sync_dir(dir).unwrap();
}

#[test]
fn a_synced_file_whose_directory_was_not_synced_is_gone_after_a_cut() {
    let (_tmp, mut m) = mounted();
    let seg = m.path().join("00000001.seg");
    let mut f = File::create(&seg).unwrap();
    f.write_all(b"group").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let cut = m.cut().unwrap();
    assert!(!seg.exists(), "its name was never made durable");
    assert_eq!(cut.nodes_gone, 1, "{cut:?}");
    // The same with the directory synced: it stays, and so do its bytes.
    let mut f = File::create(&seg).unwrap();
    f.write_all(b"group").unwrap();
    f.sync_all().unwrap();
    drop(f);
    sync_dir(m.path());
    m.cut().unwrap();
    assert_eq!(std::fs::read(&seg).unwrap(), b"group");
}

#[test]
fn writes_and_a_truncation_after_the_last_sync_are_undone() {
    let (_tmp, mut m) = mounted();
    let path = m.path().join("hard-state");
    let mut f = File::create(&path).unwrap();
    f.write_all(b"slot one").unwrap();
    f.sync_all().unwrap();
    sync_dir(m.path());
    f.write_all(b", slot two").unwrap();
    f.set_len(4).unwrap();
    drop(f);
    assert_eq!(std::fs::read(&path).unwrap(), b"slot", "the kernel sees what was written");
    m.cut().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"slot one", "a cut leaves what was synced");
}

#[test]
fn an_rwf_dsync_write_reaches_the_file_system_as_a_sync_of_the_file() {
    let (_tmp, mut m) = mounted();
    let path = m.path().join("wal");
    File::create(&path).unwrap();
    sync_dir(m.path());
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    let before = m.seen.file_syncs.load(Ordering::Relaxed);
    let data = b"committed group";
    let iov = [nix::libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() }];
    // SAFETY: one iovec over a live buffer, on an open descriptor.
    let n = unsafe { nix::libc::pwritev2(f.as_raw_fd(), iov.as_ptr(), 1, 0, nix::libc::RWF_DSYNC) };
    assert_eq!(n, data.len() as isize, "{}", std::io::Error::last_os_error());
    assert!(m.seen.file_syncs.load(Ordering::Relaxed) > before, "the kernel synced the file after the write");
    drop(f);
    m.cut().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
}

#[test]
fn a_rename_and_an_unlink_count_once_their_directory_is_synced() {
    let (_tmp, mut m) = mounted();
    let (tmp_name, final_name) = (m.path().join(".tmp-1"), m.path().join("1.jsonl"));
    let mut f = File::create(&tmp_name).unwrap();
    f.write_all(b"batch").unwrap();
    f.sync_all().unwrap();
    drop(f);
    sync_dir(m.path());
    std::fs::rename(&tmp_name, &final_name).unwrap();
    m.cut().unwrap();
    assert!(tmp_name.exists() && !final_name.exists(), "the rename was not durable");
    std::fs::rename(&tmp_name, &final_name).unwrap();
    sync_dir(m.path());
    std::fs::remove_file(&final_name).unwrap();
    m.cut().unwrap();
    assert_eq!(std::fs::read(&final_name).unwrap(), b"batch", "the unlink was not durable");
    let names: Vec<String> =
        std::fs::read_dir(m.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, vec!["1.jsonl".to_string()]);
}

#[test]
fn the_daemon_on_the_file_system_keeps_everything_it_delivered_through_a_cut() {
    let (_tmp, mut m) = mounted();
    let (data, sink) = (m.path().join("data"), m.path().join("sink"));
    let run = || {
        let mut c = std::process::Command::new(skippr_tests::skipprd_bin());
        c.args(["run", "--once", "--generator-records", "3000", "--data-dir", data.to_str().unwrap()]).args([
            "--sink-dir",
            sink.to_str().unwrap(),
            "--wal-bytes-per-file",
            "65536",
        ]);
        skippr_tests::output_within(&mut c, std::time::Duration::from_secs(120))
    };
    let out = run();
    assert_eq!(out.status.code(), Some(0), "{}", skippr_tests::stderr(&out));
    let cut = m.cut().unwrap();
    // A clean stop synced what it acknowledged; what the cut dropped is
    // what nothing depended on (a directory's last change, say).
    let verify = std::process::Command::new(skippr_tests::skipprd_bin())
        .args(["wal", "verify", data.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{cut:?}: {}", skippr_tests::stderr(&verify));
    let again = run();
    assert_eq!(again.status.code(), Some(0), "{}", skippr_tests::stderr(&again));
    assert!(skippr_tests::stdout(&again).starts_with("records: 0,"), "{}", skippr_tests::stdout(&again));
    skippr_tests::assert_exactly_once(&sink, &["events"], 2, 3000);
    assert!(m.seen.file_syncs.load(Ordering::Relaxed) > 0 && m.seen.dir_syncs.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_clusters_certificates_and_data_dirs_survive_a_cut_right_after_they_are_made() {
    let (_tmp, mut m) = mounted();
    let certs = m.path().join("deploy/certs");
    let out = skippr_tests::skipprd(&["cluster", "certs", "--dir", certs.to_str().unwrap(), "--nodes", "1,2,3"]);
    assert_eq!(out.status.code(), Some(0), "{}", skippr_tests::stderr(&out));
    let data = m.path().join("d1");
    let init = ["cluster", "init", "--node-id", "1", "--voters", "1,2,3", data.to_str().unwrap()];
    let out = skippr_tests::skipprd(&init);
    assert_eq!(out.status.code(), Some(0), "{}", skippr_tests::stderr(&out));
    let id = skippr_tests::stdout(&out).split_whitespace().nth(1).unwrap().trim_end_matches(':').to_string();
    let joined = m.path().join("d4");
    let join = ["cluster", "join", "--node-id", "4", "--voters", "1,2,3", "--cluster-id", &id, "--replaces", "3"];
    let out = skippr_tests::skipprd(&[&join[..], &[joined.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", skippr_tests::stderr(&out));
    let listing = |dir: &std::path::Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let (made, inited, prepared) = (listing(&certs), listing(&data), listing(&joined));
    assert_eq!(made.len(), 8, "{made:?}");
    m.cut().unwrap();
    assert_eq!(listing(&certs), made, "an operator's certificates, written and reported, are kept");
    assert_eq!((listing(&data), listing(&joined)), (inited, prepared), "the DATA_DIRs init and join prepared");
}

#[test]
fn a_cut_waits_for_a_file_still_open_on_the_mount_and_names_one_never_closed() {
    let (_tmp, mut m) = mounted();
    let path = m.path().join("held");
    std::fs::write(&path, b"x").unwrap();
    // Held until the cut has been refused once as busy (counted, never
    // timed): the cut must then go through.
    let held = File::open(&path).unwrap();
    let seen = std::sync::Arc::clone(&m.seen);
    let closer = std::thread::spawn(move || {
        while seen.busy_unmounts.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(held);
    });
    m.cut().expect("the cut goes through once the file is closed");
    closer.join().unwrap();
    assert!(m.seen.busy_unmounts.load(Ordering::Relaxed) >= 1);
    // Never closed (the mount's root, which every cut keeps): the cut
    // gives up, naming this process.
    let held = File::open(m.path()).unwrap();
    let err = m.cut().expect_err("a mount held open cannot be cut").to_string();
    let me = std::process::id().to_string();
    assert!(err.contains("still busy") && err.contains(&me), "{err}");
    drop(held);
}
