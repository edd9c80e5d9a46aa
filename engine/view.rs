//! The public JSON shape of a run (SPEC 2, `GET /runs/{id}`), shared by the HTTP API
//! and `vectorstep runs show --json`, and the terminal table.

use serde_json::{json, Map, Value};

use crate::clock::rfc3339;
use crate::store::{EventRecord, RunRecord, StepJournal, StepRecord};

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
pub fn step_table(steps: &[StepRecord]) -> String {
    let mut rows = vec![[
        "STEP".to_string(),
        "STATUS".into(),
        "CONFIDENCE".into(),
        "DURATION".into(),
        "TOKENS".into(),
        "COST".into(),
    ]];
    for s in steps {
        let indent = if s.kind.is_branch() { "  " } else { "" };
        rows.push([
            format!("{indent}{}", s.step_path),
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
        ]);
    }
    aligned(&rows)
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

#[cfg(test)]
mod tests {
    use super::*;

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
