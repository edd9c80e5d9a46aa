//! A pipeline's step graph: what `GET /pipelines/{name}` returns as `steps`, and
//! its drawing on `/ui/pipelines/{name}` (entries top to bottom, a group's
//! branches side by side, a fan-out as one box over its items, a sub-pipeline
//! step linked to its pipeline). Pure.

use serde::Serialize;

use crate::pipeline::executor_config::ExecutorConfig;
use crate::pipeline::model::{Action, Entry, Pipeline};

/// One unit of work in the graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unit {
    pub name: String,
    pub executor: &'static str,
    /// The pipeline a `pipeline` step runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// One top-level entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphEntry {
    pub name: String,
    /// `step`, `parallel` or `fan_out`.
    pub kind: &'static str,
    /// The condition of `when:`, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// A step's or fan-out's unit; a group's branches.
    pub units: Vec<Unit>,
    /// A fan-out's item list template, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over: Option<String>,
}

fn unit(name: &str, a: &Action) -> Unit {
    Unit {
        name: name.to_string(),
        executor: a.executor.as_str(),
        pipeline: match &a.config {
            ExecutorConfig::Pipeline(p) => Some(p.pipeline.clone()),
            _ => None,
        },
        agent: a.agent.clone(),
    }
}

pub fn entries(p: &Pipeline) -> Vec<GraphEntry> {
    p.steps
        .iter()
        .map(|e| {
            let (kind, units, over) = match e {
                Entry::Step(s) => ("step", vec![unit(&s.name, &s.action)], None),
                Entry::Parallel(g) => (
                    "parallel",
                    g.branches
                        .iter()
                        .map(|b| unit(&b.name, &b.action))
                        .collect(),
                    None,
                ),
                Entry::FanOut(f) => (
                    "fan_out",
                    vec![unit(&f.name, &f.action)],
                    Some(f.over.source.clone()),
                ),
            };
            GraphEntry {
                name: e.name().to_string(),
                kind,
                when: e.when().map(|w| w.source.clone()),
                units,
                over,
            }
        })
        .collect()
}

/// A box of the drawing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    pub label: String,
    pub detail: String,
    pub kind: &'static str,
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
    /// `/ui/pipelines/<name>` for a sub-pipeline step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// A group's frame around its branches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frame {
    pub label: String,
    pub kind: &'static str,
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drawing {
    pub nodes: Vec<Node>,
    pub frames: Vec<Frame>,
    /// Lines `(x1, y1, x2, y2)` from one entry to the next.
    pub edges: Vec<(f64, f64, f64, f64)>,
    pub width: f64,
    pub height: f64,
}

const BOX_W: f64 = 180.0;
const BOX_H: f64 = 46.0;
const GAP: f64 = 20.0;
const ROW: f64 = 96.0;
const PAD: f64 = 14.0;
const MIN_WIDTH: f64 = 560.0;
/// The longest `over` template shown above a fan-out's frame.
const OVER_CHARS: usize = 60;

pub fn draw(entries: &[GraphEntry]) -> Drawing {
    let widest = entries
        .iter()
        .map(|e| e.units.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    // Wide enough for a group's label above its frame.
    let width = (widest * (BOX_W + GAP) + GAP + 2.0 * PAD).max(MIN_WIDTH);
    let mut nodes = Vec::new();
    let mut frames = Vec::new();
    let mut edges = Vec::new();
    let mut prev_bottom: Option<f64> = None;
    for (row, e) in entries.iter().enumerate() {
        let y = GAP + row as f64 * ROW + PAD;
        let n = e.units.len().max(1) as f64;
        let row_w = n * BOX_W + (n - 1.0) * GAP;
        let x0 = (width - row_w) / 2.0;
        if e.kind != "step" {
            frames.push(Frame {
                label: match &e.over {
                    Some(over) => {
                        let over = over.trim();
                        let shown: String = over.chars().take(OVER_CHARS).collect();
                        let more = if over.chars().count() > OVER_CHARS {
                            "…"
                        } else {
                            ""
                        };
                        format!("{} (for each of {shown}{more})", e.name)
                    }
                    None => format!("{} (parallel)", e.name),
                },
                kind: e.kind,
                x: x0 - PAD,
                y: y - PAD - 4.0,
                w: row_w + 2.0 * PAD,
                h: BOX_H + 2.0 * PAD + 4.0,
            });
        }
        if let Some(bottom) = prev_bottom {
            edges.push((width / 2.0, bottom, width / 2.0, y - PAD - 4.0));
        }
        for (i, u) in e.units.iter().enumerate() {
            let mut detail = u.executor.to_string();
            if let Some(a) = &u.agent {
                detail = format!("{detail} · {a}");
            }
            if let Some(p) = &u.pipeline {
                detail = format!("runs {p}");
            }
            if e.when.is_some() && e.kind == "step" {
                detail.push_str(" · when");
            }
            nodes.push(Node {
                label: u.name.clone(),
                detail,
                kind: if e.kind == "fan_out" {
                    "fan_out"
                } else {
                    "step"
                },
                x: x0 + i as f64 * (BOX_W + GAP),
                y,
                w: BOX_W,
                h: BOX_H,
                link: u
                    .pipeline
                    .as_ref()
                    .map(|p| format!("/ui/pipelines/{}", crate::ui::path_segment(p))),
            });
        }
        prev_bottom = Some(y + BOX_H + PAD);
    }
    Drawing {
        nodes,
        frames,
        edges,
        width,
        height: GAP + entries.len() as f64 * ROW + PAD,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(name: &str, executor: &'static str, pipeline: Option<&str>) -> Unit {
        Unit {
            name: name.into(),
            executor,
            pipeline: pipeline.map(str::to_string),
            agent: None,
        }
    }

    #[test]
    fn groups_are_framed_with_their_branches_side_by_side() {
        let entries = vec![
            GraphEntry {
                name: "triage".into(),
                kind: "step",
                when: None,
                units: vec![u("triage", "agent", None)],
                over: None,
            },
            GraphEntry {
                name: "gather".into(),
                kind: "parallel",
                when: None,
                units: vec![u("logs", "shell", None), u("metrics", "webhook", None)],
                over: None,
            },
            GraphEntry {
                name: "fix".into(),
                kind: "step",
                when: None,
                units: vec![u("fix", "pipeline", Some("remediate db"))],
                over: None,
            },
        ];
        let d = draw(&entries);
        assert_eq!(d.nodes.len(), 4);
        assert_eq!(d.frames.len(), 1);
        assert_eq!(d.edges.len(), 2);
        let (logs, metrics) = (&d.nodes[1], &d.nodes[2]);
        assert_eq!(logs.y, metrics.y, "branches side by side");
        assert!(metrics.x >= logs.x + logs.w);
        let frame = &d.frames[0];
        assert!(frame.x <= logs.x && frame.x + frame.w >= metrics.x + metrics.w);
        assert_eq!(
            d.nodes[3].link.as_deref(),
            Some("/ui/pipelines/remediate%20db")
        );
        assert!(d.nodes.iter().all(|n| n.x >= 0.0 && n.x + n.w <= d.width));
        assert!(d.nodes.iter().all(|n| n.y + n.h <= d.height));
    }
}
