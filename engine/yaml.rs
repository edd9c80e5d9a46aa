//! A YAML document as a tree of nodes that remember where they came from.
//!
//! serde-based YAML loaders forget positions; validation needs them to print
//! `FILE:LINE:COL` for every problem. This module turns the event stream of
//! `yaml-rust2` into [`Node`]s carrying a [`Span`], and can convert a node into a
//! `serde_json::Value` for the parts of a pipeline that stay free-form
//! (`executor_config`, notification `config`, `vars`).

use std::collections::HashMap;
use std::sync::Arc;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::diag::Span;

/// How a scalar was written. Block scalars (`|`, `>`) start on the line after the
/// indicator, which matters when mapping a template error back to a YAML line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarStyle {
    Plain,
    Quoted,
    Block,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub span: Span,
    pub style: ScalarStyle,
}

impl Node {
    pub fn new(value: Value, span: Span) -> Self {
        Node {
            value,
            span,
            style: ScalarStyle::Plain,
        }
    }

    /// A short name for the node's type, used in "expected X, found Y" messages.
    pub fn type_name(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }

    /// Looks up a key in a mapping node.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// The scalar as text, whatever YAML type it was parsed as. Used where the
    /// original schema accepted any scalar as a string (labels, match values).
    pub fn scalar_text(&self) -> Option<String> {
        match &self.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// Converts to JSON, dropping positions. Mapping keys become strings.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(J::Number)
                .unwrap_or(J::Null),
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.scalar_text().unwrap_or_default(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// Applies `f` to every string scalar in the tree (used for `${VAR}` expansion).
    pub fn map_strings(&mut self, f: &mut dyn FnMut(&str) -> String) {
        match &mut self.value {
            Value::Str(s) => *s = f(s),
            Value::Seq(items) => items.iter_mut().for_each(|n| n.map_strings(f)),
            Value::Map(entries) => entries.iter_mut().for_each(|(_, v)| v.map_strings(f)),
            _ => {}
        }
    }
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub span: Span,
    pub message: String,
}

/// Parses one YAML document. An empty document is `Null`.
pub fn parse(file: &Arc<str>, source: &str) -> Result<Node, SyntaxError> {
    let mut builder = Builder {
        file: file.clone(),
        stack: Vec::new(),
        root: None,
        anchors: HashMap::new(),
        error: None,
    };
    let mut parser = Parser::new_from_str(source);
    if let Err(e) = parser.load(&mut builder, false) {
        let m = e.marker();
        return Err(SyntaxError {
            span: Span::new(file.clone(), m.line().max(1), m.col() + 1),
            message: format!("invalid YAML: {}", e.info()),
        });
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder
        .root
        .unwrap_or_else(|| Node::new(Value::Null, Span::new(file.clone(), 1, 1))))
}

enum Frame {
    Seq(Node, usize),
    Map(Node, usize, Option<Node>),
}

struct Builder {
    file: Arc<str>,
    stack: Vec<Frame>,
    root: Option<Node>,
    anchors: HashMap<usize, Node>,
    error: Option<SyntaxError>,
}

impl Builder {
    fn span(&self, mark: Marker) -> Span {
        Span::new(self.file.clone(), mark.line().max(1), mark.col() + 1)
    }

    fn insert(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Frame::Seq(seq, _)) => {
                if let Value::Seq(items) = &mut seq.value {
                    items.push(node);
                }
            }
            Some(Frame::Map(map, _, pending_key)) => match pending_key.take() {
                None => *pending_key = Some(node),
                Some(key) => {
                    if let Value::Map(entries) = &mut map.value {
                        entries.push((key, node));
                    }
                }
            },
        }
    }
}

fn plain_scalar(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = text.parse::<i64>() {
        return Value::Int(i);
    }
    let looks_numeric = text
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
        && text.chars().any(|c| c.is_ascii_digit());
    if looks_numeric {
        if let Ok(f) = text.parse::<f64>() {
            return Value::Float(f);
        }
    }
    match text {
        ".inf" | ".Inf" | "+.inf" => Value::Float(f64::INFINITY),
        "-.inf" | "-.Inf" => Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" => Value::Float(f64::NAN),
        _ => Value::Str(text.to_string()),
    }
}

fn is_str_tag(tag: &Option<Tag>) -> bool {
    tag.as_ref().is_some_and(|t| t.suffix == "str")
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let (value, style) = match style {
                    TScalarStyle::Plain if !is_str_tag(&tag) => {
                        (plain_scalar(&text), ScalarStyle::Plain)
                    }
                    TScalarStyle::Literal | TScalarStyle::Folded => {
                        (Value::Str(text), ScalarStyle::Block)
                    }
                    _ => (Value::Str(text), ScalarStyle::Quoted),
                };
                let node = Node {
                    value,
                    span: self.span(mark),
                    style,
                };
                self.insert(node, anchor);
            }
            Event::SequenceStart(anchor, _) => {
                let node = Node::new(Value::Seq(Vec::new()), self.span(mark));
                self.stack.push(Frame::Seq(node, anchor));
            }
            Event::MappingStart(anchor, _) => {
                let node = Node::new(Value::Map(Vec::new()), self.span(mark));
                self.stack.push(Frame::Map(node, anchor, None));
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Seq(node, anchor)) | Some(Frame::Map(node, anchor, _)) => {
                    self.insert(node, anchor)
                }
                None => {}
            },
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(mut node) => {
                    node.span = self.span(mark);
                    self.insert(node, 0);
                }
                None => {
                    self.error = Some(SyntaxError {
                        span: self.span(mark),
                        message: "invalid YAML: alias to an unknown anchor".into(),
                    })
                }
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Arc<str> {
        Arc::from("t.yaml")
    }

    #[test]
    fn positions_are_one_based() {
        let n = parse(&file(), "a: 1\nb:\n  c: [x, 2.5]\n").unwrap();
        let b = n.get("b").unwrap();
        let c = b.get("c").unwrap();
        assert_eq!((c.span.line, c.span.col), (3, 6));
        let items = c.as_seq().unwrap();
        assert_eq!(items[0].value, Value::Str("x".into()));
        assert_eq!(items[1].value, Value::Float(2.5));
        assert_eq!(n.get("a").unwrap().value, Value::Int(1));
    }

    #[test]
    fn block_scalar_is_marked_block() {
        let n = parse(&file(), "p: |\n  one\n  two\n").unwrap();
        let p = n.get("p").unwrap();
        assert_eq!(p.style, ScalarStyle::Block);
        assert_eq!(p.as_str(), Some("one\ntwo\n"));
        // The mark of a block scalar is its first non-blank content line.
        assert_eq!((p.span.line, p.span.col), (2, 3));
        let n2 = parse(&file(), "x: 1\np: |\n\n  one\n  two\nq: 1\n").unwrap();
        assert_eq!(n2.get("p").unwrap().span.line, 4);
    }

    #[test]
    fn syntax_error_has_position() {
        let err = parse(&file(), "a: [1, 2\nb: 3\n").unwrap_err();
        assert!(err.message.starts_with("invalid YAML"));
        assert!(err.span.line >= 1);
    }

    #[test]
    fn aliases_resolve() {
        let n = parse(&file(), "a: &x {k: v}\nb: *x\n").unwrap();
        assert_eq!(n.get("b").unwrap().get("k").unwrap().as_str(), Some("v"));
    }
}
