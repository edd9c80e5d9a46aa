//! Flow decisions, all pure: the confidence gate, joins, budgets, retry delays and
//! turning a rendered `over:` into a fan-out item list.

use std::time::Duration;

use serde_json::Value;

use crate::pipeline::{Backoff, Budget, Gate, Join, LowConfidence, OnEmpty, Retry};

pub use crate::domain::StepStatus;

/// Applies the confidence gate (strictly below the threshold triggers it), then
/// `proceed: false`. A low-confidence escalate or abort wins over `proceed: false`.
pub fn gate(confidence: f64, proceed: bool, gate: &Gate) -> StepStatus {
    if confidence < gate.confidence_threshold {
        match gate.on_low_confidence {
            LowConfidence::Escalate => return StepStatus::Escalated,
            LowConfidence::Abort => return StepStatus::Aborted,
            LowConfidence::Proceed => {}
        }
    }
    if !proceed {
        return StepStatus::Stopped;
    }
    StepStatus::Completed
}

/// Joins branch confidences (failed branches count as 0.0) in declaration order.
pub fn join(strategy: Join, branches: &[(f64, f64)]) -> f64 {
    if branches.is_empty() {
        return 0.0;
    }
    match strategy {
        Join::AllMustPass => branches.iter().map(|b| b.0).fold(f64::INFINITY, f64::min),
        Join::AnyMustPass => branches
            .iter()
            .map(|b| b.0)
            .fold(f64::NEG_INFINITY, f64::max),
        Join::WeightedAverage => {
            let total: f64 = branches.iter().map(|b| b.1).sum();
            if total <= 0.0 {
                0.0
            } else {
                branches.iter().map(|(c, w)| c * w).sum::<f64>() / total
            }
        }
    }
}

/// The delay before retry number `attempt + 1`, after `attempt` failed.
pub fn retry_delay(retry: &Retry, attempt: u32) -> Duration {
    let factor = match retry.backoff {
        Backoff::Fixed => 1.0,
        Backoff::Exponential => 2f64.powi(attempt.saturating_sub(1).min(30) as i32),
    };
    Duration::from_secs_f64((retry.delay_seconds * factor).clamp(0.0, 3600.0))
}

/// Whether accumulated usage breaks the budget; strictly greater trips it, tokens
/// are checked first. Returns the message recorded with `budget_exceeded`.
pub fn budget_exceeded(budget: &Budget, tokens: u64, cost_usd: f64) -> Option<String> {
    if let Some(limit) = budget.max_tokens {
        if tokens > limit {
            return Some(format!(
                "Token budget exceeded: {} tokens used (limit: {})",
                thousands(tokens),
                thousands(limit)
            ));
        }
    }
    if let Some(limit) = budget.max_usd {
        if cost_usd > limit {
            return Some(format!(
                "Cost budget exceeded: {cost_usd:.2} USD used (limit: {limit:.2} USD)"
            ));
        }
    }
    None
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What a fan-out does with its rendered item list.
#[derive(Debug, Clone, PartialEq)]
pub enum FanOutItems {
    Run(Vec<Value>),
    /// Empty list: the fan-out completes (`skipped` with `on_empty: skip`) with
    /// confidence 1.0.
    Empty {
        skipped: bool,
    },
    /// Empty with `on_empty: abort` (`empty`), too many items, or an unusable `over`.
    Fail {
        empty: bool,
        reason: String,
    },
}

/// Turns the rendered `over:` text into the item list: a JSON list, a YAML list,
/// or a Python-style list literal (`['a', 'b']`).
pub fn parse_items(name: &str, rendered: &str) -> Result<Vec<Value>, String> {
    let text = rendered.trim();
    if text.is_empty() {
        return Err(format!(
            "Fan-out '{name}': `over` rendered to an empty string"
        ));
    }
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return match v {
            Value::Array(items) => Ok(items),
            other => Err(format!(
                "Fan-out '{name}': `over` must render to a list, got {}",
                short(&other.to_string())
            )),
        };
    }
    // A Python-style literal before YAML: YAML would read `None` as a string.
    if let Some(items) = python_list(text) {
        return Ok(items);
    }
    if let Ok(node) = crate::yaml::parse(&std::sync::Arc::from("over"), text) {
        if let Some(items) = node.as_seq() {
            return Ok(items.iter().map(crate::yaml::Node::to_json).collect());
        }
    }
    Err(format!(
        "Fan-out '{name}': `over` did not render to a list: {}",
        short(text)
    ))
}

fn short(s: &str) -> String {
    let mut out: String = s.chars().take(120).collect();
    if s.chars().count() > 120 {
        out.push('…');
    }
    out
}

/// A Python repr list such as `['a', "b", 1, True, None]`.
fn python_list(text: &str) -> Option<Vec<Value>> {
    if !(text.starts_with('[') && text.ends_with(']')) {
        return None;
    }
    let mut json = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    let mut word = String::new();
    let flush = |word: &mut String, json: &mut String| {
        match word.as_str() {
            "True" => json.push_str("true"),
            "False" => json.push_str("false"),
            "None" => json.push_str("null"),
            w => json.push_str(w),
        }
        word.clear();
    };
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        if n == '\'' {
                            json.push('\'');
                        } else {
                            json.push('\\');
                            json.push(n);
                        }
                    }
                }
                '"' if q == '\'' => json.push_str("\\\""),
                c if c == q => {
                    json.push('"');
                    quote = None;
                }
                c => json.push(c),
            },
            None => match c {
                '\'' | '"' => {
                    flush(&mut word, &mut json);
                    quote = Some(c);
                    json.push('"');
                }
                c if c.is_alphanumeric() || c == '_' || c == '.' || c == '-' => word.push(c),
                c => {
                    flush(&mut word, &mut json);
                    json.push(c);
                }
            },
        }
    }
    flush(&mut word, &mut json);
    match serde_json::from_str(&json) {
        Ok(Value::Array(items)) => Some(items),
        _ => None,
    }
}

/// Decides what a fan-out does with `items`.
pub fn fan_out_items(
    name: &str,
    items: Vec<Value>,
    max_items: usize,
    on_empty: OnEmpty,
) -> FanOutItems {
    if items.is_empty() {
        return match on_empty {
            OnEmpty::Abort => FanOutItems::Fail {
                empty: true,
                reason: format!("Fan-out '{name}': empty list — on_empty=abort"),
            },
            OnEmpty::Skip => FanOutItems::Empty { skipped: true },
            OnEmpty::Complete => FanOutItems::Empty { skipped: false },
        };
    }
    if items.len() > max_items {
        return FanOutItems::Fail {
            empty: false,
            reason: format!(
                "Fan-out '{name}': {} items exceeds max_items={max_items}",
                items.len()
            ),
        };
    }
    FanOutItems::Run(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn g(threshold: f64, on_low: LowConfidence) -> Gate {
        Gate {
            confidence_threshold: threshold,
            on_low_confidence: on_low,
            on_abort: "notify".into(),
        }
    }

    #[test]
    fn gate_table() {
        use LowConfidence::*;
        use StepStatus::*;
        let cases = [
            (0.8, true, g(0.75, Escalate), Completed),
            (0.75, true, g(0.75, Escalate), Completed), // strictly below only
            (0.74, true, g(0.75, Escalate), Escalated),
            (0.74, true, g(0.75, Abort), Aborted),
            (0.74, true, g(0.75, Proceed), Completed),
            (0.9, false, g(0.75, Escalate), Stopped),
            (0.1, false, g(0.75, Escalate), Escalated), // escalate beats proceed=false
            (0.1, false, g(0.75, Proceed), Stopped),
        ];
        for (c, proceed, gt, want) in cases {
            assert_eq!(
                gate(c, proceed, &gt),
                want,
                "confidence {c} proceed {proceed}"
            );
        }
    }

    #[test]
    fn join_table() {
        let b = [(0.9, 1.0), (0.5, 3.0), (0.7, 0.0)];
        assert_eq!(join(Join::AllMustPass, &b), 0.5);
        assert_eq!(join(Join::AnyMustPass, &b), 0.9);
        assert!((join(Join::WeightedAverage, &b) - (0.9 + 1.5) / 4.0).abs() < 1e-9);
        assert_eq!(join(Join::WeightedAverage, &[(0.9, 0.0)]), 0.0);
        assert_eq!(join(Join::AllMustPass, &[]), 0.0);
    }

    #[test]
    fn retry_delays() {
        let r = |backoff| Retry {
            attempts: 4,
            backoff,
            delay_seconds: 0.5,
        };
        let exp: Vec<f64> = (1..4)
            .map(|a| retry_delay(&r(Backoff::Exponential), a).as_secs_f64())
            .collect();
        assert_eq!(exp, vec![0.5, 1.0, 2.0]);
        assert_eq!(retry_delay(&r(Backoff::Fixed), 3).as_secs_f64(), 0.5);
    }

    #[test]
    fn budget_is_strict_and_checks_tokens_first() {
        let b = Budget {
            max_tokens: Some(1000),
            max_usd: Some(0.5),
            include_approx_cost: false,
        };
        assert_eq!(budget_exceeded(&b, 1000, 0.5), None);
        assert_eq!(
            budget_exceeded(&b, 1001, 9.0).as_deref(),
            Some("Token budget exceeded: 1,001 tokens used (limit: 1,000)")
        );
        assert_eq!(
            budget_exceeded(&b, 10, 0.51).as_deref(),
            Some("Cost budget exceeded: 0.51 USD used (limit: 0.50 USD)")
        );
    }

    #[test]
    fn item_lists_in_every_form() {
        let cases = [
            (r#"["a", "b"]"#, json!(["a", "b"])),
            ("['a', 'b']", json!(["a", "b"])),
            ("[True, None, 3]", json!([true, null, 3])),
            ("- x\n- y\n", json!(["x", "y"])),
            (r#"[{"k": 1}]"#, json!([{"k": 1}])),
            ("[]", json!([])),
        ];
        for (text, want) in cases {
            assert_eq!(
                Value::Array(parse_items("fo", text).unwrap()),
                want,
                "{text}"
            );
        }
        assert!(parse_items("fo", "").is_err());
        assert!(parse_items("fo", "{\"a\": 1}")
            .unwrap_err()
            .contains("must render to a list"));
        assert!(parse_items("fo", "checkout").is_err());
    }

    #[test]
    fn fan_out_modes() {
        assert_eq!(
            fan_out_items("fo", vec![], 5, OnEmpty::Skip),
            FanOutItems::Empty { skipped: true }
        );
        assert_eq!(
            fan_out_items("fo", vec![], 5, OnEmpty::Complete),
            FanOutItems::Empty { skipped: false }
        );
        assert!(matches!(
            fan_out_items("fo", vec![], 5, OnEmpty::Abort),
            FanOutItems::Fail { empty: true, .. }
        ));
        let three = vec![json!(1), json!(2), json!(3)];
        assert!(matches!(
            fan_out_items("fo", three.clone(), 2, OnEmpty::Complete),
            FanOutItems::Fail { empty: false, .. }
        ));
        assert_eq!(
            fan_out_items("fo", three.clone(), 3, OnEmpty::Complete),
            FanOutItems::Run(three)
        );
    }
}
