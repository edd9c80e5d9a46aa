//! `shell`: runs an argv list without a shell in between.

use super::{FieldSpec, Fields};
use crate::diag::Diagnostics;
use crate::yaml::Value;

pub const FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "command",
        ty: "list of templates",
        default: "required",
        doc: "The argv list; each element is rendered, nothing is parsed by a shell.",
    },
    FieldSpec {
        name: "env",
        ty: "map string -> string",
        default: "{}",
        doc: "Extra environment variables; `${VAR}` is taken from vectorstep's environment.",
    },
    FieldSpec {
        name: "cwd",
        ty: "string",
        default: "vectorstep's working directory",
        doc: "The directory the command runs in; `${VAR}` is expanded.",
    },
];

#[derive(Debug, Clone, PartialEq)]
pub struct ShellConfig {
    /// The argv as written; the runner renders element `i` as pointer `command/i`.
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
}

pub(super) fn decode(f: &mut Fields<'_>, d: &mut Diagnostics) -> Option<ShellConfig> {
    let command = f.get("command");
    let env = f.scalar_map(d, "env").unwrap_or_default();
    let cwd = f.string(d, "cwd", "a directory path");
    let path = f.path_of("command");
    let Some(n) = command else {
        d.error_hint(
            f.span(),
            f.path(),
            "the shell executor needs `executor_config.command`",
            "an argv list such as `[\"systemctl\", \"status\", \"nginx\"]`",
        );
        return None;
    };
    let Some(items) = n.as_seq() else {
        d.error_hint(
            &n.span,
            &path,
            format!("expected an argv list, found {}", n.type_name()),
            "commands run without a shell: write `command: [\"df\", \"-h\", \"{{ labels.mount }}\"]`",
        );
        return None;
    };
    if items.is_empty() {
        d.error(&n.span, &path, "the command list is empty");
        return None;
    }
    let mut argv = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let Some(s) = item.scalar_text() else {
            f.wrong_type(d, item, &p, "a string");
            ok = false;
            continue;
        };
        // A number or boolean in the argv is its text, and may hold no template.
        let mut it = item.clone();
        it.value = Value::Str(s.clone());
        f.template(format!("command/{i}"), it, p);
        argv.push(s);
    }
    ok.then_some(ShellConfig {
        command: argv,
        env,
        cwd,
    })
}
