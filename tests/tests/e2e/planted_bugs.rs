//! Every planted bug is caught by the checker within 10,000 seeds, and the
//! failure names one of the checker's invariants, not only a core assertion.

use skippr_tests::*;

/// Extra flags a planted bug needs to show: nondeterminism only shows when
/// each seed runs twice, and the bugs of S3 mode and of clustered mode need
/// their mode.
fn flags_for(name: &str) -> (&'static str, Vec<&'static str>) {
    match name {
        "nondeterministic-retry" => ("0..300", vec!["--check-determinism"]),
        "stale-writer-commits" | "s3-overwrite-on-ambiguous" | "offsets-regress" => ("0..10000", vec!["--wal", "s3"]),
        "commit-before-quorum"
        | "ack-before-persist"
        | "vote-not-persisted"
        | "no-truncate-on-conflict"
        | "serve-before-term-commit"
        | "wiped-peer-votes"
        | "finish-before-drained" => ("0..10000", vec!["--wal", "clustered"]),
        // Dead letters are on in about one seed in four; each of these is
        // caught in about one seed of nine.
        "dead-letters-before-decision" | "replay-decides-again" | "dead-letters-renumbered" => ("0..2000", vec![]),
        // Poison is on in a fifth of the seeds with dead letters off (about
        // one seed in seven); this is caught in about one seed of eleven.
        "batch-skip-too-far" => ("0..2000", vec![]),
        // Poison with dead letters on (about one seed in twenty) is split
        // by the engine; this is caught in about one seed of thirty.
        "split-loses-rest" => ("0..500", vec![]),
        // Sources send broken records in about one seed in eight (dead
        // letters on, a share drawn); this is caught in about one seed of
        // nine.
        "quarantine-sent" => ("0..500", vec![]),
        // A source is a Singer-like tap in about one seed in three; these
        // are caught in about one seed of twenty, fifteen and five.
        "compaction-over-open-window" | "unclosed-window-kept" | "bookmark-duplicate-passed" => ("0..1000", vec![]),
        _ => ("0..10000", vec![]),
    }
}

#[test]
fn every_planted_bug_is_caught_by_a_checker_invariant() {
    let _cores = both_cores();
    let list = skipprd(&["sim", "--list-mutations"]);
    let names: Vec<String> = stdout(&list).lines().map(str::to_string).collect();
    assert_eq!(names.len(), 36, "{names:?}");
    let mut report = Vec::new();
    // Ten failing seeds show a bug caught (and by which invariants): the
    // sweep starts no seed after that, the rest of its range unrun.
    let stop = 10;
    let stop_flag = stop.to_string();
    for name in &names {
        let (range, extra) = flags_for(name);
        let mut args = vec!["sim", "--seeds", range, "--jobs", "2", "--mutation", name.as_str()];
        args.extend(["--stop-after-failures", stop_flag.as_str()]);
        args.extend(extra);
        let out = skipprd(&args);
        assert_eq!(out.status.code(), Some(1), "{name} was not caught:\n{}", stdout(&out));
        let (ran, failed) = sweep_summary(&out);
        let stopped = format!("stopped after {failed} failing seeds: {ran} of the ");
        // Those running when the tenth failed finish: one more per other job.
        assert!(
            (failed >= stop && failed < stop + 2 && stdout(&out).contains(&stopped))
                || !stdout(&out).contains("stopped"),
            "{name}: {}",
            stdout(&out)
        );
        let by = failures_by_invariant(&out);
        assert!(
            by.iter().any(|(invariant, n)| invariant != "core-assertion" && *n > 0),
            "{name} tripped only core assertions: {by:?}"
        );
        assert!(stdout(&out).contains(&format!("--mutation {name}")), "reproduce lines carry the flag");
        report.push(format!("{name}: {failed} failing seeds of {ran}, {by:?}"));
    }
    eprintln!("{}", report.join("\n"));
}

/// Clustered mode runs the checks of every mode. Recovering a host twice
/// from copies of its disk gives what recovering once gives: the planted
/// bug `delete-during-recovery` (a host deleting its oldest segment as it
/// restores, without raft's log moving past it) fails that check in
/// nearly all of the runs it breaks. Under `--once` every host's offsets
/// store holds every record at the end: `offsets-stale-value` fails that
/// check. Bit rot strikes a host's disk, which the host finds and names,
/// and the operator replaces.
#[test]
fn clustered_mode_checks_recovery_idempotence_and_materialized_offsets_and_meets_bit_rot() {
    let _cores = both_cores();
    let args =
        ["sim", "--wal", "clustered", "--seeds", "0..200", "--jobs", "2", "--mutation", "delete-during-recovery"];
    let out = skipprd(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let by = failures_by_invariant(&out);
    assert!(by.iter().any(|(invariant, n)| invariant == "recovery-not-idempotent" && *n > 0), "{by:?}");

    let args = ["sim", "--wal", "clustered", "--seeds", "0..300", "--jobs", "2", "--mutation", "offsets-stale-value"];
    let out = skipprd(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let by = failures_by_invariant(&out);
    assert!(by.iter().any(|(invariant, n)| invariant == "offsets-not-materialized" && *n > 0), "{by:?}");

    let out = skipprd(&["sim", "--wal", "clustered", "--seeds", "0..400", "--jobs", "2", "--stats"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    let seeds_with = |name: &str| -> u64 {
        let line = text.lines().find(|l| l.trim_start().starts_with(&format!("{name}: "))).expect(name);
        // "name: N (P%)", and a name may hold ": " itself.
        line.rsplit(": ").next().unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    assert!(seeds_with("bit rot") > 0, "{text}");
    assert!(seeds_with("clustered: a rotten disk found and replaced") > 0, "{text}");
}

/// Clustered mode's model checks that a batch handed to a sink has its
/// plan, not only its records, committed on a majority, and that a
/// truncation zeroes or removes every byte it replaces (a remnant that no
/// longer validates is still a remnant).
#[test]
fn clustered_mode_checks_dispatched_plans_and_truncation_remnants() {
    let _cores = both_cores();
    let args =
        ["sim", "--wal", "clustered", "--seeds", "0..50", "--jobs", "2", "--mutation", "dispatch-before-plan-commit"];
    let out = skipprd(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let by = failures_by_invariant(&out);
    assert!(by.iter().any(|(invariant, n)| invariant == "dispatch-before-majority" && *n > 25), "{by:?}");
    assert!(stdout(&out).contains("whose plan no majority holds"), "{}", stdout(&out));

    let args =
        ["sim", "--wal", "clustered", "--seeds", "0..400", "--jobs", "2", "--mutation", "no-truncate-on-conflict"];
    let out = skipprd(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let by = failures_by_invariant(&out);
    assert!(by.iter().any(|(invariant, n)| invariant == "truncation-left-bytes" && *n > 10), "{by:?}");
    assert!(stdout(&out).contains("a truncation zeroes or removes all it replaces"), "{}", stdout(&out));
}

/// Clustered hosts stopped on a SIGTERM start again from their stop
/// record; at every start that finds one, recovering from copies of the
/// host's disk with it and without it must agree (committed state, records
/// some sink still needs, raft's log). A start that trusts a record no
/// longer true (`trust-stale-stop-record`: written, then the host started
/// from it and wrote more before a crash) fails that check.
#[test]
fn clustered_hosts_start_from_stop_records_that_a_scan_bears_out() {
    let _cores = both_cores();
    let out = skipprd(&["sim", "--wal", "clustered", "--seeds", "0..200", "--jobs", "2", "--stats"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let used = stdout(&out)
        .lines()
        .find_map(|l| l.trim().strip_prefix("stop records used: ").map(|v| v.parse::<f64>().unwrap()))
        .expect("the stop-record line");
    assert!(used > 0.2, "clustered hosts started from stop records: {used} a run");
    let args =
        ["sim", "--wal", "clustered", "--seeds", "0..200", "--jobs", "2", "--mutation", "trust-stale-stop-record"];
    let out = skipprd(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let by = failures_by_invariant(&out);
    assert!(by.iter().any(|(invariant, n)| invariant == "stop-record-unfaithful" && *n > 10), "{by:?}");
}
