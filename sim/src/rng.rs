//! Seeded randomness. One `u64` seed makes a ChaCha8 generator per component
//! (a separate stream of the same key), so a new draw in one component never
//! shifts the numbers another component sees.

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The components, each on its own stream.
#[derive(Clone, Copy)]
pub enum Stream {
    Scenario = 1,
    Scheduler = 2,
    Disk = 3,
    Offsets = 4,
    Sources = 5,
    Sinks = 6,
    Crashes = 7,
    /// What an operator does between runs (a segment deleted by hand).
    Operator = 8,
}

#[derive(Clone)]
pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn new(seed: u64, stream: Stream) -> Rng {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(stream as u64);
        Rng(r)
    }

    /// A uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0.gen_range(lo..=hi)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.0.gen_bool(p.min(1.0))
    }

    /// A probability drawn for swarm testing: zero with probability `off`,
    /// otherwise uniform in `lo..hi`.
    pub fn rate(&mut self, off: f64, lo: f64, hi: f64) -> f64 {
        if self.chance(off) {
            0.0
        } else {
            self.0.gen_range(lo..hi)
        }
    }

    pub fn u64(&mut self) -> u64 {
        self.0.gen()
    }
}
