//! What each page shows, built from store records and the loaded pipelines.
//! Pure: the handlers (`http::ui`) read, these decide, the templates draw.

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{graph, timeline};
use crate::clock::rfc3339;
use crate::domain::{RunStatus, Word};
use crate::pipeline::model::Pipeline;
use crate::run::context::Normalised;
use crate::store::{ApprovalRecord, EventRecord, RunRecord, StepJournal, StepRecord};

/// What every page's frame needs.
#[derive(Debug, Clone, Serialize)]
pub struct Frame {
    /// The CSRF token of the browser's session, for every form on the page.
    pub csrf: String,
    /// The signed-in operator, if auth is configured.
    pub operator: Option<String>,
}

/// "3 min ago", "in 2 h": the distance from `now` in words.
pub fn relative(now: i64, at: i64) -> String {
    let secs = (now - at) / 1000;
    let (n, future) = (secs.abs(), secs < 0);
    let text = if n < 60 {
        format!("{n} s")
    } else if n < 3600 {
        format!("{} min", n / 60)
    } else if n < 86_400 {
        format!("{} h", n / 3600)
    } else {
        format!("{} d", n / 86_400)
    };
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A duration in words (`850 ms`, `12.3 s`, `4 min 2 s`, `3 h 5 min`).
pub fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000)
    } else {
        format!("{} h {} min", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    }
}

fn trigger_of(run: &RunRecord) -> Normalised {
    serde_json::from_str(&run.context_json).unwrap_or_else(|_| Normalised {
        source: run.source.clone(),
        pipeline: None,
        severity: None,
        labels: Default::default(),
        summary: None,
        fingerprint: None,
        team: None,
        metadata: Map::new(),
        received_at: String::new(),
        ..Normalised::default()
    })
}

/// The part of a run id that tells runs apart at a glance: its last 8
/// characters (a UUIDv7 begins with its time, the same for runs started
/// together).
pub fn short_id(id: &str) -> String {
    let chars: Vec<char> = id.chars().collect();
    chars[chars.len().saturating_sub(8)..].iter().collect()
}

/// A run as one row of a list.
pub fn run_row(r: &RunRecord, now: i64) -> Value {
    let t = trigger_of(r);
    let end = r.completed_at.unwrap_or(now);
    json!({
        "id": r.id,
        "short": short_id(&r.id),
        "pipeline": r.pipeline_name,
        "status": r.status,
        "team": r.team,
        "source": r.source,
        "stage": r.stage,
        "summary": t.summary,
        "severity": t.severity,
        "labels": t.labels.iter().take(4).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "triggered_at": rfc3339(r.triggered_at),
        "ago": relative(now, r.triggered_at),
        "duration": duration(end - r.triggered_at),
    })
}

/// The filters of the runs list, as the form shows them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ListFilters {
    pub status: String,
    pub pipeline: String,
    pub team: String,
    pub since: String,
    pub until: String,
    pub q: String,
}

impl ListFilters {
    /// The query string that repeats these filters (for the next page's link).
    pub fn query(&self) -> String {
        [
            ("status", &self.status),
            ("pipeline", &self.pipeline),
            ("team", &self.team),
            ("since", &self.since),
            ("until", &self.until),
            ("q", &self.q),
        ]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", super::query_value(v)))
        .collect::<Vec<_>>()
        .join("&")
    }
}

/// One page of the runs list.
pub struct RunsList<'a> {
    pub runs: &'a [RunRecord],
    pub counts: &'a [(String, u64)],
    pub filters: &'a ListFilters,
    /// The cursor of the next page, if there is one.
    pub next: Option<String>,
    pub first_page: bool,
    pub pipelines: &'a [String],
    pub now: i64,
}

pub fn runs_page(frame: &Frame, list: &RunsList<'_>) -> Value {
    let RunsList {
        runs,
        counts,
        filters,
        next,
        first_page,
        pipelines,
        now,
    } = list;
    let (first_page, now) = (*first_page, *now);
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    let query = filters.query();
    json!({
        "frame": frame,
        "title": "Runs",
        "runs": runs.iter().map(|r| run_row(r, now)).collect::<Vec<_>>(),
        "counts": counts.iter().map(|(s, n)| json!({"status": s, "n": n})).collect::<Vec<_>>(),
        "total": total,
        "filters": filters,
        "statuses": RunStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "pipelines": pipelines,
        "next": next.as_ref().map(|c| if query.is_empty() { format!("/ui?after={c}") } else { format!("/ui?{query}&after={c}") }),
        "first_page": first_page,
        "live": first_page,
    })
}

/// A step's or run's JSON, indented for reading.
fn pretty(json: Option<&str>) -> Option<String> {
    let v: Value = serde_json::from_str(json?).ok()?;
    serde_json::to_string_pretty(&v).ok()
}

/// A pending approval shown on a page, with its form's CSRF token.
#[derive(Debug, Clone, Serialize)]
pub struct PendingApproval {
    pub token: String,
    pub run_id: String,
    pub pipeline: String,
    pub step: String,
    /// The human step's rendered message: its template's own markup, every
    /// interpolated value escaped when it was rendered (SPEC 13).
    pub message: String,
    pub deadline_at: String,
    pub time_left: String,
    pub form_csrf: String,
    pub created_ago: String,
}

impl PendingApproval {
    pub fn of(a: &ApprovalRecord, form_csrf: String, now: i64) -> PendingApproval {
        PendingApproval {
            token: a.token.clone(),
            run_id: a.run_id.clone(),
            pipeline: a.pipeline_name.clone(),
            step: a.step_path.clone(),
            message: a.message.clone(),
            deadline_at: rfc3339(a.deadline_at),
            time_left: if a.deadline_at > now {
                format!("{} left", duration(a.deadline_at - now))
            } else {
                "deadline passed".into()
            },
            form_csrf,
            created_ago: relative(now, a.created_at),
        }
    }
}

/// Everything the run page shows.
pub struct RunPage<'a> {
    pub run: &'a RunRecord,
    pub steps: &'a [StepRecord],
    pub events: &'a [EventRecord],
    pub journals: &'a [StepJournal],
    pub approvals: Vec<PendingApproval>,
    /// The pipeline as loaded now, if it still is.
    pub pipeline: Option<&'a Pipeline>,
    /// Runs that replay this one.
    pub replays: &'a [RunRecord],
    pub now: i64,
}

fn step_view(s: &StepRecord, label: &str, journals: &[StepJournal]) -> Value {
    let calls: Vec<Value> = journals
        .iter()
        .filter(|j| j.step_path == s.step_path)
        .flat_map(|j| j.calls.iter().filter(|c| c.step_path == s.step_path))
        .map(|c| {
            json!({"turn": c.turn, "tool": c.tool, "status": c.status.as_str(),
                "effect": c.effect.as_str(), "effect_key": c.effect_key, "attempt": c.attempt,
                "arguments": pretty(Some(&c.arguments_json)), "result": pretty(c.result_json.as_deref()),
                "decided_by": c.decided_by})
        })
        .collect();
    let turns = journals
        .iter()
        .filter(|j| j.step_path == s.step_path)
        .map(|j| {
            j.turns
                .iter()
                .filter(|t| t.step_path == s.step_path)
                .count()
        })
        .sum::<usize>();
    json!({
        "path": s.step_path,
        "label": label,
        "kind": s.kind.as_str(),
        "executor": s.executor,
        "agent": s.agent,
        "status": s.status.as_str(),
        "attempts": s.attempts,
        "iteration": s.iteration,
        "idempotency_key": s.idempotency_key,
        "started_at": rfc3339(s.started_at),
        "duration": s.duration_ms.map(|d| duration(d as i64)),
        "output": pretty(s.output_json.as_deref()),
        "error": s.error,
        "tokens": s.input_tokens + s.output_tokens,
        "cost_usd": s.cost_usd,
        "turns": turns,
        "tool_calls": calls,
        "depth": s.step_path.matches('/').count(),
    })
}

pub fn run_page(frame: &Frame, p: &RunPage<'_>) -> Value {
    let r = p.run;
    let t = trigger_of(r);
    let end = r.completed_at.unwrap_or(p.now);
    let loop_event = crate::events::name_of_variant("LoopIteration");
    let loops: Vec<timeline::LoopStart> = p
        .events
        .iter()
        .filter(|e| Some(e.event.as_str()) == loop_event)
        .filter_map(|e| {
            let f: Value = serde_json::from_str(&e.fields_json).ok()?;
            Some(timeline::LoopStart {
                step: f.get("step")?.as_str()?.to_string(),
                iteration: u32::try_from(f.get("iteration")?.as_u64()?).ok()?,
                at: e.ts,
            })
        })
        .collect();
    let drawing = timeline::layout(r.triggered_at, end, p.steps, p.journals, &loops);
    let labels: Vec<(String, String)> = drawing
        .rows
        .iter()
        .filter(|row| !matches!(row.kind, "turn" | "tool_call" | "iteration"))
        .map(|row| (row.path.clone(), row.label.clone()))
        .collect();
    let label_of = |path: &str| {
        labels
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| path.to_string())
    };
    let mut steps: Vec<&StepRecord> = p.steps.iter().collect();
    steps.sort_by_key(|s| (s.step_index, s.started_at));
    let annotations: Vec<(String, String)> = t
        .metadata
        .get("common_annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let resumes: Vec<Value> = p
        .events
        .iter()
        .filter(|e| Some(e.event.as_str()) == crate::events::name_of_variant("RunResumed"))
        .map(|e| {
            json!({"ts": rfc3339(e.ts), "msg": e.msg,
                "fields": serde_json::from_str::<Value>(&e.fields_json).ok()
                    .and_then(|v| v.as_object().cloned())
                    .map(|m| m.into_iter().map(|(k, v)| format!("{k}: {}", v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect::<Vec<_>>())
                    .unwrap_or_default()})
        })
        .collect();
    // Replay starts at a top-level entry: the pipeline's, in order, when it is
    // still loaded, else those the run recorded.
    let entries: Vec<String> = match p.pipeline {
        Some(pl) => pl.steps.iter().map(|e| e.name().to_string()).collect(),
        None => {
            let mut names: Vec<String> = Vec::new();
            for s in &steps {
                if !s.step_path.contains('/') && !names.contains(&s.step_path) {
                    names.push(s.step_path.clone());
                }
            }
            names
        }
    };
    let running = r.status == RunStatus::Running;
    json!({
        "frame": frame,
        "title": format!("Run {}", short_id(&r.id)),
        "run": run_row(r, p.now),
        "status": r.status,
        "live": running,
        "completed_at": r.completed_at.map(rfc3339),
        "resumed_at": r.resumed_at.map(rfc3339),
        "resume_count": r.resume_count,
        "fingerprint": r.config_fingerprint,
        "parent_run_id": r.parent_run_id,
        "replay_of": r.replay_of,
        "replays": p.replays.iter().map(|x| run_row(x, p.now)).collect::<Vec<_>>(),
        "tokens": r.tokens_used,
        "cost_usd": format!("{:.4}", r.cost_usd),
        "reason": r.reason,
        "terminal_step": r.terminal_step,
        "labels": t.labels,
        "annotations": annotations,
        "summary": t.summary,
        "severity": t.severity,
        "resumes": resumes,
        "timeline": drawing,
        "steps": steps.iter().map(|s| step_view(s, &label_of(&s.step_path), p.journals)).collect::<Vec<_>>(),
        "logs": p.events.iter().map(|e| json!({"id": e.id, "ts": rfc3339(e.ts), "level": e.level, "event": e.event, "msg": e.msg})).collect::<Vec<_>>(),
        "last_event_id": p.events.last().map(|e| e.id).unwrap_or(0),
        "approvals": p.approvals,
        "replay_from": entries,
        "can_replay": !running && p.pipeline.is_some(),
        "pipeline_loaded": p.pipeline.is_some(),
        "final_output": pretty(r.final_output_json.as_deref()),
    })
}

/// Outcome counts and duration percentiles of a pipeline's recent runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RecentStats {
    pub runs: usize,
    pub completed: usize,
    pub failed: usize,
    pub other: usize,
    /// Of the finished runs, the share that completed, in percent.
    pub success_rate: Option<u32>,
    pub p50: Option<String>,
    pub p95: Option<String>,
}

pub fn recent_stats(runs: &[RunRecord]) -> RecentStats {
    let mut s = RecentStats {
        runs: runs.len(),
        ..RecentStats::default()
    };
    let mut durations: Vec<i64> = Vec::new();
    for r in runs {
        match r.status {
            RunStatus::Completed => s.completed += 1,
            RunStatus::Failed => s.failed += 1,
            _ => s.other += 1,
        }
        if let Some(done) = r.completed_at {
            durations.push(done - r.triggered_at);
        }
    }
    let finished = runs
        .iter()
        .filter(|r| r.status != RunStatus::Running)
        .count();
    s.success_rate = (s.completed * 100).checked_div(finished).map(|p| p as u32);
    durations.sort_unstable();
    let pick = |q: f64| -> Option<String> {
        if durations.is_empty() {
            return None;
        }
        let i = ((durations.len() as f64 - 1.0) * q).round() as usize;
        durations.get(i).map(|d| duration(*d))
    };
    s.p50 = pick(0.5);
    s.p95 = pick(0.95);
    s
}

/// A pipeline's header facts, shared by the list and its page.
pub fn pipeline_facts(p: &Pipeline, next_tick: Option<i64>, now: i64) -> Value {
    json!({
        "name": p.name,
        "description": p.description,
        "stage": p.stage.as_str(),
        "trigger": p.trigger.conditions.iter().map(|(k, op)| format!("{k} {}", describe_op(op))).collect::<Vec<_>>(),
        "durable": p.durable.is_some(),
        "schedule": p.schedule.as_ref().map(|s| s.cron.clone()),
        "next_tick": next_tick.map(|t| format!("{} ({})", rfc3339(t), relative(now, t))),
        "fingerprint": p.fingerprint,
        "file": p.file.display().to_string(),
        "steps": p.steps.len(),
    })
}

/// A `trigger.match` operator and its operand, as an operator would write it.
pub fn describe_op(op: &crate::pipeline::model::MatchOp) -> String {
    use crate::pipeline::model::MatchOp::*;
    match op {
        Eq(v) => format!("= {v}"),
        Ne(v) => format!("!= {v}"),
        In(v) => format!("in {v}"),
        NotIn(v) => format!("not in {v}"),
        Regex(r) => format!("~ /{}/", r.as_str()),
        Gt(n) => format!("> {n}"),
        Gte(n) => format!(">= {n}"),
        Lt(n) => format!("< {n}"),
        Lte(n) => format!("<= {n}"),
    }
}

pub fn pipelines_page(frame: &Frame, rows: Vec<(Value, RecentStats)>) -> Value {
    json!({
        "frame": frame,
        "title": "Pipelines",
        "pipelines": rows.into_iter().map(|(facts, stats)| json!({"facts": facts, "stats": stats})).collect::<Vec<_>>(),
    })
}

pub fn pipeline_page(
    frame: &Frame,
    p: &Pipeline,
    next_tick: Option<i64>,
    recent: &[RunRecord],
    now: i64,
) -> Value {
    let entries = graph::entries(p);
    json!({
        "frame": frame,
        "title": format!("Pipeline {}", p.name),
        "facts": pipeline_facts(p, next_tick, now),
        "graph": graph::draw(&entries),
        "stats": recent_stats(recent),
        "runs": recent.iter().map(|r| run_row(r, now)).collect::<Vec<_>>(),
    })
}

pub fn approvals_page(frame: &Frame, approvals: Vec<PendingApproval>) -> Value {
    json!({"frame": frame, "title": "Approvals", "approvals": approvals})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(status: RunStatus, triggered: i64, done: Option<i64>) -> RunRecord {
        RunRecord {
            id: "r".into(),
            pipeline_name: "p".into(),
            status,
            source: "generic".into(),
            team: None,
            stage: "production".into(),
            triggered_at: triggered,
            completed_at: done,
            resumed_at: None,
            resume_count: 0,
            config_fingerprint: "f".into(),
            parent_run_id: None,
            parent_step_path: None,
            dedup_fingerprint: None,
            context_json:
                r#"{"source":"generic","labels":{"service":"<b>api</b>"},"summary":"disk full"}"#
                    .into(),
            payload_json: "{}".into(),
            tokens_used: 0,
            cost_usd: 0.0,
            terminal_step: None,
            reason: None,
            final_output_json: None,
            replay_of: None,
        }
    }

    #[test]
    fn recent_runs_give_rates_and_percentiles() {
        let runs: Vec<RunRecord> = (0..10)
            .map(|i| {
                run(
                    if i < 8 {
                        RunStatus::Completed
                    } else {
                        RunStatus::Failed
                    },
                    0,
                    Some((i + 1) * 1000),
                )
            })
            .chain([run(RunStatus::Running, 0, None)])
            .collect();
        let s = recent_stats(&runs);
        assert_eq!((s.runs, s.completed, s.failed, s.other), (11, 8, 2, 1));
        assert_eq!(s.success_rate, Some(80));
        assert_eq!(s.p50.as_deref(), Some("6.0 s"));
        assert_eq!(s.p95.as_deref(), Some("10.0 s"));
        assert_eq!(recent_stats(&[]), RecentStats::default());
    }

    #[test]
    fn rows_carry_the_trigger_and_words_for_times() {
        let r = run(RunStatus::Running, 0, None);
        let row = run_row(&r, 125_000);
        assert_eq!(row["summary"], "disk full");
        assert_eq!(row["labels"][0], "service=<b>api</b>");
        assert_eq!(row["ago"], "2 min ago");
        assert_eq!(row["duration"], "2 min 5 s");
        assert_eq!(relative(0, 7_200_000), "in 2 h");
    }

    #[test]
    fn short_ids_are_the_random_end_of_the_id() {
        assert_eq!(short_id("01a23b6e-5f2a-7000-8000-0123456789ab"), "456789ab");
        assert_eq!(short_id("abc"), "abc");
    }

    #[test]
    fn filters_repeat_in_the_next_page_link() {
        let f = ListFilters {
            status: "failed".into(),
            q: "a b&c".into(),
            ..ListFilters::default()
        };
        assert_eq!(f.query(), "status=failed&q=a%20b%26c");
    }
}
