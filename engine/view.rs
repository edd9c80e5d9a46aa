//! The public JSON shape of a run (SPEC 2, `GET /runs/{id}`), shared by the HTTP API
//! and `vectorstep runs show --json`, and the terminal table; the same for the
//! replicas (`GET /replicas`, `vectorstep replicas list`).

use serde_json::{json, Map, Value};

use crate::clock::rfc3339;
use crate::domain::Word;
use crate::run::lease::Timing;
use crate::store::{EventRecord, ReplicaRecord, RunRecord, StepJournal, StepRecord};

/// `s` with HTML's special characters escaped, for text that goes into an HTML
/// page or a Telegram message in HTML mode (both quotes included, so it is safe
/// inside attribute values too).
pub fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
}

fn ts(ms: Option<i64>) -> Value {
    ms.map(|m| Value::from(rfc3339(m))).unwrap_or(Value::Null)
}

fn parse(s: Option<&str>) -> Value {
    s.and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null)
}

pub fn run_summary(r: &RunRecord) -> Value {
    json!({
        "id": r.id,
        "pipeline_name": r.pipeline_name,
        "status": r.status,
        "source": r.source,
        "team": r.team,
        "stage": r.stage,
        "triggered_at": rfc3339(r.triggered_at),
        "completed_at": ts(r.completed_at),
        "resumed_at": ts(r.resumed_at),
        "resume_count": r.resume_count,
        "config_fingerprint": r.config_fingerprint,
        "parent_run_id": r.parent_run_id,
        "replay_of": r.replay_of,
        "tokens_used": r.tokens_used,
        "cost_usd": r.cost_usd,
        "terminal_step": r.terminal_step,
        "reason": r.reason,
    })
}

pub fn step(s: &StepRecord) -> Value {
    json!({
        "step_name": s.step_path,
        "step_index": s.step_index,
        "kind": s.kind,
        "executor": s.executor,
        "agent": s.agent,
        "status": s.status,
        "attempts": s.attempts,
        "iteration": s.iteration,
        "idempotency_key": s.idempotency_key,
        "started_at": rfc3339(s.started_at),
        "finished_at": ts(s.finished_at),
        "duration_ms": s.duration_ms,
        "primary_confidence": s.primary_confidence,
        "effective_confidence": s.effective_confidence,
        "output": parse(s.output_json.as_deref()),
        "error": s.error,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "cost_usd": s.cost_usd,
        "items": parse(s.items_json.as_deref()),
    })
}

pub fn log_entry(e: &EventRecord) -> Value {
    let mut m = Map::new();
    if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&e.fields_json) {
        m.extend(fields);
    }
    m.insert("ts".into(), Value::from(rfc3339(e.ts)));
    m.insert("level".into(), Value::from(e.level.clone()));
    m.insert("event".into(), Value::from(e.event.clone()));
    m.insert("msg".into(), Value::from(e.msg.clone()));
    Value::Object(m)
}

/// [`log_entry`] with its `id`, as JSON text, written without parsing the
/// stored fields: the events stream sends one per event to every follower, and
/// parsing then re-serialising the fields was most of its cost. The stored
/// fields come first and the entry's own keys after them, so a field of the same
/// name is overridden, as in [`log_entry`] (JSON readers keep the last key).
/// Fields that are not a JSON object's text are left out, as there.
pub fn log_entry_json(e: &EventRecord) -> String {
    let fields = e.fields_json.trim();
    let inner = fields
        .strip_prefix('{')
        .and_then(|f| f.strip_suffix('}'))
        .map(str::trim);
    let mut out = String::with_capacity(fields.len() + e.msg.len() + 96);
    out.push('{');
    if let Some(inner) = inner.filter(|i| !i.is_empty()) {
        out.push_str(inner);
        out.push(',');
    }
    let text = |v: &str| serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into());
    out.push_str("\"ts\":");
    out.push_str(&text(&rfc3339(e.ts)));
    out.push_str(",\"level\":");
    out.push_str(&text(&e.level));
    out.push_str(",\"event\":");
    out.push_str(&text(&e.event));
    out.push_str(",\"msg\":");
    out.push_str(&text(&e.msg));
    out.push_str(",\"id\":");
    out.push_str(&e.id.to_string());
    out.push('}');
    out
}

/// What started the run, from its stored trigger: `labels`, `severity`,
/// `summary`, for an Alertmanager notification its `status` and the chosen
/// alert's `fingerprint`, and `dedup_key` (what deduplication compared).
fn trigger(r: &RunRecord) -> Value {
    let t: crate::run::context::Normalised =
        serde_json::from_str(&r.context_json).unwrap_or_default();
    json!({
        "labels": t.labels,
        "severity": t.severity,
        "summary": t.summary,
        "status": t.notification_status(),
        "fingerprint": t.alert.as_ref().and_then(|a| a.get("fingerprint")).cloned(),
        "dedup_key": r.dedup_fingerprint,
    })
}

/// `journals` are the agent steps' journals (`Store::journals_of_run`): each such
/// step gets its `turns`, with their tool calls.
pub fn run_detail(
    r: &RunRecord,
    steps: &[StepRecord],
    events: &[EventRecord],
    journals: &[StepJournal],
) -> Value {
    let mut v = run_summary(r);
    if let Value::Object(m) = &mut v {
        m.insert("final_output".into(), parse(r.final_output_json.as_deref()));
        m.insert("trigger".into(), trigger(r));
        let steps = steps
            .iter()
            .map(|s| {
                let mut v = step(s);
                if let (Value::Object(o), Some(j)) =
                    (&mut v, journals.iter().find(|j| j.step_path == s.step_path))
                {
                    o.insert("turns".into(), turns(j));
                }
                v
            })
            .collect();
        m.insert("steps".into(), Value::Array(steps));
        m.insert(
            "logs".into(),
            Value::Array(events.iter().map(log_entry).collect()),
        );
    }
    v
}

/// An agent step's turns (from 1) with their tool calls (from 1), delegations'
/// own turns left out.
fn turns(j: &StepJournal) -> Value {
    let own = |p: &str| p == j.step_path;
    Value::Array(
        j.turns
            .iter()
            .filter(|t| own(&t.step_path))
            .map(|t| {
                let calls: Vec<Value> = j
                    .calls
                    .iter()
                    .filter(|c| own(&c.step_path) && c.iteration == t.iteration && c.turn == t.turn)
                    .map(|c| {
                        json!({
                            "call_index": c.call_index,
                            "tool": c.tool,
                            "arguments": serde_json::from_str::<Value>(&c.arguments_json)
                                .unwrap_or(Value::Null),
                            "status": c.status.as_str(),
                            "effect": c.effect.as_str(),
                            "effect_key": c.effect_key,
                            "attempt": c.attempt,
                            "duration_ms": c.duration_ms,
                        })
                    })
                    .collect();
                json!({
                    "iteration": t.iteration,
                    "turn": t.turn,
                    "status": t.status.as_str(),
                    "input_tokens": t.input_tokens,
                    "output_tokens": t.output_tokens,
                    "cost_usd": t.cost_usd,
                    "tool_calls": calls,
                })
            })
            .collect(),
    )
}

/// A fixed-width table of a run's steps for terminals.
/// The display label of fan-out item `index` (docs/ui.md): a scalar item itself,
/// else its `name` or `id` field, else the index. Only a label: the step path
/// stays `<fan_out>/<index>`.
pub fn item_label(items: Option<&Value>, index: usize) -> String {
    let item = items.and_then(|v| v.as_array()).and_then(|a| a.get(index));
    let text = match item {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => Some(v.to_string()),
        Some(Value::Object(o)) => ["name", "id"].iter().find_map(|k| match o.get(*k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(v @ Value::Number(_)) => Some(v.to_string()),
            _ => None,
        }),
        _ => None,
    };
    match text {
        Some(t) if !t.trim().is_empty() => t.chars().take(80).collect(),
        _ => index.to_string(),
    }
}

/// A step's name for people: a fan-out branch is followed by its item's label
/// ([`item_label`]), `per-service/0 (checkout)`; the path itself is unchanged.
pub fn step_display_name(s: &StepRecord, steps: &[StepRecord]) -> String {
    if s.kind != crate::domain::StepKind::FanOutBranch {
        return s.step_path.clone();
    }
    let Some((parent, leaf)) = s.step_path.rsplit_once('/') else {
        return s.step_path.clone();
    };
    let Ok(index) = leaf.parse::<usize>() else {
        return s.step_path.clone();
    };
    let items = steps
        .iter()
        .find(|r| r.step_path == parent)
        .and_then(|r| r.items_json.as_deref())
        .and_then(|j| serde_json::from_str::<Value>(j).ok());
    let label = item_label(items.as_ref(), index);
    if label == leaf {
        s.step_path.clone()
    } else {
        format!("{} ({})", s.step_path, terminal_safe(&label))
    }
}

/// A step's output summary, else its error, on one line of at most `max` chars.
fn step_summary(s: &StepRecord, max: usize) -> String {
    let summary = s
        .output_json
        .as_deref()
        .and_then(|j| serde_json::from_str::<Value>(j).ok())
        .and_then(|v| v.get("summary").and_then(Value::as_str).map(str::to_string))
        .or_else(|| s.error.clone())
        .unwrap_or_default();
    let one_line = terminal_safe(&summary.split_whitespace().collect::<Vec<_>>().join(" "));
    if one_line.chars().count() > max {
        let cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

pub fn step_table(steps: &[StepRecord]) -> String {
    let mut rows = vec![[
        "STEP".to_string(),
        "STATUS".into(),
        "CONFIDENCE".into(),
        "DURATION".into(),
        "TOKENS".into(),
        "COST".into(),
        "SUMMARY".into(),
    ]];
    for s in steps {
        let indent = if s.kind.is_branch() { "  " } else { "" };
        rows.push([
            format!("{indent}{}", step_display_name(s, steps)),
            s.status.to_string(),
            s.effective_confidence
                .map(|c| format!("{c:.2}"))
                .unwrap_or_else(|| "-".into()),
            s.duration_ms
                .map(|d| format!("{:.2}s", d as f64 / 1000.0))
                .unwrap_or_else(|| "-".into()),
            (s.input_tokens + s.output_tokens).to_string(),
            s.cost_usd
                .map(|c| format!("${c:.4}"))
                .unwrap_or_else(|| "-".into()),
            step_summary(s, 72),
        ]);
    }
    aligned(&rows)
}

/// `runs show --verbose`: each step's output (pretty JSON) and error, under its
/// display name. Terminal-safe: outputs quote model text and tool results.
pub fn step_details(steps: &[StepRecord]) -> String {
    let mut out = String::new();
    for s in steps {
        out.push_str(&format!(
            "== {} ({})\n",
            step_display_name(s, steps),
            s.status
        ));
        if let Some(o) = s.output_json.as_deref() {
            let pretty = serde_json::from_str::<Value>(o)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or_else(|| o.to_string());
            let safe: Vec<String> = pretty.lines().map(terminal_safe).collect();
            out.push_str(&format!("output:\n{}\n", safe.join("\n")));
        }
        if let Some(e) = &s.error {
            out.push_str(&format!("error: {}\n", terminal_safe(e)));
        }
    }
    out
}

/// Rows of cells as left-aligned columns two spaces apart, one line each.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `s` made safe for a terminal: control characters (ESC, CSI, newlines, DEL, the
/// C1 range) and the invisible formatting characters that reorder or hide text
/// (bidirectional overrides, zero-width ones) are written as escapes (`\n`,
/// `\u{1b}`), so a value a model or a tool chose cannot move the cursor, recolour
/// the screen or disguise itself. Everything else is kept as it is.
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || is_invisible_format(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// Unicode format characters that change how the text around them is shown.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// The first `max` characters of `s`, with `…` when something was cut.
fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// How many characters of a call's arguments the turn table shows.
pub const TABLE_ARGUMENTS_CHARS: usize = 48;

/// An agent step's turns (the `turns` of [`run_detail`]) as a terminal table: one
/// row per tool call (turn, tool, arguments cut to [`TABLE_ARGUMENTS_CHARS`],
/// outcome, duration: milliseconds under a second) and one for a turn without calls (the answer, or a turn
/// that got no reply). A turn's tokens are on its first row. Turns of loop
/// iterations after the first read `iteration:turn`. Tool names and arguments
/// come from the model: they go through [`terminal_safe`].
pub fn turn_table(turns: &Value) -> String {
    let mut rows = vec![[
        "TURN".to_string(),
        "TOOL".into(),
        "ARGUMENTS".into(),
        "OUTCOME".into(),
        "DURATION".into(),
        "TOKENS".into(),
    ]];
    let text = |v: &Value| terminal_safe(v.as_str().unwrap_or("-"));
    for t in turns.as_array().map(Vec::as_slice).unwrap_or_default() {
        let iteration = t["iteration"].as_u64().unwrap_or(1);
        let turn = match t["turn"].as_u64() {
            Some(n) if iteration > 1 => format!("{iteration}:{n}"),
            Some(n) => n.to_string(),
            None => "-".into(),
        };
        let tokens = (t["input_tokens"].as_u64().unwrap_or(0)
            + t["output_tokens"].as_u64().unwrap_or(0))
        .to_string();
        let calls = t["tool_calls"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if calls.is_empty() {
            let status = text(&t["status"]);
            let what = if status == crate::domain::TurnStatus::Completed.as_str() {
                "(answer)"
            } else {
                "(no reply)"
            };
            rows.push([turn, what.into(), "-".into(), status, "-".into(), tokens]);
            continue;
        }
        for (i, c) in calls.iter().enumerate() {
            let arguments = match &c["arguments"] {
                Value::Null => "-".to_string(),
                v => truncate(&terminal_safe(&v.to_string()), TABLE_ARGUMENTS_CHARS),
            };
            rows.push([
                turn.clone(),
                text(&c["tool"]),
                arguments,
                text(&c["status"]),
                c["duration_ms"]
                    .as_u64()
                    .map(|d| match d {
                        0..=999 => format!("{d}ms"),
                        _ => format!("{:.2}s", d as f64 / 1000.0),
                    })
                    .unwrap_or_else(|| "-".into()),
                if i == 0 {
                    tokens.clone()
                } else {
                    String::new()
                },
            ]);
        }
    }
    aligned(&rows)
}

/// For every agent step of a run (`run_detail`'s `steps` with `turns`), a heading
/// and its [`turn_table`]; empty when the run has no agent turns.
pub fn agent_turn_tables(detail: &Value) -> String {
    let mut out = String::new();
    for s in detail["steps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let Some(turns) = s
            .get("turns")
            .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        else {
            continue;
        };
        out.push_str(&format!(
            "\nagent step {} ({}):\n",
            terminal_safe(s["step_name"].as_str().unwrap_or("-")),
            terminal_safe(s["agent"].as_str().unwrap_or("-")),
        ));
        out.push_str(&turn_table(turns));
    }
    out
}

/// Whether replica `r` is alive at `now` (the database's clock, unix ms): not
/// stopped, and it heartbeat within one lease ([`Timing::live`]).
pub fn replica_live(r: &ReplicaRecord, timing: Timing, now: i64) -> bool {
    r.stopped_at.is_none() && timing.live(&r.into(), now)
}

/// The body of `GET /replicas`: every replica the store holds, dead ones included
/// (`live: false`), judged at `now` on the database's clock, which the body
/// carries (`now`) so that a reader can tell how old each heartbeat is without
/// trusting its own clock.
pub fn replicas(records: &[ReplicaRecord], timing: Timing, now: i64) -> Value {
    let list: Vec<Value> = records
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "kind": r.kind.as_str(),
                "host": r.host,
                "started_at": rfc3339(r.started_at),
                "heartbeat_at": rfc3339(r.heartbeat_at),
                "stopped_at": ts(r.stopped_at),
                "live": replica_live(r, timing, now),
                "runs": r.runs,
                "fingerprints": r.fingerprints,
            })
        })
        .collect();
    json!({"now": rfc3339(now), "replicas": list})
}

/// How long ago `at` was at `now` (RFC 3339 strings as [`replicas`] writes
/// them): `0.8s`, `42.0s`, `3m07s`, `2h05m`; `-` when either does not parse.
fn age(at: Option<&str>, now: Option<&str>) -> String {
    let parse = |s: Option<&str>| {
        s.and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.timestamp_millis())
    };
    let (Some(at), Some(now)) = (parse(at), parse(now)) else {
        return "-".into();
    };
    let ms = (now - at).max(0);
    let secs = ms / 1000;
    if secs < 60 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    }
}

/// The body of `GET /replicas` as a terminal table: id, kind, live (`yes`, `no`,
/// or `ended`: it stopped cleanly), the heartbeat's age on the database's clock, how many runs it
/// holds, and its host. Ids and hosts come from other processes: they go through
/// [`terminal_safe`].
pub fn replica_table(body: &Value) -> String {
    let now = body["now"].as_str();
    let mut rows = vec![[
        "ID".to_string(),
        "KIND".into(),
        "LIVE".into(),
        "HEARTBEAT".into(),
        "RUNS".into(),
        "HOST".into(),
    ]];
    for r in body["replicas"].as_array().into_iter().flatten() {
        let text = |k: &str| terminal_safe(r[k].as_str().unwrap_or("-"));
        let live = if !r["stopped_at"].is_null() {
            "ended"
        } else if r["live"].as_bool() == Some(true) {
            "yes"
        } else {
            "no"
        };
        rows.push([
            text("id"),
            text("kind"),
            live.into(),
            format!("{} ago", age(r["heartbeat_at"].as_str(), now)),
            r["runs"].as_array().map_or(0, Vec::len).to_string(),
            text("host"),
        ]);
    }
    aligned(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ReplicaKind;

    #[test]
    fn a_log_entry_written_without_parsing_reads_as_the_parsed_one() {
        let cases = [
            r#"{"step":"triage","attempt":2}"#,
            "{}",
            "",
            " { \"nested\": {\"a\": [1, \"}\"]} } ",
            r#"{"msg":"a field named like the entry's own key"}"#,
            "[1, 2]",
            "not json",
        ];
        for fields in cases {
            let e = EventRecord {
                id: 42,
                run_id: "r1".into(),
                ts: 1_700_000_000_123,
                level: "INFO".into(),
                event: "step_finished".into(),
                msg: "quote \" and <script> and \n newline".into(),
                fields_json: fields.into(),
            };
            let mut want = log_entry(&e);
            want["id"] = 42.into();
            let text = log_entry_json(&e);
            let got: Value = serde_json::from_str(&text).unwrap_or_else(|err| {
                panic!("{fields:?} gave text that is not JSON: {text} ({err})")
            });
            assert_eq!(got, want, "fields {fields:?}");
            assert!(!text.contains('\n'), "one SSE data line: {text}");
        }
    }

    fn replica(id: &str, heartbeat_at: i64, stopped_at: Option<i64>) -> ReplicaRecord {
        ReplicaRecord {
            id: id.into(),
            kind: ReplicaKind::Serve,
            started_at: 0,
            heartbeat_at,
            stopped_at,
            host: Some("h1".into()),
            fingerprints: vec!["fp1".into()],
            runs: vec![],
        }
    }

    #[test]
    fn replica_liveness() {
        const T: Timing = Timing {
            lease_ms: 3_000,
            heartbeat_ms: 1_000,
        };
        const NOW: i64 = 1_000_000;
        #[rustfmt::skip]
        let rows = [
            ("heartbeat just now", replica("a", NOW, None), true),
            ("heartbeat one ms inside the lease", replica("a", NOW - 2_999, None), true),
            ("heartbeat exactly one lease ago", replica("a", NOW - 3_000, None), false),
            ("heartbeat long ago", replica("a", NOW - 60_000, None), false),
            ("stopped, however fresh its heartbeat", replica("a", NOW, Some(NOW)), false),
            ("a heartbeat after the reading (a clock read first)", replica("a", NOW + 5, None), true),
        ];
        for (what, r, want) in rows {
            assert_eq!(replica_live(&r, T, NOW), want, "{what}");
        }
    }

    #[test]
    fn replicas_body_and_table() {
        let t = Timing {
            lease_ms: 3_000,
            heartbeat_ms: 1_000,
        };
        let now = 1_700_000_000_000;
        let mut live = replica("r-live", now - 800, None);
        live.runs = vec!["run-1".into(), "run-2".into()];
        let mut stopped = replica("r-stop\u{1b}[2J", now - 200_000, Some(now - 100));
        stopped.kind = ReplicaKind::Run;
        stopped.host = None;
        let old = replica("r-old", now - 7_500_000, None);
        let body = replicas(&[live, old, stopped], t, now);
        assert_eq!(body["now"], rfc3339(now));
        let list = body["replicas"].as_array().expect("a list");
        assert_eq!(list.len(), 3);
        assert_eq!(
            list[0],
            json!({
                "id": "r-live", "kind": "serve", "host": "h1",
                "started_at": rfc3339(0), "heartbeat_at": rfc3339(now - 800),
                "stopped_at": null, "live": true, "runs": ["run-1", "run-2"],
                "fingerprints": ["fp1"],
            })
        );
        assert_eq!(list[1]["live"], false);
        assert_eq!(list[2]["live"], false);
        assert_eq!(list[2]["stopped_at"], rfc3339(now - 100));
        assert_eq!(list[2]["host"], Value::Null);

        let table = replica_table(&body);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        let cells = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[0]),
            ["ID", "KIND", "LIVE", "HEARTBEAT", "RUNS", "HOST"]
        );
        assert_eq!(
            cells(lines[1]),
            ["r-live", "serve", "yes", "0.8s", "ago", "2", "h1"]
        );
        assert_eq!(
            cells(lines[2]),
            ["r-old", "serve", "no", "2h05m", "ago", "0", "h1"]
        );
        assert_eq!(
            cells(lines[3]),
            ["r-stop\\u{1b}[2J", "run", "ended", "3m20s", "ago", "0", "-"]
        );
        assert!(!table.contains('\u{1b}'), "{table}");
        // The columns line up: every row's second column starts where the header's does.
        let col = lines[0].find("KIND").expect("header");
        assert!(lines
            .iter()
            .all(|l| l[col..].starts_with(|c: char| c.is_alphabetic())));
    }

    #[test]
    fn terminal_safe_escapes_what_a_terminal_would_act_on() {
        assert_eq!(terminal_safe("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(terminal_safe("x\u{9b}31m"), "x\\u{9b}31m");
        assert_eq!(terminal_safe("l1\nl2\r\t\u{7f}"), "l1\\nl2\\r\\t\\u{7f}");
        assert_eq!(terminal_safe("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(terminal_safe("ünïcode ok: …"), "ünïcode ok: …");
    }

    #[test]
    fn turn_table_has_a_row_per_call_and_one_for_the_answer() {
        let turns = json!([
            {"iteration": 1, "turn": 1, "status": "completed", "input_tokens": 10, "output_tokens": 2,
             "tool_calls": [
                {"tool": "get_pods", "arguments": {"namespace": "shop"}, "status": "completed", "duration_ms": 12},
                {"tool": "get\u{1b}]0;x\u{7}", "arguments": {"pod": "p".repeat(80)}, "status": "failed", "duration_ms": null},
             ]},
            {"iteration": 2, "turn": 1, "status": "completed", "input_tokens": 5, "output_tokens": 5, "tool_calls": []},
        ]);
        let table = turn_table(&turns);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("TURN  TOOL"), "{table}");
        assert!(lines[1].starts_with("1     get_pods"), "{table}");
        assert!(
            lines[1].contains(r#"{"namespace":"shop"}"#) && lines[1].contains("12ms"),
            "{table}"
        );
        assert!(
            lines[1].trim_end().ends_with("12"),
            "tokens on the turn's first row: {table}"
        );
        assert!(
            lines[2].contains("get\\u{1b}]0;x\\u{7}") && lines[2].contains("failed"),
            "{table}"
        );
        assert!(
            lines[2].contains('…') && !lines[2].contains(&"p".repeat(60)),
            "{table}"
        );
        assert!(!lines[2].trim_end().ends_with("12"), "{table}");
        assert!(
            lines[3].starts_with("2:1") && lines[3].contains("(answer)"),
            "{table}"
        );
        assert!(
            !table.contains('\u{1b}') && !table.contains('\u{7}'),
            "{table}"
        );
    }
}
