//! Authorisation end to end: the real `vectorstep serve` with team, operator and
//! scraper tokens. Every route of the API answers 401 without a credential and
//! 403 with one of the wrong kind; the approval page decides with its link and
//! CSRF token only; whoever decides or cancels is recorded from the credential;
//! secrets that expand empty and open listeners on public addresses stop the start.

mod common;
use common::{crash_support, service_support};

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use crash_support::{event, events};
use serde_json::{json, Value};
use service_support::*;
use vectorstep::http::RouteClass;

const TEAM: &str = "team-secret-0123456789";
const OPERATOR: &str = "operator-secret-0123456789";
const SCRAPER: &str = "scraper-secret-0123456789";

fn auth_config(protect_metrics: bool) -> String {
    format!(
        "auth:\n  teams: [{{name: sre, token: {TEAM}}}]\n  operators: [{{name: alice, token: {OPERATOR}}}]\n  \
         scrapers: [{{name: prom, token: {SCRAPER}}}]\n  protect_metrics: {protect_metrics}\n"
    )
}

/// A pipeline whose first step waits for a human; its message interpolates a label.
fn gated() -> String {
    "name: gated\nstage: production\ntrigger: {match: {}}\nsteps:\n\
     \x20 - name: approve\n    executor: human\n    timeout_seconds: 300\n\
     \x20   prompt_template: \"<b>Restart {{ labels.service }}?</b>\"\n\
     \x20 - name: after\n    executor: mock\n\
     \x20   executor_config: {output: {confidence: 0.9, summary: after, next_step_context: \"\"}}\n"
        .to_string()
}

/// A pipeline that stays in flight for a while (so it can be cancelled).
fn slow() -> String {
    "name: slow\nstage: production\ntrigger: {match: {}}\nsteps:\n\
     \x20 - name: wait\n    executor: mock\n\
     \x20   executor_config: {delay_ms: 1500, output: {confidence: 0.9, summary: s, next_step_context: \"\"}}\n\
     \x20 - name: after\n    executor: mock\n\
     \x20   executor_config: {output: {confidence: 0.9, summary: after, next_step_context: \"\"}}\n"
        .to_string()
}

/// A service with auth configured, whose harness reads runs as the operator.
async fn start_authed(extra: &str, pipelines: &[(&str, String)]) -> Intake {
    // At INFO: approval decisions are logged there.
    let mut s = Intake::start_logging("info", "", extra, pipelines).await;
    s.bearer = Some(OPERATOR.into());
    // Redirects are answers here (the UI sends a visitor without a session to
    // the token form): seen, not followed.
    s.http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    s
}

impl Intake {
    async fn call(&self, method: &str, path: &str, bearer: Option<&str>, body: Value) -> Answer {
        let url = self.url(path);
        let mut req = match method {
            "GET" => self.http.get(url),
            _ => self.http.post(url).json(&body),
        };
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }

    async fn start_run(&self, pipeline: &str, labels: Value) -> String {
        let a = self
            .call(
                "POST",
                &format!("/pipelines/{pipeline}/run"),
                Some(TEAM),
                json!({"labels": labels}),
            )
            .await;
        assert_eq!(a.status, 202, "{a:?}");
        a.run_id()
    }

    /// The one pending approval of `run`, as `GET /approvals` lists it.
    async fn pending_token(&self, run: &str) -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let list = self
                .call("GET", "/approvals", Some(OPERATOR), Value::Null)
                .await;
            assert_eq!(list.status, 200, "{list:?}");
            let found = list.json["approvals"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["run_id"] == run)
                .and_then(|a| a["token"].as_str().map(str::to_string));
            if let Some(t) = found {
                return t;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no approval for {run}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn form(&self, token: &str, fields: &[(&str, &str)]) -> Answer {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", v.replace(' ', "+")))
            .collect();
        self.post_raw(
            &format!("/approvals/{token}"),
            &[("content-type", "application/x-www-form-urlencoded")],
            body.join("&").into_bytes(),
        )
        .await
    }
}

/// The CSRF token in the approval page's form.
fn csrf_of(page: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let start = page
        .find(marker)
        .unwrap_or_else(|| panic!("no CSRF field in {page}"))
        + marker.len();
    page[start..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Every route the server declares, as the test expects its class. A route added to
/// the server without a row here fails `every_route_has_a_class_and_is_enforced`.
const EXPECTED: &[(&str, &str, RouteClass, &str)] = &[
    (
        "POST",
        "/webhook",
        RouteClass::Trigger,
        "/webhook?source=generic",
    ),
    (
        "POST",
        "/pipelines/:name/run",
        RouteClass::Trigger,
        "/pipelines/slow/run",
    ),
    ("GET", "/runs", RouteClass::Operator, "/runs"),
    (
        "GET",
        "/runs/:id",
        RouteClass::Operator,
        "/runs/no-such-run",
    ),
    (
        "POST",
        "/runs/:id/cancel",
        RouteClass::Operator,
        "/runs/no-such-run/cancel",
    ),
    (
        "POST",
        "/runs/:id/replay",
        RouteClass::Operator,
        "/runs/no-such-run/replay",
    ),
    (
        "GET",
        "/runs/:id/events",
        RouteClass::Operator,
        "/runs/no-such-run/events",
    ),
    ("GET", "/pipelines", RouteClass::Operator, "/pipelines"),
    (
        "GET",
        "/pipelines/:name",
        RouteClass::Operator,
        "/pipelines/slow",
    ),
    ("GET", "/approvals", RouteClass::Operator, "/approvals"),
    ("GET", "/replicas", RouteClass::Operator, "/replicas"),
    ("POST", "/-/reload", RouteClass::Operator, "/-/reload"),
    (
        "GET",
        "/approvals/:token",
        RouteClass::ApprovalLink,
        "/approvals/no-such-token",
    ),
    (
        "POST",
        "/approvals/:token",
        RouteClass::ApprovalLink,
        "/approvals/no-such-token",
    ),
    ("GET", "/metrics", RouteClass::Metrics, "/metrics"),
    ("GET", "/healthz", RouteClass::Open, "/healthz"),
    ("GET", "/readyz", RouteClass::Open, "/readyz"),
    ("GET", "/", RouteClass::Open, "/"),
    ("GET", "/favicon.ico", RouteClass::Open, "/favicon.ico"),
    (
        "GET",
        "/ui/static/:file",
        RouteClass::Open,
        "/ui/static/app.js",
    ),
    ("GET", "/ui", RouteClass::Ui, "/ui"),
    (
        "GET",
        "/ui/runs/:id",
        RouteClass::Ui,
        "/ui/runs/no-such-run",
    ),
    ("GET", "/ui/pipelines", RouteClass::Ui, "/ui/pipelines"),
    (
        "GET",
        "/ui/pipelines/:name",
        RouteClass::Ui,
        "/ui/pipelines/slow",
    ),
    ("GET", "/ui/approvals", RouteClass::Ui, "/ui/approvals"),
    ("POST", "/ui/logout", RouteClass::Ui, "/ui/logout"),
    ("GET", "/ui/login", RouteClass::UiLogin, "/ui/login"),
    ("POST", "/ui/login", RouteClass::UiLogin, "/ui/login"),
];

#[tokio::test]
async fn every_route_has_a_class_and_is_enforced() {
    // The server's own table and this one list the same routes with the same class.
    let declared: BTreeSet<(String, String, String)> = vectorstep::http::routes()
        .iter()
        .map(|r| {
            (
                r.method.to_string(),
                r.path.to_string(),
                format!("{:?}", r.class),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String, String)> = EXPECTED
        .iter()
        .map(|(m, p, c, _)| (m.to_string(), p.to_string(), format!("{c:?}")))
        .collect();
    assert_eq!(
        declared, expected,
        "routes served vs routes this test knows"
    );

    let s = start_authed(&auth_config(false), &[("slow", slow())]).await;
    for (method, pattern, class, path) in EXPECTED {
        let body = json!({"decision": "approve"});
        let none = s.call(method, path, None, body.clone()).await;
        let team = s.call(method, path, Some(TEAM), body.clone()).await;
        let scraper = s.call(method, path, Some(SCRAPER), body.clone()).await;
        let operator = s.call(method, path, Some(OPERATOR), body.clone()).await;
        let wrong = s.call(method, path, Some("not-a-token"), body).await;
        let what = format!("{method} {pattern} ({class:?})");
        match class {
            RouteClass::Open | RouteClass::Metrics => {
                // `/` sends everyone on to the UI, which decides.
                let expected = if *path == "/" { 303 } else { 200 };
                for a in [&none, &team, &scraper, &operator, &wrong] {
                    assert_eq!(a.status, expected, "{what}: {a:?}");
                }
            }
            RouteClass::Ui => {
                // Without a credential, or with one that matches nothing: to the
                // token form, which brings the visitor back.
                for a in [&none, &wrong] {
                    assert_eq!(a.status, 303, "{what}: {a:?}");
                }
                team.assert_error(403);
                scraper.assert_error(403);
                assert!(
                    ![401, 403].contains(&operator.status),
                    "{what}: {operator:?}"
                );
            }
            RouteClass::UiLogin if *method == "GET" => {
                for a in [&none, &team, &operator] {
                    assert_eq!(a.status, 200, "{what}: {a:?}");
                }
            }
            RouteClass::UiLogin => {
                // The token form's POST needs its CSRF token, whatever else is sent.
                for a in [&none, &team, &operator] {
                    assert_eq!(a.status, 403, "{what}: {a:?}");
                }
            }
            RouteClass::Trigger => {
                none.assert_error(401);
                wrong.assert_error(401);
                scraper.assert_error(403);
                for a in [&team, &operator] {
                    assert!(![401, 403].contains(&a.status), "{what}: {a:?}");
                }
            }
            RouteClass::Operator => {
                none.assert_error(401);
                wrong.assert_error(401);
                team.assert_error(403);
                scraper.assert_error(403);
                assert!(
                    ![401, 403].contains(&operator.status),
                    "{what}: {operator:?}"
                );
            }
            RouteClass::ApprovalLink if *method == "GET" => {
                // The link is the credential: an unknown one is simply not found.
                for a in [&none, &team, &operator] {
                    assert_eq!(a.status, 404, "{what}: {a:?}");
                }
            }
            RouteClass::ApprovalLink => {
                // Deciding through the JSON API needs an operator.
                none.assert_error(401);
                team.assert_error(403);
                assert_eq!(operator.status, 404, "{what}: {operator:?}");
            }
        }
    }
    // A team token on an operator route is told what it needs.
    let a = s.call("GET", "/runs", Some(TEAM), Value::Null).await;
    assert!(a.text.contains("operator token"), "{a:?}");
}

#[tokio::test]
async fn protected_metrics_need_a_scraper_or_an_operator() {
    let s = start_authed(&auth_config(true), &[]).await;
    s.call("GET", "/metrics", None, Value::Null)
        .await
        .assert_error(401);
    s.call("GET", "/metrics", Some(TEAM), Value::Null)
        .await
        .assert_error(403);
    for t in [SCRAPER, OPERATOR] {
        let a = s.call("GET", "/metrics", Some(t), Value::Null).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.text.contains("vectorstep_"), "{a:?}");
    }
    assert_eq!(
        s.call("GET", "/healthz", None, Value::Null).await.status,
        200
    );
}

#[tokio::test]
async fn the_page_decides_with_its_link_and_csrf_token_and_records_who() {
    let s = start_authed(&auth_config(false), &[("gated", gated()), ("slow", slow())]).await;
    let run = s
        .start_run("gated", json!({"service": "<script>alert(1)</script>"}))
        .await;
    let token = s.pending_token(&run).await;

    // The page: run, step, question (template markup kept, the label escaped), time left.
    let page = s
        .call("GET", &format!("/approvals/{token}"), None, Value::Null)
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.text.contains(&run), "{}", page.text);
    assert!(page.text.contains("approve"), "{}", page.text);
    assert!(
        page.text.contains("<b>Restart &lt;script&gt;"),
        "{}",
        page.text
    );
    assert!(!page.text.contains("<script>"), "{}", page.text);
    assert!(page.text.contains("left"), "{}", page.text);
    let csrf = csrf_of(&page.text);

    // Without the CSRF token, or with another one, nothing is decided.
    let no_csrf = s
        .form(&token, &[("decision", "approve"), ("by", "mallory")])
        .await;
    assert_eq!(no_csrf.status, 403, "{no_csrf:?}");
    let forged = s
        .form(
            &token,
            &[
                ("csrf", &"0".repeat(64)),
                ("decision", "approve"),
                ("by", "mallory"),
            ],
        )
        .await;
    assert_eq!(forged.status, 403, "{forged:?}");
    // Nor through the JSON API without an operator credential, whatever `by` says.
    let api = s
        .call(
            "POST",
            &format!("/approvals/{token}"),
            None,
            json!({"decision": "approve", "by": "alice"}),
        )
        .await;
    api.assert_error(401);
    let api = s
        .call(
            "POST",
            &format!("/approvals/{token}"),
            Some(TEAM),
            json!({"decision": "approve", "by": "alice"}),
        )
        .await;
    api.assert_error(403);
    assert_eq!(s.run(&run).await["status"], "running");

    // The page's own form decides, and answers with a page.
    let ok = s
        .form(
            &token,
            &[
                ("csrf", &csrf),
                ("decision", "approve"),
                ("by", "Bob Smith"),
            ],
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert!(
        ok.text.contains("<html") && ok.text.contains("approved"),
        "{}",
        ok.text
    );
    let again = s
        .form(
            &token,
            &[("csrf", &csrf), ("decision", "reject"), ("by", "Bob")],
        )
        .await;
    assert_eq!(again.status, 409, "{again:?}");
    assert!(again.text.contains("<html"), "{}", again.text);

    let done = s
        .wait_run(&run, "completed", |r| r["status"] == "completed")
        .await;
    let decided = event(&done, "approval_decided");
    assert_eq!(
        decided["by"], "Bob Smith (approval page, 127.0.0.1)",
        "{decided:#}"
    );
    assert_eq!(decided["via"], "page", "{decided:#}");
    assert_eq!(decided["client"], "127.0.0.1", "{decided:#}");
    assert!(
        s.svc
            .log_tail()
            .contains("Approval approved by Bob Smith (approval page, 127.0.0.1)"),
        "{}",
        s.svc.log_tail()
    );

    // An operator deciding through the API is recorded as the operator.
    let run2 = s.start_run("gated", json!({"service": "web"})).await;
    let token2 = s.pending_token(&run2).await;
    let a = s
        .call(
            "POST",
            &format!("/approvals/{token2}"),
            Some(OPERATOR),
            json!({"decision": "reject", "by": "someone-else"}),
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json["by"], "alice", "{a:?}");
    let done2 = s
        .wait_run(&run2, "ended", |r| r["status"] != "running")
        .await;
    assert_eq!(
        event(&done2, "approval_decided")["by"],
        "alice",
        "{done2:#}"
    );
    assert!(
        s.svc.log_tail().contains("Approval rejected by alice"),
        "{}",
        s.svc.log_tail()
    );

    // So is an operator's cancel.
    let run3 = s.start_run("slow", json!({})).await;
    let c = s
        .call(
            "POST",
            &format!("/runs/{run3}/cancel"),
            Some(OPERATOR),
            json!({"by": "mallory"}),
        )
        .await;
    assert_eq!(c.status, 200, "{c:?}");
    let done3 = s
        .wait_run(&run3, "cancelled", |r| r["status"] == "cancelled")
        .await;
    let cancelled = events(&done3, "run_cancelled");
    assert_eq!(cancelled.len(), 1, "{done3:#}");
    assert_eq!(cancelled[0]["by"], "alice", "{done3:#}");
}

#[tokio::test]
async fn with_approvers_the_page_shows_the_request_but_does_not_decide() {
    let extra = format!(
        "{}human_approval: {{approvers: [\"12345\"]}}\n",
        auth_config(false)
    );
    let s = start_authed(&extra, &[("gated", gated())]).await;
    let run = s.start_run("gated", json!({"service": "web"})).await;
    let token = s.pending_token(&run).await;
    let page = s
        .call("GET", &format!("/approvals/{token}"), None, Value::Null)
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.text.contains("Restart web"), "{}", page.text);
    assert!(!page.text.contains("<form"), "{}", page.text);
    assert!(page.text.contains("Telegram"), "{}", page.text);
    let a = s
        .form(
            &token,
            &[("csrf", "x"), ("decision", "approve"), ("by", "eve")],
        )
        .await;
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(s.run(&run).await["status"], "running");
    // Operators may always decide through the API.
    let a = s
        .call(
            "POST",
            &format!("/approvals/{token}"),
            Some(OPERATOR),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    s.wait_run(&run, "completed", |r| r["status"] == "completed")
        .await;
}

#[tokio::test]
async fn without_auth_the_json_api_still_takes_the_body_name_but_not_text_plain() {
    let s = Intake::start("", "", &[("gated", gated())]).await;
    let run = s
        .svc
        .post_run("gated", json!({"labels": {"service": "web"}}))
        .await;
    let token = s.pending_token(&run).await;
    // A cross-site form can post text/plain without asking the server first.
    let a = s
        .post_raw(
            &format!("/approvals/{token}"),
            &[("content-type", "text/plain")],
            br#"{"decision":"approve","by":"x"}"#.to_vec(),
        )
        .await;
    a.assert_error(415);
    let a = s
        .call(
            "POST",
            &format!("/approvals/{token}"),
            None,
            json!({"decision": "approve", "by": "carol"}),
        )
        .await;
    assert_eq!(a.status, 200, "{a:?}");
    let done = s
        .wait_run(&run, "completed", |r| r["status"] == "completed")
        .await;
    assert_eq!(event(&done, "approval_decided")["by"], "carol");
}

/// `vectorstep` with `args`, in `dir`, with a clean environment plus `env`.
fn vectorstep(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vectorstep"));
    cmd.current_dir(dir)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vectorstep starts");
    // A command that should refuse must do so at once; one that starts is stopped.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("output")
}

fn write_config(dir: &std::path::Path, text: &str) {
    std::fs::create_dir_all(dir.join("pipelines")).unwrap();
    std::fs::write(dir.join("config.yaml"), text).unwrap();
}

#[test]
fn an_empty_team_token_variable_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        "server: {host: 127.0.0.1, port: 0}\ndatabase: {path: ./data/v.db}\n\
         auth:\n  teams: [{name: sre, token: \"${SRE_TOKEN}\"}]\n",
    );
    for env in [vec![], vec![("SRE_TOKEN", "")]] {
        let out = vectorstep(dir.path(), &["serve"], &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{env:?}: {stderr}");
        assert!(stderr.contains("auth.teams[0].token"), "{stderr}");
        assert!(stderr.contains("SRE_TOKEN"), "{stderr}");
        assert!(
            !dir.path().join("data/v.db").exists(),
            "nothing was created: {stderr}"
        );
    }
    // `${VAR:-}` says "not configured" and starts; shown here by `validate`, which
    // loads the same config and never needs the secret.
    write_config(
        dir.path(),
        "server: {host: 127.0.0.1, port: 0}\ndatabase: {path: ./data/v.db}\n\
         auth:\n  teams: [{name: sre, token: \"${SRE_TOKEN:-}\"}]\n",
    );
    let out = vectorstep(dir.path(), &["validate"], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_open_api_is_refused_on_a_public_address_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        "server: {host: 0.0.0.0, port: 0}\ndatabase: {path: ./data/v.db}\n",
    );
    let out = vectorstep(dir.path(), &["serve"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("allow_unauthenticated"), "{stderr}");
    write_config(
        dir.path(),
        "server: {host: 0.0.0.0, port: 0, allow_unauthenticated: true}\ndatabase: {path: ./data/v.db}\n",
    );
    let out = vectorstep(dir.path(), &["serve"], &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("listening on"), "{stdout}\n{stderr}");
    assert!(stderr.contains("every route is open"), "{stderr}");
}

#[tokio::test]
async fn the_cli_sends_its_token() {
    let s = start_authed(&auth_config(false), &[("gated", gated())]).await;
    let run = s.start_run("gated", json!({"service": "web"})).await;
    let token = s.pending_token(&run).await;
    let dir = tempfile::tempdir().unwrap();
    let url = s.url("");
    let list = |env: Vec<(&'static str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        vectorstep(dir.path(), &["approvals", "list", "--url", &url], &env)
    };
    let out = list(vec![]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("VECTORSTEP_TOKEN"));
    let out = list(vec![("VECTORSTEP_TOKEN", TEAM.to_string())]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("operator token"));
    let out = list(vec![("VECTORSTEP_TOKEN", OPERATOR.to_string())]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&token));
    let out = vectorstep(
        dir.path(),
        &[
            "approvals",
            "approve",
            &token,
            "--url",
            &url,
            "--token",
            OPERATOR,
            "--by",
            "mallory",
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("approved by alice"));
    let done = s
        .wait_run(&run, "completed", |r| r["status"] == "completed")
        .await;
    assert_eq!(event(&done, "approval_decided")["by"], "alice");
}
