//! The daemon's one clock: monotonic time since start, in the engine's units.

use skippr_core::Instant;

#[derive(Clone, Copy)]
pub struct Clock {
    start: std::time::Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock { start: std::time::Instant::now() }
    }

    pub fn now(&self) -> Instant {
        Instant::from_micros(self.start.elapsed().as_micros() as u64)
    }

    /// The wall-clock moment of an engine instant, for sleeping until it.
    pub fn to_std(&self, at: Instant) -> std::time::Instant {
        self.start + std::time::Duration::from_micros(at.as_micros())
    }
}
