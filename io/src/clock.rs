//! The daemon's one clock: time since start, in the engine's units, from
//! `CLOCK_BOOTTIME`. Like `CLOCK_MONOTONIC` it never jumps with the wall
//! clock; unlike it, it keeps counting while the machine or VM is suspended,
//! so a writer that was suspended past its lease sees that it was, and stops
//! committing before it learns who took over (docs/ARCHITECTURE.md §15).

use nix::time::{clock_gettime, ClockId};
use skippr_core::Instant;

#[derive(Clone, Copy)]
pub struct Clock {
    start: std::time::Duration,
}

fn boottime() -> std::time::Duration {
    let t = clock_gettime(ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME is readable on Linux");
    std::time::Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

impl Clock {
    pub fn start() -> Clock {
        Clock { start: boottime() }
    }

    pub fn now(&self) -> Instant {
        Instant::from_micros(boottime().saturating_sub(self.start).as_micros() as u64)
    }

    /// The Unix time, in milliseconds, of this clock's zero: the wall
    /// clock now less the time since the start (what the engine adds its
    /// `now` to for the times it records, such as a refusal's).
    pub fn wall_origin_ms(&self) -> u64 {
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        (wall.as_millis() as u64).saturating_sub(self.now().as_micros() / 1_000)
    }

    /// The moment to sleep until for an engine instant (tokio sleeps on the
    /// monotonic clock; the distance from now is what carries over).
    pub fn to_std(&self, at: Instant) -> std::time::Instant {
        let ahead = at.as_micros().saturating_sub(self.now().as_micros());
        std::time::Instant::now() + std::time::Duration::from_micros(ahead)
    }
}
