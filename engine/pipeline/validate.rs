//! The validation pass: a parsed YAML tree in, a [`Pipeline`] out, and every problem
//! collected on the way. Only this module (with `steps` and `action` below it) knows
//! the authored shape.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::context::{Ctx, SubpipelineRef};
use super::library::Library;
use super::model::*;
use super::steps;
use crate::config::Config;
use crate::decode::{join, Obj};
use crate::diag::Diagnostics;
use crate::yaml::Node;

/// The keys of a pipeline document.
pub const PIPELINE_KEYS: &[&str] = &[
    "name",
    "description",
    "tags",
    "version",
    "stage",
    "trigger",
    "vars",
    "context_template",
    "steps",
    "notifications",
    "schedule",
    "budget",
    "durable",
];
/// Top-level keys of VectorStep features this engine ignores (with a warning).
pub const PIPELINE_IGNORED_KEYS: &[&str] = &["readiness"];
pub const DEFAULT_VERSION: u64 = 1;
pub const DEFAULT_SCHEDULE_SEVERITY: &str = "info";
/// The words of `stage:`; the first is the default.
pub const STAGES: &[&str] = &["testing", "production"];
pub const CONTEXT_TEMPLATE_KEYS: &[&str] = &["include"];
pub const TRIGGER_KEYS: &[&str] = &["match", "dedup"];
pub const TRIGGER_DEDUP_KEYS: &[&str] = &["enabled", "window_seconds"];
pub const NOTIFICATION_KEYS: &[&str] = &["channel", "template", "config"];
pub const NOTIFICATION_CHANNELS: &[&str] = &["log", "webhook", "telegram"];
pub const SCHEDULE_KEYS: &[&str] = &["cron", "summary", "severity", "labels", "team"];
pub const BUDGET_KEYS: &[&str] = &["max_tokens", "max_usd", "max_cost", "include_approx_cost"];
pub const DURABLE_KEYS: &[&str] = &["on_interrupted", "max_resume_age_seconds"];
/// The words of `durable.on_interrupted`; the first is the default.
pub const ON_INTERRUPTED: &[&str] = &["rerun", "escalate"];

/// Validates one pipeline document.
pub fn pipeline(
    root: &Node,
    file: &Path,
    config: &Config,
    library: &Library,
    d: &mut Diagnostics,
) -> Option<(Pipeline, Vec<SubpipelineRef>)> {
    let start = d.len();
    let validated = pipeline_unlabelled(root, file, config, library, d);
    // Every field path that runs through a step also names it.
    let labels = super::step_labels::step_labels(root);
    if !labels.is_empty() {
        d.relabel_from(start, |path| super::step_labels::label_path(path, &labels));
    }
    validated
}

fn pipeline_unlabelled(
    root: &Node,
    file: &Path,
    config: &Config,
    library: &Library,
    d: &mut Diagnostics,
) -> Option<(Pipeline, Vec<SubpipelineRef>)> {
    let o = Obj::new(root, "", PIPELINE_KEYS, PIPELINE_IGNORED_KEYS, d)?;
    let mut cx = Ctx::for_pipeline(config, library);
    let name = o.req_str(d, "name");
    if let (Some(n), Some(node)) = (&name, o.get("name")) {
        if n.trim().is_empty() {
            d.error(&node.span, "name", "a pipeline name cannot be empty");
        }
    }
    let description = o.str(d, "description").unwrap_or_default();
    let tags = o.str_list(d, "tags").unwrap_or_default();
    let version = o.u64(d, "version").unwrap_or(DEFAULT_VERSION) as i64;
    let stage = match o.choice(d, "stage", STAGES).as_deref() {
        Some("production") => Stage::Production,
        _ => Stage::Testing,
    };
    let trigger = match o.get("trigger") {
        Some(t) => trigger(t, d),
        None => {
            o.missing(d, "trigger");
            None
        }
    };
    if stage == Stage::Testing {
        // An empty match is the usual shape of a pipeline started by name, so
        // only a pipeline that says what alerts it wants is warned about.
        if trigger
            .as_ref()
            .is_some_and(|t| !t.conditions.is_empty() && takes_alerts(t))
        {
            let at = o.get("stage").or(o.get("name")).unwrap_or(root);
            let said = if o.get("stage").is_some() {
                "is `stage: testing`"
            } else {
                "has no `stage`, so it is in stage testing"
            };
            d.warning_hint(
                &at.span,
                "stage",
                format!("the pipeline {said}: an Alertmanager notification it matches is answered `202 skipped_testing` and starts nothing"),
                "set `stage: production` to run it on alerts; `?allow_testing=true` runs a testing pipeline on purpose",
            );
        }
    }
    let vars: BTreeMap<String, String> = o
        .str_map(d, "vars")
        .unwrap_or_default()
        .into_iter()
        .collect();
    let context_include = o
        .get("context_template")
        .and_then(|c| Obj::new(c, "context_template", CONTEXT_TEMPLATE_KEYS, &[], d))
        .and_then(|c| c.str_list(d, "include"))
        .unwrap_or_default();
    // Template context names that are always there, so `steps.X` checks know them.
    let mut entries = Vec::new();
    match o.get("steps") {
        None => o.missing(d, "steps"),
        Some(list) => match list.as_seq() {
            None => {
                d.error_hint(
                    &list.span,
                    "steps",
                    format!("expected a list of steps, found {}", list.type_name()),
                    "write each step as a list item starting with `- name:`",
                );
            }
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("steps[{i}]");
                    if let Some(e) = steps::entry(item, &path, &mut cx, d) {
                        match &e {
                            Entry::Step(s) => cx.make_available(&s.name),
                            Entry::Parallel(p) => {
                                cx.make_available(&p.name);
                                for b in &p.branches {
                                    cx.make_available(&b.name);
                                }
                            }
                            Entry::FanOut(f) => {
                                cx.make_available(&f.name);
                                cx.fan_outs.push(f.name.clone());
                            }
                        }
                        entries.push(e);
                    }
                }
            }
        },
    }
    cx.current = "notifications".into();
    let notifications = o
        .get("notifications")
        .map(|n| notifications(n, &mut cx, d))
        .unwrap_or_default();
    cx.settle_refs(d);
    let schedule = o.get("schedule").and_then(|n| schedule(n, d));
    let budget = o.get("budget").and_then(|n| budget(n, d));
    let durable = o.get("durable").and_then(|n| durable(n, d));
    let fingerprint = super::fingerprint::of_entries(&entries);
    let pipeline = Pipeline {
        name: name?,
        description,
        tags,
        version,
        stage,
        trigger: trigger?,
        vars,
        context_include,
        steps: entries,
        notifications,
        schedule,
        budget,
        durable,
        file: file.to_path_buf(),
        fingerprint,
        templates: Arc::new(cx.templates),
    };
    Some((pipeline, cx.subpipeline_refs))
}

/// Whether a trigger can take Alertmanager notifications: its match does not
/// pin `source` to something else.
fn takes_alerts(t: &Trigger) -> bool {
    t.conditions
        .iter()
        .all(|(key, op)| match (key.as_str(), op) {
            ("source", MatchOp::Eq(v)) => v.as_str() == Some("alertmanager"),
            ("source", MatchOp::In(serde_json::Value::Array(vs))) => {
                vs.iter().any(|v| v.as_str() == Some("alertmanager"))
            }
            ("source", MatchOp::Ne(v)) => v.as_str() != Some("alertmanager"),
            _ => true,
        })
}

fn trigger(n: &Node, d: &mut Diagnostics) -> Option<Trigger> {
    let o = Obj::new(n, "trigger", TRIGGER_KEYS, &[], d)?;
    let mut conditions = Vec::new();
    if let Some(m) = o.get("match") {
        match m.as_map() {
            None => {
                d.error(
                    &m.span,
                    "trigger.match",
                    format!("expected a mapping of conditions, found {}", m.type_name()),
                );
            }
            Some(entries) => {
                for (k, v) in entries {
                    let key = k.scalar_text().unwrap_or_default();
                    let path = join("trigger.match", &key);
                    if let Some(op) = match_op(v, &path, d) {
                        if key == "status" {
                            notification_status(&op, v, &path, d);
                        }
                        conditions.push((key, op));
                    }
                }
            }
        }
    }
    let (mut dedup_enabled, mut dedup_window_seconds) = (None, None);
    if let Some(dd) = o.get("dedup") {
        if let Some(dobj) = Obj::new(dd, "trigger.dedup", TRIGGER_DEDUP_KEYS, &[], d) {
            dedup_enabled = dobj.bool(d, "enabled");
            dedup_window_seconds = dobj.u64(d, "window_seconds");
        }
    }
    Some(Trigger {
        conditions,
        dedup_enabled,
        dedup_window_seconds,
    })
}

/// `trigger.match.status` tests an Alertmanager notification's status, which
/// is `firing` or `resolved`: any other word would never match.
fn notification_status(op: &MatchOp, v: &Node, path: &str, d: &mut Diagnostics) {
    let words: Vec<&serde_json::Value> = match op {
        MatchOp::Eq(w) | MatchOp::Ne(w) => vec![w],
        MatchOp::In(serde_json::Value::Array(ws))
        | MatchOp::NotIn(serde_json::Value::Array(ws)) => ws.iter().collect(),
        _ => return,
    };
    for w in words {
        if !matches!(w.as_str(), Some("firing" | "resolved")) {
            d.error_hint(
                &v.span,
                path,
                format!("an Alertmanager notification's status is firing or resolved, not {w}"),
                "status: resolved takes resolved notifications; status: {in: [firing, resolved]} takes both",
            );
        }
    }
}

/// The operators of a `trigger.match` condition.
pub const MATCH_OPS: &[&str] = &[
    "eq", "ne", "in", "not_in", "regex", "gt", "gte", "lt", "lte",
];

fn match_op(v: &Node, path: &str, d: &mut Diagnostics) -> Option<MatchOp> {
    let Some(entries) = v.as_map() else {
        return Some(MatchOp::Eq(v.to_json()));
    };
    if entries.len() != 1 {
        d.error_hint(
            &v.span,
            path,
            "a match condition has exactly one operator",
            format!("operators: {}", MATCH_OPS.join(", ")),
        );
        return None;
    }
    let (k, operand) = &entries[0];
    let op = k.scalar_text().unwrap_or_default();
    let number = |d: &mut Diagnostics| -> Option<f64> {
        match &operand.value {
            crate::yaml::Value::Int(i) => Some(*i as f64),
            crate::yaml::Value::Float(f) => Some(*f),
            crate::yaml::Value::Str(s) if s.trim().parse::<f64>().is_ok() => s.trim().parse().ok(),
            _ => {
                d.error(
                    &operand.span,
                    &join(path, &op),
                    format!("`{op}` compares numbers; found {}", operand.type_name()),
                );
                None
            }
        }
    };
    Some(match op.as_str() {
        "eq" => MatchOp::Eq(operand.to_json()),
        "ne" => MatchOp::Ne(operand.to_json()),
        "in" | "not_in" => {
            if operand.as_seq().is_none() && operand.as_str().is_none() {
                d.error(
                    &operand.span,
                    &join(path, &op),
                    format!(
                        "`{op}` needs a list (or a string for substring tests), found {}",
                        operand.type_name()
                    ),
                );
                return None;
            }
            if op == "in" {
                MatchOp::In(operand.to_json())
            } else {
                MatchOp::NotIn(operand.to_json())
            }
        }
        "regex" => {
            let Some(src) = operand.as_str() else {
                d.error(
                    &operand.span,
                    &join(path, "regex"),
                    format!(
                        "expected a regular expression string, found {}",
                        operand.type_name()
                    ),
                );
                return None;
            };
            match regex::Regex::new(src) {
                Ok(re) => MatchOp::Regex(re),
                Err(e) => {
                    let first = e
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim()
                        .to_string();
                    d.error(
                        &operand.span,
                        &join(path, "regex"),
                        format!("invalid regular expression `{src}`: {first}"),
                    );
                    return None;
                }
            }
        }
        "gt" => MatchOp::Gt(number(d)?),
        "gte" => MatchOp::Gte(number(d)?),
        "lt" => MatchOp::Lt(number(d)?),
        "lte" => MatchOp::Lte(number(d)?),
        other => {
            let mut hint = String::new();
            if let Some(s) = crate::diag::did_you_mean(other, MATCH_OPS.iter().copied()) {
                hint.push_str(&format!("did you mean `{s}`? "));
            }
            hint.push_str(&format!("operators: {}", MATCH_OPS.join(", ")));
            d.error_hint(
                &k.span,
                path,
                format!("unknown match operator `{other}`"),
                hint,
            );
            return None;
        }
    })
}

fn notifications(
    n: &Node,
    cx: &mut Ctx,
    d: &mut Diagnostics,
) -> BTreeMap<String, Vec<Notification>> {
    let mut out = BTreeMap::new();
    let Some(entries) = n.as_map() else {
        d.error(
            &n.span,
            "notifications",
            format!("expected a mapping of actions, found {}", n.type_name()),
        );
        return out;
    };
    for (k, v) in entries {
        let action = k.scalar_text().unwrap_or_default();
        let path = join("notifications", &action);
        let items: Vec<(&Node, String)> = match v.as_seq() {
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, n)| (n, format!("{path}[{i}]")))
                .collect(),
            None => vec![(v, path.clone())],
        };
        let mut list = Vec::new();
        for (item, p) in items {
            let Some(o) = Obj::new(item, &p, NOTIFICATION_KEYS, &[], d) else {
                continue;
            };
            let channel = o.choice(d, "channel", NOTIFICATION_CHANNELS);
            if !o.has("channel") {
                o.missing(d, "channel");
            }
            if !o.has("template") {
                o.missing(d, "template");
            }
            let telegram = channel.as_deref() == Some("telegram");
            let template = cx.template_as(&o, "template", telegram, d);
            let config = o
                .json_map(d, "config")
                .unwrap_or(serde_json::Value::Object(Default::default()));
            if channel.as_deref() == Some("webhook") && config.get("url").is_none() {
                d.error(o.span(), &p, "the webhook channel needs `config.url`");
            }
            if let Some(channel) = channel {
                list.push(Notification {
                    channel,
                    template,
                    config,
                });
            }
        }
        out.insert(action, list);
    }
    out
}

fn schedule(n: &Node, d: &mut Diagnostics) -> Option<Schedule> {
    let o = Obj::new(n, "schedule", SCHEDULE_KEYS, &[], d)?;
    let cron = o.req_str(d, "cron")?;
    if let Err(e) = croner::Cron::new(&cron).with_seconds_optional().parse() {
        let node = o.get("cron").unwrap_or(n);
        d.error_hint(
            &node.span,
            "schedule.cron",
            format!("invalid cron expression `{cron}`: {e}"),
            "five fields (minute hour day-of-month month day-of-week), or six with seconds first, e.g. `*/15 * * * *`",
        );
        return None;
    }
    Some(Schedule {
        cron,
        summary: o.str(d, "summary").unwrap_or_default(),
        severity: o
            .str(d, "severity")
            .unwrap_or_else(|| DEFAULT_SCHEDULE_SEVERITY.into()),
        labels: o
            .str_map(d, "labels")
            .unwrap_or_default()
            .into_iter()
            .collect(),
        team: o.str(d, "team"),
    })
}

fn budget(n: &Node, d: &mut Diagnostics) -> Option<Budget> {
    let o = Obj::new(n, "budget", BUDGET_KEYS, &[], d)?;
    let max_tokens = o.u64(d, "max_tokens");
    let max_usd = o.f64(d, "max_usd").or_else(|| o.f64(d, "max_cost"));
    for (key, zero) in [
        ("max_tokens", max_tokens == Some(0)),
        ("max_usd", max_usd.is_some_and(|v| v <= 0.0)),
    ] {
        if zero {
            d.error_hint(
                &o.get(key).unwrap_or(n).span,
                &o.path_of(key),
                "a budget limit must be > 0",
                "remove the key to have no limit on it",
            );
        }
    }
    if max_tokens.is_none()
        && max_usd.is_none()
        && !o.has("max_tokens")
        && !o.has("max_usd")
        && !o.has("max_cost")
    {
        d.error_hint(
            &n.span,
            "budget",
            "a budget needs a limit",
            "set `max_tokens`, `max_usd`, or both",
        );
        return None;
    }
    Some(Budget {
        max_tokens: max_tokens.filter(|v| *v > 0),
        max_usd: max_usd.filter(|v| *v > 0.0),
        include_approx_cost: o.bool(d, "include_approx_cost").unwrap_or(false),
    })
}

fn durable(n: &Node, d: &mut Diagnostics) -> Option<Durable> {
    if let crate::yaml::Value::Bool(b) = n.value {
        return b.then_some(Durable {
            on_interrupted: OnInterrupted::Rerun,
            max_resume_age_seconds: None,
        });
    }
    let o = Obj::new(n, "durable", DURABLE_KEYS, &[], d)?;
    let on_interrupted = match o.choice(d, "on_interrupted", ON_INTERRUPTED).as_deref() {
        Some("escalate") => OnInterrupted::Escalate,
        _ => OnInterrupted::Rerun,
    };
    Some(Durable {
        on_interrupted,
        max_resume_age_seconds: o.u64(d, "max_resume_age_seconds"),
    })
}
