//! Templates and `when:` expressions, compiled once when a pipeline loads.
//!
//! Every template of a pipeline lives in one minijinja environment owned by the
//! pipeline, registered under the field path it came from (`steps[0].prompt_template`),
//! so rendering never re-parses and runtime errors name the field.

use minijinja::{Environment, UndefinedBehavior};

/// A compiled template. Empty sources are not registered and render as "".
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub id: Option<String>,
    pub source: String,
}

impl Template {
    pub fn empty() -> Self {
        Template {
            id: None,
            source: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.source.is_empty()
    }
}

/// A compiled boolean expression (`when:`). It is stored as the template
/// `{% if EXPR %}1{% endif %}` so it can live in the same environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub id: String,
    pub source: String,
}

/// A template compile error with the 1-based line inside the template source.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileError {
    pub line: usize,
    pub message: String,
}

/// A runtime rendering failure.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RenderError {
    pub field: String,
    pub message: String,
}

pub struct Templates {
    env: Environment<'static>,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Templates")
    }
}

/// Marks a template id whose values are HTML-escaped.
const HTML_SUFFIX: &str = "#html";

impl Default for Templates {
    fn default() -> Self {
        Self::new()
    }
}

fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(detail) => format!("{}: {}", e.kind(), detail),
        None => e.kind().to_string(),
    }
}

impl Templates {
    pub fn new() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_keep_trailing_newline(true);
        // Messages people read in Telegram or on the approval page keep their own
        // markup while every value interpolated into them is escaped.
        env.set_auto_escape_callback(|name| {
            if name.ends_with(HTML_SUFFIX) {
                minijinja::AutoEscape::Html
            } else {
                minijinja::AutoEscape::None
            }
        });
        Templates { env }
    }

    /// Compiles `source` under `id`.
    pub fn add(&mut self, id: &str, source: &str) -> Result<Template, CompileError> {
        self.add_as(id, source, false)
    }

    /// Compiles a message template: its own markup is kept, every interpolated
    /// value is HTML-escaped (Telegram's HTML mode and the web page).
    pub fn add_html(&mut self, id: &str, source: &str) -> Result<Template, CompileError> {
        self.add_as(id, source, true)
    }

    fn add_as(&mut self, id: &str, source: &str, html: bool) -> Result<Template, CompileError> {
        let id = if html {
            format!("{id}{HTML_SUFFIX}")
        } else {
            id.to_string()
        };
        let id = id.as_str();
        if source.is_empty() {
            return Ok(Template::empty());
        }
        self.env
            .add_template_owned(id.to_string(), source.to_string())
            .map_err(|e| CompileError {
                line: e.line().unwrap_or(1),
                message: format!("template {}", describe(&e)),
            })?;
        Ok(Template {
            id: Some(id.to_string()),
            source: source.to_string(),
        })
    }

    /// Compiles a boolean expression written without braces.
    pub fn add_expr(&mut self, id: &str, source: &str) -> Result<Expr, CompileError> {
        let wrapped = format!("{{% if {source} %}}1{{% endif %}}");
        self.env
            .add_template_owned(id.to_string(), wrapped)
            .map_err(|e| CompileError {
                line: 1,
                message: format!("expression {}", describe(&e)),
            })?;
        Ok(Expr {
            id: id.to_string(),
            source: source.to_string(),
        })
    }

    pub fn render(&self, t: &Template, ctx: &minijinja::Value) -> Result<String, RenderError> {
        let Some(id) = &t.id else {
            return Ok(String::new());
        };
        self.render_id(id, ctx)
    }

    fn render_id(&self, id: &str, ctx: &minijinja::Value) -> Result<String, RenderError> {
        let tpl = self.env.get_template(id).map_err(|e| RenderError {
            field: id.to_string(),
            message: describe(&e),
        })?;
        tpl.render(ctx).map_err(|e| RenderError {
            field: id.to_string(),
            message: describe(&e),
        })
    }

    pub fn eval(&self, e: &Expr, ctx: &minijinja::Value) -> Result<bool, RenderError> {
        Ok(self.render_id(&e.id, ctx)? == "1")
    }
}

/// Step names a template refers to through `steps.NAME` or `steps['NAME']`.
/// A filter, test or function a template calls that the engine does not have.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownName {
    /// `filter`, `test` or `function`.
    pub kind: &'static str,
    pub name: String,
    /// The line within the template (1-based).
    pub line: usize,
    /// A known name close to it.
    pub suggestion: Option<&'static str>,
}

/// Builtin names offered as "did you mean" suggestions (minijinja's builtins);
/// whether a name exists is asked of the environment itself.
const FILTER_NAMES: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "urlencode",
];
const TEST_NAMES: &[&str] = &[
    "boolean",
    "defined",
    "divisibleby",
    "endingwith",
    "eq",
    "equalto",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "gt",
    "in",
    "integer",
    "iterable",
    "le",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "safe",
    "sameas",
    "sequence",
    "startingwith",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];
const FUNCTION_NAMES: &[&str] = &["debug", "dict", "namespace", "range"];
/// A known name close to `name`: a near spelling, else one it starts or ends
/// with (`upper_case`, `touppercase` -> `upper`), the longest such.
fn suggest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    crate::diag::did_you_mean(name, known.iter().copied()).or_else(|| {
        let lower = name.to_ascii_lowercase();
        known
            .iter()
            .copied()
            .filter(|k| k.len() >= 3 && (lower.starts_with(k) || lower.ends_with(k)))
            .max_by_key(|k| k.len())
    })
}

/// Names a template may call that are not global functions.
const CALLABLE_LOCALS: &[&str] = &["caller", "loop", "super", "self", "varargs", "kwargs"];

impl Templates {
    /// The filters, tests and functions `source` names that this environment does
    /// not have. minijinja looks them up only when a template renders, which for
    /// a late step is after the model calls were paid for; this makes them load
    /// errors. `source` has compiled already (a syntax error is reported first).
    pub fn unknown_names(&self, source: &str) -> Vec<UnknownName> {
        use minijinja::machinery::{self, Instruction};
        let Ok(ast) = machinery::parse(source, "t", Default::default(), Default::default()) else {
            return Vec::new();
        };
        let mut g = machinery::CodeGenerator::new("t", source);
        g.compile_stmt(&ast);
        let (root, blocks) = g.finish();
        let mut defined: Vec<&str> = CALLABLE_LOCALS.to_vec();
        let mut used: Vec<(&'static str, &str, usize)> = Vec::new();
        for code in std::iter::once(&root).chain(blocks.values()) {
            for idx in 0..code.len() as u32 {
                let line = code.get_line(idx).unwrap_or(1);
                match code.get(idx) {
                    Some(Instruction::ApplyFilter(name, ..)) => used.push(("filter", name, line)),
                    Some(Instruction::PerformTest(name, ..)) => used.push(("test", name, line)),
                    Some(Instruction::CallFunction(name, _)) => used.push(("function", name, line)),
                    Some(Instruction::BuildMacro(name, ..) | Instruction::StoreLocal(name)) => {
                        defined.push(name)
                    }
                    _ => {}
                }
            }
        }
        let mut unknown: Vec<UnknownName> = Vec::new();
        for (kind, name, line) in used {
            if unknown.iter().any(|u| u.kind == kind && u.name == name)
                || (kind == "function" && defined.contains(&name))
                || self.knows(kind, name)
            {
                continue;
            }
            let known = match kind {
                "filter" => FILTER_NAMES,
                "test" => TEST_NAMES,
                _ => FUNCTION_NAMES,
            };
            unknown.push(UnknownName {
                kind,
                name: name.to_string(),
                line,
                suggestion: suggest(name, known),
            });
        }
        unknown
    }

    /// Whether the environment has filter, test or function `name`: a probe
    /// that fails with "unknown" only when it does not.
    fn knows(&self, kind: &str, name: &str) -> bool {
        use minijinja::ErrorKind;
        let (probe, missing) = match kind {
            "filter" => (format!("{{{{ none | {name} }}}}"), ErrorKind::UnknownFilter),
            "test" => (
                format!("{{% if none is {name} %}}{{% endif %}}"),
                ErrorKind::UnknownTest,
            ),
            _ => (
                format!("{{% if {name} is defined %}}1{{% endif %}}"),
                ErrorKind::UnknownFunction,
            ),
        };
        match self.env.render_str(&probe, ()) {
            // A function is a global: `is defined` says whether there is one.
            Ok(out) if kind == "function" => out == "1",
            Ok(_) => true,
            Err(e) => e.kind() != missing,
        }
    }
}

pub fn step_references(source: &str) -> Vec<String> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(r#"\bsteps(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*['"]([^'"]+)['"]\s*\])"#)
            .expect("static regex")
    });
    re.captures_iter(source)
        .filter_map(|c| {
            c.get(1)
                .or_else(|| c.get(2))
                .map(|m| m.as_str().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_templates_escape_values_but_keep_their_markup() {
        let mut t = Templates::new();
        let src = "<b>{{ labels.service }}</b> {{ summary }}";
        let html = t.add_html("m", src).unwrap();
        let plain = t.add("p", src).unwrap();
        let ctx = minijinja::Value::from_serialize(serde_json::json!({
            "labels": {"service": "<script>alert(1)</script>"}, "summary": "a & b"}));
        assert_eq!(
            t.render(&html, &ctx).unwrap(),
            "<b>&lt;script&gt;alert(1)&lt;&#x2f;script&gt;</b> a &amp; b"
        );
        assert_eq!(
            t.render(&plain, &ctx).unwrap(),
            "<b><script>alert(1)</script></b> a & b"
        );
    }

    #[test]
    fn unknown_filters_tests_and_functions_are_found_and_known_ones_are_not() {
        let t = Templates::new();
        type Found<'a> = (&'a str, &'a str, Option<&'a str>);
        let cases: &[(&str, &[Found])] = &[
            (
                "{{ labels.service | upper }} {{ x | tojson }} {{ y | default('n') }}",
                &[],
            ),
            (
                "{{ summary | upper_case }}",
                &[("filter", "upper_case", Some("upper"))],
            ),
            ("{% if x is defined and y is odd %}{% endif %}", &[]),
            (
                "{% if x is definedd %}{% endif %}",
                &[("test", "definedd", Some("defined"))],
            ),
            (
                "{% for i in range(3) %}{{ loop.index }}{% endfor %}{{ dict(a=1) }}",
                &[],
            ),
            ("{{ now() }}", &[("function", "now", None)]),
            ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1) }}", &[]),
            (
                "line one\n{{ a | nope }}\n{{ b | nope }}",
                &[("filter", "nope", None)],
            ),
            ("{{ items.keys() }} {{ s.upper() }}", &[]),
        ];
        for (source, want) in cases {
            let found = t.unknown_names(source);
            let got: Vec<Found> = found
                .iter()
                .map(|u| (u.kind, u.name.as_str(), u.suggestion))
                .collect();
            assert_eq!(&got, want, "{source}");
        }
        let lines = t.unknown_names("a\nb\n{{ x | nope }}");
        assert_eq!(lines[0].line, 3, "the template line it sits on");
    }

    #[test]
    fn renders_and_evaluates() {
        let mut t = Templates::new();
        let tpl = t.add("p", "hi {{ name }}").unwrap();
        let ex = t.add_expr("w", "n > 2").unwrap();
        let ctx = minijinja::context! { name => "bob", n => 3 };
        assert_eq!(t.render(&tpl, &ctx).unwrap(), "hi bob");
        assert!(t.eval(&ex, &ctx).unwrap());
        assert!(!t.eval(&ex, &minijinja::context! { n => 1 }).unwrap());
        // Undefined names are falsy, not errors.
        assert!(!t.eval(&ex, &minijinja::context! {}).unwrap());
    }

    #[test]
    fn compile_errors_carry_the_line() {
        let mut t = Templates::new();
        let err = t
            .add("p", "line one\nline two\n{{ labels.x \n")
            .unwrap_err();
        assert_eq!(err.line, 3);
        assert!(
            err.message.starts_with("template syntax error"),
            "{}",
            err.message
        );
        assert!(t.add_expr("w", "a >").is_err());
    }

    #[test]
    fn finds_step_references() {
        let refs =
            step_references("{{ steps.triage.summary }} {{ steps['fo/0'].x }} {{ mysteps.y }}");
        assert_eq!(refs, vec!["triage".to_string(), "fo/0".to_string()]);
    }
}
