//! The unit of work shared by steps, branches and fan-outs: `executor`,
//! `executor_config` (checked per executor kind), `prompt_template` and
//! `timeout_seconds`.

use serde_json::Value as Json;

use super::model::*;
use super::validate::Ctx;
use crate::decode::{join, Obj};
use crate::diag::Diagnostics;
use crate::yaml::Node;

/// Checks the shared parts of a unit of work and the executor's own config.
pub(super) fn action(o: &Obj<'_>, cx: &mut Ctx, d: &mut Diagnostics) -> Option<Action> {
    let executor_name = o.req_str(d, "executor");
    let config = o
        .json_map(d, "executor_config")
        .unwrap_or(Json::Object(Default::default()));
    // Messages people read (a human step's request, a notify to Telegram) escape
    // every value they interpolate; other prompts go to machines as written.
    let is_message = match executor_name.as_deref().and_then(ExecutorKind::parse) {
        Some(ExecutorKind::Human) => true,
        Some(ExecutorKind::Notify) => {
            config.get("channel").and_then(Json::as_str) == Some("telegram")
        }
        _ => false,
    };
    let prompt = cx.template_as(o, "prompt_template", is_message, d);
    let timeout_seconds = o.seconds(d, "timeout_seconds").filter(|s| *s > 0.0);
    let executor_name = executor_name?;
    let Some(executor) = ExecutorKind::parse(&executor_name) else {
        let n = o.get("executor").unwrap_or(o.node);
        let msg = format!("unknown executor `{executor_name}`");
        let mut hint = String::new();
        if let Some(s) =
            crate::diag::did_you_mean(&executor_name, ExecutorKind::NAMES.iter().copied())
        {
            hint.push_str(&format!("did you mean `{s}`? "));
        }
        hint.push_str(&format!("executors: {}", ExecutorKind::NAMES.join(", ")));
        d.error_hint(&n.span, &o.path_of("executor"), msg, hint);
        return None;
    };
    let cfg_node = o.get("executor_config");
    let cfg_path = o.path_of("executor_config");
    let mut config_templates = Vec::new();
    let mut agent = None;
    let cfg_span = cfg_node.map(|n| &n.span).unwrap_or(o.span()).clone();
    let field = |key: &str| cfg_node.and_then(|n| n.get(key)).filter(|n| !n.is_null());
    match executor {
        ExecutorKind::Agent => match field("agent") {
            None => {
                d.error_hint(
                    &cfg_span,
                    &cfg_path,
                    "the agent executor needs `executor_config.agent`",
                    format!(
                        "name one of the agents in config.yaml: {}",
                        cx.agent_names()
                    ),
                );
            }
            Some(n) => match n.as_str() {
                Some(a) if cx.config.agents.contains_key(a) => agent = Some(a.to_string()),
                Some(a) => {
                    let known = cx.agent_names();
                    let mut hint = String::new();
                    if let Some(s) =
                        crate::diag::did_you_mean(a, cx.config.agents.keys().map(String::as_str))
                    {
                        hint.push_str(&format!("did you mean `{s}`? "));
                    }
                    hint.push_str(&format!("agents defined in config.yaml: {known}"));
                    d.error_hint(
                        &n.span,
                        &join(&cfg_path, "agent"),
                        format!("unknown agent `{a}`"),
                        hint,
                    );
                }
                None => {
                    d.error(
                        &n.span,
                        &join(&cfg_path, "agent"),
                        format!("expected an agent name, found {}", n.type_name()),
                    );
                }
            },
        },
        ExecutorKind::Webhook => match field("url") {
            Some(n) if n.as_str().is_some() => {
                if let Some(t) = cx.template_node(n, &join(&cfg_path, "url"), d) {
                    config_templates.push(("url".to_string(), t));
                }
            }
            Some(n) => {
                d.error(
                    &n.span,
                    &join(&cfg_path, "url"),
                    format!("expected a URL string, found {}", n.type_name()),
                );
            }
            None => {
                d.error_hint(
                    &cfg_span,
                    &cfg_path,
                    "the webhook executor needs `executor_config.url`",
                    "e.g. `executor_config: {url: \"https://hooks.example/alert\"}`",
                );
            }
        },
        ExecutorKind::Shell => match field("command") {
            Some(n) => match n.as_seq() {
                Some(items) if !items.is_empty() => {
                    for (i, item) in items.iter().enumerate() {
                        let p = format!("{}[{i}]", join(&cfg_path, "command"));
                        if item.scalar_text().is_none() {
                            d.error(
                                &item.span,
                                &p,
                                format!("expected a string, found {}", item.type_name()),
                            );
                            continue;
                        }
                        let mut it = item.clone();
                        if let Some(s) = item.scalar_text() {
                            it.value = crate::yaml::Value::Str(s);
                        }
                        if let Some(t) = cx.template_node(&it, &p, d) {
                            config_templates.push((format!("command/{i}"), t));
                        }
                    }
                }
                Some(_) => {
                    d.error(
                        &n.span,
                        &join(&cfg_path, "command"),
                        "the command list is empty",
                    );
                }
                None => {
                    d.error_hint(
                        &n.span,
                        &join(&cfg_path, "command"),
                        format!("expected an argv list, found {}", n.type_name()),
                        "commands run without a shell: write `command: [\"df\", \"-h\", \"{{ labels.mount }}\"]`",
                    );
                }
            },
            None => {
                d.error_hint(
                    &cfg_span,
                    &cfg_path,
                    "the shell executor needs `executor_config.command`",
                    "an argv list such as `[\"systemctl\", \"status\", \"nginx\"]`",
                );
            }
        },
        ExecutorKind::Pipeline => match field("pipeline").map(|n| (n, n.as_str())) {
            Some((n, Some(name))) => {
                cx.subpipeline_refs.push((
                    name.to_string(),
                    n.span.clone(),
                    join(&cfg_path, "pipeline"),
                ));
                if let Some(c) = field("context") {
                    if c.as_map().is_some() {
                        collect_string_templates(
                            c,
                            "context",
                            &join(&cfg_path, "context"),
                            cx,
                            &mut config_templates,
                            d,
                        );
                    } else {
                        d.error(
                            &c.span,
                            &join(&cfg_path, "context"),
                            format!("expected a mapping, found {}", c.type_name()),
                        );
                    }
                }
            }
            Some((n, None)) => {
                d.error(
                    &n.span,
                    &join(&cfg_path, "pipeline"),
                    format!("expected a pipeline name, found {}", n.type_name()),
                );
            }
            None => {
                d.error(
                    &cfg_span,
                    &cfg_path,
                    "the pipeline executor needs `executor_config.pipeline`",
                );
            }
        },
        ExecutorKind::Notify => {
            if let Some(n) = field("channel") {
                match n.as_str() {
                    Some("log" | "webhook" | "telegram") => {}
                    _ => {
                        d.error_hint(
                            &n.span,
                            &join(&cfg_path, "channel"),
                            "unknown notify channel",
                            "channels: log, webhook, telegram",
                        );
                    }
                }
                if n.as_str() == Some("webhook") && field("url").is_none() {
                    d.error(
                        &cfg_span,
                        &cfg_path,
                        "the webhook channel needs `executor_config.url`",
                    );
                }
            }
        }
        ExecutorKind::Mock => {
            if let Some(n) = field("output") {
                if n.as_map().is_none() {
                    d.error(
                        &n.span,
                        &join(&cfg_path, "output"),
                        format!("expected a mapping, found {}", n.type_name()),
                    );
                } else {
                    collect_string_templates(
                        n,
                        "output",
                        &join(&cfg_path, "output"),
                        cx,
                        &mut config_templates,
                        d,
                    );
                }
            }
        }
        ExecutorKind::Human => {}
    }
    Some(Action {
        executor_name,
        executor,
        config,
        agent,
        prompt,
        config_templates,
        timeout_seconds,
    })
}

/// Compiles every string inside `n` that looks like a template.
pub(super) fn collect_string_templates(
    n: &Node,
    pointer: &str,
    path: &str,
    cx: &mut Ctx,
    out: &mut Vec<(String, super::template::Template)>,
    d: &mut Diagnostics,
) {
    use crate::yaml::Value;
    match &n.value {
        Value::Str(s) if s.contains("{{") || s.contains("{%") => {
            if let Some(t) = cx.template_node(n, path, d) {
                out.push((pointer.to_string(), t));
            }
        }
        Value::Map(entries) => {
            for (k, v) in entries {
                let key = k.scalar_text().unwrap_or_default();
                collect_string_templates(
                    v,
                    &format!("{pointer}/{key}"),
                    &join(path, &key),
                    cx,
                    out,
                    d,
                );
            }
        }
        Value::Seq(items) => {
            for (i, v) in items.iter().enumerate() {
                collect_string_templates(
                    v,
                    &format!("{pointer}/{i}"),
                    &format!("{path}[{i}]"),
                    cx,
                    out,
                    d,
                );
            }
        }
        _ => {}
    }
}
