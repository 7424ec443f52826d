//! The `skipprd sim` command line is a contract other tools parse: exit
//! codes, the trace hash, the sweep's last line, reproduce lines, saved
//! failures and their replay.

use skippr_tests::*;

#[test]
fn one_seed_passes_and_its_trace_hash_is_stable() {
    let a = skipprd(&["sim", "--seed", "3"]);
    let b = skipprd(&["sim", "--seed", "3"]);
    assert_eq!(a.status.code(), Some(0), "{}", stdout(&a));
    let hash = |o| stdout(o).lines().find(|l| l.starts_with("trace hash: ")).map(str::to_string);
    assert!(hash(&a).is_some(), "prints its trace hash: {}", stdout(&a));
    assert_eq!(hash(&a), hash(&b), "same seed, same trace");
    let other = skipprd(&["sim", "--seed", "4"]);
    assert_ne!(hash(&a), hash(&other), "another seed takes another path");
}

#[test]
fn trace_prints_every_input_and_output_with_its_time() {
    let out = skipprd(&["sim", "--seed", "12", "--trace"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    let outputs = text.lines().filter(|l| l.contains("s <- io")).count();
    let inputs = text.lines().filter(|l| l.contains("s -> done io")).count();
    assert!(outputs > 100 && inputs > 100, "{outputs} outputs, {inputs} inputs");
    assert!(text.contains("wal-append") && text.contains("sink-apply") && text.contains("source-ack"));
}

#[test]
fn a_sweep_ends_with_the_summary_line_and_stats_show_the_scenario() {
    let out = skipprd(&["sim", "--seeds", "100..400", "--jobs", "2", "--stats"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(sweep_summary(&out), (300, 0));
    let text = stdout(&out);
    for row in ["source records", "crashes", "compactions", "segments deleted", "recoveries", "faults: torn writes"] {
        assert!(text.contains(&format!("  {row}: ")), "--stats shows {row}: {text}");
    }
    // How many seeds met each fault: a scenario with teeth meets most.
    let reach = text.split("seeds that met each fault at least once:\n").nth(1).expect("the reach section");
    let met = |name: &str| -> u64 {
        let line = reach.lines().find(|l| l.trim_start().starts_with(&format!("{name}: "))).unwrap_or_else(|| {
            panic!("no reach line for {name}: {reach}");
        });
        line.split(": ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    for name in [
        "crashes",
        "torn writes",
        "fsync failures",
        "sink lost replies",
        "source request failures",
        "dead letters replayed",
        "dead letters found by splitting",
    ] {
        assert!(met(name) > 0 && met(name) <= 300, "{name}: {}", met(name));
    }
    assert_eq!(met("s3 writers frozen"), 0, "no S3 faults in a disk sweep");
    // The rare engine paths, and how far each planted bug reaches.
    let paths = text.split("seeds that took each rare engine path at least once:\n").nth(1).expect("the paths section");
    assert!(paths.contains("a segment sealed ahead of a group that would not fit: "), "{paths}");
    assert!(!paths.contains("a batch split (its sink answered fatal, naming no record): 0 "), "{paths}");
    assert!(
        paths.contains("a commit that landed as the lease may have lapsed, verified: 0 (0.0%)"),
        "no lease on disk"
    );
    let planted = text.split("runs the checker failed:\n").nth(1).expect("the planted-bug section");
    let caught = |name: &str| -> u64 {
        let line = planted.lines().find(|l| l.trim_start().starts_with(&format!("{name}: "))).expect("a line per bug");
        line.split("caught ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    assert!(caught("offsets-before-commit") > 100, "{planted}");
    assert_eq!(caught("nondeterministic-retry"), 0, "caught only by --check-determinism: {planted}");
}

#[test]
fn list_mutations_names_every_planted_bug() {
    let out = skipprd(&["sim", "--list-mutations"]);
    assert_eq!(out.status.code(), Some(0));
    let names: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    let expected = [
        "ack-before-commit",
        "offsets-before-commit",
        "unstable-compaction-id",
        "delete-before-compaction-ack",
        "admit-torn-segment",
        "skip-compaction-replay",
        "dispatch-before-plan-commit",
        "snapshot-drops-frontier",
        "accept-resent-records",
        "delete-during-recovery",
        "offsets-stale-value",
        "nondeterministic-retry",
        "stale-writer-commits",
        "s3-overwrite-on-ambiguous",
        "offsets-regress",
        "ignore-missing-segments",
        "read-back-wrong-partition",
        "read-back-one-group-of-a-run",
        "drop-unfinished-group",
        "trust-stale-stop-record",
        "dead-letters-before-decision",
        "replay-decides-again",
        "dead-letters-renumbered",
        "batch-skip-too-far",
        "split-loses-rest",
        "quarantine-sent",
        "compaction-over-open-window",
        "unclosed-window-kept",
        "bookmark-duplicate-passed",
        "commit-before-quorum",
        "ack-before-persist",
        "vote-not-persisted",
        "no-truncate-on-conflict",
        "serve-before-term-commit",
        "wiped-peer-votes",
        "finish-before-drained",
    ];
    assert_eq!(names, expected, "the planted bugs, as the README lists them");
}

#[test]
fn bad_arguments_are_usage_errors_that_say_what_to_do() {
    let out = skipprd(&["sim", "--seeds", "5..5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
    let out = skipprd(&["sim", "--seed", "1", "--mutation", "no-such-bug"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown mutation 'no-such-bug'; known: ack-before-commit"));
    let out = skipprd(&["sim", "--seed", "1", "--wal", "tape"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown WAL mode 'tape'; known: disk, s3"), "{}", stderr(&out));
    let out = skipprd(&["sim"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--seed S, --seeds A..B"));
}

#[test]
fn failures_print_a_reproduce_line_that_reproduces_them() {
    let out = skipprd(&["sim", "--seeds", "0..50", "--mutation", "ack-before-commit"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let line = text.lines().find(|l| l.starts_with("reproduce: ")).expect("a reproduce line");
    let words: Vec<&str> = line.trim_start_matches("reproduce: skipprd ").split(' ').collect();
    assert!(words.contains(&"--mutation") && words.contains(&"ack-before-commit"), "{line}");
    let again = skipprd(&words);
    assert_eq!(again.status.code(), Some(1), "{}", stdout(&again));
    assert!(stdout(&again).contains("FAILED: acked-record-lost"), "{}", stdout(&again));
}

#[test]
fn saved_failures_replay_with_their_flags() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("found");
    let out = skipprd(&[
        "sim",
        "--seeds",
        "0..40",
        "--mutation",
        "ack-before-commit",
        "--save-failures",
        saved.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let (_, failed) = sweep_summary(&out);
    let files: Vec<_> = std::fs::read_dir(&saved).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len() as u64, failed);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    for key in ["seed = ", "flags = --mutation ack-before-commit", "sim_version = ", "invariant = ", "found = "] {
        assert!(text.contains(key), "{key} missing from {text}");
    }
    // The mutation is saved with the seed, so the replay still fails.
    let replay = skipprd(&["sim", "--replay", saved.to_str().unwrap()]);
    assert_eq!(replay.status.code(), Some(1), "{}", stdout(&replay));

    // A seed saved without flags passes on a correct engine.
    let fixed = dir.path().join("fixed");
    std::fs::create_dir(&fixed).unwrap();
    std::fs::write(fixed.join("seed-12.txt"), "seed = 12\nflags = \ninvariant = lost-record\n").unwrap();
    let replay = skipprd(&["sim", "--replay", fixed.to_str().unwrap()]);
    assert_eq!(replay.status.code(), Some(0), "{}", stdout(&replay));
    assert!(stdout(&replay).contains("seed 12 passed"));
}

#[test]
fn shrink_finds_a_smaller_schedule_that_fails_the_same_way() {
    let out = skipprd(&["sim", "--seed", "3", "--mutation", "snapshot-drops-frontier", "--shrink"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let invariant = |t: &str| {
        t.lines().find_map(|l| l.split_once("FAILED: ").map(|(_, r)| r.split(':').next().unwrap().to_string()))
    };
    let line = text.lines().find(|l| l.starts_with("reproduce (shrunk): ")).expect("a shrunk reproduce line");
    let words: Vec<&str> = line.trim_start_matches("reproduce (shrunk): skipprd ").split(' ').collect();
    assert!(words.len() > 5, "the shrunk schedule carries override flags: {line}");
    let steps: Vec<u64> = text
        .lines()
        .find_map(|l| l.strip_prefix("shrunk: "))
        .map(|l| l.split(' ').filter_map(|w| w.parse().ok()).take(2).collect())
        .expect("a shrunk line");
    assert!(steps[1] < steps[0], "smaller: {steps:?}");
    let again = skipprd(&words);
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(invariant(&stdout(&again)), invariant(&text));
}
