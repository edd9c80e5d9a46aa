//! Turning what arrives (an Alertmanager notification, a generic JSON payload) into
//! a [`Normalised`] trigger, and finding the pipeline it starts. Pure.

use std::collections::BTreeMap;

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
    let (labels, annotations, base) = match strategy {
        "most_severe" => {
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
    })
}

/// The value a match key reads: top-level fields first, then labels.
fn lookup(t: &Normalised, key: &str) -> Option<Value> {
    match key {
        "source" => Some(Value::from(t.source.clone())),
        "severity" => Some(t.severity.clone().map(Value::from).unwrap_or(Value::Null)),
        "summary" => Some(t.summary.clone().map(Value::from).unwrap_or(Value::Null)),
        "pipeline" => Some(t.pipeline.clone().map(Value::from).unwrap_or(Value::Null)),
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

/// The explicit pipeline if named, else the first pipeline (file order) whose
/// `trigger.match` holds.
pub fn resolve<'a>(set: &'a PipelineSet, t: &Normalised) -> Option<&'a std::sync::Arc<Pipeline>> {
    if let Some(name) = t.pipeline.as_deref().filter(|n| !n.is_empty()) {
        return set.get(name);
    }
    set.pipelines.iter().find(|p| matches(p, t))
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
