//! The last warning an I/O driver logged (a refused connection, a full
//! disk), kept so that the stall report can name the cause without the
//! engine knowing error texts. The shell's log layer feeds it.

use std::sync::Mutex;

static LAST_WARNING: Mutex<Option<String>> = Mutex::new(None);

/// Keeps `text` as the last warning.
pub fn note(text: String) {
    *LAST_WARNING.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
}

/// The last warning, if any was logged.
pub fn last_warning() -> Option<String> {
    LAST_WARNING.lock().unwrap_or_else(|p| p.into_inner()).clone()
}
