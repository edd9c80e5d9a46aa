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
