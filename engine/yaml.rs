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
    /// `|`: lines are kept, so a line inside maps to a line of the file.
    Literal,
    /// `>`: lines are folded, so inner line numbers do not map back.
    Folded,
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

/// Nesting deeper than this is refused: no real pipeline comes close, and the
/// limit keeps a hostile file from exhausting the stack.
pub const MAX_DEPTH: usize = 128;
/// Nodes a document may expand to (aliases included): a small file with nested
/// aliases must not balloon into gigabytes.
pub const MAX_NODES: usize = 200_000;

/// Parses one YAML document. An empty document is `Null`.
pub fn parse(file: &Arc<str>, source: &str) -> Result<Node, SyntaxError> {
    let mut builder = Builder {
        file: file.clone(),
        stack: Vec::new(),
        root: None,
        anchors: HashMap::new(),
        error: None,
        nodes: 0,
        line_lengths: source.lines().map(|l| l.chars().count()).collect(),
    };
    // Events are pulled one by one (yaml-rust2's own loader recurses per level).
    let mut parser = Parser::new_from_str(source);
    loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => break,
            // Only the first document is read.
            Ok((Event::DocumentEnd, _)) if builder.root.is_some() => break,
            Ok((ev, mark)) => {
                builder.on_event(ev, mark);
                if builder.error.is_some() {
                    break;
                }
            }
            Err(e) => {
                let m = e.marker();
                return Err(SyntaxError {
                    span: clamp(file, source, m.line(), m.col() + 1),
                    message: format!("invalid YAML: {}", e.info()),
                });
            }
        }
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    Ok(builder
        .root
        .unwrap_or_else(|| Node::new(Value::Null, Span::new(file.clone(), 1, 1))))
}

/// Keeps a position inside the file: errors found at end of input point at the end
/// of the last line, not at a line that does not exist.
fn clamp(file: &Arc<str>, source: &str, line: usize, col: usize) -> Span {
    let lines: Vec<&str> = source.lines().collect();
    let line = line.max(1);
    if lines.is_empty() {
        return Span::new(file.clone(), 1, 1);
    }
    if line > lines.len() {
        let last = lines.len();
        return Span::new(file.clone(), last, lines[last - 1].chars().count() + 1);
    }
    Span::new(file.clone(), line, col)
}

fn count_nodes(n: &Node) -> usize {
    match &n.value {
        Value::Seq(items) => 1 + items.iter().map(count_nodes).sum::<usize>(),
        Value::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| count_nodes(k) + count_nodes(v))
                .sum::<usize>()
        }
        _ => 1,
    }
}

enum Frame {
    Seq(Node, usize),
    Map(Node, usize, Option<Node>),
}

struct Builder {
    file: Arc<str>,
    stack: Vec<Frame>,
    root: Option<Node>,
    anchors: HashMap<usize, (Node, usize)>,
    error: Option<SyntaxError>,
    nodes: usize,
    /// Characters per line, so marks at end of input can be kept inside the file.
    line_lengths: Vec<usize>,
}

impl Builder {
    fn span(&self, mark: Marker) -> Span {
        let line = mark.line().max(1);
        match self.line_lengths.len() {
            0 => Span::new(self.file.clone(), 1, 1),
            n if line > n => Span::new(self.file.clone(), n, self.line_lengths[n - 1] + 1),
            _ => Span::new(self.file.clone(), line, mark.col() + 1),
        }
    }

    fn fail(&mut self, mark: Marker, message: &str) {
        if self.error.is_none() {
            self.error = Some(SyntaxError {
                span: self.span(mark),
                message: message.to_string(),
            });
        }
    }

    fn insert(&mut self, mut node: Node, anchor: usize) {
        // A block mapping's own mark sits after its first key; point at the key.
        if let Value::Map(entries) = &node.value {
            if let Some((k, _)) = entries.first() {
                if (k.span.line, k.span.col) < (node.span.line, node.span.col) {
                    node.span = k.span.clone();
                }
            }
        }
        if anchor > 0 {
            let size = count_nodes(&node);
            self.anchors.insert(anchor, (node.clone(), size));
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

/// How YAML reads an unquoted scalar: null, boolean, integer, float or string.
pub fn plain_scalar(text: &str) -> Value {
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
                self.nodes += 1;
                let (value, style) = match style {
                    TScalarStyle::Plain if !is_str_tag(&tag) => {
                        (plain_scalar(&text), ScalarStyle::Plain)
                    }
                    TScalarStyle::Literal => (Value::Str(text), ScalarStyle::Literal),
                    TScalarStyle::Folded => (Value::Str(text), ScalarStyle::Folded),
                    _ => (Value::Str(text), ScalarStyle::Quoted),
                };
                let node = Node {
                    value,
                    span: self.span(mark),
                    style,
                };
                self.insert(node, anchor);
            }
            Event::SequenceStart(_, _) | Event::MappingStart(_, _)
                if self.stack.len() >= MAX_DEPTH =>
            {
                self.fail(
                    mark,
                    &format!("invalid YAML: nesting deeper than {MAX_DEPTH} levels"),
                );
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
                Some((_, size)) if self.nodes + size > MAX_NODES => {
                    self.fail(
                        mark,
                        &format!("invalid YAML: aliases expand past {MAX_NODES} nodes"),
                    );
                }
                Some((mut node, size)) => {
                    self.nodes += size;
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
        assert_eq!(p.style, ScalarStyle::Literal);
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

#[cfg(test)]
mod limits {
    use super::*;

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let src = format!("steps:\n  {}x\n", "- ".repeat(50_000));
        let err = parse(&Arc::from("t.yaml"), &src).unwrap_err();
        assert!(err.message.contains("nesting deeper"), "{}", err.message);
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut src = String::from("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let refs = vec![format!("*l{}", i - 1); 10].join(", ");
            src.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
        }
        let err = parse(&Arc::from("t.yaml"), &src).unwrap_err();
        assert!(err.message.contains("aliases expand"), "{}", err.message);
    }

    #[test]
    fn errors_at_end_of_input_stay_inside_the_file() {
        let err = parse(&Arc::from("t.yaml"), "{0").unwrap_err();
        assert_eq!((err.span.line, err.span.col), (1, 3));
    }

    #[test]
    fn block_mappings_point_at_their_first_key() {
        let n = parse(
            &Arc::from("t.yaml"),
            "steps:\n  - name: a\n    executor: mock\n",
        )
        .unwrap();
        let step = &n.get("steps").unwrap().as_seq().unwrap()[0];
        assert_eq!((step.span.line, step.span.col), (2, 5));
    }
}
