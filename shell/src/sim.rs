//! `skipprd sim`: the simulator's command line. The words printed here are a
//! contract other tools parse: keep them.

use crate::exit;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use skippr_core::{Mutation, Mutations};
use skippr_sim::scenario::{FaultKind, Overrides, WalMode};
use skippr_sim::shrink::shrink;
use skippr_sim::sweep::{planted_reach, planted_report, run_seed, sweep, SeedResult, SweepOptions, Totals};
use skippr_sim::{run, Outcome, RunOptions, SIM_VERSION};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Run one seed.
    #[arg(long, conflicts_with_all = ["seeds", "replay", "list_mutations"])]
    seed: Option<u64>,
    /// Sweep seeds A..B (A inclusive, B exclusive).
    #[arg(long, value_name = "A..B", value_parser = parse_range, conflicts_with_all = ["replay", "list_mutations"])]
    seeds: Option<Range<u64>>,
    /// Run every saved failure in DIR with its saved flags.
    #[arg(long, value_name = "DIR", conflicts_with = "list_mutations")]
    replay: Option<PathBuf>,
    /// Print the names of the planted bugs, one a line.
    #[arg(long)]
    list_mutations: bool,
    /// Worker threads for a sweep.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Print every engine input and output with its simulated time (one seed).
    #[arg(long)]
    trace: bool,
    /// Run each seed twice; a seed fails if its trace hashes differ.
    #[arg(long)]
    check_determinism: bool,
    /// Print per-seed averages: records, crashes, faults by kind, compactions,
    /// segments deleted, recoveries; then how many seeds met each fault and
    /// took each rare engine path at least once; then, on the first 300
    /// seeds run again with each planted bug on, how many runs each bug
    /// changed and how many the checker failed.
    #[arg(long)]
    stats: bool,
    /// Write each failing seed to DIR as a small text file.
    #[arg(long, value_name = "DIR")]
    save_failures: Option<PathBuf>,
    /// With --seeds: write every seed's trace hash to FILE, one `seed hash`
    /// a line in seed order, so two builds can be compared with `cmp` (a
    /// refactor that only moves code must leave every line as it was).
    #[arg(long, value_name = "FILE", requires = "seeds")]
    hashes: Option<PathBuf>,
    /// With --seeds: start no more seeds once N have failed (those running
    /// finish); the summary counts the seeds that ran. For showing that a
    /// planted bug is caught without sweeping the rest of the range.
    #[arg(long, value_name = "N", requires = "seeds", conflicts_with = "hashes", value_parser = clap::value_parser!(u64).range(1..))]
    stop_after_failures: Option<u64>,
    /// Turn on a planted bug (repeatable); see --list-mutations.
    #[arg(long, value_name = "NAME", value_parser = parse_mutation)]
    mutation: Vec<Mutation>,
    /// With --seed: if it fails, search for a smaller schedule (fewer
    /// crashes, faults and records) that fails the same way, and print the
    /// command that reproduces it.
    #[arg(long, requires = "seed")]
    shrink: bool,
    /// Keep only the first N crashes the seed schedules.
    #[arg(long, value_name = "N")]
    crashes: Option<u32>,
    /// Scale every partition's record count to P percent (1 to 100).
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u32).range(1..=100))]
    records_percent: Option<u32>,
    /// Switch faults off, comma-separated: fsync-fail, disk-full, rot,
    /// lost-dir-entry, sink-retryable, sink-lost-reply, offsets-ambiguous,
    /// source-fail, shutdown-mid-run, lost-segment, read-fail, s3-ambiguous,
    /// s3-throttle, pause, lease-wipe.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_fault)]
    faults_off: Vec<FaultKind>,
    /// Where the simulated WAL lives: `disk` (segment files under a page
    /// cache), `s3` (objects created with If-None-Match, a writer lease
    /// and offsets in DynamoDB, frozen writers waking next to their
    /// replacements) or `clustered` (several hosts, each with its own
    /// disk, replicating by raft over a network that loses, duplicates,
    /// delays and partitions; hosts killed, powered off, frozen, and
    /// stopped with SIGTERM).
    #[arg(long, value_name = "MODE", default_value = "disk", value_parser = parse_wal)]
    wal: WalMode,
    /// With --wal clustered: the number of hosts (3 or 5; default 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=9))]
    hosts: Option<u32>,
}

fn parse_wal(s: &str) -> Result<WalMode, String> {
    WalMode::from_name(s).ok_or_else(|| format!("unknown WAL mode '{s}'; known: disk, s3, clustered"))
}

fn parse_fault(s: &str) -> Result<FaultKind, String> {
    FaultKind::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault '{s}'; known: {}", names.join(", "))
    })
}

fn parse_range(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("'{s}' is not a range: write A..B, like 0..10000"))?;
    let a: u64 = a.trim().parse().map_err(|_| format!("'{a}' is not a seed number"))?;
    let b: u64 = b.trim().parse().map_err(|_| format!("'{b}' is not a seed number"))?;
    if a >= b {
        return Err(format!("the range {a}..{b} is empty: B must be greater than A"));
    }
    Ok(a..b)
}

fn parse_mutation(s: &str) -> Result<Mutation, String> {
    Mutation::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Mutation::ALL.iter().chain(Mutation::CLUSTERED).map(|m| m.name()).collect();
        format!("unknown mutation '{s}'; known: {}", names.join(", "))
    })
}

pub fn main(args: SimArgs) -> i32 {
    // A panic inside a run is reported as that run's failure, with its
    // message; the default hook would print it a second time.
    std::panic::set_hook(Box::new(|_| {}));
    let mut mutations = Mutations::NONE;
    for m in &args.mutation {
        mutations = mutations.with(*m);
    }
    let mut faults_off = args.faults_off.clone();
    faults_off.sort();
    faults_off.dedup();
    let overrides = Overrides { crashes: args.crashes, records_percent: args.records_percent, faults_off };
    if args.hosts.is_some() && args.wal != WalMode::Clustered {
        eprintln!("skipprd sim: --hosts needs --wal clustered");
        return exit::USAGE;
    }
    let hosts = args.hosts.unwrap_or(0) as usize;
    let opts = RunOptions { mutations, wal: args.wal, hosts, trace: args.trace, overrides };
    if args.list_mutations {
        // The clustered ones last: only `--wal clustered` reaches them.
        for m in Mutation::ALL.iter().chain(Mutation::CLUSTERED) {
            println!("{m}");
        }
        return exit::OK;
    }
    if let Some(seed) = args.seed {
        return one(seed, &args, &opts);
    }
    if let Some(seeds) = args.seeds.clone() {
        return many(seeds, &args, &opts);
    }
    if let Some(dir) = &args.replay {
        return replay(dir, &args);
    }
    eprintln!("skipprd sim: say what to run: --seed S, --seeds A..B, --replay DIR or --list-mutations");
    exit::USAGE
}

fn flags(opts: &RunOptions) -> String {
    let wal = match opts.wal {
        WalMode::Disk => String::new(),
        mode => format!(" --wal {}", mode.name()),
    };
    let hosts = if opts.hosts > 0 { format!(" --hosts {}", opts.hosts) } else { String::new() };
    let mutations: String = opts.mutations.iter().map(|m| format!(" --mutation {m}")).collect();
    wal + &hosts + &mutations + &opts.overrides.flags()
}

fn one(seed: u64, args: &SimArgs, opts: &RunOptions) -> i32 {
    let report = run(seed, opts);
    for line in &report.trace {
        println!("{line}");
    }
    let mut outcome = report.outcome.clone();
    if args.check_determinism {
        let again = run(seed, opts);
        if again.trace_hash != report.trace_hash {
            outcome = Outcome::Fail(skippr_sim::Violation {
                invariant: skippr_sim::invariant::NONDETERMINISM,
                detail: format!("trace hash {:016x} then {:016x}", report.trace_hash, again.trace_hash),
            });
        }
    }
    let result = SeedResult { seed, outcome, trace_hash: report.trace_hash, stats: report.stats };
    print_result(&result, opts, true);
    println!("trace hash: {:016x}", result.trace_hash);
    if args.stats {
        let mut totals = Totals::default();
        totals.add(&result);
        print!("{}", totals.report());
    }
    if result.failed().is_some() {
        save(args, &result, opts);
        if args.shrink {
            print_shrunk(seed, opts);
        }
        return exit::SIM_FAILED;
    }
    exit::OK
}

fn print_shrunk(seed: u64, opts: &RunOptions) {
    let quiet = RunOptions { trace: false, ..opts.clone() };
    let Some(s) = shrink(seed, &quiet) else { return };
    let still = match &s.report.outcome {
        Outcome::Fail(v) => v.to_string(),
        _ => "passing".into(),
    };
    println!("shrunk: {} -> {} engine steps in {} runs; still {still}", s.steps_before, s.report.stats.steps, s.runs);
    println!("reproduce (shrunk): skipprd sim --seed {seed}{}", flags(&s.opts));
}

fn print_result(r: &SeedResult, opts: &RunOptions, verbose: bool) {
    match &r.outcome {
        Outcome::Fail(v) => {
            println!("seed {} FAILED: {v}", r.seed);
            println!("reproduce: skipprd sim --seed {}{}", r.seed, flags(opts));
        }
        Outcome::FailClosed(why) if verbose => println!("seed {}: passed (failed closed: {why})", r.seed),
        Outcome::Pass if verbose => println!("seed {}: passed", r.seed),
        _ => {}
    }
}

/// Seeds `--stats` runs once more with each planted bug on.
const PLANTED_SAMPLE: u64 = 300;

fn many(seeds: Range<u64>, args: &SimArgs, opts: &RunOptions) -> i32 {
    let count = seeds.end - seeds.start;
    let bar = ProgressBar::new(count);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {per_sec}, eta {eta} {msg}").expect("valid template"),
    );
    let started = Instant::now();
    let mut totals = Totals::default();
    let mut by_invariant: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failures: Vec<SeedResult> = Vec::new();
    let mut hashes: Vec<(u64, u64)> = Vec::new();
    let sweep_opts = SweepOptions {
        seeds,
        jobs: args.jobs,
        run: opts.clone(),
        check_determinism: args.check_determinism,
        stop_after_failures: args.stop_after_failures,
    };
    sweep(&sweep_opts, |result| {
        totals.add(&result);
        bar.inc(1);
        if args.hashes.is_some() {
            hashes.push((result.seed, result.trace_hash));
        }
        if let Some(v) = result.failed() {
            *by_invariant.entry(v.invariant).or_default() += 1;
            bar.set_message(format!("{} failed", totals.failed));
            failures.push(result);
        }
    });
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(path) = &args.hashes {
        hashes.sort_unstable();
        let text: String = hashes.iter().map(|(seed, hash)| format!("{seed} {hash:016x}\n")).collect();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("skipprd sim: cannot write {}: {e}", path.display());
            return exit::USAGE;
        }
    }
    failures.sort_by_key(|r| r.seed);
    for r in failures.iter().take(20) {
        bar.suspend(|| print_result(r, opts, false));
    }
    if failures.len() > 20 {
        println!("... and {} more failing seeds", failures.len() - 20);
    }
    for r in &failures {
        save(args, r, opts);
    }
    if !by_invariant.is_empty() {
        let tally: Vec<String> = by_invariant.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("failures by invariant: {}", tally.join(", "));
    }
    if args.stats {
        print!("{}", totals.report());
        if opts.mutations == Mutations::NONE {
            let sample = sweep_opts.seeds.start..sweep_opts.seeds.start + count.min(PLANTED_SAMPLE);
            let reach = planted_reach(sample, args.jobs, opts);
            print!("{}", planted_report(count.min(PLANTED_SAMPLE), &reach));
        }
    }
    if totals.seeds < count {
        println!("stopped after {} failing seeds: {} of the {count} seeds ran", totals.failed, totals.seeds);
    }
    let ran = totals.seeds;
    println!("seeds: {ran}, failed: {}, seeds/s: {:.0}", totals.failed, ran as f64 / elapsed.max(1e-9));
    if totals.failed > 0 {
        exit::SIM_FAILED
    } else {
        exit::OK
    }
}

fn save(args: &SimArgs, r: &SeedResult, opts: &RunOptions) {
    let (Some(dir), Some(v)) = (&args.save_failures, r.failed()) else {
        return;
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("skipprd sim: cannot create {}: {e}", dir.display());
        return;
    }
    let text = format!(
        "seed = {}\nflags = {}\nsim_version = {SIM_VERSION}\ninvariant = {}\nfound = {}\n",
        r.seed,
        flags(opts).trim(),
        v.invariant,
        v.detail.replace('\n', " ")
    );
    let path = dir.join(format!("seed-{}.txt", r.seed));
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("skipprd sim: cannot write {}: {e}", path.display());
    }
}

/// A saved failure: its seed and the flags it ran with.
struct Saved {
    path: PathBuf,
    seed: u64,
    opts: RunOptions,
}

fn read_saved(path: &Path) -> Result<Saved, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut seed = None;
    let mut mutations = Mutations::NONE;
    let mut overrides = Overrides::default();
    let mut wal = WalMode::Disk;
    let mut hosts = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        match k.trim() {
            "seed" => seed = Some(v.trim().parse().map_err(|_| format!("{}: bad seed '{v}'", path.display()))?),
            "flags" => {
                let words: Vec<&str> = v.split_whitespace().collect();
                let bad = || format!("{}: unknown flags '{}'", path.display(), v.trim());
                for pair in words.chunks(2) {
                    match pair {
                        ["--wal", mode] => wal = parse_wal(mode)?,
                        ["--hosts", n] => hosts = n.parse().map_err(|_| bad())?,
                        ["--mutation", name] => mutations = mutations.with(parse_mutation(name)?),
                        ["--crashes", n] => overrides.crashes = Some(n.parse().map_err(|_| bad())?),
                        ["--records-percent", p] => overrides.records_percent = Some(p.parse().map_err(|_| bad())?),
                        ["--faults-off", list] => {
                            for name in list.split(',') {
                                overrides.faults_off.push(parse_fault(name)?);
                            }
                        }
                        _ => return Err(bad()),
                    }
                }
            }
            _ => {}
        }
    }
    let seed = seed.ok_or_else(|| format!("{}: no 'seed = N' line", path.display()))?;
    Ok(Saved { path: path.to_path_buf(), seed, opts: RunOptions { mutations, wal, hosts, trace: false, overrides } })
}

fn replay(dir: &Path, args: &SimArgs) -> i32 {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("skipprd sim: cannot read the directory {}: {e}", dir.display());
            return exit::USAGE;
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    paths.sort();
    let mut failed = 0;
    for path in &paths {
        let saved = match read_saved(path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipprd sim: {e}");
                failed += 1;
                continue;
            }
        };
        let r = run_seed(saved.seed, &saved.opts, args.check_determinism);
        match r.failed() {
            Some(_) => {
                failed += 1;
                print_result(&r, &saved.opts, false);
            }
            None => println!("{}: seed {} passed", saved.path.display(), saved.seed),
        }
    }
    println!("seeds: {}, failed: {failed}", paths.len());
    if failed > 0 {
        exit::SIM_FAILED
    } else {
        exit::OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_of_faults_off_names_every_fault_that_can_be_switched_off() {
        let cmd = SimArgs::augment_args(clap::Command::new("sim"));
        let arg = cmd.get_arguments().find(|a| a.get_id() == "faults_off").expect("--faults-off");
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        for kind in FaultKind::ALL {
            assert!(help.contains(kind.name()), "--faults-off does not name {}: {help}", kind.name());
        }
    }
}
