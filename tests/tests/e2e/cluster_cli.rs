//! `skipprd cluster init` and `cluster join` give an empty DATA_DIR its
//! cluster identity, refuse one that has it already, and say what to fix.

use skippr_tests::*;

#[test]
fn init_and_join_write_an_identity_once_and_refuse_what_would_reuse_one() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let a = a.to_str().unwrap();
    let out = skipprd(&["cluster", "init", "--node-id", "1", "--voters", "1,2,3", a]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id =
        stdout(&out).split_whitespace().nth(1).expect("the cluster id is printed").trim_end_matches(':').to_string();
    assert_eq!(id.len(), 16, "{}", stdout(&out));
    let state = std::path::Path::new(a).join("raft-state");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o600);
    let again = skipprd(&["cluster", "init", "--node-id", "1", "--voters", "1,2,3", a]);
    assert_eq!(again.status.code(), Some(3));
    assert!(stderr(&again).contains("already belongs to a cluster node"), "{}", stderr(&again));

    let b = tmp.path().join("b");
    let b = b.to_str().unwrap();
    let old_id = skipprd(&["cluster", "join", "--node-id", "2", "--voters", "1,2,3", "--cluster-id", &id, b]);
    assert_eq!(old_id.status.code(), Some(3));
    assert!(stderr(&old_id).contains("joins under a new id"), "{}", stderr(&old_id));
    // An abbreviated id names another cluster: refused, never padded.
    for short in [&id[..4], &id[12..], "0x12345678abcdef0", &format!("{id}0")] {
        let out = skipprd(&["cluster", "join", "--node-id", "4", "--voters", "1,2,3", "--cluster-id", short, b]);
        assert_eq!(out.status.code(), Some(2), "{short}: {}", stderr(&out));
        assert!(stderr(&out).contains("give all 16 hex digits"), "{short}: {}", stderr(&out));
    }
    let no_id = skipprd(&["cluster", "join", "--node-id", "4", "--voters", "1,2,3", b]);
    assert!(stderr(&no_id).contains("--cluster-id is required"), "{}", stderr(&no_id));
    let no_old = skipprd(&["cluster", "join", "--node-id", "4", "--voters", "1,2,3", "--cluster-id", &id, b]);
    assert_eq!(no_old.status.code(), Some(3));
    assert!(stderr(&no_old).contains("--replaces is required"), "{}", stderr(&no_old));
    let itself =
        skipprd(&["cluster", "join", "--node-id", "4", "--voters", "1,2,3", "--cluster-id", &id, "--replaces", "4", b]);
    assert!(stderr(&itself).contains("must be another, positive node id"), "{}", stderr(&itself));
    let join =
        skipprd(&["cluster", "join", "--node-id", "4", "--voters", "1,2,3", "--cluster-id", &id, "--replaces", "2", b]);
    assert_eq!(join.status.code(), Some(0), "{}", stderr(&join));
    assert!(stdout(&join).contains(&format!("cluster {id}: node 4")), "{}", stdout(&join));
    // The host it replaces, for `run` to ask the cluster with, at 0600.
    let join_file = std::path::Path::new(b).join("cluster-join");
    assert_eq!(std::fs::read_to_string(&join_file).unwrap(), "2\n");
    assert_eq!(std::fs::metadata(&join_file).unwrap().permissions().mode() & 0o777, 0o600);
    let init_replaces = skipprd(&[
        "cluster",
        "init",
        "--node-id",
        "1",
        "--voters",
        "1,2,3",
        "--replaces",
        "2",
        tmp.path().join("d").to_str().unwrap(),
    ]);
    assert!(stderr(&init_replaces).contains("--replaces is for `cluster join`"), "{}", stderr(&init_replaces));
    let not_voter =
        skipprd(&["cluster", "init", "--node-id", "5", "--voters", "1,2,3", tmp.path().join("c").to_str().unwrap()]);
    assert!(stderr(&not_voter).contains("is not among --voters"), "{}", stderr(&not_voter));
}
