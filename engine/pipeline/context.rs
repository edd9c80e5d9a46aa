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

    /// Warns about `steps.X` references to steps that do not run earlier.
    pub fn check_refs(&self, source: &str, node: &Node, path: &str, d: &mut Diagnostics) {
        for r in step_references(source) {
            let known = self.available.contains(&r)
                || r.split_once('/').is_some_and(|(fo, i)| {
                    self.fan_outs.iter().any(|f| f == fo) && i.chars().all(|c| c.is_ascii_digit())
                });
            if !known {
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
            Ok(t) => Some(t),
            Err(e) => {
                let leading_blank = source.chars().take_while(|c| *c == '\n').count();
                // Only a literal block keeps its lines; quoted and folded text maps to
                // where the value starts.
                let line = match n.style {
                    ScalarStyle::Literal => {
                        let first = n.span.line.saturating_sub(leading_blank);
                        let last =
                            first + source.trim_end_matches('\n').split('\n').count().max(1) - 1;
                        // An error at end of input points at the block's last line.
                        (first + e.line.max(1) - 1).min(last)
                    }
                    _ => n.span.line,
                };
                let span = Span::new(n.span.file.clone(), line.max(1), n.span.col);
                d.error_hint(&span, path, e.message, "templates use Jinja syntax: `{{ labels.service }}`, `{% if ... %}...{% endif %}`");
                None
            }
        }
    }
}
