//! Logs: `tracing` to stderr, text or JSON, level from `RUST_LOG` (default
//! `info`). Warnings of the I/O drivers are also kept as the last one seen
//! (`skippr_io::health`), for the stall report.

use std::fmt::{self, Write};
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `node`: in clustered mode, this host's node id, which every line then
/// names (`[node 3] ` before a text line, `"node":3` first in a JSON one),
/// so that the logs of hosts sharing a terminal or a collector tell apart.
pub fn init(json: bool, node: Option<u64>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    let fmt = match (json, node) {
        (false, None) => fmt.boxed(),
        (true, None) => fmt.json().boxed(),
        (false, Some(node)) => fmt.event_format(OfNode { node, json, inner: Format::default() }).boxed(),
        (true, Some(node)) => fmt.event_format(OfNode { node, json, inner: Format::default().json() }).boxed(),
    };
    tracing_subscriber::registry().with(fmt.with_filter(filter)).with(LastWarning).init();
}

/// An event format that names the node, around another.
struct OfNode<F> {
    node: u64,
    json: bool,
    inner: F,
}

impl<S, N, F> FormatEvent<S, N> for OfNode<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        if !self.json {
            write!(writer, "[node {}] ", self.node)?;
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"node\":{},{rest}", self.node),
            None => writer.write_str(&line),
        }
    }
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
