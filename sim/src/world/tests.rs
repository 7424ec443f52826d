//! The fault dice keep components apart: a draw added to one leaves runs
//! that do not use it as they were.

use super::*;
use crate::scenario::Scenario;

fn opts(wal: WalMode) -> RunOptions {
    RunOptions { mutations: Mutations::NONE, wal, hosts: 0, trace: false, overrides: Overrides::default() }
}

/// The trace hash of `seed`, with `die` rolled `extra` more times before
/// the run starts (as a draw added to that component's code would).
fn hash_with_extra_draws(seed: u64, wal: WalMode, die: Die, extra: u32) -> u64 {
    let mut world = crate::writer::world(seed, opts(wal));
    for _ in 0..extra {
        world.dice.roll(die).u64();
    }
    world.run().trace_hash
}

#[test]
fn a_draw_added_to_one_fault_model_leaves_runs_without_that_fault_as_they_were() {
    let mut checked = 0;
    for seed in 0..400 {
        let faults = Scenario::from_seed(seed).faults;
        if faults.sink_lost_reply > 0.0 {
            continue;
        }
        let before = hash_with_extra_draws(seed, WalMode::Disk, Die::SinkLostReply, 0);
        assert_eq!(before, hash_with_extra_draws(seed, WalMode::Disk, Die::SinkLostReply, 3), "seed {seed}");
        checked += 1;
    }
    assert!(checked > 50, "enough seeds without lost sink replies: {checked}");
    // S3's fault models take no part in a disk run.
    for seed in 0..100 {
        let before = hash_with_extra_draws(seed, WalMode::Disk, Die::S3Ambiguous, 0);
        assert_eq!(before, hash_with_extra_draws(seed, WalMode::Disk, Die::S3Ambiguous, 5), "seed {seed}");
    }
}

#[test]
fn a_draw_added_to_a_component_every_run_uses_does_change_runs() {
    // The control: the test above could not pass by every draw being
    // ignored.
    let changed = (0..100)
        .filter(|&seed| {
            hash_with_extra_draws(seed, WalMode::Disk, Die::DiskLatency, 0)
                != hash_with_extra_draws(seed, WalMode::Disk, Die::DiskLatency, 1)
        })
        .count();
    assert!(changed > 50, "{changed} of 100 runs changed");
}
