//! The validation context shared by every level of the pass: what validating one
//! pipeline needs from outside (config, step library), the templates it compiles, the
//! step names it claims and the `steps.X` references it checks. The bottom of the
//! pass: `action`, `steps` and `validate` build on it; it knows no authored shape.

use std::collections::{HashMap, HashSet};

use super::library::Library;
use super::template::{step_references, Template, Templates};
use crate::config::Config;
use crate::decode::Obj;
use crate::diag::{Diagnostics, Span};
use crate::yaml::{Node, ScalarStyle};

/// An `executor: pipeline` reference: target name, where, and the field path.
pub type SubpipelineRef = (String, Span, String);

/// What validation of one pipeline needs from outside, and what it collects.
pub struct Ctx<'a> {
    pub config: &'a Config,
    pub library: &'a Library,
    pub templates: Templates,
    /// `executor: pipeline` references, checked once every pipeline is loaded.
    pub subpipeline_refs: Vec<SubpipelineRef>,
    claimed: HashMap<String, Span>,
    available: HashSet<String>,
    /// Fan-outs validated so far: `steps.NAME/3` refers to one of their items.
    pub(super) fan_outs: Vec<String>,
    /// The unit being validated, named in warnings.
    pub(super) current: String,
    /// `steps.X` references to no step before them, kept until the whole
    /// pipeline is read ([`Ctx::settle_refs`]): a step that runs later is a
    /// warning, a step that does not exist an error. `None` for a library step,
    /// whose references name steps of the pipelines that use it: warned at once.
    pending_refs: Option<Vec<PendingRef>>,
}

/// A `steps.X` reference waiting for [`Ctx::settle_refs`].
struct PendingRef {
    reference: String,
    span: Span,
    path: String,
    unit: String,
}

impl<'a> Ctx<'a> {
    pub fn new(config: &'a Config, library: &'a Library) -> Self {
        Ctx {
            config,
            library,
            templates: Templates::new(),
            subpipeline_refs: Vec::new(),
            claimed: HashMap::new(),
            available: HashSet::new(),
            fan_outs: Vec::new(),
            current: String::new(),
            pending_refs: None,
        }
    }

    /// A context for a whole pipeline: references to steps that do not exist
    /// become errors once every step is known.
    pub fn for_pipeline(config: &'a Config, library: &'a Library) -> Self {
        Ctx {
            pending_refs: Some(Vec::new()),
            ..Ctx::new(config, library)
        }
    }

    /// After the last step: each reference to a step that did not run before it
    /// is a warning if the step exists (it runs later, so it renders empty) and
    /// an error with a did-you-mean if it does not.
    pub fn settle_refs(&mut self, d: &mut Diagnostics) {
        let Some(pending) = self.pending_refs.take() else {
            return;
        };
        let names: Vec<String> = self
            .claimed
            .keys()
            .flat_map(|p| {
                let leaf = p.rsplit('/').next().unwrap_or(p).to_string();
                [p.clone(), leaf.clone(), leaf.replace('-', "_")]
            })
            .collect();
        let mut seen = HashSet::new();
        for r in pending {
            // A template checked twice (a library step's, say) reports once.
            if !seen.insert((r.reference.clone(), r.path.clone(), r.span.line)) {
                continue;
            }
            let base = r.reference.split('/').next().unwrap_or(&r.reference);
            if names.iter().any(|n| n == base) {
                d.warning(
                    &r.span,
                    &r.path,
                    format!(
                        "`steps.{}` refers to a step that does not run before `{}`; it will render empty",
                        r.reference, r.unit
                    ),
                );
                continue;
            }
            let hint = match crate::diag::did_you_mean(base, names.iter().map(String::as_str)) {
                Some(s) => format!("did you mean `steps.{s}`?"),
                None => {
                    let mut known: Vec<&str> = names.iter().map(String::as_str).collect();
                    known.sort_unstable();
                    known.dedup();
                    format!("the steps of this pipeline: {}", known.join(", "))
                }
            };
            d.error_hint(
                &r.span,
                &r.path,
                format!("`steps.{}` refers to no step of this pipeline", r.reference),
                hint,
            );
        }
    }

    /// Reads and claims the `name` of a step, group or fan-out.
    pub fn unit_name(&mut self, o: &Obj<'_>, d: &mut Diagnostics) -> Option<String> {
        let name = o.req_str(d, "name")?;
        let node = o.get("name").unwrap_or(o.node);
        self.check_name(&name, node, &o.path_of("name"), d);
        self.claim_path(&name, node, &o.path_of("name"), d);
        self.current = name.clone();
        Some(name)
    }

    pub fn check_name(&self, name: &str, node: &Node, path: &str, d: &mut Diagnostics) {
        if name.trim().is_empty() {
            d.error(&node.span, path, "a name cannot be empty");
        } else if name.contains('/') {
            d.error_hint(
                &node.span,
                path,
                format!("`{name}` contains `/`"),
                "`/` separates a group from its branches in step paths; use `-` or `_`",
            );
        }
    }

    /// Records a step path; a second unit with the same path is an error.
    pub fn claim_path(&mut self, p: &str, node: &Node, path: &str, d: &mut Diagnostics) {
        if let Some(first) = self.claimed.get(p) {
            d.error_hint(
                &node.span,
                path,
                format!("duplicate step name `{p}`"),
                format!(
                    "first used at line {}; step paths must be unique within a pipeline",
                    first.line
                ),
            );
        } else {
            self.claimed.insert(p.to_string(), node.span.clone());
        }
    }

    /// Makes `steps.NAME` (and its `_` spelling) known to the units that follow.
    pub(super) fn make_available(&mut self, name: &str) {
        self.available.insert(name.to_string());
        self.available.insert(name.replace('-', "_"));
    }

    /// Checks `steps.X` references against the steps that run earlier; the
    /// others wait for [`Ctx::settle_refs`] (or, in a library step, warn).
    pub fn check_refs(&mut self, source: &str, node: &Node, path: &str, d: &mut Diagnostics) {
        for r in step_references(source) {
            let known = self.available.contains(&r)
                || r.split_once('/').is_some_and(|(fo, i)| {
                    self.fan_outs.iter().any(|f| f == fo) && i.chars().all(|c| c.is_ascii_digit())
                });
            if known {
                continue;
            }
            if let Some(pending) = &mut self.pending_refs {
                pending.push(PendingRef {
                    reference: r,
                    span: node.span.clone(),
                    path: path.to_string(),
                    unit: self.current.clone(),
                });
            } else {
                d.warning(
                    &node.span,
                    path,
                    format!(
                        "`steps.{r}` refers to a step that does not run before `{}`; it will render empty",
                        self.current
                    ),
                );
            }
        }
    }

    /// Compiles the template at `o[key]` (absent: empty template).
    pub fn template(&mut self, o: &Obj<'_>, key: &str, d: &mut Diagnostics) -> Template {
        self.template_as(o, key, false, d)
    }

    /// A template whose interpolated values are HTML-escaped when `html` (messages
    /// read in Telegram or on the approval page).
    pub fn template_as(
        &mut self,
        o: &Obj<'_>,
        key: &str,
        html: bool,
        d: &mut Diagnostics,
    ) -> Template {
        let Some(n) = o.get(key) else {
            return Template::empty();
        };
        if n.as_str().is_none() {
            d.error(
                &n.span,
                &o.path_of(key),
                format!("expected a template string, found {}", n.type_name()),
            );
            return Template::empty();
        }
        self.template_node_as(n, &o.path_of(key), html, d)
            .unwrap_or_else(Template::empty)
    }

    /// Compiles a string node as a template, mapping syntax errors to the YAML line
    /// they sit on (inside block scalars too).
    pub fn template_node(&mut self, n: &Node, path: &str, d: &mut Diagnostics) -> Option<Template> {
        self.template_node_as(n, path, false, d)
    }

    fn template_node_as(
        &mut self,
        n: &Node,
        path: &str,
        html: bool,
        d: &mut Diagnostics,
    ) -> Option<Template> {
        let source = n.as_str()?;
        self.check_refs(source, n, path, d);
        let compiled = if html {
            self.templates.add_html(path, source)
        } else {
            self.templates.add(path, source)
        };
        match compiled {
            Ok(t) => {
                self.check_names(source, n, path, d);
                Some(t)
            }
            Err(e) => {
                let span = template_line(n, source, e.line);
                d.error_hint(&span, path, e.message, "templates use Jinja syntax: `{{ labels.service }}`, `{% if ... %}...{% endif %}`");
                None
            }
        }
    }

    /// Unknown filters, tests and functions of a compiled template (or `when`
    /// expression) are errors at the line they sit on.
    pub fn check_names(&self, source: &str, n: &Node, path: &str, d: &mut Diagnostics) {
        for u in self.templates.unknown_names(source) {
            let hint = match u.suggestion {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("see the {}s in docs/pipelines.md, section 11", u.kind),
            };
            d.error_hint(
                &template_line(n, source, u.line),
                path,
                format!("unknown {} `{}`", u.kind, u.name),
                hint,
            );
        }
    }
}

/// Where line `line` of the template in `n` sits in the YAML file. Only a
/// literal block keeps its lines; quoted and folded text maps to where the value
/// starts. A line past the end points at the block's last line.
fn template_line(n: &Node, source: &str, line: usize) -> Span {
    let leading_blank = source.chars().take_while(|c| *c == '\n').count();
    let line = match n.style {
        ScalarStyle::Literal => {
            let first = n.span.line.saturating_sub(leading_blank);
            let last = first + source.trim_end_matches('\n').split('\n').count().max(1) - 1;
            (first + line.max(1) - 1).min(last)
        }
        _ => n.span.line,
    };
    Span::new(n.span.file.clone(), line.max(1), n.span.col)
}
