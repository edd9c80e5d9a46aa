//! The step output contract (SPEC 4, "LLMOutput"): what every executor returns and
//! what later templates read as `steps.<name>.<field>`.

use serde_json::{Map, Value};

/// A step's output. Extra fields an executor returns are kept in `extra` and stay
/// reachable from templates, so the context rebuilt after a restart is identical.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    pub confidence: f64,
    pub summary: String,
    pub next_step_context: String,
    pub proceed: bool,
    pub proceed_reason: Option<String>,
    pub reasoning: Option<Map<String, Value>>,
    pub extra: Map<String, Value>,
}

/// Why a JSON value is not a valid step output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid step output: {0}")]
pub struct OutputError(pub String);

impl StepOutput {
    pub fn new(confidence: f64, summary: impl Into<String>) -> Self {
        StepOutput {
            confidence,
            summary: summary.into(),
            next_step_context: String::new(),
            proceed: true,
            proceed_reason: None,
            reasoning: None,
            extra: Map::new(),
        }
    }

    /// The output recorded for a unit that failed: confidence 0 and the error.
    pub fn failed(error: &str) -> Self {
        StepOutput::new(0.0, error)
    }

    /// Whether `v` is shaped like a step output (an object with `confidence` and
    /// `summary`). Webhook and shell results that are not become a plain summary.
    pub fn looks_like_output(v: &Value) -> bool {
        v.as_object()
            .is_some_and(|o| o.contains_key("confidence") && o.contains_key("summary"))
    }

    /// Parses and checks the contract: `confidence` a number in 0..1, `summary` a
    /// string, `next_step_context` a string (absent means empty), `proceed` a
    /// boolean, `reasoning` a mapping.
    pub fn from_json(v: &Value) -> Result<StepOutput, OutputError> {
        let Some(obj) = v.as_object() else {
            return Err(OutputError(format!(
                "expected a JSON object, found {}",
                kind(v)
            )));
        };
        let confidence = match obj.get("confidence") {
            None | Some(Value::Null) => return Err(OutputError("missing `confidence`".into())),
            Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
            Some(other) => {
                return Err(OutputError(format!(
                    "`confidence` must be a number, found {}",
                    kind(other)
                )))
            }
        };
        if !(0.0..=1.0).contains(&confidence) {
            return Err(OutputError(format!(
                "`confidence` must be within 0..1, found {confidence}"
            )));
        }
        let summary = match obj.get("summary") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => return Err(OutputError("missing `summary`".into())),
            Some(other) => {
                return Err(OutputError(format!(
                    "`summary` must be a string, found {}",
                    kind(other)
                )))
            }
        };
        let next_step_context = match obj.get("next_step_context") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(OutputError(format!(
                    "`next_step_context` must be a string, found {}",
                    kind(other)
                )))
            }
        };
        let proceed = match obj.get("proceed") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(OutputError(format!(
                    "`proceed` must be true or false, found {}",
                    kind(other)
                )))
            }
        };
        let proceed_reason = match obj.get("proceed_reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(OutputError(format!(
                    "`proceed_reason` must be a string, found {}",
                    kind(other)
                )))
            }
        };
        let reasoning = match obj.get("reasoning") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(other) => {
                return Err(OutputError(format!(
                    "`reasoning` must be a mapping, found {}",
                    kind(other)
                )))
            }
        };
        let extra = obj
            .iter()
            .filter(|(k, _)| !CONTRACT_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(StepOutput {
            confidence,
            summary,
            next_step_context,
            proceed,
            proceed_reason,
            reasoning,
            extra,
        })
    }

    /// The flat JSON form stored in the step record and exposed to templates.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("confidence".into(), Value::from(self.confidence));
        m.insert("summary".into(), Value::from(self.summary.clone()));
        m.insert(
            "next_step_context".into(),
            Value::from(self.next_step_context.clone()),
        );
        m.insert("proceed".into(), Value::from(self.proceed));
        m.insert(
            "proceed_reason".into(),
            self.proceed_reason
                .clone()
                .map(Value::from)
                .unwrap_or(Value::Null),
        );
        m.insert(
            "reasoning".into(),
            self.reasoning
                .clone()
                .map(Value::Object)
                .unwrap_or(Value::Null),
        );
        for (k, v) in &self.extra {
            m.insert(k.clone(), v.clone());
        }
        Value::Object(m)
    }
}

const CONTRACT_FIELDS: &[&str] = &[
    "confidence",
    "summary",
    "next_step_context",
    "proceed",
    "proceed_reason",
    "reasoning",
];

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Token usage and cost of one executor call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `None` when the model has no price in `pricing`.
    pub cost_usd: Option<f64>,
}

impl Usage {
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(input: Value, expected: Result<(), &str>) {
        match (StepOutput::from_json(&input), expected) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(want)) => {
                assert!(e.0.contains(want), "{input}: got `{}`, want `{want}`", e.0)
            }
            (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn contract_checks() {
        check(
            json!({"confidence": 0.5, "summary": "s", "next_step_context": ""}),
            Ok(()),
        );
        check(json!({"confidence": 1, "summary": "s"}), Ok(()));
        check(json!({"summary": "s"}), Err("missing `confidence`"));
        check(json!({"confidence": 7, "summary": "s"}), Err("within 0..1"));
        check(
            json!({"confidence": "high", "summary": "s"}),
            Err("must be a number"),
        );
        check(
            json!({"confidence": 0.5, "summary": "s", "reasoning": "because"}),
            Err("`reasoning` must be a mapping"),
        );
        check(json!({"confidence": 0.5}), Err("missing `summary`"));
        check(json!([1, 2]), Err("expected a JSON object"));
        check(
            json!({"confidence": 0.5, "summary": "s", "proceed": "no"}),
            Err("`proceed`"),
        );
    }

    #[test]
    fn extra_fields_round_trip() {
        let v = json!({"confidence": 0.9, "summary": "s", "next_step_context": "n", "services": ["a", "b"]});
        let out = StepOutput::from_json(&v).unwrap();
        assert_eq!(out.extra.get("services"), Some(&json!(["a", "b"])));
        let back = StepOutput::from_json(&out.to_json()).unwrap();
        assert_eq!(back, out);
    }
}
