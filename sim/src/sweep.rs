//! Seed sweeps: independent runs spread over worker threads, nothing shared
//! but a counter of the next seed and a channel of results. Totals do not
//! depend on which thread ran which seed.

use crate::checker::Violation;
use crate::world::{run, Outcome, RunOptions, RunStats};
use skippr_core::Mutation;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

pub struct SweepOptions {
    pub seeds: Range<u64>,
    pub jobs: usize,
    pub run: RunOptions,
    /// Run every seed twice and fail it if the trace hashes differ.
    pub check_determinism: bool,
    /// Start no seed once this many have failed (the seeds running finish):
    /// enough to show a planted bug is caught, without the rest of the range.
    pub stop_after_failures: Option<u64>,
}

pub struct SeedResult {
    pub seed: u64,
    pub outcome: Outcome,
    pub trace_hash: u64,
    pub stats: RunStats,
}

impl SeedResult {
    pub fn failed(&self) -> Option<&Violation> {
        match &self.outcome {
            Outcome::Fail(v) => Some(v),
            _ => None,
        }
    }
}

/// Runs one seed, twice when checking determinism.
pub fn run_seed(seed: u64, opts: &RunOptions, check_determinism: bool) -> SeedResult {
    let report = run(seed, opts);
    let mut outcome = report.outcome;
    if check_determinism {
        let again = run(seed, opts);
        if again.trace_hash != report.trace_hash && !matches!(outcome, Outcome::Fail(_)) {
            outcome = Outcome::Fail(Violation {
                invariant: crate::checker::invariant::NONDETERMINISM,
                detail: format!("trace hash {:016x} then {:016x}", report.trace_hash, again.trace_hash),
            });
        }
    }
    SeedResult { seed, outcome, trace_hash: report.trace_hash, stats: report.stats }
}

/// Results reach the calling thread in batches of this many: one wake-up
/// per batch rather than per seed.
const BATCH: usize = 16;

/// Runs every seed in the range on `jobs` threads, calling `each` on the
/// calling thread as results arrive.
pub fn sweep(opts: &SweepOptions, mut each: impl FnMut(SeedResult)) {
    let next = AtomicU64::new(opts.seeds.start);
    let failed = AtomicU64::new(0);
    let end = opts.seeds.end;
    let (tx, rx) = mpsc::sync_channel::<Vec<SeedResult>>(64);
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.max(1) {
            let tx = tx.clone();
            let (next, failed) = (&next, &failed);
            scope.spawn(move || {
                let mut batch = Vec::with_capacity(BATCH);
                loop {
                    if opts.stop_after_failures.is_some_and(|n| failed.load(Ordering::Relaxed) >= n) {
                        break;
                    }
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let result = run_seed(seed, &opts.run, opts.check_determinism);
                    failed.fetch_add(result.failed().is_some() as u64, Ordering::Relaxed);
                    batch.push(result);
                    if batch.len() == BATCH
                        && tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))).is_err()
                    {
                        return;
                    }
                }
                let _ = tx.send(batch);
            });
        }
        drop(tx);
        for batch in rx {
            batch.into_iter().for_each(&mut each);
        }
    });
}

/// Sums of per-seed statistics, for `--stats`.
#[derive(Default)]
pub struct Totals {
    pub seeds: u64,
    pub passed: u64,
    pub fail_closed: u64,
    pub failed: u64,
    pub with_crash: u64,
    pub with_deletion: u64,
    pub sum: RunStats,
    /// Per fault kind, the seeds in which it happened at least once.
    pub reached: Vec<u64>,
}

/// How many of the entries of `faults` are faults; the rare engine paths
/// follow them.
const FAULT_KINDS: usize = 27;

/// The faults of a run and the rare engine paths it took, by the names
/// `--stats` prints them under.
fn faults(s: &RunStats) -> [(&'static str, u64); 52] {
    [
        ("crashes", s.crashes),
        ("crashes that cut the power", s.power_cuts),
        ("crashes during a commit", s.crashes_in_commit),
        ("crashes during recovery", s.crashes_in_recovery),
        ("crashes during a shutdown drain", s.crashes_in_drain),
        ("torn writes", s.torn_writes),
        ("lost writes", s.lost_writes),
        ("lost directory entries", s.lost_dir_entries),
        ("fsync failures", s.fsync_failures),
        ("disk full", s.no_space),
        ("bit rot", s.rot),
        ("sink retryable", s.sink_retryable),
        ("sink lost replies", s.sink_lost_replies),
        ("sink refusals", s.sink_refusals),
        ("sink fatal on poison", s.sink_poisoned),
        ("dead letters found by splitting", s.split_letters),
        ("dead letters of records refused at intake", s.intake_letters),
        ("a Singer-like tap started (again)", s.tap_starts),
        ("batches given up", s.batch_skips),
        ("dead-letter replays", s.replays),
        ("dead letters replayed", s.replayed),
        ("offsets ambiguous", s.offsets_ambiguous),
        ("source request failures", s.source_failures),
        ("segments deleted by an operator", s.lost_segments),
        ("s3 puts with an unknown outcome", s.s3_ambiguous),
        ("s3 throttled requests", s.s3_throttled),
        ("s3 writers frozen", s.pauses),
        ("WAL reads for a sink that failed", s.read_fails),
        ("WAL reads for recovery that failed", s.recovery_read_fails),
        ("clustered: partitions", s.partitions),
        ("clustered: hosts frozen", s.freezes),
        ("clustered: hosts wiped", s.wipes),
        ("clustered: hosts that died in the middle of a truncation", s.truncations_interrupted),
        ("clustered: raft messages lost", s.messages_lost),
        ("clustered: raft messages duplicated", s.messages_duplicated),
        ("a commit that landed as the lease may have lapsed, verified", s.late_commits_verified),
        ("a segment sealed ahead of a group that would not fit", s.seals_ahead),
        ("a segment sealed because the next frame did not fit", s.seals_no_room),
        ("a batch split (its sink answered fatal, naming no record)", s.splits),
        ("a probe found the sink holding a batch from before its split", s.held_before_split),
        ("records read back from the WAL for a sink", s.read_backs),
        ("sources paused at the WAL's size limit", s.wal_full),
        ("clustered: a leader elected", s.elections),
        ("clustered: more than one term had a leader", s.terms.saturating_sub(1)),
        ("clustered: a leader stopped on losing leadership", s.deposed),
        ("clustered: a conflicting uncommitted tail truncated", s.truncations),
        ("clustered: a wiped host joined under a new id", s.joins),
        ("clustered: a rotten disk found and replaced", s.disks_replaced),
        ("clustered: a joined host promoted to voter", s.promotions),
        ("clustered: two truncations", s.truncations.saturating_sub(1)),
        ("clustered: a snapshot installed", s.snapshots),
        ("clustered: a host restarted", s.restarts.saturating_sub(3)),
    ]
}

impl Totals {
    pub fn add(&mut self, r: &SeedResult) {
        self.seeds += 1;
        match r.outcome {
            Outcome::Pass => self.passed += 1,
            Outcome::FailClosed(_) => self.fail_closed += 1,
            Outcome::Fail(_) => self.failed += 1,
        }
        let s = &r.stats;
        self.with_crash += (s.crashes > 0) as u64;
        self.with_deletion += (s.segments_deleted > 0) as u64;
        let kinds = faults(s);
        self.reached.resize(kinds.len(), 0);
        for (reached, (_, n)) in self.reached.iter_mut().zip(kinds) {
            *reached += (n > 0) as u64;
        }
        let t = &mut self.sum;
        t.source_records += s.source_records;
        t.crashes += s.crashes;
        t.power_cuts += s.power_cuts;
        t.crashes_in_recovery += s.crashes_in_recovery;
        t.crashes_in_drain += s.crashes_in_drain;
        t.crashes_in_commit += s.crashes_in_commit;
        t.restarts += s.restarts;
        t.recoveries += s.recoveries;
        t.compactions += s.compactions;
        t.segments_deleted += s.segments_deleted;
        t.torn_writes += s.torn_writes;
        t.lost_writes += s.lost_writes;
        t.lost_dir_entries += s.lost_dir_entries;
        t.fsync_failures += s.fsync_failures;
        t.no_space += s.no_space;
        t.rot += s.rot;
        t.sink_retryable += s.sink_retryable;
        t.sink_lost_replies += s.sink_lost_replies;
        t.sink_refusals += s.sink_refusals;
        t.sink_poisoned += s.sink_poisoned;
        t.split_letters += s.split_letters;
        t.intake_letters += s.intake_letters;
        t.tap_starts += s.tap_starts;
        t.tap_windows += s.tap_windows;
        t.batch_skips += s.batch_skips;
        t.replays += s.replays;
        t.replayed += s.replayed;
        t.offsets_ambiguous += s.offsets_ambiguous;
        t.source_failures += s.source_failures;
        t.shutdowns += s.shutdowns;
        t.schema_decisions += s.schema_decisions;
        t.clean_stops += s.clean_stops;
        t.s3_ambiguous += s.s3_ambiguous;
        t.s3_landed_late += s.s3_landed_late;
        t.s3_throttled += s.s3_throttled;
        t.s3_conflicts += s.s3_conflicts;
        t.pauses += s.pauses;
        t.lost_segments += s.lost_segments;
        t.fenced += s.fenced;
        t.lease_waits += s.lease_waits;
        t.late_commits_verified += s.late_commits_verified;
        t.seals_ahead += s.seals_ahead;
        t.seals_no_room += s.seals_no_room;
        t.splits += s.splits;
        t.held_before_split += s.held_before_split;
        t.read_backs += s.read_backs;
        t.read_fails += s.read_fails;
        t.recovery_reads += s.recovery_reads;
        t.recovery_read_fails += s.recovery_read_fails;
        t.stop_records_written += s.stop_records_written;
        t.stop_records_found += s.stop_records_found;
        t.stop_records_used += s.stop_records_used;
        t.stop_records_stale += s.stop_records_stale;
        t.wal_full += s.wal_full;
        t.terms += s.terms;
        t.elections += s.elections;
        t.deposed += s.deposed;
        t.partitions += s.partitions;
        t.freezes += s.freezes;
        t.sigterms += s.sigterms;
        t.sigterm_stops += s.sigterm_stops;
        t.truncations += s.truncations;
        t.wipes += s.wipes;
        t.disks_replaced += s.disks_replaced;
        t.joins += s.joins;
        t.promotions += s.promotions;
        t.joins_refused += s.joins_refused;
        t.stalled_out += s.stalled_out;
        t.removed_told += s.removed_told;
        t.snapshots += s.snapshots;
        t.snapshot_failures += s.snapshot_failures;
        t.truncations_interrupted += s.truncations_interrupted;
        t.messages_lost += s.messages_lost;
        t.messages_duplicated += s.messages_duplicated;
        t.steps += s.steps;
        t.sim_micros += s.sim_micros;
    }

    /// Per-seed averages, one `name: value` a line.
    pub fn report(&self) -> String {
        let n = self.seeds.max(1) as f64;
        let t = &self.sum;
        let pct = |x: u64| 100.0 * x as f64 / n;
        let rows: Vec<(&str, f64)> = vec![
            ("source records", t.source_records as f64 / n),
            ("crashes", t.crashes as f64 / n),
            ("crashes that cut the power", t.power_cuts as f64 / n),
            ("crashes during a commit", t.crashes_in_commit as f64 / n),
            ("crashes during recovery", t.crashes_in_recovery as f64 / n),
            ("crashes during a shutdown drain", t.crashes_in_drain as f64 / n),
            ("recoveries", t.recoveries as f64 / n),
            ("compactions", t.compactions as f64 / n),
            ("segments deleted", t.segments_deleted as f64 / n),
            ("faults: torn writes", t.torn_writes as f64 / n),
            ("faults: lost writes", t.lost_writes as f64 / n),
            ("faults: lost directory entries", t.lost_dir_entries as f64 / n),
            ("faults: fsync failures", t.fsync_failures as f64 / n),
            ("faults: disk full", t.no_space as f64 / n),
            ("faults: bit rot", t.rot as f64 / n),
            ("faults: sink retryable", t.sink_retryable as f64 / n),
            ("faults: sink lost replies", t.sink_lost_replies as f64 / n),
            ("faults: batches with records a sink refused", t.sink_refusals as f64 / n),
            ("faults: batches a sink answered fatal (poison)", t.sink_poisoned as f64 / n),
            ("dead letters of poisoned records, found by splitting", t.split_letters as f64 / n),
            ("dead letters of records refused at intake", t.intake_letters as f64 / n),
            ("a Singer-like tap's starts", t.tap_starts as f64 / n),
            ("a Singer-like tap's windows closed", t.tap_windows as f64 / n),
            ("operator: batches given up (--skip-batch)", t.batch_skips as f64 / n),
            ("operator: starts that replay dead letters", t.replays as f64 / n),
            ("operator: dead letters replayed into a sink or the dead letters", t.replayed as f64 / n),
            ("faults: offsets ambiguous", t.offsets_ambiguous as f64 / n),
            ("faults: source request failures", t.source_failures as f64 / n),
            ("faults: segments deleted by an operator", t.lost_segments as f64 / n),
            ("faults: WAL reads for a sink that failed", t.read_fails as f64 / n),
            ("faults: WAL reads for recovery that failed", t.recovery_read_fails as f64 / n),
            ("read-back requests to the WAL for a sink", t.read_backs as f64 / n),
            ("recovery's reads of the WAL", t.recovery_reads as f64 / n),
            ("stop records written", t.stop_records_written as f64 / n),
            ("stop records found at a start", t.stop_records_found as f64 / n),
            ("stop records used", t.stop_records_used as f64 / n),
            ("stop records set aside", t.stop_records_stale as f64 / n),
            ("sources paused at the WAL's size limit", t.wal_full as f64 / n),
            ("schema decisions", t.schema_decisions as f64 / n),
            ("shutdowns", t.shutdowns as f64 / n),
            ("clean stops", t.clean_stops as f64 / n),
            ("s3: puts with an unknown outcome", t.s3_ambiguous as f64 / n),
            ("s3: puts that landed late", t.s3_landed_late as f64 / n),
            ("s3: throttled requests", t.s3_throttled as f64 / n),
            ("s3: puts that met other bytes", t.s3_conflicts as f64 / n),
            ("s3: writers frozen", t.pauses as f64 / n),
            ("s3: writers fenced or lease lost", t.fenced as f64 / n),
            ("s3: lease waits", t.lease_waits as f64 / n),
            ("clustered: terms with a leader", t.terms as f64 / n),
            ("clustered: elections won", t.elections as f64 / n),
            ("clustered: leaders deposed (engine restarted)", t.deposed as f64 / n),
            ("clustered: partitions", t.partitions as f64 / n),
            ("clustered: hosts frozen", t.freezes as f64 / n),
            ("clustered: hosts sent a SIGTERM", t.sigterms as f64 / n),
            ("clustered: hosts stopped on a SIGTERM", t.sigterm_stops as f64 / n),
            ("clustered: truncated tails", t.truncations as f64 / n),
            ("clustered: hosts wiped", t.wipes as f64 / n),
            ("clustered: wiped hosts joined again", t.joins as f64 / n),
            ("clustered: joined hosts promoted", t.promotions as f64 / n),
            ("clustered: joins refused", t.joins_refused as f64 / n),
            ("clustered: hosts out on a stall after the run finished", t.stalled_out as f64 / n),
            ("clustered: removed hosts told", t.removed_told as f64 / n),
            ("clustered: snapshots installed", t.snapshots as f64 / n),
            ("clustered: snapshot transfers failed", t.snapshot_failures as f64 / n),
            ("clustered: hosts that died in the middle of a truncation", t.truncations_interrupted as f64 / n),
            ("clustered: raft messages lost", t.messages_lost as f64 / n),
            ("clustered: raft messages duplicated", t.messages_duplicated as f64 / n),
            ("engine steps", t.steps as f64 / n),
            ("simulated seconds", t.sim_micros as f64 / n / 1e6),
        ];
        let mut out = String::from("per-seed averages:\n");
        for (name, v) in rows {
            out.push_str(&format!("  {name}: {v:.2}\n"));
        }
        out.push_str(&format!("  seeds with a crash: {:.1}%\n", pct(self.with_crash)));
        out.push_str(&format!("  seeds with a segment deleted: {:.1}%\n", pct(self.with_deletion)));
        out.push_str(&format!("  seeds failed closed (corruption, a lost segment): {:.2}%\n", pct(self.fail_closed)));
        out.push_str("seeds that met each fault at least once:\n");
        for (i, ((name, _), reached)) in faults(&RunStats::default()).iter().zip(&self.reached).enumerate() {
            if i == FAULT_KINDS {
                out.push_str("seeds that took each rare engine path at least once:\n");
            }
            out.push_str(&format!("  {name}: {reached} ({:.1}%)\n", pct(*reached)));
        }
        out
    }
}

/// How far one planted bug reaches over a sample of seeds.
pub struct PlantedReach {
    pub mutation: Mutation,
    /// Seeds whose trace the planted bug changed: its site was reached and
    /// made a difference.
    pub changed: u64,
    /// Seeds the checker failed with the planted bug on.
    pub caught: u64,
}

/// Runs `seeds` once as they are and once with each planted bug on, on
/// `jobs` threads, and counts the seeds each bug changed and those the
/// checker caught.
pub fn planted_reach(seeds: Range<u64>, jobs: usize, base: &RunOptions) -> Vec<PlantedReach> {
    let hashes_of = |run: RunOptions| {
        let mut out = BTreeMap::new();
        let opts =
            SweepOptions { seeds: seeds.clone(), jobs, run, check_determinism: false, stop_after_failures: None };
        sweep(&opts, |r| {
            out.insert(r.seed, (r.trace_hash, r.failed().is_some()));
        });
        out
    };
    let plain = hashes_of(base.clone());
    let planted = if base.wal == crate::scenario::WalMode::Clustered { Mutation::CLUSTERED } else { Mutation::ALL };
    planted
        .iter()
        .map(|&mutation| {
            let mut run = base.clone();
            run.mutations = base.mutations.with(mutation);
            let mutated = hashes_of(run);
            let changed = mutated.iter().filter(|(seed, (hash, _))| plain[*seed].0 != *hash).count() as u64;
            let caught = mutated.values().filter(|(_, failed)| *failed).count() as u64;
            PlantedReach { mutation, changed, caught }
        })
        .collect()
}

/// `planted_reach` as `--stats` prints it.
pub fn planted_report(seeds: u64, reach: &[PlantedReach]) -> String {
    let pct = |x: u64| 100.0 * x as f64 / seeds.max(1) as f64;
    let mut out =
        format!("planted bugs on the first {seeds} seeds: runs each one changed, and runs the checker failed:\n");
    for r in reach {
        out.push_str(&format!(
            "  {}: changed {} ({:.1}%), caught {} ({:.1}%)\n",
            r.mutation.name(),
            r.changed,
            pct(r.changed),
            r.caught,
            pct(r.caught)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::WalMode;

    /// A short sweep of each mode: what `cargo mutants` judges a mutant of
    /// core by, with core's own tests (BENCHMARKS.md, mutation testing).
    #[test]
    fn short_sweeps_of_both_modes_pass() {
        for wal in [WalMode::Disk, WalMode::S3] {
            let run = RunOptions { wal, ..RunOptions::default() };
            let opts =
                SweepOptions { seeds: 0..1_500, jobs: 2, run, check_determinism: false, stop_after_failures: None };
            let mut failed = Vec::new();
            sweep(&opts, |r| {
                if let Some(v) = r.failed() {
                    failed.push(format!("seed {}: {v}", r.seed));
                }
            });
            failed.sort();
            assert!(failed.is_empty(), "{wal:?}: {} failed, first {:?}", failed.len(), failed.first());
        }
    }
}
