//! The operator web UI in real headless Chromium (tests/common/browser.rs)
//! against the real `serve` binary with auth configured: sign-in through the
//! token form, the runs list of webhook-started runs and its filters, a run page
//! that follows its run live, fan-out items by name on the timeline, approving
//! from `/ui/approvals`, cancel, replay from a step (the fake peer's counts prove
//! the copied steps did not run again), untrusted labels shown as text, and no
//! console error or missing resource on any page. Screenshots go to `docs/ui/`.

mod common;
use common::browser::{Browser, Page};
use common::crash_support::{event, HoldingPeer, Reply};
use common::peer::Answer;
use common::service_support::*;

use std::path::PathBuf;

use serde_json::{json, Value};

const OPERATOR: &str = "operator-secret-0123456789";
const TEAM: &str = "team-secret-0123456789";

fn auth() -> String {
    format!(
        "auth:\n  teams: [{{name: sre, token: {TEAM}}}]\n  operators: [{{name: alice, token: {OPERATOR}}}]\n"
    )
}

fn shot(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/ui");
    std::fs::create_dir_all(&dir).expect("docs/ui");
    dir.join(format!("{name}.png"))
}

fn mock(name: &str, delay_ms: u64, extra: &str) -> String {
    format!(
        "  - name: {name}\n    executor: mock\n    executor_config:\n      delay_ms: {delay_ms}\n      output: {{confidence: 0.9, summary: \"{name} done\", next_step_context: \"\"{extra}}}\n"
    )
}

fn webhook(name: &str, url: &str, path: &str) -> String {
    format!(
        "  - name: {name}\n    executor: webhook\n    executor_config: {{url: \"{url}{path}\", timeout_seconds: 60}}\n    prompt_template: '{{\"step\": \"{name}\"}}'\n"
    )
}

fn pipeline_of(name: &str, trigger: &str, steps: &[String]) -> String {
    format!(
        "name: {name}\ndescription: \"{name}, for the browser tests\"\nstage: production\ndurable: true\ntrigger: {{match: {trigger}}}\nsteps:\n{}",
        steps.concat()
    )
}

/// A service with auth; the harness reads runs as the operator.
async fn start(pipelines: &[(&str, String)]) -> Intake {
    let mut s = Intake::start("", &auth(), pipelines).await;
    s.bearer = Some(OPERATOR.into());
    s
}

/// Starts a run the way Alertmanager-less monitoring does: a generic webhook
/// with the team's token.
async fn webhook_run(s: &Intake, pipeline: &str, labels: Value) -> String {
    let a = s
        .send(
            s.http
                .post(s.url("/webhook?source=generic"))
                .bearer_auth(TEAM)
                .json(&json!({"pipeline": pipeline, "summary": format!("{pipeline} alert"), "labels": labels})),
        )
        .await;
    assert_eq!(a.status, 202, "{a:?}");
    a.run_id()
}

/// Signs in through the token form (asserting that the page asked first).
async fn sign_in(page: &Page, s: &Intake) {
    page.goto(&s.url("/ui")).await;
    assert!(
        page.url().await.contains("/ui/login?next="),
        "{}",
        page.url().await
    );
    page.fill("input[name=token]", OPERATOR).await;
    page.click_and_wait_navigation("form.login button").await;
    assert!(page.url().await.ends_with("/ui"), "{}", page.url().await);
    page.wait_for_text("header.top .who", "alice").await;
    page.assert_clean().await;
}

async fn rows(page: &Page) -> i64 {
    page.eval("document.querySelectorAll('#runs-body tr.run').length")
        .await
        .as_i64()
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_list_shows_webhook_runs_filters_them_and_keeps_labels_as_text() {
    let s = start(&[
        (
            "checks",
            pipeline_of(
                "checks",
                "{}",
                &[mock("triage", 0, ""), mock("notify", 0, "")],
            ),
        ),
        ("other", pipeline_of("other", "{}", &[mock("only", 0, "")])),
    ])
    .await;
    let browser = Browser::launch().await;
    let page = browser.page().await;

    // Without the cookie every page goes to the token form.
    for path in [
        "/ui",
        "/ui/runs/no-such-run",
        "/ui/pipelines",
        "/ui/pipelines/checks",
        "/ui/approvals",
    ] {
        page.goto(&s.url(path)).await;
        let url = page.url().await;
        assert!(url.contains("/ui/login?next="), "{path}: {url}");
    }
    page.wait_for("form.login input[name=token]").await;
    page.screenshot(&shot("login")).await;
    page.assert_clean().await;
    sign_in(&page, &s).await;

    let hostile = "<script>window.__pwned = 1</script>";
    let mut ids = Vec::new();
    for (p, service) in [
        ("checks", "api"),
        ("checks", "db"),
        ("checks", hostile),
        ("other", "web"),
        ("other", "cache"),
    ] {
        ids.push(webhook_run(&s, p, json!({"service": service, "severity": "critical"})).await);
    }
    for id in &ids {
        s.wait_terminal(id).await;
    }
    page.goto(&s.url("/ui")).await;
    assert_eq!(rows(&page).await, 5);
    for id in &ids {
        page.wait_for(&format!("tr.run[data-run=\"{id}\"]")).await;
    }
    // The label is text on the page, and its script never ran.
    assert_eq!(page.eval("window.__pwned === undefined").await, json!(true));
    let labels = page.text("#runs-body").await;
    assert!(labels.contains(hostile), "{labels}");
    page.wait_for_text("#counts", "completed").await;
    page.screenshot(&shot("runs")).await;
    page.assert_clean().await;

    // Filter by pipeline, then search by a label value.
    page.eval("document.querySelector('select[name=pipeline]').value = 'other'")
        .await;
    page.click_and_wait_navigation("form.filters button").await;
    assert_eq!(rows(&page).await, 2);
    let pipelines = page
        .eval("[...document.querySelectorAll('#runs-body tr.run td:nth-child(2)')].map(td => td.textContent.trim())")
        .await;
    assert_eq!(pipelines, json!(["other", "other"]));
    page.goto(&s.url("/ui?q=db")).await;
    assert_eq!(rows(&page).await, 1);
    page.wait_for(&format!("tr.run[data-run=\"{}\"]", ids[1]))
        .await;
    page.assert_clean().await;

    // A run started while the list is open appears without a reload.
    page.goto(&s.url("/ui")).await;
    page.eval("window.__still_here = true").await;
    let late = webhook_run(&s, "other", json!({"service": "late"})).await;
    page.wait_for(&format!("tr.run[data-run=\"{late}\"]")).await;
    assert_eq!(page.eval("window.__still_here === true").await, json!(true));

    // A POST made with the cookie but without the page's CSRF token is refused.
    let status = page
        .eval(&format!(
            "fetch('/runs/{}/cancel', {{method: 'POST', body: new URLSearchParams({{by: 'x'}})}}).then(r => r.status)",
            ids[0]
        ))
        .await;
    assert_eq!(status, json!(403));
    page.clear_problems();
    let run_page = browser.page().await;
    run_page.goto(&s.url(&format!("/ui/runs/{}", ids[2]))).await;
    assert!(run_page.text("#run-header").await.contains(hostile));
    assert_eq!(
        run_page.eval("window.__pwned === undefined").await,
        json!(true)
    );
    run_page.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_page_follows_its_run_live_and_names_fan_out_items() {
    let peer = HoldingPeer::start(|r| {
        if r.path == "/slow" {
            Answer::Hold(Reply::output(0.9, "slow done"))
        } else {
            Answer::Reply(Reply::output(0.9, "ok"))
        }
    })
    .await;
    let services = r#", services: [{name: api}, {name: db}, {id: cache-7}]"#;
    let steps = [
        mock("triage", 0, services),
        "  - fan_out:\n      name: per-service\n      over: \"{{ steps.triage.services | tojson }}\"\n      as: service\n      executor: mock\n      executor_config:\n        delay_ms: 100\n        output: {confidence: 0.9, summary: \"item {{ fan_out_index }} ok\", next_step_context: \"\"}\n".to_string(),
        webhook("wait-for-peer", &peer.url(), "/slow"),
        mock("notify", 0, ""),
    ];
    let s = start(&[("live", pipeline_of("live", "{}", &steps))]).await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    sign_in(&page, &s).await;
    let id = webhook_run(&s, "live", json!({"service": "api"})).await;
    peer.wait_for_path("/slow", 1).await;

    page.goto(&s.url(&format!("/ui/runs/{id}"))).await;
    page.wait_for_text("#run-status", "running").await;
    page.eval("window.__no_reload = true").await;
    peer.release();
    // The page redraws from the events stream: the status, the step, the log.
    page.wait_for_text("#run-status", "completed").await;
    page.wait_for_text("#log", "run_finished").await;
    assert_eq!(page.eval("window.__no_reload === true").await, json!(true));
    for label in ["api", "db", "cache-7"] {
        page.wait_for(&format!("#timeline g.row[data-label=\"{label}\"]"))
            .await;
    }
    let paths = page
        .eval("[...document.querySelectorAll('#timeline g.row.kind-fan_out_branch')].map(g => g.getAttribute('data-path'))")
        .await;
    assert_eq!(
        paths,
        json!(["per-service/0", "per-service/1", "per-service/2"])
    );
    page.screenshot(&shot("run")).await;
    page.assert_clean().await;
    assert_eq!(peer.count_path("/slow"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_from_the_approvals_page_completes_the_run() {
    let gate = "  - name: approve-restart\n    executor: human\n    timeout_seconds: 600\n    prompt_template: \"<b>Restart {{ labels.service }}?</b>\"\n";
    let s = start(&[(
        "gated",
        pipeline_of(
            "gated",
            "{}",
            &[
                mock("triage", 0, ""),
                gate.to_string(),
                mock("restart", 0, ""),
            ],
        ),
    )])
    .await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    sign_in(&page, &s).await;
    let id = webhook_run(&s, "gated", json!({"service": "<i>checkout</i>"})).await;
    s.wait_run(&id, "waiting on the human step", |r| {
        r["steps"]
            .as_array()
            .is_some_and(|st| st.iter().any(|x| x["status"] == "waiting"))
    })
    .await;
    page.goto(&s.url("/ui/approvals")).await;
    page.wait_for("section.approval form.decide button.approve")
        .await;
    let msg = page.text("section.approval .msg").await;
    assert!(
        msg.contains("Restart <i>checkout</i>?"),
        "the label is text: {msg}"
    );
    page.screenshot(&shot("approvals")).await;
    page.assert_clean().await;
    page.click_and_wait_navigation("section.approval button.approve")
        .await;
    assert!(page.url().await.ends_with("/ui/approvals"));
    let done = s.wait_terminal(&id).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    assert_eq!(event(&done, "approval_decided")["by"], "alice", "{done:#}");
    page.wait_for("#approvals-empty").await;
    page.assert_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_replay_from_a_step_work_from_the_run_page() {
    let peer = HoldingPeer::answering(Reply::output(0.9, "ok")).await;
    let three = [
        webhook("fetch", &peer.url(), "/fetch"),
        webhook("analyse", &peer.url(), "/analyse"),
        webhook("report", &peer.url(), "/report"),
    ];
    let m = "executor: mock\n          executor_config: {output: {confidence: 0.9, summary: x, next_step_context: \"\"}}";
    let flow = [
        mock("triage", 0, ", services: [api, db]"),
        format!("  - parallel:\n      name: gather\n      steps:\n        - name: logs\n          {m}\n        - name: metrics\n          {m}\n        - name: deploys\n          {m}\n"),
        "  - fan_out:\n      name: per-service\n      over: \"{{ steps.triage.services | tojson }}\"\n      as: service\n      executor: mock\n      executor_config: {output: {confidence: 0.9, summary: x, next_step_context: \"\"}}\n".to_string(),
        "  - name: remediate\n    executor: pipeline\n    executor_config: {pipeline: three}\n".to_string(),
    ];
    let s = start(&[
        ("three", pipeline_of("three", "{}", &three)),
        ("flow", pipeline_of("flow", "{}", &flow)),
        (
            "slow",
            pipeline_of(
                "slow",
                "{}",
                &[mock("wait", 4000, ""), mock("after", 0, "")],
            ),
        ),
    ])
    .await;
    let browser = Browser::launch().await;
    let page = browser.page().await;
    sign_in(&page, &s).await;

    // Cancel.
    let slow = webhook_run(&s, "slow", json!({})).await;
    page.goto(&s.url(&format!("/ui/runs/{slow}"))).await;
    page.click_and_wait_navigation("form.cancel button").await;
    page.wait_for_text("#run-status", "cancelled").await;
    let done = s.wait_terminal(&slow).await;
    assert_eq!(done["status"], "cancelled");
    assert_eq!(event(&done, "run_cancelled")["by"], "alice");
    page.assert_clean().await;

    // Replay from the second step: a new run whose first step is copied.
    let first = webhook_run(&s, "three", json!({"service": "api"})).await;
    s.wait_terminal(&first).await;
    assert_eq!(
        (
            peer.count_path("/fetch"),
            peer.count_path("/analyse"),
            peer.count_path("/report")
        ),
        (1, 1, 1)
    );
    page.goto(&s.url(&format!("/ui/runs/{first}"))).await;
    page.eval("document.querySelector('form.replay select[name=from_step]').value = 'analyse'")
        .await;
    page.click_and_wait_navigation("form.replay button").await;
    let url = page.url().await;
    let replay = url.rsplit('/').next().unwrap_or_default().to_string();
    assert!(
        replay.len() > 8 && replay != first,
        "on the new run's page: {url}"
    );
    page.wait_for_text("#run-status", "completed").await;
    page.wait_for_text("#run-header", &first).await;
    let done = s.wait_terminal(&replay).await;
    assert_eq!(done["replay_of"], first.as_str(), "{done:#}");
    assert_eq!(
        (
            peer.count_path("/fetch"),
            peer.count_path("/analyse"),
            peer.count_path("/report")
        ),
        (1, 2, 2),
        "the copied step was not executed again"
    );
    page.assert_clean().await;
    // The old run's page links to its replay.
    page.goto(&s.url(&format!("/ui/runs/{first}"))).await;
    page.wait_for(&format!("a[href=\"/ui/runs/{replay}\"]"))
        .await;
    page.assert_clean().await;

    page.goto(&s.url("/ui/pipelines")).await;
    page.wait_for_text("table.pipelines", "three").await;
    page.screenshot(&shot("pipelines")).await;
    page.assert_clean().await;
    page.goto(&s.url("/ui/pipelines/flow")).await;
    page.wait_for("#graph g.node[data-step=\"metrics\"]").await;
    page.wait_for("#graph a[href=\"/ui/pipelines/three\"]")
        .await;
    page.screenshot(&shot("pipeline")).await;
    page.assert_clean().await;
}
