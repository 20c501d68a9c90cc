//! Logs in the formats engines read: runc's JSON lines
//! (`{"level":"error","msg":"…","time":"…"}`, which containerd's shim
//! scans for the last error) or plain text.

use std::fmt::{self, Write as _};
use std::fs::OpenOptions;
use std::io::IsTerminal;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Sets up logging to `log` (appending) or stderr. `RUNSBX_LOG` (an
/// EnvFilter) overrides the level; `--debug` means debug.
pub fn init(log: Option<&Path>, format: Option<&str>, debug: bool) -> Result<()> {
    // libcgroups warns about every v1 controller this host lacks, on every
    // command; those are not actionable. libcontainer logs each failure at
    // every level it passes through, some as Debug dumps of its errors:
    // runsbx's own message carries the cause chain, once, so on a terminal
    // or an engine's stderr those lines appear only with --debug; a --log
    // file keeps them for whoever reads it.
    let default = match (debug, log.is_some()) {
        (true, _) => "debug",
        (false, true) => "warn,libcgroups=error",
        (false, false) => "warn,libcontainer=off,libcgroups=off",
    };
    let filter = EnvFilter::try_from_env("RUNSBX_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let json = match format.unwrap_or("text") {
        "text" => false,
        "json" => true,
        other => bail!("--log-format {other:?}: use `text` or `json`"),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match (log, json) {
        (Some(path), json) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("open log file {path:?}"))?;
            let builder = builder
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false);
            if json {
                builder.event_format(RuncJson).try_init()
            } else {
                builder.try_init()
            }
        }
        (None, true) => builder
            .with_writer(std::io::stderr)
            .event_format(RuncJson)
            .try_init(),
        (None, false) => builder
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .without_time()
            .with_target(false)
            .try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("set up logging: {e}"))
}

/// runc's (logrus's) JSON log line.
struct RuncJson;

impl<S, N> FormatEvent<S, N> for RuncJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut msg = Message::default();
        event.record(&mut msg);
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let line = serde_json::json!({ "level": level, "msg": msg.0, "time": time });
        writeln!(writer, "{line}")
    }
}

/// The event's message followed by its other fields as `key=value`.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}{rest}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}
