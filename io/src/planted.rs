//! Faults planted in the real drivers, to show that the power-cut tests
//! catch them (issue #29): each breaks one durability step the drivers
//! take. Armed for a whole process by `SKIPPR_PLANTED_DRIVER_FAULTS`
//! (comma-separated names), an environment variable that `--help` does not
//! list: one binary serves the suite and its users, and nothing is armed
//! unless that variable names it. Named like the simulator's planted bugs.

use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverFault {
    /// A new WAL segment's directory entry is not synced.
    SkipSegmentDirSync,
    /// A WAL append returns before its bytes are durable (a plain write,
    /// no `RWF_DSYNC`, no `fdatasync`): the engine acknowledges what a power
    /// cut can take.
    AckBeforeDurable,
    /// The directory sink links a batch into place without ever syncing
    /// its file.
    SinkLinkUnsynced,
    /// Clustered mode: a hard-state slot is written without a sync.
    HardStateUnsynced,
}

impl DriverFault {
    pub const ALL: [DriverFault; 4] = [
        DriverFault::SkipSegmentDirSync,
        DriverFault::AckBeforeDurable,
        DriverFault::SinkLinkUnsynced,
        DriverFault::HardStateUnsynced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DriverFault::SkipSegmentDirSync => "skip-segment-dir-sync",
            DriverFault::AckBeforeDurable => "ack-before-durable",
            DriverFault::SinkLinkUnsynced => "sink-link-unsynced",
            DriverFault::HardStateUnsynced => "hard-state-unsynced",
        }
    }

    fn bit(self) -> u32 {
        1 << DriverFault::ALL.iter().position(|f| *f == self).expect("listed")
    }
}

static ARMED: AtomicU32 = AtomicU32::new(0);

/// Whether `fault` is armed in this process.
pub fn armed(fault: DriverFault) -> bool {
    ARMED.load(Ordering::Relaxed) & fault.bit() != 0
}

/// The environment variable that arms faults.
pub const ENV: &str = "SKIPPR_PLANTED_DRIVER_FAULTS";

/// Arms what `SKIPPR_PLANTED_DRIVER_FAULTS` names; returns them, or why
/// a name is unknown.
pub fn arm_from_env() -> Result<Vec<DriverFault>, String> {
    let Ok(names) = std::env::var(ENV) else { return Ok(Vec::new()) };
    let mut armed = Vec::new();
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(fault) = DriverFault::ALL.into_iter().find(|f| f.name() == name) else {
            let known: Vec<&str> = DriverFault::ALL.iter().map(|f| f.name()).collect();
            return Err(format!("{ENV} names {name:?}, which is no planted driver fault: {}", known.join(", ")));
        };
        ARMED.fetch_or(fault.bit(), Ordering::Relaxed);
        armed.push(fault);
    }
    Ok(armed)
}
