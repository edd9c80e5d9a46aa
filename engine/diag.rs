//! Diagnostics: every problem found while loading config or pipelines, with the
//! file, line and column it points at, the field path, and a hint.
//!
//! Loading collects all diagnostics at once instead of stopping at the first, so an
//! operator fixes a broken pipeline folder in one pass.

use std::fmt;
use std::sync::Arc;

/// A position in a source file. Lines and columns are 1-based, as editors show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub file: Arc<str>,
    pub line: usize,
    pub col: usize,
}

impl Span {
    pub fn new(file: Arc<str>, line: usize, col: usize) -> Self {
        Span { file, line, col }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem: where it is, which field, what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub span: Span,
    /// The field path, e.g. `steps[2].fan_out.over`; empty for whole-file problems.
    pub path: String,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}:{}:{}: {}: ",
            self.span.file, self.span.line, self.span.col, level
        )?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        write!(f, "{}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n    hint: {hint}")?;
        }
        Ok(())
    }
}

impl Diagnostic {
    /// Where it is, which field, what and how to fix, as JSON fields (the reload
    /// API's 422 and the JSON log both use these names).
    pub fn fields_json(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        m.insert("severity".into(), severity.into());
        m.insert("file".into(), self.span.file.as_ref().into());
        m.insert("line".into(), self.span.line.into());
        m.insert("column".into(), self.span.col.into());
        m.insert("path".into(), self.path.as_str().into());
        m.insert("message".into(), self.message.as_str().into());
        m.insert("hint".into(), self.hint.as_deref().into());
        m
    }
}

/// An ordered collection of diagnostics.
#[derive(Debug, Default, Clone)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn error(&mut self, span: &Span, path: &str, message: impl Into<String>) -> &mut Self {
        self.push(Severity::Error, span, path, message.into(), None)
    }

    pub fn error_hint(
        &mut self,
        span: &Span,
        path: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> &mut Self {
        self.push(
            Severity::Error,
            span,
            path,
            message.into(),
            Some(hint.into()),
        )
    }

    pub fn warning(&mut self, span: &Span, path: &str, message: impl Into<String>) -> &mut Self {
        self.push(Severity::Warning, span, path, message.into(), None)
    }

    pub fn warning_hint(
        &mut self,
        span: &Span,
        path: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> &mut Self {
        self.push(
            Severity::Warning,
            span,
            path,
            message.into(),
            Some(hint.into()),
        )
    }

    fn push(
        &mut self,
        severity: Severity,
        span: &Span,
        path: &str,
        message: String,
        hint: Option<String>,
    ) -> &mut Self {
        self.items.push(Diagnostic {
            severity,
            span: span.clone(),
            path: path.to_string(),
            message,
            hint,
        });
        self
    }

    pub fn extend(&mut self, other: Diagnostics) {
        self.items.extend(other.items);
    }

    pub fn has_errors(&self) -> bool {
        self.items.iter().any(|d| d.severity == Severity::Error)
    }

    pub fn error_count(&self) -> usize {
        self.items
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| d.severity == Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items
            .iter()
            .filter(|d| d.severity == Severity::Warning)
    }

    /// How many diagnostics there are so far.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Rewrites the field path of every diagnostic from index `start` on.
    pub fn relabel_from(&mut self, start: usize, relabel: impl Fn(&str) -> String) {
        for d in self.items.iter_mut().skip(start) {
            d.path = relabel(&d.path);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Sorts by file, line and column so output reads top to bottom.
    pub fn sort(&mut self) {
        self.items.sort_by(|a, b| {
            (&a.span.file, a.span.line, a.span.col).cmp(&(&b.span.file, b.span.line, b.span.col))
        });
    }

    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.items
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.items {
            writeln!(f, "{d}")?;
        }
        Ok(())
    }
}

/// The closest known name to `unknown`, if one is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    unknown: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (strsim::damerau_levenshtein(unknown, k), k))
        .filter(|(dist, k)| *dist <= 1.max(k.len() / 4))
        .min_by_key(|(dist, _)| *dist)
        .map(|(_, k)| k)
}
