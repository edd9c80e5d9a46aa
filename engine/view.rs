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
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<w$}", w = widths[c]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
