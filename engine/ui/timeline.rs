//! The run page's timeline: one row per recorded unit (step, parallel group and
//! its branches, fan-out and its items, an agent step's turns and tool calls),
//! each a bar from its start to its end on one time scale. Pure: records in,
//! rows with coordinates out; the template draws them as SVG.

use serde::Serialize;
use serde_json::Value;

use crate::domain::{StepKind, UnixMillis};
use crate::store::{StepJournal, StepRecord};

/// The drawing's width in SVG user units; bars are placed on `[LABEL_WIDTH, WIDTH]`.
pub const WIDTH: f64 = 1000.0;
pub const LABEL_WIDTH: f64 = 260.0;
pub const ROW_HEIGHT: f64 = 22.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// What the row shows: a step's name, a branch's name, a fan-out item's label,
    /// `turn 2`, a tool's name.
    pub label: String,
    /// The record it draws (`per-service/0`), for links and tests; a turn or a
    /// tool call carries its step's path.
    pub path: String,
    /// Nesting: 0 for a top-level entry, 1 for a branch, item or turn, 2 for a
    /// turn's tool call.
    pub depth: u32,
    pub kind: &'static str,
    pub status: String,
    pub x: f64,
    pub width: f64,
    pub y: f64,
    /// Hover text: duration and status.
    pub title: String,
}

/// The whole drawing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub rows: Vec<Row>,
    pub height: f64,
    /// `(x, label)` of the time axis ticks.
    pub ticks: Vec<(f64, String)>,
    pub span_ms: i64,
}

pub use crate::view::item_label;

fn duration(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

/// When iteration `iteration` (from 2) of the looping step `step` began: its
/// `loop_iteration` event.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopStart {
    pub step: String,
    pub iteration: u32,
    pub at: UnixMillis,
}

/// Lays the run out: `start` is when the run was triggered, `end` when it
/// finished (or now, for a run still going). A looping step's iterations are
/// rows beneath it, each from its start to the next one's.
pub fn layout(
    start: UnixMillis,
    end: UnixMillis,
    steps: &[StepRecord],
    journals: &[StepJournal],
    loops: &[LoopStart],
) -> Timeline {
    let first = steps.iter().map(|s| s.started_at).min().unwrap_or(start);
    let t0 = start.min(first);
    let last = steps
        .iter()
        .map(|s| s.finished_at.unwrap_or(end))
        .max()
        .unwrap_or(end);
    let span = (end.max(last) - t0).max(1);
    let scale = (WIDTH - LABEL_WIDTH) / span as f64;
    let place = |from: i64, to: Option<i64>| -> (f64, f64) {
        let to = to.unwrap_or(end).max(from);
        let x = LABEL_WIDTH + (from - t0) as f64 * scale;
        // A bar is at least 2 units wide, so an instant step stays visible.
        (x, ((to - from) as f64 * scale).max(2.0))
    };
    let mut ordered: Vec<&StepRecord> = steps.iter().collect();
    // Pipeline order, then each entry's sub-records by their path (items by index).
    ordered.sort_by(|a, b| {
        a.step_index
            .cmp(&b.step_index)
            .then_with(|| sort_key(&a.step_path).cmp(&sort_key(&b.step_path)))
    });
    let mut rows = Vec::new();
    let mut push = |label: String, path: &str, depth: u32, kind, status: String, from, to| {
        let (x, width) = place(from, to);
        let title = format!(
            "{label}: {status}, {}",
            duration(to.unwrap_or(end).max(from) - from)
        );
        rows.push(Row {
            label,
            path: path.to_string(),
            depth,
            kind,
            status,
            x,
            width,
            y: 0.0,
            title,
        });
    };
    for s in &ordered {
        let (parent, leaf) = match s.step_path.rsplit_once('/') {
            Some((p, l)) => (Some(p), l),
            None => (None, s.step_path.as_str()),
        };
        let depth = s.step_path.matches('/').count() as u32;
        let label = match (s.kind, parent) {
            (StepKind::FanOutBranch, Some(p)) => {
                let items = steps
                    .iter()
                    .find(|r| r.step_path == p)
                    .and_then(|r| r.items_json.as_deref())
                    .and_then(|j| serde_json::from_str::<Value>(j).ok());
                match leaf.parse::<usize>() {
                    Ok(i) => item_label(items.as_ref(), i),
                    Err(_) => leaf.to_string(),
                }
            }
            _ => leaf.to_string(),
        };
        push(
            label,
            &s.step_path,
            depth,
            s.kind.as_str(),
            s.status.as_str().to_string(),
            s.started_at,
            s.finished_at,
        );
        let mut starts: Vec<(u32, i64)> = loops
            .iter()
            .filter(|l| l.step == s.step_path)
            .map(|l| (l.iteration, l.at))
            .collect();
        if !starts.is_empty() {
            starts.push((1, s.started_at));
            starts.sort_unstable();
            for (i, (n, at)) in starts.iter().enumerate() {
                let until = starts.get(i + 1).map(|(_, t)| *t).or(s.finished_at);
                let status = if i + 1 < starts.len() {
                    crate::domain::StepStatus::Completed.as_str().to_string()
                } else {
                    s.status.as_str().to_string()
                };
                push(
                    format!("iteration {n}"),
                    &s.step_path,
                    depth + 1,
                    "iteration",
                    status,
                    *at,
                    until,
                );
            }
        }
        if let Some(j) = journals.iter().find(|j| j.step_path == s.step_path) {
            for t in j.turns.iter().filter(|t| t.step_path == s.step_path) {
                push(
                    format!("turn {}", t.turn),
                    &s.step_path,
                    depth + 1,
                    "turn",
                    t.status.as_str().to_string(),
                    t.started_at,
                    t.finished_at,
                );
                for c in j.calls.iter().filter(|c| {
                    c.step_path == s.step_path && c.iteration == t.iteration && c.turn == t.turn
                }) {
                    push(
                        c.tool.clone(),
                        &s.step_path,
                        depth + 2,
                        "tool_call",
                        c.status.as_str().to_string(),
                        c.started_at,
                        c.finished_at,
                    );
                }
            }
        }
    }
    for (i, r) in rows.iter_mut().enumerate() {
        r.y = 24.0 + i as f64 * ROW_HEIGHT;
    }
    let ticks = (0..=4)
        .map(|i| {
            let ms = span * i / 4;
            (LABEL_WIDTH + ms as f64 * scale, duration(ms))
        })
        .collect();
    Timeline {
        height: 24.0 + rows.len() as f64 * ROW_HEIGHT + 8.0,
        rows,
        ticks,
        span_ms: span,
    }
}

/// A path's segments, numbers compared as numbers (`f/10` after `f/9`).
fn sort_key(path: &str) -> Vec<(u64, String)> {
    path.split('/')
        .map(|seg| match seg.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (u64::MAX, seg.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::StepStatus;
    use serde_json::json;

    fn rec(path: &str, index: u32, kind: StepKind, from: i64, to: Option<i64>) -> StepRecord {
        StepRecord {
            run_id: "r".into(),
            step_path: path.into(),
            step_index: index,
            kind,
            executor: "mock".into(),
            agent: None,
            status: if to.is_some() {
                StepStatus::Completed
            } else {
                StepStatus::Running
            },
            attempts: 1,
            iteration: 0,
            idempotency_key: format!("k-{path}"),
            started_at: from,
            finished_at: to,
            duration_ms: None,
            primary_confidence: None,
            effective_confidence: None,
            output_json: None,
            error: None,
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: None,
            items_json: None,
        }
    }

    #[test]
    fn fan_out_items_are_labelled_by_the_rule() {
        let items =
            json!(["db-1", 7, {"name": "api"}, {"id": 42}, {"other": 1}, {"name": ""}, [1]]);
        let labels: Vec<String> = (0..8).map(|i| item_label(Some(&items), i)).collect();
        assert_eq!(labels, ["db-1", "7", "api", "42", "4", "5", "6", "7"]);
        assert_eq!(item_label(None, 3), "3");
    }

    #[test]
    fn bars_are_drawn_to_scale_in_pipeline_order() {
        let mut fan = rec("per", 1, StepKind::FanOut, 100, Some(300));
        fan.items_json = Some(json!([{"name": "api"}, "db"]).to_string());
        let steps = vec![
            rec("per/1", 1, StepKind::FanOutBranch, 100, Some(300)),
            rec("triage", 0, StepKind::Step, 0, Some(100)),
            fan,
            rec("per/0", 1, StepKind::FanOutBranch, 100, Some(200)),
            rec("notify", 2, StepKind::Step, 300, None),
        ];
        let t = layout(0, 400, &steps, &[], &[]);
        let got: Vec<(&str, &str, u32)> = t
            .rows
            .iter()
            .map(|r| (r.label.as_str(), r.path.as_str(), r.depth))
            .collect();
        assert_eq!(
            got,
            [
                ("triage", "triage", 0),
                ("per", "per", 0),
                ("api", "per/0", 1),
                ("db", "per/1", 1),
                ("notify", "notify", 0),
            ]
        );
        let unit = (WIDTH - LABEL_WIDTH) / 400.0;
        let triage = &t.rows[0];
        assert!((triage.x - LABEL_WIDTH).abs() < 1e-9);
        assert!((triage.width - 100.0 * unit).abs() < 1e-9);
        // Items side by side in time: both start where the fan-out starts.
        assert!((t.rows[2].x - t.rows[3].x).abs() < 1e-9);
        assert!(t.rows[3].width > t.rows[2].width);
        // A step still running reaches the end of the drawing.
        let notify = &t.rows[4];
        assert!((notify.x + notify.width - WIDTH).abs() < 1e-9);
        assert!(t.rows.windows(2).all(|w| w[1].y > w[0].y));
    }

    #[test]
    fn an_agent_steps_turns_and_tool_calls_are_rows_beneath_it() {
        use crate::domain::{ToolCallStatus, ToolEffect, TurnStatus};
        use crate::store::{ToolCallRecord, TurnRecord};
        let turn = |n: u32, from: i64, to: i64| TurnRecord {
            run_id: "r".into(),
            step_path: "triage".into(),
            iteration: 0,
            turn: n,
            status: TurnStatus::Completed,
            messages_json: "[]".into(),
            reply_json: None,
            tools_json: None,
            input_tokens: 1,
            output_tokens: 1,
            cost_usd: None,
            error: None,
            started_at: from,
            finished_at: Some(to),
        };
        let call = ToolCallRecord {
            run_id: "r".into(),
            step_path: "triage".into(),
            iteration: 0,
            turn: 1,
            call_index: 1,
            call_id: "c1".into(),
            tool: "get_logs".into(),
            arguments_json: "{}".into(),
            effect: ToolEffect::Read,
            effect_key: "r:triage:0:1:1".into(),
            status: ToolCallStatus::Completed,
            attempt: 1,
            result_json: None,
            approval_token: None,
            approval_deadline: None,
            decided_by: None,
            started_at: 40,
            finished_at: Some(60),
            duration_ms: Some(20),
        };
        let journal = StepJournal {
            run_id: "r".into(),
            step_path: "triage".into(),
            turns: vec![turn(1, 0, 40), turn(2, 60, 100)],
            calls: vec![call],
            delegations: vec![],
        };
        let t = layout(
            0,
            100,
            &[rec("triage", 0, StepKind::Step, 0, Some(100))],
            &[journal],
            &[],
        );
        let got: Vec<(&str, &str, u32)> = t
            .rows
            .iter()
            .map(|r| (r.label.as_str(), r.kind, r.depth))
            .collect();
        assert_eq!(
            got,
            [
                ("triage", "step", 0),
                ("turn 1", "turn", 1),
                ("get_logs", "tool_call", 2),
                ("turn 2", "turn", 1),
            ]
        );
        // The tool call sits where it ran: after turn 1's reply, before turn 2.
        assert!(t.rows[2].x > t.rows[1].x && t.rows[2].x < t.rows[3].x);
    }

    #[test]
    fn a_looping_steps_iterations_follow_each_other_beneath_it() {
        let mut looped = rec("refine", 0, StepKind::Step, 0, Some(90));
        looped.iteration = 3;
        let loops = [
            LoopStart {
                step: "refine".into(),
                iteration: 3,
                at: 60,
            },
            LoopStart {
                step: "refine".into(),
                iteration: 2,
                at: 30,
            },
        ];
        let t = layout(0, 90, &[looped], &[], &loops);
        let got: Vec<(&str, f64)> = t.rows.iter().map(|r| (r.label.as_str(), r.x)).collect();
        assert_eq!(got.len(), 4);
        assert_eq!(
            got.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
            ["refine", "iteration 1", "iteration 2", "iteration 3"]
        );
        assert!(got[1].1 < got[2].1 && got[2].1 < got[3].1);
        let unit = (WIDTH - LABEL_WIDTH) / 90.0;
        assert!((t.rows[2].width - 30.0 * unit).abs() < 1e-9);
    }

    #[test]
    fn an_instant_step_stays_visible_and_an_empty_run_draws_nothing() {
        let t = layout(
            0,
            10_000,
            &[rec("a", 0, StepKind::Step, 5, Some(5))],
            &[],
            &[],
        );
        assert_eq!(t.rows[0].width, 2.0);
        let empty = layout(50, 50, &[], &[], &[]);
        assert!(empty.rows.is_empty());
        assert_eq!(empty.span_ms, 1);
    }
}
