//! The operator web UI (SPEC 12): pages rendered on the server from templates
//! embedded in the binary, readable without JavaScript; one small script
//! (`static/app.js`) follows a run's events and refreshes lists.
//!
//! Pure: `views` turns store records into what a page shows, `timeline` and
//! `graph` lay out the drawings, and [`render`] fills a template. Every template
//! is autoescaped (`.html`): a value from a payload, a label or an agent's output
//! is text on the page, never markup. The handlers that read the store and
//! answer HTTP are in `http::ui`.

use std::sync::OnceLock;

use minijinja::{AutoEscape, Environment};

pub mod graph;
pub mod timeline;
pub mod views;

/// A page that could not be rendered: a template bug, never user input.
#[derive(Debug, thiserror::Error)]
#[error("rendering {template}: {message}")]
pub struct RenderError {
    pub template: String,
    pub message: String,
}

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("runs.html", include_str!("templates/runs.html")),
    ("run.html", include_str!("templates/run.html")),
    ("pipelines.html", include_str!("templates/pipelines.html")),
    ("pipeline.html", include_str!("templates/pipeline.html")),
    ("approvals.html", include_str!("templates/approvals.html")),
    ("login.html", include_str!("templates/login.html")),
    ("message.html", include_str!("templates/message.html")),
    ("decide.html", include_str!("templates/decide.html")),
];

/// The UI's static files: path under `/ui/static/`, content type, bytes.
pub const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("static/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("static/style.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("static/favicon.svg"),
    ),
];

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_auto_escape_callback(|name| {
            if name.ends_with(".html") {
                AutoEscape::Html
            } else {
                AutoEscape::None
            }
        });
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        env.add_filter("seg", |s: String| path_segment(&s));
        env.add_filter("q", |s: String| crate::ui::query_value(&s));
        for (name, source) in TEMPLATES {
            // The templates are part of the binary; `templates_compile` tests them.
            if let Err(e) = env.add_template(name, source) {
                tracing::error!(template = name, error = %e, "A UI template does not compile.");
            }
        }
        env
    })
}

/// Fills template `name` with `context`.
pub fn render(name: &str, context: &serde_json::Value) -> Result<String, RenderError> {
    let fail = |e: minijinja::Error| RenderError {
        template: name.to_string(),
        message: format!("{e:#}"),
    };
    environment()
        .get_template(name)
        .map_err(fail)?
        .render(context)
        .map_err(fail)
}

/// `s` as one path segment of a URL (a run id, a pipeline name).
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `s` as a query value.
pub fn query_value(s: &str) -> String {
    path_segment(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_compile() {
        for (name, source) in TEMPLATES {
            let mut env = Environment::new();
            for (n, s) in TEMPLATES {
                env.add_template(n, s).expect(n);
            }
            assert!(env.get_template(name).is_ok(), "{name}: {source:.40}");
        }
    }

    #[test]
    fn values_are_escaped_on_every_page() {
        let hostile = "<script>alert(1)</script>\"'&";
        let ctx = serde_json::json!({"title": hostile, "message": hostile});
        let html = render("message.html", &ctx).expect("renders");
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;"), "{html}");
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(path_segment("a b/c"), "a%20b%2Fc");
        assert_eq!(path_segment("run-1_x.y"), "run-1_x.y");
    }
}
