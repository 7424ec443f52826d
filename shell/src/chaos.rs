//! Chaos mode: with `SKIPPR_CHAOS_MODE=yes` the daemon SIGKILLs itself at a
//! moment drawn from `SKIPPR_CHAOS_SEED` between `SKIPPR_CHAOS_MIN_SECONDS`
//! and `SKIPPR_CHAOS_MAX_SECONDS` (fractions allowed): a real SIGKILL, no
//! cleanup, to prove that recovery keeps the exactly-once contract.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tracing::warn;

pub fn arm_from_env() {
    if std::env::var("SKIPPR_CHAOS_MODE").as_deref() != Ok("yes") {
        return;
    }
    let num = |name: &str, default: f64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let seed = std::env::var("SKIPPR_CHAOS_SEED").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let min = num("SKIPPR_CHAOS_MIN_SECONDS", 1.0).max(0.0);
    let max = num("SKIPPR_CHAOS_MAX_SECONDS", 10.0).max(min);
    let at = min + (max - min) * unit(seed);
    warn!(seed, at_seconds = at, "chaos mode: this process will SIGKILL itself");
    eprintln!("skipprd: chaos mode: SIGKILL in {at:.3}s (seed {seed})");
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs_f64(at));
        let _ = kill(Pid::this(), Signal::SIGKILL);
    });
}

/// A uniform number in [0, 1) from the seed (splitmix64).
fn unit(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
