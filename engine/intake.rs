//! Turning what arrives (an Alertmanager notification, a generic JSON payload) into
//! a [`Normalised`] trigger, and finding the pipeline it starts. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::pipeline::{MatchOp, Pipeline, PipelineSet};
use crate::run::context::Normalised;

/// Why a payload cannot be taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("the payload must be a JSON object")]
    NotAnObject,
    #[error("a generic payload needs a string `pipeline`")]
    MissingPipeline,
    #[error("`{field}` must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("unknown source `{0}`; sources: alertmanager, generic")]
    UnknownSource(String),
    #[error("unknown strategy `{0}`; strategies: most_severe, common_labels")]
    UnknownStrategy(String),
}

fn str_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let s = match v {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    (k.clone(), s)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn opt_str(v: &Value, key: &'static str) -> Result<Option<String>, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Error::WrongType {
            field: key,
            expected: "a string",
        }),
    }
}

/// Normalises a payload from `source`.
pub fn normalise(
    source: &str,
    strategy: Option<&str>,
    payload: &Value,
    received_at: &str,
) -> Result<Normalised, Error> {
    match source {
        "alertmanager" => alertmanager(payload, strategy.unwrap_or("most_severe"), received_at),
        "generic" => generic(payload, received_at),
        other => Err(Error::UnknownSource(other.to_string())),
    }
}

/// A generic payload: `{pipeline, event, source, summary, idempotency_key, data}`.
pub fn generic(payload: &Value, received_at: &str) -> Result<Normalised, Error> {
    if !payload.is_object() {
        return Err(Error::NotAnObject);
    }
    let pipeline = opt_str(payload, "pipeline")?
        .filter(|p| !p.is_empty())
        .ok_or(Error::MissingPipeline)?;
    let mut labels = str_map(payload.get("labels"));
    if let Some(event) = opt_str(payload, "event")? {
        labels.insert("event".into(), event);
    }
    let metadata = match payload.get("data") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(Error::WrongType {
                field: "data",
                expected: "an object",
            })
        }
    };
    Ok(Normalised {
        source: opt_str(payload, "source")?.unwrap_or_else(|| "generic".into()),
        pipeline: Some(pipeline),
        severity: opt_str(payload, "severity")?,
        labels,
        summary: opt_str(payload, "summary")?,
        fingerprint: opt_str(payload, "idempotency_key")?,
        team: None,
        metadata,
        received_at: received_at.to_string(),
        ..Normalised::default()
    })
}

fn severity_rank(s: Option<&str>) -> u8 {
    match s {
        Some("critical") => 0,
        Some("warning") => 1,
        Some("info") => 2,
        _ => 99,
    }
}

/// An Alertmanager webhook notification (version 4).
pub fn alertmanager(
    payload: &Value,
    strategy: &str,
    received_at: &str,
) -> Result<Normalised, Error> {
    if !payload.is_object() {
        return Err(Error::NotAnObject);
    }
    let alerts: &[Value] = match payload.get("alerts") {
        None | Some(Value::Null) => &[],
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(Error::WrongType {
                field: "alerts",
                expected: "a list",
            })
        }
    };
    let status = opt_str(payload, "status")?;
    // The most severe alert (the first of equals): the trigger's labels under
    // `most_severe`, and `alert` in templates under either strategy.
    let chosen = alerts
        .iter()
        .enumerate()
        .min_by_key(|(i, a)| {
            let sev = a
                .get("labels")
                .and_then(|l| l.get("severity"))
                .and_then(Value::as_str);
            (severity_rank(sev), *i)
        })
        .map(|(_, a)| a);
    let (labels, annotations, base) = match strategy {
        "most_severe" => {
            let labels = str_map(chosen.and_then(|a| a.get("labels")));
            let annotations = str_map(chosen.and_then(|a| a.get("annotations")));
            let fp = chosen
                .and_then(|a| a.get("fingerprint"))
                .and_then(Value::as_str)
                .map(str::to_string);
            (labels, annotations, fp)
        }
        "common_labels" => (
            str_map(payload.get("commonLabels")),
            str_map(payload.get("commonAnnotations")),
            opt_str(payload, "groupKey")?,
        ),
        other => return Err(Error::UnknownStrategy(other.to_string())),
    };
    let base = base.filter(|b| !b.is_empty()).unwrap_or_else(|| {
        let json = serde_json::to_string(&labels).unwrap_or_default();
        blake3::hash(json.as_bytes()).to_hex()[..16].to_string()
    });
    // The status is part of the key so a resolve is never deduplicated against its firing.
    let fingerprint = match &status {
        Some(s) => format!("{base}:{s}"),
        None => base,
    };
    let mut metadata = Map::new();
    metadata.insert(
        "status".into(),
        status.clone().map(Value::from).unwrap_or(Value::Null),
    );
    metadata.insert("strategy".into(), Value::from(strategy));
    metadata.insert("alert_count".into(), Value::from(alerts.len()));
    for (key, src) in [
        ("group_labels", "groupLabels"),
        ("common_labels", "commonLabels"),
        ("common_annotations", "commonAnnotations"),
        ("external_url", "externalURL"),
    ] {
        metadata.insert(key.into(), payload.get(src).cloned().unwrap_or(Value::Null));
    }
    Ok(Normalised {
        source: "alertmanager".into(),
        pipeline: labels.get("pipeline").cloned().filter(|p| !p.is_empty()),
        severity: labels.get("severity").cloned(),
        summary: annotations
            .get("summary")
            .or_else(|| annotations.get("description"))
            .cloned(),
        labels,
        fingerprint: Some(fingerprint),
        team: None,
        metadata,
        received_at: received_at.to_string(),
        alert: chosen.map(|a| alert_view(a, status.as_deref())),
        alerts: alerts
            .iter()
            .map(|a| alert_view(a, status.as_deref()))
            .collect(),
    })
}

/// One alert of a notification as templates see it (docs/pipelines.md):
/// `status` (the alert's own, else the notification's), `labels`,
/// `annotations`, `starts_at`, `ends_at`, `generator_url`, `fingerprint`.
/// Values of the wrong type become empty rather than refusing the alert.
pub fn alert_view(alert: &Value, notification_status: Option<&str>) -> Value {
    let text = |key: &str| {
        alert
            .get(key)
            .and_then(Value::as_str)
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    let status = match text("status") {
        Value::Null => notification_status.map(Value::from).unwrap_or(Value::Null),
        s => s,
    };
    serde_json::json!({
        "status": status,
        "labels": str_map(alert.get("labels")),
        "annotations": str_map(alert.get("annotations")),
        "starts_at": text("startsAt"),
        "ends_at": text("endsAt"),
        "generator_url": text("generatorURL"),
        "fingerprint": text("fingerprint"),
    })
}

/// The value a match key reads: top-level fields first, then labels.
fn lookup(t: &Normalised, key: &str) -> Option<Value> {
    match key {
        "source" => Some(Value::from(t.source.clone())),
        "severity" => Some(t.severity.clone().map(Value::from).unwrap_or(Value::Null)),
        "summary" => Some(t.summary.clone().map(Value::from).unwrap_or(Value::Null)),
        "pipeline" => Some(t.pipeline.clone().map(Value::from).unwrap_or(Value::Null)),
        "status" if t.source == "alertmanager" => Some(
            t.notification_status()
                .map(Value::from)
                .unwrap_or(Value::Null),
        ),
        _ => t.labels.get(key).map(|v| Value::from(v.clone())),
    }
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn contains(operand: &Value, actual: &Value) -> bool {
    match operand {
        Value::Array(items) => items.iter().any(|i| {
            i == actual || (as_str_loose(i).is_some() && as_str_loose(i) == as_str_loose(actual))
        }),
        Value::String(s) => actual.as_str().is_some_and(|a| s.contains(a)),
        _ => false,
    }
}

fn as_str_loose(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether one condition holds for `actual`.
pub fn holds(op: &MatchOp, actual: &Value) -> bool {
    let eq = |want: &Value| {
        want == actual
            || (as_str_loose(want).is_some() && as_str_loose(want) == as_str_loose(actual))
    };
    match op {
        MatchOp::Eq(want) => eq(want),
        MatchOp::Ne(want) => !eq(want),
        MatchOp::In(list) => contains(list, actual),
        MatchOp::NotIn(list) => !contains(list, actual),
        MatchOp::Regex(re) => actual.as_str().is_some_and(|a| re.is_match(a)),
        MatchOp::Gt(n) => as_f64(actual).is_some_and(|a| a > *n),
        MatchOp::Gte(n) => as_f64(actual).is_some_and(|a| a >= *n),
        MatchOp::Lt(n) => as_f64(actual).is_some_and(|a| a < *n),
        MatchOp::Lte(n) => as_f64(actual).is_some_and(|a| a <= *n),
    }
}

pub fn matches(p: &Pipeline, t: &Normalised) -> bool {
    p.trigger
        .conditions
        .iter()
        .all(|(key, op)| match lookup(t, key) {
            Some(actual) => holds(op, &actual),
            None => false,
        })
}

/// Where a trigger goes ([`route`]).
#[derive(Debug)]
pub enum Route<'a> {
    /// Start a run of this pipeline.
    Start(&'a Arc<Pipeline>),
    /// A resolved Alertmanager notification that this pipeline would take if it
    /// were firing: the pipeline does not name `status` in its match, so it
    /// takes firing notifications only.
    IgnoredResolved(&'a Arc<Pipeline>),
    /// No loaded pipeline takes it.
    NoMatch,
    /// The caller named a pipeline (`POST /pipelines/{name}/run`) that is not
    /// loaded.
    UnknownPipeline(String),
}

/// Whether `p` takes `t`'s notification status: a pipeline that names
/// `status` in its match decides by that condition (in [`matches`]); any other
/// takes firing notifications only. Triggers that are not Alertmanager
/// notifications have no status to gate.
fn takes_status(p: &Pipeline, t: &Normalised) -> bool {
    match t.notification_status() {
        None => true,
        Some(_) if p.trigger.conditions.iter().any(|(k, _)| k == "status") => true,
        Some(status) => status == "firing",
    }
}

/// Where a trigger goes. `forced` is the pipeline of `POST /pipelines/{name}/run`:
/// run as asked, whatever its match. A generic payload names its pipeline.
/// An Alertmanager notification goes to the first pipeline (file order) whose
/// `trigger.match` holds and that takes its status; a `pipeline` label narrows
/// the candidates to that pipeline, whose match must still hold (an alert about
/// vectorstep's own metrics carries `pipeline` and must not start it).
pub fn route<'a>(set: &'a PipelineSet, t: &Normalised, forced: Option<&str>) -> Route<'a> {
    if let Some(name) = forced {
        return set
            .get(name)
            .map_or_else(|| Route::UnknownPipeline(name.to_string()), Route::Start);
    }
    let named = t.pipeline.as_deref().filter(|n| !n.is_empty());
    if t.source != "alertmanager" {
        return named
            .and_then(|n| set.get(n))
            .map_or(Route::NoMatch, Route::Start);
    }
    let mut ignored = None;
    for p in set
        .pipelines
        .iter()
        .filter(|p| named.is_none_or(|n| p.name == n))
        .filter(|p| matches(p, t))
    {
        if takes_status(p, t) {
            return Route::Start(p);
        }
        ignored.get_or_insert(p);
    }
    ignored.map_or(Route::NoMatch, Route::IgnoredResolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn alertmanager_most_severe_and_fingerprint() {
        let payload = json!({"status": "firing", "groupKey": "g", "alerts": [
            {"labels": {"alertname": "A", "severity": "warning"}, "annotations": {"summary": "warn"}, "fingerprint": "f1"},
            {"labels": {"alertname": "B", "severity": "critical"}, "annotations": {"description": "crit"}, "fingerprint": "f2"}
        ]});
        let n = alertmanager(&payload, "most_severe", "t").unwrap();
        assert_eq!(n.severity.as_deref(), Some("critical"));
        assert_eq!(n.summary.as_deref(), Some("crit"));
        assert_eq!(n.fingerprint.as_deref(), Some("f2:firing"));
        let resolved = alertmanager(
            &json!({"status": "resolved", "alerts": payload["alerts"]}),
            "most_severe",
            "t",
        )
        .unwrap();
        assert_ne!(resolved.fingerprint, n.fingerprint);
        let common = alertmanager(
            &json!({"status": "firing", "groupKey": "g", "commonLabels": {"x": "1"}}),
            "common_labels",
            "t",
        )
        .unwrap();
        assert_eq!(common.fingerprint.as_deref(), Some("g:firing"));
    }

    fn set(yamls: &[&str]) -> PipelineSet {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<_> = yamls
            .iter()
            .enumerate()
            .map(|(i, y)| {
                let f = dir.path().join(format!("{i}.yaml"));
                std::fs::write(&f, y).unwrap();
                f
            })
            .collect();
        let config = crate::config::Config {
            step_library_dir: dir.path().join("no-library"),
            ..Default::default()
        };
        let (set, d) = crate::pipeline::load(&files, &config);
        set.unwrap_or_else(|| panic!("{d}"))
    }

    fn pipeline_yaml(name: &str, matching: &str) -> String {
        format!(
            "name: {name}\nstage: production\ntrigger:\n  match: {matching}\nsteps:\n  - name: s\n    executor: mock\n    prompt_template: x\n"
        )
    }

    fn notification(status: &str, labels: Value) -> Normalised {
        alertmanager(
            &json!({"status": status, "alerts": [{"status": status, "labels": labels,
                "annotations": {"summary": "s", "runbook_url": "https://runbooks/x"},
                "startsAt": "2026-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prom/graph", "fingerprint": "abc"}]}),
            "most_severe",
            "t",
        )
        .unwrap()
    }

    fn routed(r: Route<'_>) -> String {
        match r {
            Route::Start(p) => format!("start {}", p.name),
            Route::IgnoredResolved(p) => format!("ignored_resolved {}", p.name),
            Route::NoMatch => "no_match".into(),
            Route::UnknownPipeline(n) => format!("unknown {n}"),
        }
    }

    #[test]
    fn routing_by_status_pipeline_label_and_forced_name() {
        let set = set(&[
            &pipeline_yaml("triage", "{severity: critical}"),
            &pipeline_yaml("resolve-note", "{severity: critical, status: resolved}"),
            &pipeline_yaml("db", "{service: db}"),
        ]);
        let crit = json!({"severity": "critical", "alertname": "A"});
        let cases: Vec<(&str, Normalised, Option<&str>, &str)> = vec![
            (
                "firing goes to the first match",
                notification("firing", crit.clone()),
                None,
                "start triage",
            ),
            (
                "resolved skips pipelines that do not name status",
                notification("resolved", crit.clone()),
                None,
                "start resolve-note",
            ),
            (
                "a pipeline label narrows the candidates",
                notification(
                    "firing",
                    json!({"severity": "critical", "pipeline": "resolve-note"}),
                ),
                None,
                "no_match",
            ),
            (
                "a pipeline label whose match holds routes",
                notification("firing", json!({"service": "db", "pipeline": "db"})),
                None,
                "start db",
            ),
            (
                "a pipeline label whose match fails starts nothing",
                notification("firing", json!({"severity": "warning", "pipeline": "db"})),
                None,
                "no_match",
            ),
            (
                "resolved with only status-less matches is ignored",
                notification("resolved", json!({"service": "db"})),
                None,
                "ignored_resolved db",
            ),
            (
                "nothing matches",
                notification("firing", json!({"severity": "info"})),
                None,
                "no_match",
            ),
            (
                "forced runs whatever the match",
                notification("firing", json!({})),
                Some("db"),
                "start db",
            ),
            (
                "forced to an unknown name",
                notification("firing", json!({})),
                Some("nope"),
                "unknown nope",
            ),
            (
                "generic names its pipeline",
                generic(&json!({"pipeline": "db"}), "t").unwrap(),
                None,
                "start db",
            ),
            (
                "generic with an unknown pipeline",
                generic(&json!({"pipeline": "nope"}), "t").unwrap(),
                None,
                "no_match",
            ),
        ];
        for (why, t, forced, want) in cases {
            assert_eq!(routed(route(&set, &t, forced)), want, "{why}");
        }
    }

    #[test]
    fn templates_see_the_chosen_alert_and_every_alert() {
        let payload = json!({"status": "firing", "alerts": [
            {"labels": {"severity": "warning", "service": "a"}, "annotations": {"summary": "w"}, "fingerprint": "f1"},
            {"status": "firing", "labels": {"severity": "critical", "service": "b"},
             "annotations": {"description": "d", "runbook_url": "https://r/b"},
             "startsAt": "2026-01-01T00:00:00Z", "generatorURL": "http://prom/g", "fingerprint": "f2"},
            {"labels": "not a map", "startsAt": 7}
        ]});
        for strategy in ["most_severe", "common_labels"] {
            let n = alertmanager(&payload, strategy, "t").unwrap();
            let alert = n.alert.as_ref().expect("chosen alert");
            assert_eq!(
                alert["annotations"]["runbook_url"], "https://r/b",
                "{strategy}"
            );
            assert_eq!(alert["fingerprint"], "f2");
            assert_eq!(alert["generator_url"], "http://prom/g");
            assert_eq!(alert["starts_at"], "2026-01-01T00:00:00Z");
            assert_eq!(n.alerts.len(), 3);
            assert_eq!(n.alerts[0]["status"], "firing", "the notification's status");
            assert_eq!(n.alerts[2]["labels"], json!({}), "a wrong type is empty");
            assert_eq!(n.alerts[2]["starts_at"], Value::Null);
        }
    }

    #[test]
    fn generic_needs_pipeline() {
        assert_eq!(
            generic(&json!({"event": "x"}), "t"),
            Err(Error::MissingPipeline)
        );
        assert_eq!(generic(&json!([1]), "t"), Err(Error::NotAnObject));
        let n = generic(
            &json!({"pipeline": "p", "event": "deploy", "idempotency_key": "k", "data": {"a": 1}}),
            "t",
        )
        .unwrap();
        assert_eq!(n.labels.get("event").map(String::as_str), Some("deploy"));
        assert_eq!(n.fingerprint.as_deref(), Some("k"));
    }

    #[test]
    fn operators() {
        let re = regex::Regex::new("^pay").unwrap();
        let cases: Vec<(MatchOp, Value, bool)> = vec![
            (MatchOp::Eq(json!("critical")), json!("critical"), true),
            (MatchOp::Ne(json!("critical")), json!("warning"), true),
            (MatchOp::In(json!(["a", "b"])), json!("b"), true),
            (MatchOp::NotIn(json!(["a", "b"])), json!("b"), false),
            (MatchOp::Regex(re), json!("payments"), true),
            (MatchOp::Gt(5.0), json!("7"), true),
            (MatchOp::Gte(5.0), json!("5"), true),
            (MatchOp::Lt(5.0), json!("x"), false),
            (MatchOp::Lte(5.0), json!(5), true),
        ];
        for (op, actual, want) in cases {
            assert_eq!(holds(&op, &actual), want, "{op:?} {actual}");
        }
    }
}
