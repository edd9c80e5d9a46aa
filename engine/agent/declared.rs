//! Running one declared tool call (`tools:` of `config.yaml`, SPEC 10).
//!
//! The arguments come from a model, so they are outside data: they are checked
//! against the tool's `parameters` before anything runs, a webhook tool sends them
//! as the JSON body and never as a URL or header, and a shell tool renders them
//! into argv entries with no shell in between: `; rm -rf /` in an argument stays
//! one literal argument. Every call carries its effect key and attempt
//! (`Idempotency-Key` / `VECTORSTEP_IDEMPOTENCY_KEY`), so a peer can tell a
//! re-run after a crash from a new call. The HTTP bound per peer and the process
//! handling (own group, killed on timeout or drop, capped output) are the
//! executors' own (`executor::http`, `executor::shell`).

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde_json::Value;

use super::schema;
use crate::config::{DeclaredTool, ShellTool, ToolRun, WebhookTool};
use crate::executor::http;
use crate::executor::shell;

/// A webhook tool without `timeout_seconds` waits this long for its answer.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);
/// A shell tool without `timeout_seconds` is killed after this long.
pub const DEFAULT_SHELL_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a failing peer's answer or a command's stderr a result quotes.
const EXCERPT_CHARS: usize = 1000;

/// Which call this is: the effect key `<run_id>:<step path>:<iteration>:<turn>:<call
/// index>` (SPEC 10.2) and the attempt, 1 unless the call is run again after a crash.
#[derive(Debug, Clone, Copy)]
pub struct CallIdentity<'a> {
    pub effect_key: &'a str,
    pub attempt: u32,
}

/// What the tool answered; both kinds go back to the model as the tool's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    /// The tool ran and reported failure (non-2xx, non-zero exit), or the
    /// arguments were refused before it ran (schema, or an argument a command
    /// prints that was not given).
    pub failed: bool,
}

impl ToolOutput {
    fn ok(text: String) -> ToolOutput {
        ToolOutput {
            text,
            failed: false,
        }
    }

    fn failed(text: String) -> ToolOutput {
        ToolOutput { text, failed: true }
    }
}

/// The tool could not be run at all, so there is no result from it: whether it had
/// an effect is unknown (a connection that broke, a command that hung).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The call could not be made or its answer was lost: connection refused,
    /// a timeout, a program that cannot be started. Another attempt may work.
    #[error("tool `{tool}`: {message}")]
    Transport { tool: String, message: String },
    /// The tool cannot work as configured (a header name or value that is not
    /// one): another attempt fails the same way.
    #[error("tool `{tool}`: {message}")]
    Config { tool: String, message: String },
    /// A shell tool ran past its timeout and was killed with its process group.
    #[error("tool `{tool}`: {message}")]
    TimedOut { tool: String, message: String },
}

impl Error {
    /// Whether another attempt may succeed.
    pub fn is_retriable(&self) -> bool {
        !matches!(self, Error::Config { .. })
    }
}

/// Runs one call of `tool` with `arguments`. Arguments that do not fit the tool's
/// `parameters` are refused with a failed output naming every problem; the tool is
/// not run.
pub async fn run(
    client: &reqwest::Client,
    tool: &DeclaredTool,
    arguments: &Value,
    id: CallIdentity<'_>,
) -> Result<ToolOutput, Error> {
    if let Err(problems) = schema::validate(&tool.parameters, arguments) {
        return Ok(ToolOutput::failed(format!(
            "invalid arguments for `{}`:\n{problems}",
            tool.name
        )));
    }
    match &tool.run {
        ToolRun::Webhook(w) => webhook(client, &tool.name, w, arguments, id).await,
        ToolRun::Shell(s) => run_shell(&tool.name, s, arguments, id).await,
    }
}

async fn webhook(
    client: &reqwest::Client,
    name: &str,
    w: &WebhookTool,
    arguments: &Value,
    id: CallIdentity<'_>,
) -> Result<ToolOutput, Error> {
    let timeout = http::seconds(w.timeout_seconds).unwrap_or(DEFAULT_WEBHOOK_TIMEOUT);
    let req = client
        .post(&w.url)
        .headers(headers(name, w, id)?)
        .timeout(timeout)
        .body(arguments.to_string());
    let reply = http::send(req, "POST", &w.url)
        .await
        .map_err(|e| Error::Transport {
            tool: name.to_string(),
            message: e.to_string(),
        })?;
    if !reply.is_success() {
        return Ok(ToolOutput::failed(format!(
            "HTTP {}: {}",
            reply.status.as_u16(),
            http::excerpt(&reply.body, EXCERPT_CHARS)
        )));
    }
    Ok(ToolOutput::ok(reply.body))
}

/// JSON content type, the configured headers, then the effect headers, which
/// always win so a re-run is recognisable.
fn headers(name: &str, w: &WebhookTool, id: CallIdentity<'_>) -> Result<HeaderMap, Error> {
    let config = |message: String| Error::Config {
        tool: name.to_string(),
        message,
    };
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (key, value) in &w.headers {
        let key = HeaderName::from_bytes(key.as_bytes())
            .map_err(|_| config(format!("`{key}` is not a valid header name")))?;
        // The value is not quoted: it usually carries a token.
        let value = HeaderValue::from_str(value)
            .map_err(|_| config(format!("header `{key}` has an invalid value")))?;
        h.insert(key, value);
    }
    h.extend(http::effect_headers(id.effect_key, id.attempt));
    Ok(h)
}

async fn run_shell(
    name: &str,
    s: &ShellTool,
    arguments: &Value,
    id: CallIdentity<'_>,
) -> Result<ToolOutput, Error> {
    // The templates compiled at load, so what fails here is the arguments (one
    // printed but not given): the model can fix that, so it is told.
    let argv = match render_argv(&s.command, arguments) {
        Ok(argv) => argv,
        Err(e) => return Ok(ToolOutput::failed(format!("cannot run `{name}`: {e}"))),
    };
    let envs = [
        (
            "VECTORSTEP_IDEMPOTENCY_KEY".to_string(),
            id.effect_key.to_string(),
        ),
        ("VECTORSTEP_ATTEMPT".to_string(), id.attempt.to_string()),
    ];
    let timeout = http::seconds(s.timeout_seconds).unwrap_or(DEFAULT_SHELL_TIMEOUT);
    let done = shell::run_argv(&argv, &envs, None, Some(timeout))
        .await
        .map_err(|e| match e {
            // The only failure `run_argv` reports as `Failed` is its timeout.
            crate::executor::Error::Failed(message) => Error::TimedOut {
                tool: name.to_string(),
                message,
            },
            other => Error::Transport {
                tool: name.to_string(),
                message: other.to_string(),
            },
        })?;
    let stdout = String::from_utf8_lossy(&done.stdout.bytes).into_owned();
    let stderr = String::from_utf8_lossy(&done.stderr.bytes);
    match done.status.code() {
        Some(0) => Ok(ToolOutput::ok(stdout)),
        Some(code) => Ok(ToolOutput::failed(format!(
            "exit status {code}: {}",
            http::tail(&stderr, EXCERPT_CHARS)
        ))),
        None => {
            use std::os::unix::process::ExitStatusExt;
            let signal = done.status.signal().unwrap_or(0);
            Ok(ToolOutput::failed(format!(
                "killed by signal {signal}: {}",
                http::tail(&stderr, EXCERPT_CHARS)
            )))
        }
    }
}

/// Each element of `command` rendered over `args`: one template, one argv entry,
/// whatever the text holds. A value printed from an undefined argument is an
/// error rather than an empty string, so `deploy/{{ args.service }}` never runs
/// as `deploy/`; `{% if args.x %}` still works for optional arguments.
pub fn render_argv(command: &[String], arguments: &Value) -> Result<Vec<String>, String> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::SemiStrict);
    let ctx = minijinja::context! { args => minijinja::Value::from_serialize(arguments) };
    let mut argv = Vec::with_capacity(command.len());
    for (i, source) in command.iter().enumerate() {
        let text = env
            .render_str(source, &ctx)
            .map_err(|e| format!("cannot render `command[{i}]`: {e}"))?;
        argv.push(text);
    }
    match argv.first() {
        Some(p) if !p.trim().is_empty() => Ok(argv),
        _ => Err("`command[0]` (the program) rendered to an empty string".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(command: &[&str], args: Value, expected: Result<&[&str], &str>) {
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let got = render_argv(&command, &args);
        match (got, expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{command:?}"),
            (Err(e), Err(want)) => assert!(e.contains(want), "{command:?}: `{e}` lacks `{want}`"),
            (got, want) => panic!("{command:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn each_template_is_one_argv_entry() {
        check(
            &["kubectl", "rollout", "restart", "deploy/{{ args.service }}"],
            json!({"service": "api"}),
            Ok(&["kubectl", "rollout", "restart", "deploy/api"]),
        );
        check(
            &["echo", "{{ args.service }}"],
            json!({"service": "x; rm -rf / && $(id) `id` | cat > /tmp/y"}),
            Ok(&["echo", "x; rm -rf / && $(id) `id` | cat > /tmp/y"]),
        );
        check(
            &["echo", "{{ args.n }}", "{{ args.tags | tojson }}"],
            json!({"n": 3, "tags": ["a", "b"]}),
            Ok(&["echo", "3", "[\"a\",\"b\"]"]),
        );
        check(
            &["echo", "{% if args.force %}--force{% endif %}"],
            json!({}),
            Ok(&["echo", ""]),
        );
        check(
            &["kubectl", "--tail", "{{ args.lines | default(100) }}"],
            json!({}),
            Ok(&["kubectl", "--tail", "100"]),
        );
        check(
            &["kubectl", "--tail", "{{ args.lines | default(100) }}"],
            json!({"lines": 5}),
            Ok(&["kubectl", "--tail", "5"]),
        );
        check(
            &["echo", "deploy/{{ args.service }}"],
            json!({}),
            Err("cannot render `command[1]`"),
        );
        check(
            &["{{ args.program }}"],
            json!({"program": " "}),
            Err("rendered to an empty string"),
        );
    }

    #[test]
    fn a_template_in_an_argument_is_not_evaluated() {
        check(
            &["echo", "{{ args.text }}"],
            json!({"text": "{{ 7 * 7 }}"}),
            Ok(&["echo", "{{ 7 * 7 }}"]),
        );
    }
}
