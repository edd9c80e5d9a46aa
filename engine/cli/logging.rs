//! The log of the commands that act (`serve`, `run`): with `logging.format: json`
//! every line they write to stderr is one JSON object, the tracing events and
//! also what is printed before or outside them (config and pipeline diagnostics,
//! the final error, a panic), and `serve`'s "listening" line on stdout too. A
//! command's own output (the `runs list` table, `validate`'s report) is not a log
//! line and stays text.
//!
//! Fields listed in `telemetry::JSON_FIELDS` are logged as JSON text (`labels =
//! %json`); the JSON format embeds them as JSON, so a list is a list.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Map, Value};
use tracing::Level;
use vectorstep::diag::{Diagnostic, Severity};

static JSON: AtomicBool = AtomicBool::new(false);

/// Whether log lines are JSON (set by [`init`] or [`use_format_of`]).
pub fn is_json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// Takes the log format of `config` for the lines printed from here on, before
/// the subscriber is installed (config warnings come first).
pub fn use_format_of(config: &vectorstep::config::Config) {
    JSON.store(config.logging.json, Ordering::Relaxed);
}

/// Installs the log subscriber: `RUST_LOG` wins, else `default_level` for one-shot
/// commands or the configured level for the server.
pub fn init(config: &vectorstep::config::Config, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    use_format_of(config);
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colours only for a person at a terminal: a log file or journald gets plain
    // text, not escape codes.
    let ansi = !config.logging.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let _ = if config.logging.json {
        builder
            .json()
            .with_writer(|| EmbedJsonFields(std::io::stderr()))
            .try_init()
    } else {
        builder.with_writer(std::io::stderr).try_init()
    };
}

/// One line outside tracing: plain (`error: ...`, a diagnostic as printed) or,
/// in JSON mode, an object shaped like the tracing events'.
pub fn line(level: Level, text: &str, fields: Map<String, Value>) {
    if !is_json() {
        if level == Level::ERROR && !text.contains(": error: ") {
            eprintln!("error: {text}");
        } else {
            eprintln!("{text}");
        }
        return;
    }
    let mut all = Map::new();
    all.insert("message".into(), Value::from(text));
    all.extend(fields);
    let _ = writeln!(std::io::stderr(), "{}", object(level, all));
}

/// A pipeline or config diagnostic, with where it is as fields in JSON mode.
pub fn diagnostic(d: &Diagnostic) {
    let level = match d.severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARN,
    };
    // The message is the whole diagnostic as printed; the level says the severity.
    let mut fields = d.fields_json();
    fields.remove("message");
    fields.remove("severity");
    fields.retain(|k, v| !(v.is_null() || (k == "path" && v == "")));
    line(level, &d.to_string(), fields);
}

/// `serve`'s announcement on stdout, which supervisors and tests read the bound
/// address from: text, or in JSON mode an INFO object with the same message.
pub fn announce(text: &str, fields: Map<String, Value>) {
    if !is_json() {
        println!("{text}");
        return;
    }
    let mut all = Map::new();
    all.insert("message".into(), Value::from(text));
    all.extend(fields);
    println!("{}", object(Level::INFO, all));
}

fn object(level: Level, fields: Map<String, Value>) -> Value {
    json!({
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "level": level.as_str(),
        "fields": fields,
        "target": "vectorstep",
    })
}

/// The JSON formatter writes each event with one write; this writer puts the
/// fields of `telemetry::JSON_FIELDS` back as JSON values (they arrive as the
/// JSON text they were logged with). A line it cannot read passes unchanged.
struct EmbedJsonFields<W: Write>(W);

impl<W: Write> Write for EmbedJsonFields<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match embed(buf) {
            Some(line) => self.0.write_all(line.as_bytes()),
            None => self.0.write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The event line with its JSON-text fields embedded, or `None` when nothing
/// changes.
fn embed(buf: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(buf).ok()?;
    let mut event: Value = serde_json::from_str(text.trim_end()).ok()?;
    let fields = event.get_mut("fields")?.as_object_mut()?;
    let mut changed = false;
    for name in vectorstep::telemetry::JSON_FIELDS {
        if let Some(slot) = fields.get_mut(*name) {
            if let Some(parsed) = slot
                .as_str()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
            {
                *slot = parsed;
                changed = true;
            }
        }
    }
    changed.then(|| format!("{event}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_fields_become_json() {
        let rows = [
            (
                r#"{"level":"INFO","fields":{"message":"m","added":"[\"a\",\"b\"]","n":3}}"#,
                Some(json!({"level":"INFO","fields":{"message":"m","added":["a","b"],"n":3}})),
            ),
            (
                r#"{"fields":{"labels":"{\"alertname\":\"X\"}"}}"#,
                Some(json!({"fields":{"labels":{"alertname":"X"}}})),
            ),
            // Not a listed field, or not JSON text: unchanged.
            (r#"{"fields":{"message":"[1]"}}"#, None),
            (r#"{"fields":{"added":"not json"}}"#, None),
            ("plain text", None),
        ];
        for (line, want) in rows {
            let got = embed(format!("{line}\n").as_bytes())
                .map(|s| serde_json::from_str::<Value>(&s).unwrap());
            assert_eq!(got, want, "{line}");
        }
    }
}
