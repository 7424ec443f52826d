//! A process slot: an engine while one runs there, the generation that
//! tells its requests from a predecessor's, the sources it is connected
//! to, and whether it is frozen. Drivers address a process by slot; the
//! topology says what each slot is for.

use crate::plugins::SimSource;
use skippr_core::{Host, Instant};

pub(crate) struct Proc {
    /// The engine running in the slot, if one does.
    pub host: Option<Host>,
    /// The running engine's generation: unique in the run, so a request
    /// names the engine that sent it.
    pub gen: u64,
    /// This process's connections to the sources: a cursor of its own.
    pub sources: Vec<SimSource>,
    /// Frozen until then: what reaches it waits, and so do its timers.
    pub frozen_until: Option<Instant>,
    /// Its engine's next deadline, as of its last input.
    pub timer: Option<Instant>,
}

impl Proc {
    /// An empty slot: generation 0 is never given to an engine.
    pub fn new(sources: Vec<SimSource>) -> Proc {
        Proc { host: None, gen: 0, sources, frozen_until: None, timer: None }
    }
}
