//! Shrinking: given a failing seed, find a smaller schedule that still fails
//! with the same invariant: fewer crashes, fewer faults, fewer records. Each
//! step is kept only if the run still fails the same way, so the result
//! reproduces with one command.

use crate::scenario::{FaultKind, Scenario};
use crate::world::{run, Outcome, RunOptions, RunReport};

pub struct Shrunk {
    pub opts: RunOptions,
    pub report: RunReport,
    pub steps_before: u64,
    pub runs: u32,
}

/// Returns `None` when the seed does not fail.
pub fn shrink(seed: u64, opts: &RunOptions) -> Option<Shrunk> {
    let first = run(seed, opts);
    let Outcome::Fail(target) = &first.outcome else {
        return None;
    };
    let invariant = target.invariant;
    let steps_before = first.stats.steps;
    let mut best = (opts.clone(), first);
    let mut runs = 1;
    let mut attempt = |candidate: RunOptions, best: &mut (RunOptions, RunReport)| -> bool {
        runs += 1;
        let report = run(seed, &candidate);
        let same = matches!(&report.outcome, Outcome::Fail(v) if v.invariant == invariant);
        if same && report.stats.steps <= best.1.stats.steps {
            *best = (candidate, report);
        }
        same
    };

    let scenario = Scenario::from_seed(seed).with_overrides(&opts.overrides);
    for n in 0..scenario.crashes_kept {
        let mut c = best.0.clone();
        c.overrides.crashes = Some(n);
        if attempt(c, &mut best) {
            break;
        }
    }
    for &kind in FaultKind::ALL {
        if scenario.has(kind) && !best.0.overrides.faults_off.contains(&kind) {
            let mut c = best.0.clone();
            c.overrides.faults_off.push(kind);
            c.overrides.faults_off.sort();
            attempt(c, &mut best);
        }
    }
    for percent in [5, 10, 25, 50] {
        if best.0.overrides.records_percent.is_some_and(|p| p <= percent) {
            break;
        }
        let mut c = best.0.clone();
        c.overrides.records_percent = Some(percent);
        if attempt(c, &mut best) {
            break;
        }
    }
    let (opts, report) = best;
    Some(Shrunk { opts, report, steps_before, runs })
}
