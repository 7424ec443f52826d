//! Logs: `tracing` to stderr, text or JSON, level from `RUST_LOG` (default
//! `info`). Warnings of the I/O drivers are also kept as the last one seen
//! (`skippr_io::health`), for the stall report.

use std::fmt::Write;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let fmt = if json { fmt.json().boxed() } else { fmt.boxed() };
    tracing_subscriber::registry().with(fmt.with_filter(filter)).with(LastWarning).init();
}

/// Keeps the text of every WARN event of `skippr_io`.
struct LastWarning;

impl<S: tracing::Subscriber> Layer<S> for LastWarning {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() == tracing::Level::WARN && meta.target().starts_with("skippr_io") {
            let mut text = Text(String::new());
            event.record(&mut text);
            skippr_io::health::note(text.0);
        }
    }
}

/// An event as one line: the message, then `name=value` for each field.
struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if !self.0.is_empty() {
            self.0.push_str(", ");
        }
        let _ = match field.name() {
            "message" => write!(self.0, "{value:?}"),
            name => write!(self.0, "{name}={value:?}"),
        };
    }
}
