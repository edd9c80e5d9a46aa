//! The browser harness (tests/common/browser.rs) tested on itself: a real
//! headless Chromium against the real `vectorstep serve` binary and against a
//! tiny local HTTP server whose pages misbehave on purpose.

mod common;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use common::browser::{Browser, ProblemKind, INSTALL};
use common::service::{Scratch, Service};
use futures::FutureExt as _;
use serde_json::{json, Value};

/// A pipeline whose first step waits for a human (decided on its page: no
/// approvers and no chat are configured), then a mock step.
const GATED: &str = "name: gated\nstage: production\ntrigger: {match: {}}\nsteps:\n\
     \x20 - name: approve\n    executor: human\n    timeout_seconds: 300\n\
     \x20   prompt_template: \"<b>Restart the web tier?</b>\"\n\
     \x20 - name: after\n    executor: mock\n\
     \x20   executor_config: {output: {confidence: 0.9, summary: after, next_step_context: \"\"}}\n";

/// A page with nothing wrong (its icon inline, so the browser asks for no
/// /favicon.ico).
const CLEAN: &str = "<!doctype html><html><head><meta charset=\"utf-8\">\
     <link rel=\"icon\" href=\"data:,\"><title>clean</title></head>\
     <body><h1 id=\"hi\">Hello</h1><p class=\"n\">one</p><p class=\"n\">two</p></body></html>";

/// A page that logs a console error and shows an image that is not there.
const BAD: &str = "<!doctype html><html><head><meta charset=\"utf-8\">\
     <link rel=\"icon\" href=\"data:,\"><title>bad</title></head>\
     <body><h1>Bad</h1><script>console.error(\"x\")</script><img src=\"/missing.png\"></body></html>";

/// The tiny local server of these tests, on 127.0.0.1.
struct Site {
    addr: SocketAddr,
}

impl Site {
    async fn start() -> Site {
        let app = Router::new()
            .route("/clean", get(|| async { Html(CLEAN) }))
            .route("/bad", get(|| async { Html(BAD) }))
            .route(
                "/elsewhere",
                // Port 1 on 127.0.0.1: another origin, and nothing listens there.
                get(|| async {
                    Html(
                        "<!doctype html><html><head><link rel=\"icon\" href=\"data:,\"></head>\
                         <body><img src=\"http://127.0.0.1:1/tracker.png\"></body></html>",
                    )
                }),
            )
            .route(
                "/login",
                get(|| async {
                    (
                        [(
                            header::SET_COOKIE,
                            "session=s3cret; Path=/; HttpOnly; SameSite=Lax",
                        )],
                        Html(
                            "<!doctype html><html><head><link rel=\"icon\" href=\"data:,\"></head>\
                             <body><p id=\"done\">logged in</p></body></html>",
                        ),
                    )
                }),
            )
            .route(
                "/whoami",
                get(|headers: HeaderMap| async move {
                    let cookie = headers
                        .get(header::COOKIE)
                        .and_then(|c| c.to_str().ok())
                        .unwrap_or("none")
                        .to_string();
                    Html(format!(
                        "<!doctype html><html><head><link rel=\"icon\" href=\"data:,\"></head>\
                         <body><p id=\"cookie\">{cookie}</p></body></html>"
                    ))
                }),
            )
            .fallback(|| async { (StatusCode::NOT_FOUND, "not found").into_response() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Site { addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// `GET /approvals`: the token of `run`'s pending approval, once it exists.
async fn pending_token(svc: &Service, run: &str) -> String {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list: Value = http
            .get(svc.url("/approvals"))
            .send()
            .await
            .expect("GET /approvals")
            .json()
            .await
            .expect("approvals JSON");
        let token = list["approvals"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["run_id"] == run)
            .and_then(|a| a["token"].as_str().map(str::to_string));
        if let Some(t) = token {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "no pending approval for {run}: {list}\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_loads_and_its_text_is_read() {
    let dir = Scratch::new();
    let svc = Service::start(&dir.root).await;
    let browser = Browser::launch().await;
    assert!(
        browser.version().await.contains("Chrome/"),
        "{}",
        browser.version().await
    );
    let page = browser.page().await;

    page.goto(&svc.url("/healthz")).await;
    assert_eq!(page.url().await, svc.url("/healthz"));
    let body = page.text("body").await;
    assert!(!body.trim().is_empty(), "GET /healthz showed nothing");
    assert_eq!(page.eval("1 + 2").await, json!(3));
    assert_eq!(
        page.eval("Promise.resolve({a: [1, 'b']})").await,
        json!({"a": [1, "b"]})
    );

    // The browser's own GET /favicon.ico for this page finds the service's icon.
    page.assert_clean().await;

    let site = Site::start().await;
    page.goto(&site.url("/clean")).await;
    assert_eq!(page.text("#hi").await, "Hello");
    page.wait_for_text("p.n", "two").await;
    page.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approval_pages_approve_button_completes_the_run() {
    let dir = Scratch::new();
    dir.write_pipeline("gated", GATED);
    let svc = Service::start(&dir.root).await;
    let run = svc.post_run("gated", json!({})).await;
    let token = pending_token(&svc, &run).await;

    let browser = Browser::launch().await;
    let page = browser.page().await;
    page.goto(&svc.url(&format!("/approvals/{token}"))).await;
    page.wait_for_text("h1", "Approval requested").await;
    assert!(page.text(".msg").await.contains("Restart the web tier?"));
    page.fill("input[name=by]", "Bob Smith").await;
    page.click_and_wait_navigation("button[value=approve]")
        .await;
    page.wait_for_text("h1", "Approved").await;
    assert!(
        page.text("body").await.contains("Bob Smith"),
        "{}",
        page.text("body").await
    );

    let done = svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    // The page names the service's icon, which its CSP lets load.
    page.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_error_and_a_missing_image_are_reported() {
    let site = Site::start().await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    page.goto(&site.url("/bad")).await;

    let problems = page.problems().await;
    assert!(
        problems
            .iter()
            .any(|p| p.kind == ProblemKind::Console && p.detail == "error: x"),
        "{problems:#?}"
    );
    assert!(
        problems.iter().any(|p| p.kind == ProblemKind::HttpStatus
            && p.url == site.url("/missing.png")
            && p.detail.starts_with("404")),
        "{problems:#?}"
    );

    let failed = AssertUnwindSafe(page.assert_clean()).catch_unwind().await;
    let message = panic_message(failed.expect_err("assert_clean passed a page with problems"));
    assert!(message.contains("console: error: x"), "{message}");
    assert!(message.contains("/missing.png"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_to_another_origin_is_reported() {
    let site = Site::start().await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    page.goto(&site.url("/elsewhere")).await;
    let problems = page.problems().await;
    assert!(
        problems.iter().any(
            |p| p.kind == ProblemKind::OtherOrigin && p.url == "http://127.0.0.1:1/tracker.png"
        ),
        "{problems:#?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.kind == ProblemKind::RequestFailed && p.detail.starts_with("net::")),
        "{problems:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_set_by_one_page_is_sent_by_the_next() {
    let site = Site::start().await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    page.goto(&site.url("/whoami")).await;
    assert_eq!(page.text("#cookie").await, "none");
    page.goto(&site.url("/login")).await;
    page.wait_for("#done").await;
    page.goto(&site.url("/whoami")).await;
    assert_eq!(page.text("#cookie").await, "session=s3cret");
    // Another tab of the same browser shares the profile.
    let other = browser.page().await;
    other.goto(&site.url("/whoami")).await;
    assert_eq!(other.text("#cookie").await, "session=s3cret");
    page.assert_clean().await;
    other.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screenshot_is_a_png_of_the_whole_page() {
    let site = Site::start().await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    page.goto(&site.url("/clean")).await;
    // Taller than the 800 px window: the screenshot covers it all.
    page.eval("document.body.style.height = '3000px'").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shots").join("clean.png");
    page.screenshot(&path).await;
    let png = std::fs::read(&path).expect("screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    // The IHDR chunk: width and height, big-endian, at bytes 16..24.
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(height >= 3000, "height {height}: not the whole page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_browser_kills_chromium_and_removes_its_profile_even_on_panic() {
    let seen: std::sync::Mutex<Option<(u32, PathBuf)>> = std::sync::Mutex::new(None);
    let run = AssertUnwindSafe(async {
        let browser = Browser::launch().await;
        let page = browser.page().await;
        page.goto("about:blank").await;
        *seen.lock().unwrap() = Some((browser.pid(), browser.profile_dir()));
        panic!("a test failing with the browser open");
    })
    .catch_unwind()
    .await;
    assert!(run.is_err());
    let (pid, profile) = seen.lock().unwrap().clone().expect("the browser started");
    // SAFETY: signal 0 only asks whether the process group exists.
    let alive = unsafe { libc::kill(-(pid as libc::pid_t), 0) } == 0;
    assert!(!alive, "Chromium's process group {pid} is still alive");
    assert!(!profile.exists(), "{} is still there", profile.display());
}

#[tokio::test]
async fn a_missing_chromium_fails_the_test_with_the_install_command() {
    let failed = AssertUnwindSafe(Browser::launch_at(std::path::Path::new(
        "/nonexistent/chromium",
    )))
    .catch_unwind()
    .await;
    let message = panic_message(failed.err().expect("launch without Chromium succeeded"));
    assert!(message.contains(INSTALL), "{message}");
    assert_eq!(INSTALL, "apt-get install -y chromium");
}

fn panic_message(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
