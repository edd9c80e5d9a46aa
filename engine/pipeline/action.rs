//! The unit of work shared by steps, branches and fan-outs: `executor`,
//! `executor_config` (decoded per executor kind by [`super::executor_config`]),
//! `prompt_template` and `timeout_seconds`.

use super::context::Ctx;
use super::executor_config::{self, template_sites, ExecutorConfig};
use super::model::*;
use crate::decode::Obj;
use crate::diag::Diagnostics;
use crate::yaml::Node;

/// Checks the shared parts of a unit of work and the executor's own config.
pub(super) fn action(o: &Obj<'_>, cx: &mut Ctx, d: &mut Diagnostics) -> Option<Action> {
    let executor_name = o.req_str(d, "executor");
    let cfg_node = o.get("executor_config");
    if let Some(n) = cfg_node.filter(|n| n.as_map().is_none()) {
        d.error(
            &n.span,
            &o.path_of("executor_config"),
            format!("expected a mapping, found {}", n.type_name()),
        );
    }
    // Messages people read (a human step's request, a notify to Telegram) escape
    // every value they interpolate; other prompts go to machines as written.
    let is_message = match executor_name.as_deref().and_then(ExecutorKind::parse) {
        Some(ExecutorKind::Human) => true,
        Some(ExecutorKind::Notify) => {
            cfg_node
                .and_then(|n| n.get("channel"))
                .and_then(Node::as_str)
                == Some("telegram")
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
    let cfg_path = o.path_of("executor_config");
    let agents: Vec<&str> = cx.config.agents.keys().map(String::as_str).collect();
    let decoded =
        executor_config::decode(executor, cfg_node, o.span(), &cfg_path, Some(&agents), d);
    let mut config_templates = Vec::new();
    for site in decoded.iter().flat_map(|x| &x.templates) {
        if let Some(t) = cx.template_node(&site.node, &site.path, d) {
            config_templates.push((site.pointer.clone(), t));
        }
    }
    let config = decoded?.config;
    let agent = match &config {
        ExecutorConfig::Agent(a) => Some(a.agent.clone()),
        _ => None,
    };
    if let ExecutorConfig::Pipeline(p) = &config {
        // Checked once every pipeline of the folder is loaded.
        let span = cfg_node
            .and_then(|n| n.get("pipeline"))
            .map(|n| n.span.clone())
            .unwrap_or_else(|| o.span().clone());
        cx.subpipeline_refs.push((
            p.pipeline.clone(),
            span,
            crate::decode::join(&cfg_path, "pipeline"),
        ));
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
    let mut sites = Vec::new();
    template_sites(n, pointer, path, &mut sites);
    for site in sites {
        if let Some(t) = cx.template_node(&site.node, &site.path, d) {
            out.push((site.pointer, t));
        }
    }
}
