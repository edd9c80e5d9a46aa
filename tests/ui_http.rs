//! The web UI over plain HTTP, against the real `serve` binary: the session
//! cookie and the token form, CSRF on every POST, escaping of untrusted values,
//! keyset pages of the runs list, the events stream with `Last-Event-ID`, and the
//! pipeline routes. (The same pages in a real browser: `tests/browser_ui.rs`.)

mod common;
use common::crash_support::events;
use common::service_support::*;

use std::time::Duration;

use serde_json::{json, Value};

const OPERATOR: &str = "operator-secret-0123456789";
const TEAM: &str = "team-secret-0123456789";

fn auth() -> String {
    format!(
        "auth:\n  teams: [{{name: sre, token: {TEAM}}}]\n  operators: [{{name: alice, token: {OPERATOR}}}]\n"
    )
}

fn quick(name: &str) -> String {
    pipeline(
        name,
        "production",
        "  match: {}",
        &[("triage", 0), ("gather", 0), ("notify", 0)],
    )
}

fn slow(name: &str) -> String {
    pipeline(
        name,
        "production",
        "  match: {}",
        &[("wait", 3000), ("after", 0)],
    )
}

/// A client that keeps the session cookie, as a browser does, and shows
/// redirects instead of following them.
struct Browserish {
    http: reqwest::Client,
    cookie: std::sync::Mutex<Option<String>>,
}

fn browser_like() -> Browserish {
    Browserish {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client"),
        cookie: std::sync::Mutex::new(None),
    }
}

/// A request of [`Browserish`]: sends the cookie, keeps the one it is given.
struct Req<'a> {
    b: &'a Browserish,
    req: reqwest::RequestBuilder,
}

impl Browserish {
    fn wrap(&self, req: reqwest::RequestBuilder) -> Req<'_> {
        let req = match self.cookie.lock().expect("jar").as_deref() {
            Some(c) => req.header("cookie", format!("vs_session={c}")),
            None => req,
        };
        Req { b: self, req }
    }

    fn get(&self, url: String) -> Req<'_> {
        self.wrap(self.http.get(url))
    }

    fn post(&self, url: String) -> Req<'_> {
        self.wrap(self.http.post(url))
    }
}

impl Req<'_> {
    fn form(self, fields: &[(&str, &str)]) -> Self {
        Req {
            b: self.b,
            req: self.req.form(fields),
        }
    }

    fn json(self, v: &Value) -> Self {
        Req {
            b: self.b,
            req: self.req.json(v),
        }
    }

    async fn send(self) -> Result<reqwest::Response, reqwest::Error> {
        let r = self.req.send().await?;
        for v in r.headers().get_all("set-cookie") {
            let v = v.to_str().unwrap_or_default();
            if let Some(rest) = v.strip_prefix("vs_session=") {
                let value = rest.split(';').next().unwrap_or_default();
                *self.b.cookie.lock().expect("jar") =
                    (!value.is_empty()).then(|| value.to_string());
            }
        }
        Ok(r)
    }
}

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

async fn text(r: reqwest::Response) -> (u16, String, reqwest::header::HeaderMap) {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.text().await.unwrap_or_default(), headers)
}

async fn start_run(s: &Intake, pipeline: &str, body: Value) -> String {
    let req = s
        .http
        .post(s.url(&format!("/pipelines/{pipeline}/run")))
        .json(&body);
    let req = match &s.bearer {
        Some(_) => req.bearer_auth(TEAM),
        None => req,
    };
    let a = s.send(req).await;
    assert_eq!(a.status, 202, "{a:?}");
    a.run_id()
}

#[tokio::test]
async fn without_a_session_pages_go_to_the_token_form_which_signs_in_once() {
    let mut s = Intake::start("", &auth(), &[("quick", quick("quick"))]).await;
    s.bearer = Some(OPERATOR.into());
    let id = start_run(&s, "quick", json!({"labels": {"service": "api"}})).await;
    s.wait_terminal(&id).await;
    let b = browser_like();

    for path in [
        "/ui",
        &format!("/ui/runs/{id}"),
        "/ui/pipelines",
        "/ui/approvals",
    ] {
        let (status, _, h) = text(b.get(s.url(path)).send().await.expect("GET")).await;
        assert_eq!(status, 303, "{path}");
        let to = h["location"].to_str().expect("location");
        assert!(to.starts_with("/ui/login?next="), "{path}: {to}");
    }
    // The JSON routes answer 401 without a credential, as before.
    let (status, _, _) = text(b.get(s.url("/runs")).send().await.expect("GET")).await;
    assert_eq!(status, 401);

    let (status, form, _) = text(
        b.get(s.url("/ui/login?next=/ui/pipelines"))
            .send()
            .await
            .expect("GET form"),
    )
    .await;
    assert_eq!(status, 200);
    let csrf = csrf_of(&form);
    // Without the CSRF token the form is refused; with a wrong token, no session.
    let no_csrf = b
        .post(s.url("/ui/login"))
        .form(&[("token", OPERATOR)])
        .send()
        .await
        .expect("POST");
    assert_eq!(no_csrf.status().as_u16(), 403);
    let wrong = b
        .post(s.url("/ui/login"))
        .form(&[
            ("token", TEAM),
            ("csrf", csrf.as_str()),
            ("next", "/ui/pipelines"),
        ])
        .send()
        .await
        .expect("POST");
    assert_eq!(wrong.status().as_u16(), 401);
    let ok = b
        .post(s.url("/ui/login"))
        .form(&[
            ("token", OPERATOR),
            ("csrf", csrf.as_str()),
            ("next", "/ui/pipelines"),
        ])
        .send()
        .await
        .expect("POST");
    assert_eq!(ok.status().as_u16(), 303);
    assert_eq!(ok.headers()["location"], "/ui/pipelines");
    let cookie = ok.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_string();
    for attr in ["vs_session=o.", "HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(
        !cookie.contains(OPERATOR),
        "the token itself never goes in the cookie"
    );

    // Signed in: pages, and GET routes of the API, take the cookie.
    let (status, page, _) = text(b.get(s.url("/ui")).send().await.expect("GET")).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("alice") && page.contains(&id[..8]), "{page}");
    let (status, body, _) = text(
        b.get(s.url(&format!("/runs/{id}")))
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // An open redirect is refused: `next` only ever names a page of the UI.
    let evil = b
        .post(s.url("/ui/login"))
        .form(&[
            ("token", OPERATOR),
            ("csrf", csrf_of(&page).as_str()),
            ("next", "//evil.example/"),
        ])
        .send()
        .await
        .expect("POST");
    assert_eq!(evil.headers()["location"], "/ui");
}

#[tokio::test]
async fn every_post_with_the_cookie_needs_its_csrf_token_and_the_cancel_records_the_operator() {
    let mut s = Intake::start("", &auth(), &[("slow", slow("slow"))]).await;
    s.bearer = Some(OPERATOR.into());
    let b = browser_like();
    let (_, form, _) = text(b.get(s.url("/ui/login")).send().await.expect("GET")).await;
    let signed = b
        .post(s.url("/ui/login"))
        .form(&[("token", OPERATOR), ("csrf", csrf_of(&form).as_str())])
        .send()
        .await
        .expect("POST");
    assert_eq!(signed.status().as_u16(), 303);

    let id = start_run(&s, "slow", json!({})).await;
    let (_, page, _) = text(
        b.get(s.url(&format!("/ui/runs/{id}")))
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert!(page.contains("Cancel run"), "{page}");
    let csrf = csrf_of(&page);

    // The cookie alone, as a form or as JSON, cancels nothing.
    let form = b
        .post(s.url(&format!("/runs/{id}/cancel")))
        .form(&[("by", "mallory")])
        .send()
        .await
        .expect("POST");
    assert_eq!(form.status().as_u16(), 403);
    let json_post = b
        .post(s.url(&format!("/runs/{id}/cancel")))
        .json(&json!({"by": "mallory"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(json_post.status().as_u16(), 403);
    let forged = b
        .post(s.url(&format!("/runs/{id}/cancel")))
        .form(&[("csrf", "0".repeat(64).as_str())])
        .send()
        .await
        .expect("POST");
    assert_eq!(forged.status().as_u16(), 403);
    assert_eq!(s.run(&id).await["status"], "running");

    // With the page's token: cancelled, back to the run's page, `by` is the operator.
    let ok = b
        .post(s.url(&format!("/runs/{id}/cancel")))
        .form(&[("csrf", csrf.as_str()), ("by", "mallory")])
        .send()
        .await
        .expect("POST");
    assert_eq!(ok.status().as_u16(), 303);
    assert_eq!(ok.headers()["location"], format!("/ui/runs/{id}").as_str());
    let done = s.wait_terminal(&id).await;
    assert_eq!(done["status"], "cancelled", "{done:#}");
    let cancelled = events(&done, "run_cancelled");
    assert_eq!(cancelled.len(), 1, "{done:#}");
    assert_eq!(cancelled[0]["by"], "alice", "{done:#}");
}

#[tokio::test]
async fn without_auth_the_ui_is_open_and_csrf_stays_on() {
    let s = Intake::start("", "", &[("slow", slow("slow"))]).await;
    let b = browser_like();
    let id = start_run(&s, "slow", json!({})).await;
    let r = b
        .get(s.url(&format!("/ui/runs/{id}")))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status().as_u16(), 200);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_string();
    assert!(
        cookie.starts_with("vs_session=a."),
        "an anonymous session: {cookie}"
    );
    let page = r.text().await.expect("body");
    // A page of another site can post a form, but not with this token.
    let plain = reqwest::Client::new();
    let cross = plain
        .post(s.url(&format!("/runs/{id}/cancel")))
        .form(&[("by", "x")])
        .send()
        .await
        .expect("POST");
    assert_eq!(cross.status().as_u16(), 403);
    let ok = b
        .post(s.url(&format!("/runs/{id}/cancel")))
        .form(&[("csrf", csrf_of(&page).as_str()), ("by", "carol")])
        .send()
        .await
        .expect("POST");
    assert_eq!(ok.status().as_u16(), 303);
    let done = s.wait_terminal(&id).await;
    assert_eq!(events(&done, "run_cancelled")[0]["by"], "carol", "{done:#}");
}

#[tokio::test]
async fn untrusted_values_are_text_on_every_page() {
    let s = Intake::start("", "", &[("quick", quick("quick"))]).await;
    let hostile = "<script>alert('x')</script>";
    let id = start_run(
        &s,
        "quick",
        json!({"labels": {"service": hostile}, "summary": format!("sum {hostile}")}),
    )
    .await;
    s.wait_terminal(&id).await;
    let b = browser_like();
    for path in [
        "/ui".to_string(),
        format!("/ui/runs/{id}"),
        "/ui/pipelines/quick".into(),
        format!("/ui?q={}", "%3Cscript"),
    ] {
        let (status, page, h) = text(b.get(s.url(&path)).send().await.expect("GET")).await;
        assert_eq!(status, 200, "{path}: {page}");
        assert!(!page.contains("<script>alert"), "{path}: {page}");
        assert!(page.contains("&lt;script&gt;alert("), "{path}: {page}");
        let csp = h["content-security-policy"].to_str().expect("csp");
        assert!(csp.contains("script-src 'self'"), "{csp}");
    }
}

#[tokio::test]
async fn the_runs_list_pages_by_keyset_and_filters() {
    let s = Intake::start(
        "",
        "",
        &[("quick", quick("quick")), ("other", quick("other"))],
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..60 {
        let p = if i % 3 == 0 { "other" } else { "quick" };
        ids.push(start_run(&s, p, json!({"labels": {"n": format!("run-{i}")}})).await);
    }
    for id in &ids {
        s.wait_terminal(id).await;
    }
    let b = browser_like();
    let row_ids = |page: &str| -> Vec<String> {
        page.split("data-run=\"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap_or_default().to_string())
            .collect()
    };
    let (_, first, _) = text(b.get(s.url("/ui")).send().await.expect("GET")).await;
    let page1 = row_ids(&first);
    assert_eq!(page1.len(), 50, "{first}");
    let next = first
        .split("rel=\"next\" href=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a next page")
        .replace("&#x2f;", "/")
        .replace("&amp;", "&");
    let (_, second, _) = text(b.get(s.url(&next)).send().await.expect("GET")).await;
    let page2 = row_ids(&second);
    assert_eq!(page2.len(), 10, "{second}");
    assert!(!second.contains("rel=\"next\""));
    let mut all: Vec<String> = page1.into_iter().chain(page2).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 60, "every run once across the pages");

    let (_, other, _) = text(
        b.get(s.url("/ui?pipeline=other"))
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert_eq!(row_ids(&other).len(), 20);
    let (_, found, _) = text(b.get(s.url("/ui?q=run-42")).send().await.expect("GET")).await;
    assert_eq!(row_ids(&found), vec![ids[42].clone()]);
    let (_, by_id, _) = text(
        b.get(s.url(&format!("/ui?q={}", &ids[7][..13])))
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert_eq!(row_ids(&by_id), vec![ids[7].clone()]);
    let (_, failed, _) = text(b.get(s.url("/ui?status=failed")).send().await.expect("GET")).await;
    assert!(row_ids(&failed).is_empty());
    assert!(
        first.contains("completed <b>60</b>"),
        "live counts: {first}"
    );
}

/// Reads an SSE response until `end` or the timeout; returns `(id, data)` pairs
/// and whether `end` came.
async fn read_events(resp: reqwest::Response) -> (Vec<(i64, Value)>, bool) {
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut resp = resp;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let chunk = tokio::time::timeout_at(deadline.into(), resp.chunk())
            .await
            .expect("the stream ends within 30 s")
            .expect("chunk");
        let Some(chunk) = chunk else {
            return (out, false);
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            let (mut id, mut data, mut event) = (None, String::new(), None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_string());
                }
            }
            if event.as_deref() == Some("end") {
                return (out, true);
            }
            if let Some(id) = id {
                out.push((id, serde_json::from_str(&data).expect("event JSON")));
            }
        }
    }
}

#[tokio::test]
async fn the_events_stream_sends_ids_resumes_from_last_event_id_and_ends_with_the_run() {
    let s = Intake::start("", "", &[("slow", slow("slow"))]).await;
    let id = start_run(&s, "slow", json!({})).await;
    let http = reqwest::Client::new();
    // Live: from the start until the run ends.
    let live = http
        .get(s.url(&format!("/runs/{id}/events")))
        .send()
        .await
        .expect("GET events");
    assert_eq!(live.status().as_u16(), 200);
    assert!(live.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let (all, ended) = read_events(live).await;
    assert!(ended, "an `end` event when the run finished");
    let names: Vec<&str> = all
        .iter()
        .filter_map(|(_, v)| v["event"].as_str())
        .collect();
    assert_eq!(names.first(), Some(&"run_started"), "{names:?}");
    assert_eq!(names.last(), Some(&"run_finished"), "{names:?}");
    assert!(names.contains(&"step_completed"), "{names:?}");
    assert!(all.windows(2).all(|w| w[1].0 > w[0].0), "ids increase");
    // The same log as `GET /runs/{id}`.
    let logs = s.run(&id).await["logs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(logs.len(), all.len());

    // Reconnecting with Last-Event-ID: exactly what came after it.
    let (cut, _) = all[2].clone();
    let again = http
        .get(s.url(&format!("/runs/{id}/events")))
        .header("last-event-id", cut.to_string())
        .send()
        .await
        .expect("GET events");
    let (rest, ended) = read_events(again).await;
    assert!(ended);
    assert_eq!(
        rest.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        all[3..].iter().map(|(i, _)| *i).collect::<Vec<_>>()
    );
    let missing = http
        .get(s.url("/runs/no-such-run/events"))
        .send()
        .await
        .expect("GET");
    assert_eq!(missing.status().as_u16(), 404);
}

#[tokio::test]
async fn pipelines_are_listed_with_their_step_graph() {
    let mock = |indent: usize| {
        let pad = " ".repeat(indent);
        format!("executor: mock\n{pad}executor_config: {{output: {{confidence: 0.9, summary: x, next_step_context: \"\"}}}}")
    };
    let fan = format!(
        "name: fan\nstage: testing\ntrigger: {{match: {{severity: critical}}}}\nsteps:\n\
         \x20 - parallel:\n      name: gather\n      steps:\n\
         \x20       - name: logs\n          {m}\n\
         \x20       - name: metrics\n          {m}\n\
         \x20 - fan_out:\n      name: per\n      over: \"{{{{ labels.services }}}}\"\n      as: service\n      {f}\n",
        m = mock(10),
        f = mock(6),
    );
    let s = Intake::start(
        "",
        "",
        &[("fan", fan.to_string()), ("quick", quick("quick"))],
    )
    .await;
    let list = s.get("/pipelines").await;
    assert_eq!(list.status, 200, "{list:?}");
    let names: Vec<&str> = list.json["pipelines"]
        .as_array()
        .expect("pipelines")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(
        names.contains(&"fan") && names.contains(&"quick"),
        "{names:?}"
    );
    let one = s.get("/pipelines/fan").await;
    assert_eq!(one.status, 200, "{one:?}");
    for key in [
        "name",
        "stage",
        "trigger",
        "durable",
        "schedule",
        "fingerprint",
        "file",
        "steps",
    ] {
        assert!(one.json.get(key).is_some(), "{key}: {:#}", one.json);
    }
    assert_eq!(one.json["stage"], "testing");
    let steps = &one.json["steps"];
    assert_eq!(steps[0]["kind"], "parallel");
    assert_eq!(steps[0]["units"][1]["name"], "metrics");
    assert_eq!(steps[1]["kind"], "fan_out");
    s.get("/pipelines/nope").await.assert_error(404);
    let page = s.get("/ui/pipelines/fan").await;
    assert_eq!(page.status, 200);
    assert!(page.text.contains("data-step=\"metrics\""), "{}", page.text);
    assert!(page.text.contains("gather (parallel)"), "{}", page.text);
}

/// A pipeline whose second step waits for a human.
fn gated() -> String {
    "name: gated\nstage: production\ntrigger: {match: {}}\nsteps:\n\
     \x20 - name: triage\n    executor: mock\n\
     \x20   executor_config: {output: {confidence: 0.9, summary: t, next_step_context: \"\"}}\n\
     \x20 - name: approve\n    executor: human\n    timeout_seconds: 300\n\
     \x20   prompt_template: \"Restart {{ labels.service }}?\"\n"
        .to_string()
}

async fn pending_token(s: &Intake, run: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = s.get("/approvals").await;
        if let Some(t) = list.json["approvals"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["run_id"] == run)
            .and_then(|a| a["token"].as_str())
        {
            return t.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no approval for {run}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Signs `b` in as alice through the token form.
async fn sign_in(b: &Browserish, s: &Intake) {
    let (_, form, _) = text(b.get(s.url("/ui/login")).send().await.expect("GET")).await;
    let r = b
        .post(s.url("/ui/login"))
        .form(&[("token", OPERATOR), ("csrf", csrf_of(&form).as_str())])
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 303);
}

#[tokio::test]
async fn with_approvers_a_signed_in_operator_decides_on_the_page_and_every_cookie_post_needs_csrf()
{
    let extra = format!("{}human_approval: {{approvers: [\"12345\"]}}\n", auth());
    let mut s = Intake::start("", &extra, &[("gated", gated())]).await;
    s.bearer = Some(OPERATOR.into());
    let run = start_run(&s, "gated", json!({"labels": {"service": "web"}})).await;
    let token = pending_token(&s, &run).await;

    // The link alone shows the request, read-only.
    let anonymous = browser_like();
    let (status, page, _) = text(
        anonymous
            .get(s.url(&format!("/approvals/{token}")))
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(!page.contains("<form"), "{page}");
    assert!(!page.contains("open the run"), "{page}");

    let b = browser_like();
    sign_in(&b, &s).await;
    // Every POST made with the cookie but without its CSRF token is refused,
    // and changes nothing.
    for (path, json_body) in [
        (format!("/runs/{run}/cancel"), false),
        (format!("/runs/{run}/cancel"), true),
        (format!("/runs/{run}/replay"), false),
        ("/ui/logout".to_string(), false),
        ("/ui/login".to_string(), false),
        (format!("/approvals/{token}"), true),
    ] {
        let req = b.post(s.url(&path));
        let req = if json_body {
            req.json(&json!({"decision": "approve", "from_step": "triage"}))
        } else {
            req.form(&[("decision", "approve"), ("from_step", "triage")])
        };
        let r = req.send().await.expect("POST");
        assert_eq!(r.status().as_u16(), 403, "{path} json={json_body}");
    }
    assert_eq!(s.run(&run).await["status"], "running");

    // Signed in, the approval page shows the form and the way to the run.
    let (status, page, _) = text(
        b.get(s.url(&format!("/approvals/{token}")))
            .send()
            .await
            .expect("GET"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        page.contains("<form") && !page.contains("name=\"by\""),
        "{page}"
    );
    assert!(page.contains(&format!("/ui/runs/{run}")), "{page}");
    let r = b
        .post(s.url(&format!("/approvals/{token}")))
        .form(&[
            ("csrf", csrf_of(&page).as_str()),
            ("decision", "approve"),
            ("by", "eve"),
        ])
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200);
    let done = s.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(
        events(&done, "approval_decided")[0]["by"],
        "alice",
        "{done:#}"
    );
}
