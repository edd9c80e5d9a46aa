//! Validation of step list entries: plain steps, `parallel:` groups and `fan_out:`.

use serde_json::Value as Json;

use super::action::{action, collect_string_templates};
use super::context::Ctx;
use super::model::*;
use super::template::Expr;
use crate::decode::{join, Obj, IGNORED_VECTORSTEP_KEYS};
use crate::diag::Diagnostics;
use crate::yaml::Node;

pub const STEP_KEYS: &[&str] = &[
    "name",
    "executor",
    "executor_config",
    "prompt_template",
    "confidence_threshold",
    "on_low_confidence",
    "on_abort",
    "timeout_seconds",
    "when",
    "retry",
    "loop_until",
    "on_failure",
    "include_approx_cost",
];
pub const LIBRARY_EXTRA_KEYS: &[&str] = &["description", "tags"];
pub const PARALLEL_KEYS: &[&str] = &[
    "name",
    "join",
    "confidence_threshold",
    "on_low_confidence",
    "on_abort",
    "timeout_seconds",
    "when",
    "steps",
];
pub const BRANCH_KEYS: &[&str] = &[
    "name",
    "executor",
    "executor_config",
    "prompt_template",
    "timeout_seconds",
    "weight",
];
pub const FANOUT_KEYS: &[&str] = &[
    "name",
    "over",
    "as",
    "as_var",
    "executor",
    "executor_config",
    "prompt_template",
    "timeout_seconds",
    "join",
    "confidence_threshold",
    "on_low_confidence",
    "on_abort",
    "max_items",
    "on_empty",
    "when",
];
/// The only key of a step list entry that is a `parallel:` group.
pub const PARALLEL_ENTRY_KEYS: &[&str] = &["parallel"];
/// The only key of a step list entry that is a `fan_out:`.
pub const FANOUT_ENTRY_KEYS: &[&str] = &["fan_out"];
/// VectorStep keys ignored (with a warning) in a parallel group, a branch, a fan-out.
pub const PARALLEL_IGNORED_KEYS: &[&str] = &["readiness"];
pub const BRANCH_IGNORED_KEYS: &[&str] = &["verifier"];
pub const FANOUT_IGNORED_KEYS: &[&str] = &["verifier", "readiness"];
/// The words of `on_low_confidence`; the first is the default.
pub const LOW_CONFIDENCE: &[&str] = &["escalate", "abort", "proceed"];
/// The words of `join`; the first is the default.
pub const JOINS: &[&str] = &["all_must_pass", "any_must_pass", "weighted_average"];
pub const RETRY_KEYS: &[&str] = &["attempts", "backoff", "delay_seconds"];
/// The words of `retry.backoff`; the last is the default.
pub const BACKOFFS: &[&str] = &["fixed", "exponential"];
pub const LOOP_UNTIL_KEYS: &[&str] = &["confidence", "max_iterations"];
/// The block form of `on_failure`.
pub const ON_FAILURE_KEYS: &[&str] = &["policy", "webhook"];
/// The words of `on_failure` (and its `policy`); the first is the default.
pub const FAILURE_POLICIES: &[&str] = &["abort", "continue"];
pub const FAILURE_WEBHOOK_KEYS: &[&str] =
    &["url", "method", "headers", "payload", "timeout_seconds"];
/// The methods of `on_failure.webhook.method`; the first is the default.
pub const FAILURE_WEBHOOK_METHODS: &[&str] = &["POST", "PUT", "PATCH", "GET"];
/// The words of a fan-out's `on_empty`; the first is the default.
pub const ON_EMPTY: &[&str] = &["complete", "skip", "abort"];
/// Defaults of keys a unit may leave out.
pub const DEFAULT_CONFIDENCE_THRESHOLD: f64 = 0.75;
pub const DEFAULT_ON_ABORT: &str = "notify";
pub const DEFAULT_RETRY_ATTEMPTS: u64 = 3;
pub const DEFAULT_RETRY_DELAY_SECONDS: f64 = 1.0;
pub const DEFAULT_MAX_ITERATIONS: u64 = 3;
pub const DEFAULT_FAILURE_WEBHOOK_TIMEOUT_SECONDS: f64 = 30.0;
pub const DEFAULT_BRANCH_WEIGHT: f64 = 1.0;
pub const DEFAULT_ITEM_VAR: &str = "item";
pub const DEFAULT_MAX_ITEMS: u64 = 20;
/// Library keys a fan-out takes over from `use:`.
pub const FANOUT_LIBRARY_KEYS: &[&str] = &[
    "executor",
    "executor_config",
    "prompt_template",
    "timeout_seconds",
];

/// Validates one entry of a `steps:` list.
pub fn entry(n: &Node, path: &str, cx: &mut Ctx, d: &mut Diagnostics) -> Option<Entry> {
    if n.as_map().is_none() {
        d.error_hint(
            &n.span,
            path,
            format!("expected a step mapping, found {}", n.type_name()),
            "a step list entry is a step (`name` + `executor`, or `use:`), a `parallel:` group or a `fan_out:`",
        );
        return None;
    }
    if let Some(inner) = n.get("parallel") {
        Obj::new(n, path, PARALLEL_ENTRY_KEYS, &[], d)?;
        return parallel(inner, &join(path, "parallel"), cx, d).map(Entry::Parallel);
    }
    if let Some(inner) = n.get("fan_out") {
        Obj::new(n, path, FANOUT_ENTRY_KEYS, &[], d)?;
        let p = join(path, "fan_out");
        let resolved = cx
            .library
            .resolve(inner, Some(FANOUT_LIBRARY_KEYS), &p, d)?;
        return fan_out(&resolved, &p, cx, d).map(Entry::FanOut);
    }
    let resolved = cx.library.resolve(n, None, path, d)?;
    step(&resolved, path, STEP_KEYS, cx, d).map(Entry::Step)
}

fn gate(o: &Obj<'_>, d: &mut Diagnostics) -> Gate {
    Gate {
        confidence_threshold: o
            .fraction(d, "confidence_threshold")
            .unwrap_or(DEFAULT_CONFIDENCE_THRESHOLD),
        on_low_confidence: match o.choice(d, "on_low_confidence", LOW_CONFIDENCE).as_deref() {
            Some("abort") => LowConfidence::Abort,
            Some("proceed") => LowConfidence::Proceed,
            _ => LowConfidence::Escalate,
        },
        on_abort: o
            .str(d, "on_abort")
            .unwrap_or_else(|| DEFAULT_ON_ABORT.into()),
    }
}

fn join_strategy(o: &Obj<'_>, d: &mut Diagnostics) -> Join {
    match o.choice(d, "join", JOINS).as_deref() {
        Some("any_must_pass") => Join::AnyMustPass,
        Some("weighted_average") => Join::WeightedAverage,
        _ => Join::AllMustPass,
    }
}

fn when(o: &Obj<'_>, cx: &mut Ctx, d: &mut Diagnostics) -> Option<Expr> {
    let n = o.get("when")?;
    let src = match n.scalar_text() {
        Some(s) => s,
        None => {
            d.error(
                &n.span,
                &o.path_of("when"),
                format!("expected an expression, found {}", n.type_name()),
            );
            return None;
        }
    };
    let src = src
        .trim()
        .trim_start_matches("{{")
        .trim_end_matches("}}")
        .trim()
        .to_string();
    cx.check_refs(&src, n, &o.path_of("when"), d);
    match cx.templates.add_expr(&o.path_of("when"), &src) {
        Ok(e) => {
            cx.check_names(
                &format!("{{% if {src} %}}{{% endif %}}"),
                n,
                &o.path_of("when"),
                d,
            );
            Some(e)
        }
        Err(e) => {
            d.error_hint(
                &n.span,
                &o.path_of("when"),
                format!(
                    "`{src}` is not a valid expression: {}",
                    e.message
                        .replace("unexpected end of block", "the expression is incomplete")
                ),
                "`when:` is a bare Jinja expression such as `steps.triage.confidence < 0.5`",
            );
            None
        }
    }
}

pub fn step(
    n: &Node,
    path: &str,
    keys: &[&'static str],
    cx: &mut Ctx,
    d: &mut Diagnostics,
) -> Option<Step> {
    let o = Obj::new(n, path, keys, IGNORED_VECTORSTEP_KEYS, d)?;
    let name = cx.unit_name(&o, d);
    let gate = gate(&o, d);
    let when = when(&o, cx, d);
    let action = action(&o, cx, d);
    let retry = o.get("retry").and_then(|r| {
        let ro = Obj::new(r, &o.path_of("retry"), RETRY_KEYS, &[], d)?;
        Some(Retry {
            attempts: ro
                .at_least_one(d, "attempts")
                .unwrap_or(DEFAULT_RETRY_ATTEMPTS)
                .min(1000) as u32,
            backoff: match ro.choice(d, "backoff", BACKOFFS).as_deref() {
                Some("fixed") => Backoff::Fixed,
                _ => Backoff::Exponential,
            },
            delay_seconds: ro
                .seconds(d, "delay_seconds")
                .unwrap_or(DEFAULT_RETRY_DELAY_SECONDS),
        })
    });
    let loop_until = o.get("loop_until").and_then(|l| {
        let lo = Obj::new(l, &o.path_of("loop_until"), LOOP_UNTIL_KEYS, &[], d)?;
        if !lo.has("confidence") {
            lo.missing(d, "confidence");
        }
        Some(LoopUntil {
            confidence: lo.fraction(d, "confidence")?,
            max_iterations: lo
                .at_least_one(d, "max_iterations")
                .unwrap_or(DEFAULT_MAX_ITERATIONS)
                .min(1000) as u32,
        })
    });
    let on_failure = on_failure(&o, cx, d);
    let include_approx_cost = o.bool(d, "include_approx_cost");
    Some(Step {
        name: name?,
        action: action?,
        gate,
        when,
        retry,
        loop_until,
        on_failure,
        include_approx_cost,
    })
}

fn on_failure(o: &Obj<'_>, cx: &mut Ctx, d: &mut Diagnostics) -> OnFailure {
    let default = OnFailure {
        continue_run: false,
        webhook: None,
    };
    let Some(n) = o.get("on_failure") else {
        return default;
    };
    let path = o.path_of("on_failure");
    if let Some(s) = n.as_str() {
        return match s {
            "abort" => default,
            "continue" => OnFailure {
                continue_run: true,
                webhook: None,
            },
            other => {
                d.error_hint(&n.span, &path, format!("`{other}` is not one of: abort, continue"), "use `on_failure: continue` or the block form `{policy: continue, webhook: {url: ...}}`");
                default
            }
        };
    }
    let Some(b) = Obj::new(n, &path, ON_FAILURE_KEYS, &[], d) else {
        return default;
    };
    let continue_run = b.choice(d, "policy", FAILURE_POLICIES).as_deref() == Some("continue");
    let webhook = b.get("webhook").and_then(|w| {
        let wp = b.path_of("webhook");
        let wo = Obj::new(w, &wp, FAILURE_WEBHOOK_KEYS, &[], d)?;
        let url = wo.req_str(d, "url");
        let method = wo
            .choice(d, "method", FAILURE_WEBHOOK_METHODS)
            .unwrap_or_else(|| "POST".into());
        let headers = wo.str_map(d, "headers").unwrap_or_default();
        let payload = wo
            .json_map(d, "payload")
            .unwrap_or(Json::Object(Default::default()));
        let mut payload_templates = Vec::new();
        if let Some(p) = wo.get("payload") {
            collect_string_templates(p, "", &wo.path_of("payload"), cx, &mut payload_templates, d);
        }
        Some(FailureWebhook {
            url: url?,
            method,
            headers,
            payload,
            payload_templates,
            timeout_seconds: wo
                .seconds(d, "timeout_seconds")
                .unwrap_or(DEFAULT_FAILURE_WEBHOOK_TIMEOUT_SECONDS),
        })
    });
    OnFailure {
        continue_run,
        webhook,
    }
}

fn parallel(n: &Node, path: &str, cx: &mut Ctx, d: &mut Diagnostics) -> Option<Parallel> {
    let o = Obj::new(n, path, PARALLEL_KEYS, PARALLEL_IGNORED_KEYS, d)?;
    let name = cx.unit_name(&o, d);
    let join = join_strategy(&o, d);
    let gate = gate(&o, d);
    let timeout_seconds = o.seconds(d, "timeout_seconds").filter(|s| *s > 0.0);
    let when = when(&o, cx, d);
    let mut branches = Vec::new();
    match o.get("steps") {
        None => o.missing(d, "steps"),
        Some(list) => match list.as_seq() {
            None => {
                d.error(
                    &list.span,
                    &o.path_of("steps"),
                    format!("expected a list of branches, found {}", list.type_name()),
                );
            }
            Some([]) => {
                d.error_hint(
                    o.get("steps").map(|n| &n.span).unwrap_or(o.span()),
                    &o.path_of("steps"),
                    "a parallel group needs at least one branch",
                    "list branches as `- {name: ..., executor: ...}`",
                );
            }
            Some(items) => {
                let group = name.clone().unwrap_or_default();
                for (i, item) in items.iter().enumerate() {
                    let bp = format!("{}[{i}]", o.path_of("steps"));
                    let Some(resolved) = cx.library.resolve(item, Some(BRANCH_KEYS), &bp, d) else {
                        continue;
                    };
                    if let Some(b) = branch(&resolved, &bp, &group, cx, d) {
                        branches.push(b);
                    }
                }
            }
        },
    }
    Some(Parallel {
        name: name?,
        join,
        gate,
        timeout_seconds,
        when,
        branches,
    })
}

fn branch(n: &Node, path: &str, group: &str, cx: &mut Ctx, d: &mut Diagnostics) -> Option<Branch> {
    let o = Obj::new(n, path, BRANCH_KEYS, BRANCH_IGNORED_KEYS, d)?;
    let name = o.req_str(d, "name");
    if let (Some(nm), Some(node)) = (&name, o.get("name")) {
        cx.check_name(nm, node, &o.path_of("name"), d);
        cx.claim_path(&format!("{group}/{nm}"), node, &o.path_of("name"), d);
    }
    let action = action(&o, cx, d);
    let weight = o.f64(d, "weight").unwrap_or(DEFAULT_BRANCH_WEIGHT);
    if weight < 0.0 {
        d.error(o.span(), &o.path_of("weight"), "weight must be >= 0");
    }
    Some(Branch {
        name: name?,
        action: action?,
        weight,
    })
}

fn fan_out(n: &Node, path: &str, cx: &mut Ctx, d: &mut Diagnostics) -> Option<FanOut> {
    let o = Obj::new(n, path, FANOUT_KEYS, FANOUT_IGNORED_KEYS, d)?;
    let name = cx.unit_name(&o, d);
    if !o.has("over") {
        o.missing(d, "over");
    }
    let over = o.get("over").and_then(|n| {
        let t = cx.template(&o, "over", d);
        if n.as_str().is_some_and(|src| src.trim().is_empty()) {
            d.error_hint(
                &n.span,
                &o.path_of("over"),
                "`over` is empty",
                "`over` renders the item list, e.g. `\"{{ steps.triage.services | tojson }}\"`",
            );
        }
        (!t.is_empty()).then_some(t)
    });
    let item_var = o
        .str(d, "as")
        .or_else(|| o.str(d, "as_var"))
        .unwrap_or_else(|| DEFAULT_ITEM_VAR.into());
    let action = action(&o, cx, d);
    let join = join_strategy(&o, d);
    let gate = gate(&o, d);
    let max_items = o.at_least_one(d, "max_items").unwrap_or(DEFAULT_MAX_ITEMS) as usize;
    let on_empty = match o.choice(d, "on_empty", ON_EMPTY).as_deref() {
        Some("skip") => OnEmpty::Skip,
        Some("abort") => OnEmpty::Abort,
        _ => OnEmpty::Complete,
    };
    let when = when(&o, cx, d);
    Some(FanOut {
        name: name?,
        over: over?,
        item_var,
        action: action?,
        join,
        gate,
        max_items,
        on_empty,
        when,
    })
}
