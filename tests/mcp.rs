//! The MCP client edge against real peers: a stdio server as a child process
//! and a streamable-HTTP server on 127.0.0.1, both small Python scripts
//! (`tests/fixtures/mcp/`) that record every request they receive to a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use vectorstep::config::{McpServer, McpTransport};
use vectorstep::mcp::{Error, McpServers};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/mcp")
        .join(name)
        .display()
        .to_string()
}

/// What a fixture server recorded, one JSON object per line.
struct Record(PathBuf);

impl Record {
    fn new(dir: &tempfile::TempDir) -> Record {
        Record(dir.path().join("record.jsonl"))
    }

    fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.0).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn of(&self, event: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// Waits until the server recorded `n` events named `event`.
    fn wait_for(&self, event: &str, n: usize) -> Vec<Value> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let found = self.of(event);
            if found.len() >= n || Instant::now() > until {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn stdio(record: &Record, env: &[(&str, &str)], timeout_seconds: f64) -> McpServer {
    let mut vars: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.insert("MCP_RECORD".into(), record.0.display().to_string());
    McpServer {
        transport: McpTransport::Stdio {
            command: vec![
                "python3".into(),
                fixture("stdio_server.py"),
                "--flag".into(),
            ],
            env: vars,
        },
        timeout_seconds,
        effects: BTreeMap::new(),
        approval: BTreeMap::new(),
    }
}

fn registry(servers: &[(&str, McpServer)]) -> McpServers {
    let map: BTreeMap<String, McpServer> = servers
        .iter()
        .map(|(n, s)| (n.to_string(), s.clone()))
        .collect();
    McpServers::new(&map, reqwest::Client::new())
}

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn pid_of(e: &Value) -> i32 {
    e["pid"].as_i64().expect("a recorded pid") as i32
}

/// Whether `pid` still runs. A zombie does not: it was killed and only waits
/// for a reaper (PID 1 here may not reap).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

fn gone_within(pid: i32, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !running(pid)
}

#[tokio::test]
async fn stdio_tools_are_listed_with_their_read_only_flag_and_called_with_meta() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    // MCP_LINGER: the server ignores its stdin closing, so only `shutdown`'s
    // kill ends it.
    let env = [("MCP_EXTRA", "from-config"), ("MCP_LINGER", "1")];
    let servers = registry(&[("k8s", stdio(&record, &env, 20.0))]);

    let tools = servers.list_tools("k8s").await.unwrap();
    let flags: Vec<(&str, bool)> = tools
        .iter()
        .map(|t| (t.name.as_str(), t.read_only))
        .collect();
    assert_eq!(
        flags,
        [
            ("echo", true),
            ("restart", false),
            ("fail", false),
            ("sleep", true),
            ("die", false)
        ]
    );
    assert_eq!(tools[1].description, "Restart a service");
    assert_eq!(tools[1].input_schema["required"], json!(["service"]));

    let r = servers
        .call_tool(
            "k8s",
            "restart",
            args(json!({"service": "api"})),
            "run1:fix:1:2:1",
            2,
        )
        .await
        .unwrap();
    assert_eq!(r.content_text, "restarted api");
    assert!(!r.is_error);
    let calls = record.of("call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["arguments"], json!({"service": "api"}));
    assert_eq!(calls[0]["meta"]["vectorstep/effect_key"], "run1:fix:1:2:1");
    assert_eq!(calls[0]["meta"]["vectorstep/attempt"], 2);

    // argv without a shell, env added, a process group of its own.
    let start = &record.of("start")[0];
    assert_eq!(start["argv"], json!(["--flag"]));
    assert_eq!(start["env"], "from-config");
    assert_eq!(start["pgid"], start["pid"]);
    servers.shutdown().await;
    assert!(gone_within(pid_of(start), Duration::from_secs(5)));
}

#[tokio::test]
async fn an_error_result_is_a_result_and_a_refusal_keeps_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let servers = registry(&[("k8s", stdio(&record, &[], 20.0))]);

    let r = servers
        .call_tool("k8s", "fail", Map::new(), "k:1", 1)
        .await
        .unwrap();
    assert!(r.is_error);
    assert_eq!(r.content_text, "boom");

    let e = servers
        .call_tool("k8s", "no_such_tool", Map::new(), "k:2", 1)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Tool { code: -32602, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "MCP server `k8s`: tools/call `no_such_tool` was refused: unknown tool no_such_tool (code -32602)"
    );
    assert!(!e.is_retriable());

    let r = servers
        .call_tool("k8s", "echo", args(json!({"text": "hi"})), "k:3", 1)
        .await
        .unwrap();
    assert_eq!(r.content_text, "echo: hi\ndone");
    assert_eq!(r.structured, Some(json!({"echoed": "hi"})));
    assert_eq!(record.of("initialize").len(), 1, "one session throughout");
    servers.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_users_share_one_session() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let servers = Arc::new(registry(&[("k8s", stdio(&record, &[], 20.0))]));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let servers = servers.clone();
            tokio::spawn(async move {
                let text = format!("t{i}");
                servers
                    .call_tool(
                        "k8s",
                        "echo",
                        args(json!({"text": text})),
                        &format!("k:{i}"),
                        1,
                    )
                    .await
            })
        })
        .collect();
    for t in tasks {
        assert!(t
            .await
            .unwrap()
            .unwrap()
            .content_text
            .starts_with("echo: t"));
    }
    assert_eq!(record.of("start").len(), 1);
    assert_eq!(record.of("initialize").len(), 1);
    assert_eq!(record.of("call").len(), 8);
    servers.shutdown().await;
}

#[tokio::test]
async fn a_timeout_kills_the_process_group_and_the_next_call_starts_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let servers = registry(&[("k8s", stdio(&record, &[("MCP_GRANDCHILD", "1")], 1.0))]);

    let started = Instant::now();
    let e = servers
        .call_tool("k8s", "sleep", args(json!({"seconds": 30})), "k:1", 1)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "MCP server `k8s`: tools/call `sleep` got no answer within 1s"
    );
    assert!(e.is_retriable());
    assert!(started.elapsed() < Duration::from_secs(10));

    let server = pid_of(&record.of("start")[0]);
    let grandchild = record.of("grandchild")[0]["child"].as_i64().unwrap() as i32;
    assert!(
        gone_within(server, Duration::from_secs(5)),
        "server {server} still runs"
    );
    assert!(
        gone_within(grandchild, Duration::from_secs(5)),
        "grandchild {grandchild} of the group still runs"
    );

    let r = servers
        .call_tool("k8s", "echo", args(json!({"text": "again"})), "k:2", 1)
        .await
        .unwrap();
    assert_eq!(r.content_text, "echo: again\ndone");
    assert_eq!(record.of("start").len(), 2);
    servers.shutdown().await;
}

#[tokio::test]
async fn a_server_that_died_is_started_again_on_the_next_use() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let servers = registry(&[("k8s", stdio(&record, &[], 20.0))]);

    servers.list_tools("k8s").await.unwrap();
    let e = servers
        .call_tool("k8s", "die", Map::new(), "k:1", 1)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Protocol { .. }), "{e:?}");
    assert!(e.is_retriable());
    assert!(
        e.to_string()
            .starts_with("MCP server `k8s`: tools/call `die` failed: "),
        "{e}"
    );

    let r = servers
        .call_tool("k8s", "echo", args(json!({"text": "back"})), "k:2", 1)
        .await
        .unwrap();
    assert_eq!(r.content_text, "echo: back\ndone");
    let starts = record.of("start");
    assert_eq!(starts.len(), 2);
    assert_ne!(starts[0]["pid"], starts[1]["pid"]);

    // A server that dies between uses is noticed too.
    let second = pid_of(&starts[1]);
    // SAFETY: signals a child process this test started.
    unsafe { libc::kill(second, libc::SIGKILL) };
    assert!(gone_within(second, Duration::from_secs(5)));
    let until = Instant::now() + Duration::from_secs(10);
    let r = loop {
        match servers
            .call_tool("k8s", "echo", args(json!({"text": "third"})), "k:3", 1)
            .await
        {
            Ok(r) => break r,
            // The kill may land before the session saw its stdout close: that
            // one call fails and drops the session, the next connects again.
            Err(e) if e.is_retriable() && Instant::now() < until => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(r.content_text, "echo: third\ndone");
    assert_eq!(record.of("start").len(), 3);
    servers.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_is_a_connect_error() {
    let servers = registry(&[(
        "broken",
        McpServer {
            transport: McpTransport::Stdio {
                command: vec!["/nonexistent/vectorstep-mcp-server".into()],
                env: BTreeMap::new(),
            },
            timeout_seconds: 5.0,
            effects: BTreeMap::new(),
            approval: BTreeMap::new(),
        },
    )]);
    let e = servers.list_tools("broken").await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("MCP server `broken`: cannot connect for tools/list: cannot start `/nonexistent/vectorstep-mcp-server`"),
        "{e}"
    );
    let e = servers.list_tools("k9s").await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "MCP server `k9s` is not configured (known: broken)"
    );
}

/// The streamable-HTTP fixture, killed when dropped.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_server(record: &Record, expect_auth: &str) -> HttpServer {
    use std::io::BufRead;
    let mut child = std::process::Command::new("python3")
        .arg(fixture("http_server.py"))
        .env("MCP_RECORD", &record.0)
        .env("MCP_EXPECT_AUTH", expect_auth)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    HttpServer {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

fn http(url: &str, headers: &[(&str, &str)]) -> McpServer {
    McpServer {
        transport: McpTransport::Http {
            url: url.to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
        timeout_seconds: 20.0,
        effects: BTreeMap::new(),
        approval: BTreeMap::new(),
    }
}

#[tokio::test]
async fn http_sessions_send_the_configured_headers_and_carry_meta() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let peer = http_server(&record, "Bearer s3cret");
    let servers = registry(&[(
        "grafana",
        http(
            &peer.url,
            &[("Authorization", "Bearer s3cret"), ("X-Team", "sre")],
        ),
    )]);

    let tools = servers.list_tools("grafana").await.unwrap();
    assert_eq!(tools.len(), 5);
    assert!(tools[0].read_only && !tools[1].read_only);

    // `echo` is answered as an SSE stream, `restart` and `fail` as JSON.
    let r = servers
        .call_tool(
            "grafana",
            "echo",
            args(json!({"text": "sse"})),
            "run9:s:1:1:1",
            1,
        )
        .await
        .unwrap();
    assert_eq!(r.content_text, "echo: sse\ndone");
    let r = servers
        .call_tool(
            "grafana",
            "restart",
            args(json!({"service": "db"})),
            "run9:s:1:1:2",
            3,
        )
        .await
        .unwrap();
    assert_eq!(r.content_text, "restarted db");
    let r = servers
        .call_tool("grafana", "fail", Map::new(), "run9:s:1:1:3", 1)
        .await
        .unwrap();
    assert!(r.is_error);

    let calls = record.of("call");
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[1]["meta"]["vectorstep/effect_key"], "run9:s:1:1:2");
    assert_eq!(calls[1]["meta"]["vectorstep/attempt"], 3);
    assert_eq!(record.of("initialize").len(), 1);
    let posts: Vec<Value> = record
        .of("http")
        .into_iter()
        .filter(|e| e["verb"] == "POST")
        .collect();
    assert!(posts.len() >= 5, "{posts:?}");
    for p in &posts {
        assert_eq!(p["authorization"], "Bearer s3cret", "{p}");
        assert_eq!(p["custom"], "sre", "{p}");
    }
    // Every request after `initialize` belongs to its session.
    assert!(posts[1..]
        .iter()
        .all(|p| p["session"] == posts[1]["session"] && !p["session"].is_null()));
    servers.shutdown().await;
}

#[tokio::test]
async fn a_refused_http_credential_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let peer = http_server(&record, "Bearer right");
    let servers = registry(&[(
        "grafana",
        http(&peer.url, &[("Authorization", "Bearer wrong")]),
    )]);
    let e = servers.list_tools("grafana").await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("MCP server `grafana`: cannot connect for tools/list:"),
        "{e}"
    );
    assert_eq!(record.of("initialize").len(), 0);
}

/// Set in the re-executed test binary that plays the parent to be killed.
const PARENT_ROLE: &str = "VECTORSTEP_TEST_MCP_PARENT_RECORD";

/// SIGKILL of the process holding the session kills its stdio server: no
/// cleanup code of ours runs, `PR_SET_PDEATHSIG` does it. This test runs the
/// test binary again (this test only) as that parent.
#[test]
fn sigkill_of_the_parent_kills_the_server() {
    if let Ok(path) = std::env::var(PARENT_ROLE) {
        let record = Record(PathBuf::from(path));
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            // MCP_LINGER: the server outlives its stdin, so only the death
            // signal can end it.
            let servers = registry(&[("k8s", stdio(&record, &[("MCP_LINGER", "1")], 20.0))]);
            servers.list_tools("k8s").await.unwrap();
            // The orchestrator sees `tools/list` recorded and kills us.
            tokio::time::sleep(Duration::from_secs(120)).await;
        });
        panic!("the parent was not killed");
    }
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let mut parent = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sigkill_of_the_parent_kills_the_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PARENT_ROLE, &record.0)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listed = record
        .wait_for("request", 2)
        .into_iter()
        .any(|e| e["method"] == "tools/list");
    let starts = record.of("start");
    if !listed || starts.is_empty() {
        let _ = parent.kill();
        panic!("the parent never listed tools: {:?}", record.events());
    }
    let server = pid_of(&starts[0]);
    assert!(running(server));
    parent.kill().unwrap(); // SIGKILL
                            // The server saw its stdin close and lingers; only PR_SET_PDEATHSIG ends it.
    parent.wait().unwrap();
    assert!(
        gone_within(server, Duration::from_secs(5)),
        "server {server} outlived its parent"
    );
}

/// A log sink for one test: what the service log would have received.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn the_server_stderr_goes_to_the_service_log_line_by_line() {
    let capture = Capture::default();
    let sink = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    // The global default, not a scoped one: tracing caches per call site whether
    // anyone listens, and the other tests of this binary hit the same call sites
    // from their threads. Their lines land here too; ours are told by the name.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let record = Record::new(&dir);
    let servers = registry(&[("stderr-check", stdio(&record, &[], 20.0))]);
    servers.list_tools("stderr-check").await.unwrap();
    let ours = |log: &str| {
        log.lines()
            .find(|l| l.contains("server=stderr-check ") && l.contains("stdio test server ready"))
            .map(str::to_string)
    };
    let until = Instant::now() + Duration::from_secs(20);
    while ours(&capture.text()).is_none() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = capture.text();
    let line = ours(&log).unwrap_or_else(|| panic!("no stderr line in the log:\n{log}"));
    let pid = pid_of(&record.of("start")[0]);
    assert!(
        line.contains("MCP server stderr.") && line.contains(&format!("pid={pid}")),
        "{line}"
    );
    servers.shutdown().await;
}

/// `mcp/` is an edge: the pure run logic never reaches it (docs/architecture.md).
#[test]
fn run_does_not_import_the_mcp_edge() {
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/run"),
        &mut files,
    );
    assert!(!files.is_empty());
    let mut offending = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains("crate::mcp") || line.contains("super::mcp") || line.contains("rmcp") {
                offending.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "run/ imports the MCP edge:\n{}",
        offending.join("\n")
    );
}
