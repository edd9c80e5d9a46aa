//! Browser tests in a real headless Chromium (Debian's `chromium`, at
//! [`CHROMIUM`]), driven over the Chrome DevTools Protocol by a small client of
//! our own: one WebSocket (tokio-tungstenite) on the test's tokio runtime, the
//! protocol's messages read as `serde_json::Value`, so a newer Chromium that adds
//! events or enum values never breaks the harness.
//!
//! - [`Browser::launch`] starts Chromium on a fresh profile in a temporary
//!   folder; dropping the [`Browser`] kills Chromium (its whole process group)
//!   and removes the profile, also when the test panics. Chromium missing fails
//!   the test with the install command ([`INSTALL`]); it never skips.
//! - [`Browser::page`] opens a tab. Every tab of a browser shares its profile, so
//!   a cookie one page sets is sent by the next, as in a real browser.
//! - A [`Page`] navigates, waits, reads, clicks, fills, evaluates and takes
//!   screenshots. Every wait is bounded ([`WAIT`]) and panics with what it saw.
//! - Every page collects its [`Problem`]s: console errors and warnings, uncaught
//!   exceptions, the browser's own error and warning messages (CSP violations,
//!   ...), failed requests, responses with status >= 400 (the favicon's too), and
//!   requests to an origin other than the page's (the origin of the last
//!   [`Page::goto`]). [`Page::assert_clean`] panics listing them.
//!
//! `VECTORSTEP_BROWSER_TRACE=1` prints every DevTools event to stderr.
//!
//! One browser per test: Chromium is killed when the thread that launched it
//! exits (`PR_SET_PDEATHSIG`), so a test binary that is killed leaves none
//! behind.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Where Debian's `chromium` package puts its launcher.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// What installs it (tests/run.sh does, when it is missing).
pub const INSTALL: &str = "apt-get install -y chromium";
/// The bound of every wait: generous, for a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);
/// How long the network must be quiet before the problems are read.
const QUIET: Duration = Duration::from_millis(500);

/// Chromium's flags. As root it needs `--no-sandbox`; the `--disable-*`
/// networking flags keep it from calling Google's services, which this
/// machine's closed network refuses (and which would be requests nobody asked
/// for).
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-default-apps",
    "--password-store=basic",
    "--use-mock-keychain",
    "--remote-debugging-port=0",
    "--window-size=1280,800",
];

// ---------------------------------------------------------------------------
// Problems.
// ---------------------------------------------------------------------------

/// What kind of problem a page had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// `console.error`, `console.warn` or a failed `console.assert`.
    Console,
    /// An exception no script caught.
    Exception,
    /// A message of the browser itself at level error or warning (a CSP
    /// violation, a blocked mixed-content request, ...).
    Browser,
    /// A request that got no response (a net error such as
    /// `net::ERR_CONNECTION_REFUSED`, or blocked).
    RequestFailed,
    /// A response with status 400 or more.
    HttpStatus,
    /// A request to an origin other than the page's.
    OtherOrigin,
}

/// One problem a page had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The request's URL, or the script's that logged or threw (may be empty).
    pub url: String,
    /// The message, the status (`404 Not Found`) or the net error.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ProblemKind::Console => "console",
            ProblemKind::Exception => "uncaught exception",
            ProblemKind::Browser => "browser message",
            ProblemKind::RequestFailed => "request failed",
            ProblemKind::HttpStatus => "HTTP status",
            ProblemKind::OtherOrigin => "request to another origin",
        };
        write!(f, "{kind}: {}", self.detail)?;
        if !self.url.is_empty() {
            write!(f, " ({})", self.url)?;
        }
        Ok(())
    }
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// The DevTools connection.
// ---------------------------------------------------------------------------

type Answer = Result<Value, String>;

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

/// One WebSocket to the browser; the pages' sessions share it (flat mode).
struct Conn {
    out: mpsc::UnboundedSender<String>,
    next_id: AtomicU64,
    pending: Mutex<Pending>,
    sessions: Mutex<HashMap<String, Arc<Mutex<PageState>>>>,
}

impl Conn {
    /// Sends `method` (to `session`, or to the browser) and waits for its answer.
    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().unwrap();
            if let Some(why) = &p.closed {
                return Err(format!("{method}: the DevTools connection is gone: {why}"));
            }
            p.waiting.insert(id, tx);
        }
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        if self.out.send(msg.to_string()).is_err() {
            self.pending.lock().unwrap().waiting.remove(&id);
            return Err(format!("{method}: the DevTools connection is gone"));
        }
        match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(answer)) => answer.map_err(|e| format!("{method}: {e}")),
            Ok(Err(_)) => Err(format!(
                "{method}: the DevTools connection closed before the answer: {}",
                self.pending
                    .lock()
                    .unwrap()
                    .closed
                    .clone()
                    .unwrap_or_default()
            )),
            Err(_) => {
                self.pending.lock().unwrap().waiting.remove(&id);
                Err(format!("{method}: no answer within {WAIT:?}"))
            }
        }
    }

    /// One message from the browser: an answer, or an event of a page's session.
    fn dispatch(&self, text: &str) {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        if let Some(id) = v.get("id").and_then(Value::as_u64) {
            let tx = self.pending.lock().unwrap().waiting.remove(&id);
            if let Some(tx) = tx {
                let answer = match v.get("error") {
                    Some(e) => Err(e.to_string()),
                    None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                };
                let _ = tx.send(answer);
            }
            return;
        }
        let method = v["method"].as_str().unwrap_or_default();
        let state = match v["sessionId"].as_str() {
            Some(sid) => self.sessions.lock().unwrap().get(sid).cloned(),
            // Browser-level: a page's target went away.
            None if method == "Target.detachedFromTarget" => v["params"]["sessionId"]
                .as_str()
                .and_then(|sid| self.sessions.lock().unwrap().get(sid).cloned()),
            None => None,
        };
        if std::env::var_os("VECTORSTEP_BROWSER_TRACE").is_some() {
            let mut line = v["params"].to_string();
            line.truncate(400);
            eprintln!("cdp event {method}: {line}");
        }
        if let Some(state) = state {
            state.lock().unwrap().on_event(method, &v["params"]);
        }
    }
}

/// Moves messages between the socket and the connection until either ends.
async fn pump(
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    mut out: mpsc::UnboundedReceiver<String>,
    conn: Arc<Conn>,
) {
    let (mut sink, mut stream) = ws.split();
    let why = loop {
        tokio::select! {
            msg = out.recv() => match msg {
                Some(text) => {
                    if let Err(e) = sink.send(Message::text(text)).await {
                        break format!("send failed: {e}");
                    }
                }
                None => break "closed by the harness".to_string(),
            },
            msg = stream.next() => match msg {
                Some(Ok(Message::Text(text))) => conn.dispatch(text.as_str()),
                Some(Ok(Message::Close(_))) | None => break "Chromium closed it".to_string(),
                Some(Ok(_)) => {}
                Some(Err(e)) => break format!("read failed: {e}"),
            },
        }
    };
    let mut p = conn.pending.lock().unwrap();
    p.closed = Some(why);
    // Dropping the senders wakes every caller still waiting.
    p.waiting.clear();
}

// ---------------------------------------------------------------------------
// The browser.
// ---------------------------------------------------------------------------

/// A headless Chromium on a fresh profile. Killed, and its profile removed, when
/// dropped.
pub struct Browser {
    child: Child,
    conn: Arc<Conn>,
    pump: tokio::task::JoinHandle<()>,
    /// Holds `profile/` and `chromium.log`.
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Browser {
    /// Starts Chromium and connects to it. Panics when [`CHROMIUM`] is missing
    /// (naming [`INSTALL`]), or when it does not start within [`WAIT`].
    pub async fn launch() -> Browser {
        Browser::launch_at(Path::new(CHROMIUM)).await
    }

    /// [`Browser::launch`] with the Chromium at `chromium`.
    pub async fn launch_at(chromium: &Path) -> Browser {
        let shown = chromium.display();
        if !chromium.exists() {
            panic!(
                "browser tests need Chromium at {shown}; install it with: {INSTALL} \
                 (tests/run.sh installs it when missing)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("vectorstep-chromium-")
            .tempdir()
            .expect("temp dir");
        let profile = dir.path().join("profile");
        std::fs::create_dir_all(&profile).expect("profile dir");
        let log = dir.path().join("chromium.log");
        let out = std::fs::File::create(&log).expect("chromium log");
        let err = out.try_clone().expect("chromium log");
        let mut cmd = Command::new(chromium);
        cmd.args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            // Its own profile's folders, not the user's.
            .env("HOME", dir.path())
            .env_remove("DISPLAY")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            // Its own process group, so that dropping the browser kills the
            // renderers and helpers with it.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {shown}: {e}; install it with: {INSTALL}"));
        let mut launching = Launching {
            child: Some(child),
            log: log.clone(),
        };

        // `--remote-debugging-port=0`: Chromium picks a port and writes it, and
        // the browser's WebSocket path, to DevToolsActivePort.
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + WAIT;
        let ws_url = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    if let Ok(port) = port.trim().parse::<u16>() {
                        break format!("ws://127.0.0.1:{port}{}", path.trim());
                    }
                }
            }
            if let Ok(Some(status)) = launching.child.as_mut().unwrap().try_wait() {
                panic!("{shown} exited at start ({status})\n{}", log_tail(&log));
            }
            assert!(
                Instant::now() < deadline,
                "{shown} did not open its DevTools port within {WAIT:?}\n{}",
                log_tail(&log)
            );
            tokio::time::sleep(POLL).await;
        };
        let ws = match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(&ws_url)).await {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => panic!("connecting to {ws_url}: {e}\n{}", log_tail(&log)),
            Err(_) => panic!("connecting to {ws_url}: timed out\n{}", log_tail(&log)),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            out: tx,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(Pending::default()),
            sessions: Mutex::new(HashMap::new()),
        });
        let pump = tokio::spawn(pump(ws, rx, conn.clone()));
        Browser {
            child: launching.child.take().unwrap(),
            conn,
            pump,
            dir,
            log,
        }
    }

    /// The process id of Chromium (the leader of its process group).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The profile folder (`--user-data-dir`), removed on drop.
    pub fn profile_dir(&self) -> PathBuf {
        self.dir.path().join("profile")
    }

    /// Chromium's version line (`Browser.getVersion`), e.g. `Chrome/148.0.7778.167`.
    pub async fn version(&self) -> String {
        let v = self.call("Browser.getVersion", json!({})).await;
        v["product"].as_str().unwrap_or_default().to_string()
    }

    /// A new tab on `about:blank`, collecting its problems from the start.
    pub async fn page(&self) -> Page {
        let target = self
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let target_id = target["targetId"].as_str().expect("targetId").to_string();
        let attached = self
            .call(
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
            )
            .await;
        let session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_string();
        let state = Arc::new(Mutex::new(PageState::new()));
        self.conn
            .sessions
            .lock()
            .unwrap()
            .insert(session.clone(), state.clone());
        let page = Page {
            conn: self.conn.clone(),
            session,
            target: target_id,
            state,
            log: self.log.clone(),
        };
        for (method, params) in [
            ("Page.enable", json!({})),
            ("Page.setLifecycleEventsEnabled", json!({"enabled": true})),
            ("Runtime.enable", json!({})),
            ("Network.enable", json!({})),
            // Bypassing the cache: every test sees the server's own answers.
            ("Network.setCacheDisabled", json!({"cacheDisabled": true})),
            ("Log.enable", json!({})),
        ] {
            page.call(method, params).await;
        }
        let tree = page.call("Page.getFrameTree", json!({})).await;
        page.state.lock().unwrap().main_frame = tree["frameTree"]["frame"]["id"]
            .as_str()
            .map(str::to_string);
        page
    }

    /// The last lines of Chromium's own output.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        self.conn
            .call(None, method, params)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&self.log)))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.pump.abort();
        kill_group(&mut self.child);
        if std::thread::panicking() {
            eprintln!("{}", log_tail(&self.log));
        }
        // The profile goes; a helper that was still writing is dead by now, but
        // try again briefly in case a file appeared while removing.
        let profile = self.dir.path().join("profile");
        for _ in 0..20 {
            match std::fs::remove_dir_all(&profile) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break,
            }
        }
    }
}

/// A Chromium that is starting: killed if the start fails.
struct Launching {
    child: Option<Child>,
    log: PathBuf,
}

impl Drop for Launching {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            kill_group(child);
        }
    }
}

/// SIGKILL to the child's process group (it leads it), then reaps it and waits
/// (bounded) until no process of the group is left.
fn kill_group(child: &mut Child) {
    let pgid = child.id() as libc::pid_t;
    // SAFETY: signals our own child's process group.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: signal 0 only asks whether a process of the group exists.
    while unsafe { libc::kill(-pgid, 0) } == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // Without a system bus (a container, CI) Chromium complains about D-Bus on
    // every start: noise, not the reason for a failure.
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains(":ERROR:dbus/"))
        .collect();
    let from = lines.len().saturating_sub(30);
    format!(
        "---- chromium output (tail) ----\n{}",
        lines[from..].join("\n")
    )
}

// ---------------------------------------------------------------------------
// What a page's events tell.
// ---------------------------------------------------------------------------

struct PageState {
    main_frame: Option<String>,
    /// The origin of the last `goto`: requests elsewhere are problems.
    origin: Option<String>,
    /// Loader ids whose document fired `load` in the main frame.
    loaded: HashSet<String>,
    /// Cross-document navigations of the main frame so far, and the last one's
    /// loader id.
    navigations: u64,
    last_loader: Option<String>,
    /// Requests sent and not answered yet: id → URL.
    in_flight: HashMap<String, String>,
    /// Every request's URL by id (for the failure and status messages).
    urls: HashMap<String, String>,
    last_network: Instant,
    problems: Vec<Problem>,
    /// Set when the tab crashed or was closed.
    gone: Option<String>,
}

impl PageState {
    fn new() -> PageState {
        PageState {
            main_frame: None,
            origin: None,
            loaded: HashSet::new(),
            navigations: 0,
            last_loader: None,
            in_flight: HashMap::new(),
            urls: HashMap::new(),
            last_network: Instant::now(),
            problems: Vec::new(),
            gone: None,
        }
    }

    fn problem(&mut self, kind: ProblemKind, url: &str, detail: String) {
        self.problems.push(Problem {
            kind,
            url: url.to_string(),
            detail,
        });
    }

    fn is_main(&self, frame: &Value) -> bool {
        match (&self.main_frame, frame.as_str()) {
            (Some(main), Some(f)) => main == f,
            _ => false,
        }
    }

    fn on_event(&mut self, method: &str, p: &Value) {
        match method {
            "Page.frameNavigated" => {
                let frame = &p["frame"];
                if frame.get("parentId").is_none() {
                    if let Some(id) = frame["id"].as_str() {
                        self.main_frame.get_or_insert_with(|| id.to_string());
                    }
                    self.navigations += 1;
                    self.last_loader = frame["loaderId"].as_str().map(str::to_string);
                }
            }
            "Page.lifecycleEvent" if p["name"] == "load" && self.is_main(&p["frameId"]) => {
                if let Some(l) = p["loaderId"].as_str() {
                    self.loaded.insert(l.to_string());
                }
            }
            "Runtime.consoleAPICalled" => {
                let level = p["type"].as_str().unwrap_or_default();
                if matches!(level, "error" | "warning" | "assert") {
                    let text = p["args"]
                        .as_array()
                        .map(|args| args.iter().map(remote_text).collect::<Vec<_>>().join(" "))
                        .unwrap_or_default();
                    let url = p["stackTrace"]["callFrames"][0]["url"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    self.problem(ProblemKind::Console, &url, format!("{level}: {text}"));
                }
            }
            "Runtime.exceptionThrown" => {
                let d = &p["exceptionDetails"];
                let text = d["exception"]["description"]
                    .as_str()
                    .or(d["text"].as_str())
                    .unwrap_or("exception")
                    .to_string();
                let url = d["url"].as_str().unwrap_or_default().to_string();
                self.problem(ProblemKind::Exception, &url, text);
            }
            "Log.entryAdded" => {
                let e = &p["entry"];
                let level = e["level"].as_str().unwrap_or_default();
                // Network entries ("Failed to load resource: ...") repeat what the
                // Network events below already report, with the status.
                if matches!(level, "error" | "warning") && e["source"] != "network" {
                    let url = e["url"].as_str().unwrap_or_default().to_string();
                    let text = format!(
                        "{} {level}: {}",
                        e["source"].as_str().unwrap_or_default(),
                        e["text"].as_str().unwrap_or_default()
                    );
                    self.problem(ProblemKind::Browser, &url, text);
                }
            }
            "Network.requestWillBeSent" => {
                self.last_network = Instant::now();
                let id = p["requestId"].as_str().unwrap_or_default().to_string();
                let url = p["request"]["url"].as_str().unwrap_or_default().to_string();
                if let (Some(own), Some(theirs)) = (&self.origin, origin_of(&url)) {
                    if *own != theirs {
                        let method = p["request"]["method"].as_str().unwrap_or("GET");
                        self.problem(
                            ProblemKind::OtherOrigin,
                            &url,
                            format!("{method} to {theirs}, the page is on {own}"),
                        );
                    }
                }
                // A new document replaces the page: what the old one had in
                // flight is abandoned with it, and Chromium reports no end for it.
                if p["type"] == "Document" {
                    self.in_flight.clear();
                }
                // An event stream stays open for the page's life: never "in
                // flight" for the quiet the problems wait for.
                // Nor the browser's own favicon fetch, which Chromium may leave
                // without an answer or an end when the page moves on (its 404 is
                // still reported when it comes).
                let favicon = reqwest::Url::parse(&url).is_ok_and(|u| u.path() == "/favicon.ico");
                if p["type"] != "EventSource" && !favicon {
                    self.in_flight.insert(id.clone(), url.clone());
                }
                self.urls.insert(id, url);
            }
            "Network.responseReceived" => {
                self.last_network = Instant::now();
                let r = &p["response"];
                // Answered: its status is known. (Chromium does not always end
                // a favicon's or a stream's request with loadingFinished.)
                if let Some(id) = p["requestId"].as_str() {
                    self.in_flight.remove(id);
                }
                let status = r["status"].as_u64().unwrap_or(0);
                if status >= 400 {
                    let url = r["url"].as_str().unwrap_or_default().to_string();
                    let text = r["statusText"].as_str().unwrap_or_default();
                    self.problem(
                        ProblemKind::HttpStatus,
                        &url,
                        format!("{status} {text}").trim_end().to_string(),
                    );
                }
            }
            "Network.loadingFinished" => {
                self.last_network = Instant::now();
                if let Some(id) = p["requestId"].as_str() {
                    self.in_flight.remove(id);
                }
            }
            "Network.loadingFailed" => {
                self.last_network = Instant::now();
                let id = p["requestId"].as_str().unwrap_or_default();
                self.in_flight.remove(id);
                // A request the page itself gave up (a navigation away while an
                // image loaded) is no fault of the page.
                if p["canceled"] != true {
                    let url = self.urls.get(id).cloned().unwrap_or_default();
                    let mut detail = p["errorText"].as_str().unwrap_or_default().to_string();
                    if let Some(why) = p["blockedReason"].as_str() {
                        detail.push_str(&format!(" (blocked: {why})"));
                    }
                    self.problem(ProblemKind::RequestFailed, &url, detail);
                }
            }
            "Inspector.targetCrashed" => self.gone = Some("the tab crashed".into()),
            "Target.detachedFromTarget" => self.gone = Some("the tab was closed".into()),
            _ => {}
        }
    }
}

/// A console argument as the console would print it.
fn remote_text(arg: &Value) -> String {
    match arg.get("value") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => arg["description"]
            .as_str()
            .or(arg["unserializableValue"].as_str())
            .or(arg["type"].as_str())
            .unwrap_or_default()
            .to_string(),
    }
}

/// `scheme://host:port` of a network URL; `None` for `data:`, `blob:`,
/// `about:` and the like, which go nowhere.
fn origin_of(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url).ok()?;
    match u.scheme() {
        "http" | "https" | "ws" | "wss" => Some(u.origin().ascii_serialization()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// A page.
// ---------------------------------------------------------------------------

/// One tab of a [`Browser`].
pub struct Page {
    conn: Arc<Conn>,
    session: String,
    target: String,
    state: Arc<Mutex<PageState>>,
    log: PathBuf,
}

impl Page {
    async fn call(&self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", log_tail(&self.log)))
    }

    async fn try_call(&self, method: &str, params: Value) -> Answer {
        self.conn.call(Some(&self.session), method, params).await
    }

    /// Navigates to `url` and waits (bounded) for its `load` event. A URL that
    /// cannot be loaded at all (refused, DNS) panics; an error status is a
    /// [`Problem`]. From now on the page's own origin is `url`'s. Problems are
    /// the tab's, not the document's: a late request of the previous document
    /// (its favicon) may still arrive, so check a page before leaving it.
    pub async fn goto(&self, url: &str) {
        self.state.lock().unwrap().origin = origin_of(url);
        let r = self.call("Page.navigate", json!({"url": url})).await;
        if let Some(e) = r["errorText"].as_str().filter(|e| !e.is_empty()) {
            panic!("goto {url}: {e}");
        }
        // No loader: a navigation within the document (a #fragment).
        let Some(loader) = r["loaderId"].as_str() else {
            return;
        };
        self.wait_loaded(loader, &format!("goto {url}")).await;
    }

    async fn wait_loaded(&self, loader: &str, what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            {
                let s = self.state.lock().unwrap();
                if s.loaded.contains(loader) {
                    return;
                }
                if let Some(gone) = &s.gone {
                    panic!("{what}: {gone}\n{}", log_tail(&self.log));
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "{what}: no load event within {WAIT:?}; the page is at {}\n{}",
                    self.try_url().await,
                    list(&self.state.lock().unwrap().problems)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Clicks the centre of the first element matching `selector` with the
    /// mouse, as a user would (so an element covered by another fails), once it
    /// exists and can be hit (bounded).
    pub async fn click(&self, selector: &str) {
        self.wait_for(selector).await;
        let deadline = Instant::now() + WAIT;
        let (x, y) = loop {
            // Scrolled into view; hit-tested at its centre.
            let hit = self
                .try_eval(&format!(
                    "(() => {{ const el = document.querySelector({s});\
                     if (!el) return {{error: 'gone'}};\
                     el.scrollIntoView({{block: 'center', inline: 'center'}});\
                     const r = el.getBoundingClientRect();\
                     if (r.width === 0 || r.height === 0) return {{error: 'has no size (hidden?)'}};\
                     const x = r.left + r.width / 2, y = r.top + r.height / 2;\
                     const top = document.elementFromPoint(x, y);\
                     if (!top || !(top === el || el.contains(top)))\
                       return {{error: 'is covered by ' + (top ? top.outerHTML.slice(0, 200) : 'nothing')}};\
                     return {{x, y}}; }})()",
                    s = js_str(selector)
                ))
                .await;
            let last = match hit {
                Ok(v) if v["x"].is_number() => {
                    break (v["x"].as_f64().unwrap(), v["y"].as_f64().unwrap())
                }
                Ok(v) => v["error"].as_str().unwrap_or("?").to_string(),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                panic!("click {selector}: the element {last} (waited {WAIT:?})");
            }
            tokio::time::sleep(POLL).await;
        };
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1}),
            )
            .await;
        }
    }

    /// [`Page::click`], then waits (bounded) until the click has navigated the
    /// page to a new document and that document has loaded (a form's submit, a
    /// link).
    pub async fn click_and_wait_navigation(&self, selector: &str) {
        let before = self.state.lock().unwrap().navigations;
        self.click(selector).await;
        let deadline = Instant::now() + WAIT;
        let loader = loop {
            {
                let s = self.state.lock().unwrap();
                if s.navigations > before {
                    if let Some(l) = &s.last_loader {
                        break l.clone();
                    }
                }
                if let Some(gone) = &s.gone {
                    panic!("click {selector}: {gone}");
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "click {selector}: no navigation within {WAIT:?}; still at {}\n{}",
                    self.try_url().await,
                    self.seen().await
                );
            }
            tokio::time::sleep(POLL).await;
        };
        self.wait_loaded(&loader, &format!("click {selector}"))
            .await;
    }

    /// Types `value` into the first element matching `selector` (an input or a
    /// textarea, replacing what it held; a select chooses the option with that
    /// value), as input events, then fires `change`.
    pub async fn fill(&self, selector: &str, value: &str) {
        self.wait_for(selector).await;
        let kind = self
            .eval(&format!(
                "(() => {{ const el = document.querySelector({s});\
                 el.focus();\
                 if (el.tagName === 'SELECT') {{\
                   el.value = {v};\
                   el.dispatchEvent(new Event('input', {{bubbles: true}}));\
                   el.dispatchEvent(new Event('change', {{bubbles: true}}));\
                   return 'select'; }}\
                 if (!('value' in el)) return 'not a field: ' + el.tagName;\
                 el.value = '';\
                 return 'text'; }})()",
                s = js_str(selector),
                v = js_str(value)
            ))
            .await;
        match kind.as_str() {
            Some("text") => {
                if !value.is_empty() {
                    self.call("Input.insertText", json!({"text": value})).await;
                }
                self.eval(&format!(
                    "document.querySelector({s}).dispatchEvent(new Event('change', {{bubbles: true}}))",
                    s = js_str(selector)
                ))
                .await;
            }
            Some("select") => {}
            other => panic!("fill {selector}: {other:?}"),
        }
        let now = self
            .eval(&format!(
                "document.querySelector({}).value",
                js_str(selector)
            ))
            .await;
        assert_eq!(
            now.as_str(),
            Some(value),
            "fill {selector}: the field holds {now} (maxlength? no such option?)"
        );
    }

    /// Waits (bounded) until an element matches `selector`; panics with the
    /// page's URL and text.
    pub async fn wait_for(&self, selector: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self
                .try_eval(&format!(
                    "(() => {{ try {{ return {{found: document.querySelector({}) !== null}}; }}\
                     catch (e) {{ return {{error: String(e)}}; }} }})()",
                    js_str(selector)
                ))
                .await;
            match found {
                Ok(v) if v["found"] == true => return,
                Ok(v) if v["error"].is_string() => {
                    panic!("wait_for {selector}: {}", v["error"].as_str().unwrap())
                }
                // Not yet there, or the page is between documents.
                _ => {}
            }
            if Instant::now() >= deadline {
                panic!(
                    "wait_for {selector}: nothing matched within {WAIT:?}\n{}",
                    self.seen().await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits (bounded) until an element matching `selector` shows `text` (in its
    /// rendered text); panics with the texts of what matched.
    pub async fn wait_for_text(&self, selector: &str, text: &str) {
        let deadline = Instant::now() + WAIT;
        let mut last = Value::Null;
        loop {
            let texts = self
                .try_eval(&format!(
                    "Array.from(document.querySelectorAll({})).map(e => e.innerText)",
                    js_str(selector)
                ))
                .await;
            if let Ok(v) = texts {
                if v.as_array().is_some_and(|a| {
                    a.iter()
                        .any(|t| t.as_str().is_some_and(|t| t.contains(text)))
                }) {
                    return;
                }
                last = v;
            }
            if Instant::now() >= deadline {
                panic!(
                    "wait_for_text {selector} {text:?}: not shown within {WAIT:?}; \
                     the elements matching showed {last}\n{}",
                    self.seen().await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The rendered text (`innerText`) of the first element matching `selector`,
    /// once one does (bounded).
    pub async fn text(&self, selector: &str) -> String {
        self.wait_for(selector).await;
        let v = self
            .eval(&format!(
                "document.querySelector({}).innerText",
                js_str(selector)
            ))
            .await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// Evaluates `js` in the page (a promise is awaited) and returns its value as
    /// JSON (`undefined` as null). An exception panics with its message.
    pub async fn eval(&self, js: &str) -> Value {
        self.try_eval(js)
            .await
            .unwrap_or_else(|e| panic!("eval {js}: {e}"))
    }

    async fn try_eval(&self, js: &str) -> Result<Value, String> {
        let r = self
            .try_call(
                "Runtime.evaluate",
                json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(d) = r.get("exceptionDetails") {
            return Err(d["exception"]["description"]
                .as_str()
                .or(d["text"].as_str())
                .unwrap_or("exception")
                .to_string());
        }
        Ok(r["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// The page's URL (`location.href`).
    pub async fn url(&self) -> String {
        self.eval("location.href")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    async fn try_url(&self) -> String {
        match self.try_eval("location.href").await {
            Ok(Value::String(u)) => u,
            other => format!("{other:?}"),
        }
    }

    /// What the page shows, for a failed wait's message: URL, title, text.
    async fn seen(&self) -> String {
        let v = self
            .try_eval(
                "({url: location.href, title: document.title,\
                  text: document.body ? document.body.innerText.slice(0, 2000) : ''})",
            )
            .await;
        match v {
            Ok(v) => format!(
                "---- the page ----\nurl: {}\ntitle: {}\ntext:\n{}",
                v["url"].as_str().unwrap_or_default(),
                v["title"].as_str().unwrap_or_default(),
                v["text"].as_str().unwrap_or_default()
            ),
            Err(e) => format!("---- the page could not be read: {e}"),
        }
    }

    /// Writes a PNG of the whole page (beyond the viewport) to `path`, creating
    /// its folder.
    pub async fn screenshot(&self, path: &Path) {
        let m = self.call("Page.getLayoutMetrics", json!({})).await;
        let size = &m["cssContentSize"];
        let (w, h) = (
            size["width"].as_f64().unwrap_or(1280.0).ceil(),
            size["height"].as_f64().unwrap_or(800.0).ceil(),
        );
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true,
                       "clip": {"x": 0, "y": 0, "width": w.max(1.0), "height": h.max(1.0), "scale": 1}}),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("screenshot base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot folder");
        }
        let mut f = std::fs::File::create(path).expect("screenshot file");
        f.write_all(&png).expect("write screenshot");
    }

    /// Waits until the page's network has been quiet for a moment (no request in
    /// flight, bounded), so that what a load started has been reported. Event
    /// streams (`EventSource`, `text/event-stream`) stay open and do not count.
    pub async fn settle(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            {
                let s = self.state.lock().unwrap();
                if s.in_flight.is_empty() && s.last_network.elapsed() >= QUIET {
                    return;
                }
                if Instant::now() >= deadline {
                    panic!(
                        "the page's network was not quiet within {WAIT:?}; in flight: {:?}",
                        s.in_flight.values().collect::<Vec<_>>()
                    );
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Every problem so far, once the network is quiet.
    pub async fn problems(&self) -> Vec<Problem> {
        self.settle().await;
        self.state.lock().unwrap().problems.clone()
    }

    /// Waits (bounded) until a problem matching `pred` has been collected, and
    /// returns it.
    pub async fn wait_for_problem(&self, what: &str, pred: impl Fn(&Problem) -> bool) -> Problem {
        let deadline = Instant::now() + WAIT;
        loop {
            {
                let s = self.state.lock().unwrap();
                if let Some(p) = s.problems.iter().find(|p| pred(p)) {
                    return p.clone();
                }
                if Instant::now() >= deadline {
                    panic!(
                        "no problem {what} within {WAIT:?}; collected:\n{}",
                        list(&s.problems)
                    );
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Panics listing the page's problems, if it had any (once the network is
    /// quiet).
    pub async fn assert_clean(&self) {
        self.assert_clean_except(|_| false).await;
    }

    /// [`Page::assert_clean`], ignoring the problems `ignore` accepts (say why at
    /// the call).
    pub async fn assert_clean_except(&self, ignore: impl Fn(&Problem) -> bool) {
        let left: Vec<Problem> = self
            .problems()
            .await
            .into_iter()
            .filter(|p| !ignore(p))
            .collect();
        if !left.is_empty() {
            panic!(
                "the page had {} problem(s):\n{}\n(at {})",
                left.len(),
                list(&left),
                self.try_url().await
            );
        }
    }

    /// Forgets the problems collected so far (e.g. after checking the expected
    /// ones).
    pub fn clear_problems(&self) {
        self.state.lock().unwrap().problems.clear();
    }

    /// Closes the tab.
    pub async fn close(self) {
        let _ = self
            .conn
            .call(None, "Target.closeTarget", json!({"targetId": self.target}))
            .await;
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.conn.sessions.lock().unwrap().remove(&self.session);
    }
}

/// `s` as a JavaScript string literal.
fn js_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}
