//! The side-effecting executors against real local peers: a fake webhook target,
//! a fake OpenAI-compatible API, real child processes.

mod common;
use common::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{action, call, FakeLlm, FakeServer, Reply};
use vectorstep::config::{Agent, Config, Price, Provider, Telegram};
use vectorstep::executor::{Error, Executors, Outcome};
use vectorstep::pipeline::ExecutorKind;

fn executors(config: Config) -> Executors {
    Executors::standard(&Arc::new(config))
}

async fn execute(
    ex: &Executors,
    action: &vectorstep::pipeline::Action,
    prompt: &str,
) -> Result<Outcome, Error> {
    let ex = ex.get(action.executor).expect("executor registered");
    ex.execute(call(action, prompt)).await
}

// ---------------------------------------------------------------- webhook

#[tokio::test]
async fn webhook_sends_one_request_with_idempotency_headers_and_body() {
    let peer = FakeServer::start(vec![Reply::text(200, "thanks")]).await;
    let a = action(
        ExecutorKind::Webhook,
        "webhook",
        json!({"url": "{{ vars.hook }}", "headers": {"X-Team": "ops"}}),
    );
    let ex = executors(Config::default())
        .get(ExecutorKind::Webhook)
        .unwrap();
    let mut c = call(&a, r#"{"alert": "disk full"}"#);
    c.rendered
        .insert("url".into(), format!("{}/hook", peer.url()));

    let out = ex.execute(c.clone()).await.unwrap();

    assert_eq!(peer.count(), 1);
    let r = &peer.requests()[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/hook");
    assert_eq!(r.header("Idempotency-Key"), Some("run-1:check:1"));
    assert_eq!(r.header("X-Vectorstep-Attempt"), Some("1"));
    assert_eq!(r.header("X-Team"), Some("ops"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.body, r#"{"alert": "disk full"}"#);
    assert_eq!(out.output.summary, "Webhook delivered: HTTP 200");

    // A retry carries the same key and the next attempt number.
    c.attempt = 2;
    ex.execute(c).await.unwrap();
    assert_eq!(peer.count(), 2);
    let r = &peer.requests()[1];
    assert_eq!(r.header("Idempotency-Key"), Some("run-1:check:1"));
    assert_eq!(r.header("X-Vectorstep-Attempt"), Some("2"));
}

#[tokio::test]
async fn webhook_plain_text_body_and_receipt_fields() {
    let peer = FakeServer::start(vec![Reply::json(202, json!({"queued": true}))]).await;
    let a = action(
        ExecutorKind::Webhook,
        "webhook",
        json!({"url": format!("{}/x", peer.url()), "method": "put"}),
    );
    let out = execute(&executors(Config::default()), &a, "restart nginx")
        .await
        .unwrap();
    let r = &peer.requests()[0];
    assert_eq!(r.method, "PUT");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.body, "restart nginx");
    assert_eq!(out.output.confidence, 1.0);
    assert_eq!(out.output.summary, "Webhook delivered: HTTP 202");
    assert_eq!(out.output.extra["status_code"], json!(202));
    assert_eq!(out.output.extra["body"], json!({"queued": true}));
}

#[tokio::test]
async fn webhook_step_output_response_becomes_the_output() {
    let peer = FakeServer::start(vec![Reply::json(
        200,
        json!({"confidence": 0.42, "summary": "remote verdict", "next_step_context": "ctx", "ticket": "OPS-1"}),
    )])
    .await;
    let a = action(ExecutorKind::Webhook, "webhook", json!({"url": peer.url()}));
    let out = execute(&executors(Config::default()), &a, "{}")
        .await
        .unwrap();
    assert_eq!(out.output.confidence, 0.42);
    assert_eq!(out.output.summary, "remote verdict");
    assert_eq!(out.output.next_step_context, "ctx");
    assert_eq!(out.output.extra.get("ticket"), Some(&json!("OPS-1")));
    assert!(!out.output.extra.contains_key("status_code"));
}

#[tokio::test]
async fn webhook_invalid_step_output_response_is_bad_output() {
    let peer = FakeServer::start(vec![Reply::json(
        200,
        json!({"confidence": 3, "summary": "x"}),
    )])
    .await;
    let a = action(ExecutorKind::Webhook, "webhook", json!({"url": peer.url()}));
    match execute(&executors(Config::default()), &a, "{}").await {
        Err(Error::BadOutput(m)) => assert!(m.contains("within 0..1, found 3"), "{m}"),
        other => panic!("expected BadOutput, got {other:?}"),
    }
}

#[tokio::test]
async fn webhook_non_2xx_fails_with_code_and_body() {
    let peer = FakeServer::start(vec![Reply::text(500, "database on fire")]).await;
    let a = action(ExecutorKind::Webhook, "webhook", json!({"url": peer.url()}));
    match execute(&executors(Config::default()), &a, "x").await {
        Err(Error::Failed(m)) => {
            assert_eq!(m, "webhook returned HTTP 500: database on fire")
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(peer.count(), 1);
}

#[tokio::test]
async fn webhook_connection_refused_is_transport_without_the_path() {
    // Bind then drop a listener to get a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/hooks/SECRET");
    let a = action(ExecutorKind::Webhook, "webhook", json!({"url": url}));
    match execute(&executors(Config::default()), &a, "x").await {
        Err(Error::Transport(m)) => {
            assert!(
                m.starts_with(&format!("webhook POST to http://127.0.0.1:{port}: ")),
                "{m}"
            );
            assert!(!m.contains("SECRET"), "{m}");
        }
        other => panic!("expected Transport, got {other:?}"),
    }
}

#[tokio::test]
async fn webhook_times_out() {
    let peer = FakeServer::start(vec![
        Reply::text(200, "late").delayed(Duration::from_secs(5))
    ])
    .await;
    let a = action(
        ExecutorKind::Webhook,
        "webhook",
        json!({"url": peer.url(), "timeout_seconds": 0.2}),
    );
    let started = Instant::now();
    match execute(&executors(Config::default()), &a, "x").await {
        Err(Error::Transport(m)) => assert!(m.ends_with("timed out"), "{m}"),
        other => panic!("expected Transport, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}

// ---------------------------------------------------------------- agent

fn agent_config(base_url: &str) -> Config {
    let mut c = Config::default();
    c.providers.insert(
        "fake".into(),
        Provider {
            base_url: format!("{base_url}/"),
            api_key: Some("sk-test".into()),
            timeout_seconds: 5.0,
            kind: Default::default(),
        },
    );
    c.agents.insert(
        "triage".into(),
        Agent {
            provider: "fake".into(),
            model: "gpt-test".into(),
            system_prompt: "You are an SRE.".into(),
            temperature: Some(0.1),
            max_tokens: Some(800),
            tools: Vec::new(),
            delegates: Vec::new(),
            max_turns: 10,
            approval_timeout_seconds: 900,
        },
    );
    c.pricing.insert(
        "gpt-test".into(),
        Price {
            input_per_mtok: 2.0,
            output_per_mtok: 10.0,
        },
    );
    c
}

fn agent_action() -> vectorstep::pipeline::Action {
    let mut a = action(ExecutorKind::Agent, "agent", json!({"agent": "triage"}));
    a.agent = Some("triage".into());
    a
}

async fn run_agent(content: &str) -> (FakeLlm, Result<Outcome, Error>) {
    let llm = FakeLlm::start(content, 1200, 300).await;
    let ex = executors(agent_config(&llm.base_url()));
    let a = agent_action();
    let r = execute(&ex, &a, "Disk is 97% full on db-1").await;
    (llm, r)
}

#[tokio::test]
async fn agent_sends_a_chat_completion_request() {
    let (llm, r) =
        run_agent(r#"{"confidence": 0.9, "summary": "disk", "next_step_context": "n"}"#).await;
    r.unwrap();
    assert_eq!(llm.server.count(), 1);
    let req = &llm.server.requests()[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(req.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(req.header("idempotency-key"), Some("run-1:check:1"));
    assert_eq!(req.header("x-vectorstep-attempt"), Some("1"));
    assert_eq!(
        req.json(),
        json!({
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "You are an SRE."},
                {"role": "user", "content": "Disk is 97% full on db-1"}
            ],
            "temperature": 0.1,
            "max_tokens": 800,
            "response_format": {"type": "json_object"}
        })
    );
}

#[tokio::test]
async fn agent_output_usage_and_cost() {
    let (_llm, r) = run_agent(
        r#"{"confidence": 0.85, "summary": "db-1 disk full", "next_step_context": "clean logs", "reasoning": {"evidence": "97%"}, "service": "db"}"#,
    )
    .await;
    let out = r.unwrap();
    assert_eq!(out.output.confidence, 0.85);
    assert_eq!(out.output.summary, "db-1 disk full");
    assert_eq!(out.output.next_step_context, "clean logs");
    assert_eq!(out.output.reasoning.unwrap()["evidence"], json!("97%"));
    assert_eq!(out.output.extra["service"], json!("db"));
    assert_eq!(out.output.extra["model"], json!("gpt-test"));
    assert_eq!(out.output.extra["provider"], json!("fake"));
    assert_eq!(out.usage.input_tokens, 1200);
    assert_eq!(out.usage.output_tokens, 300);
    // 1200 * 2 / 1e6 + 300 * 10 / 1e6
    let cost = out.usage.cost_usd.unwrap();
    assert!((cost - 0.0054).abs() < 1e-12, "{cost}");
}

#[tokio::test]
async fn agent_keeps_model_and_provider_it_returned() {
    let (_llm, r) = run_agent(
        r#"{"confidence": 0.5, "summary": "s", "model": "self-reported", "provider": "me"}"#,
    )
    .await;
    let out = r.unwrap();
    assert_eq!(out.output.extra["model"], json!("self-reported"));
    assert_eq!(out.output.extra["provider"], json!("me"));
}

#[tokio::test]
async fn agent_unpriced_model_has_no_cost() {
    let llm = FakeLlm::start(r#"{"confidence": 1, "summary": "s"}"#, 10, 5).await;
    let mut config = agent_config(&llm.base_url());
    config.pricing.clear();
    let out = execute(&executors(config), &agent_action(), "p")
        .await
        .unwrap();
    assert_eq!(out.usage.input_tokens, 10);
    assert_eq!(out.usage.cost_usd, None);
}

#[tokio::test]
async fn agent_parses_fenced_and_prose_wrapped_json() {
    let replies = [
        "```json\n{\"confidence\": 0.7, \"summary\": \"fenced\"}\n```",
        "Here is my assessment:\n{\"confidence\": 0.6, \"summary\": \"prose\"}\nHope this helps!",
    ];
    for (content, summary) in replies.iter().zip(["fenced", "prose"]) {
        let (_llm, r) = run_agent(content).await;
        let out = r.unwrap_or_else(|e| panic!("{content}: {e}"));
        assert_eq!(out.output.summary, summary);
    }
}

#[tokio::test]
async fn agent_bad_outputs_are_reported_clearly() {
    let cases = [
        (
            "The disk is full, I think.",
            "agent `triage` did not reply with JSON; the reply was: The disk is full, I think.",
        ),
        (r#"{"summary": "no confidence"}"#, "missing `confidence`"),
        (
            r#"{"confidence": 7, "summary": "s"}"#,
            "`confidence` must be within 0..1, found 7",
        ),
        (
            r#"{"confidence": 0.5, "summary": "s", "reasoning": "because"}"#,
            "`reasoning` must be a mapping, found a string",
        ),
    ];
    for (content, want) in cases {
        let (_llm, r) = run_agent(content).await;
        match r {
            Err(Error::BadOutput(m)) => {
                assert!(m.contains(want), "{content}: got `{m}`, want `{want}`");
                assert!(m.contains("the reply was:"), "{m}");
            }
            other => panic!("{content}: expected BadOutput, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn agent_http_error_fails_with_status() {
    let llm = FakeLlm::with_replies(vec![Reply::json(
        429,
        json!({"error": {"message": "rate limited"}}),
    )])
    .await;
    let r = execute(
        &executors(agent_config(&llm.base_url())),
        &agent_action(),
        "p",
    )
    .await;
    match r {
        Err(Error::Failed(m)) => {
            assert!(m.contains("HTTP 429"), "{m}");
            assert!(m.contains("rate limited"), "{m}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test]
async fn agent_missing_provider_is_a_config_error() {
    let mut config = agent_config("http://127.0.0.1:9");
    config.providers.clear();
    match execute(&executors(config), &agent_action(), "p").await {
        Err(Error::Config(m)) => assert!(m.contains("provider `fake`"), "{m}"),
        other => panic!("expected Config, got {other:?}"),
    }
}

#[tokio::test]
async fn agent_without_content_is_bad_output() {
    let llm = FakeLlm::with_replies(vec![Reply::json(200, json!({"choices": []}))]).await;
    let r = execute(
        &executors(agent_config(&llm.base_url())),
        &agent_action(),
        "p",
    )
    .await;
    assert!(matches!(r, Err(Error::BadOutput(_))), "{r:?}");
}

// ---------------------------------------------------------------- shell

fn shell(command: &[&str], extra: Value) -> vectorstep::pipeline::Action {
    let mut cfg = json!({"command": command});
    if let (Some(c), Some(e)) = (cfg.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    action(ExecutorKind::Shell, "shell", cfg)
}

#[tokio::test]
async fn shell_never_interprets_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let evil = "$(touch PWNED); touch PWNED";
    let a = shell(
        &["echo", "{{ labels.service }}"],
        json!({"cwd": dir.path().to_str().unwrap()}),
    );
    let ex = executors(Config::default())
        .get(ExecutorKind::Shell)
        .unwrap();
    let mut c = call(&a, "");
    c.rendered.insert("command/1".into(), evil.into());
    let out = ex.execute(c).await.unwrap();
    assert_eq!(out.output.summary, evil);
    assert_eq!(out.output.confidence, 1.0);
    assert_eq!(out.output.extra["exit_code"], json!(0));
    assert!(!dir.path().join("PWNED").exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn shell_env_carries_identity_and_expanded_values() {
    let script = r#"printf '%s|%s|%s|%s|%s|%s' "$VECTORSTEP_IDEMPOTENCY_KEY" "$VECTORSTEP_ATTEMPT" "$VECTORSTEP_RUN_ID" "$VECTORSTEP_STEP" "$GREETING" "$FROM_ENV""#;
    let a = shell(
        &["sh", "-c", script],
        json!({"env": {"GREETING": "${VECTORSTEP_TEST_SURELY_UNSET:-hello}", "FROM_ENV": "path=${PATH}"}}),
    );
    let ex = executors(Config::default())
        .get(ExecutorKind::Shell)
        .unwrap();
    let mut c = call(&a, "");
    c.attempt = 3;
    let out = ex.execute(c).await.unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    assert_eq!(
        out.output.summary,
        format!("run-1:check:1|3|run-1|check|hello|path={path}")
    );
}

#[tokio::test]
async fn shell_json_stdout_becomes_the_output() {
    let a = shell(
        &[
            "printf",
            r#"{"confidence": 0.8, "summary": "disk ok", "next_step_context": "n", "free_gb": 12}"#,
        ],
        json!({}),
    );
    let out = execute(&executors(Config::default()), &a, "")
        .await
        .unwrap();
    assert_eq!(out.output.confidence, 0.8);
    assert_eq!(out.output.summary, "disk ok");
    assert_eq!(out.output.extra.get("free_gb"), Some(&json!(12)));
    assert!(!out.output.extra.contains_key("exit_code"));
}

#[tokio::test]
async fn shell_invalid_json_output_is_bad_output() {
    let a = shell(
        &["printf", r#"{"confidence": 7, "summary": "s"}"#],
        json!({}),
    );
    match execute(&executors(Config::default()), &a, "").await {
        Err(Error::BadOutput(m)) => assert!(m.contains("within 0..1, found 7"), "{m}"),
        other => panic!("expected BadOutput, got {other:?}"),
    }
}

#[tokio::test]
async fn shell_non_zero_exit_fails_with_stderr() {
    let a = shell(
        &[
            "sh",
            "-c",
            "echo partial; echo 'disk not found' >&2; exit 3",
        ],
        json!({}),
    );
    match execute(&executors(Config::default()), &a, "").await {
        Err(Error::Failed(m)) => assert_eq!(m, "command exited with status 3: disk not found"),
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test]
async fn shell_missing_program_is_transport_naming_it() {
    let a = shell(&["vectorstep-no-such-program", "x"], json!({}));
    match execute(&executors(Config::default()), &a, "").await {
        Err(Error::Transport(m)) => assert!(m.contains("`vectorstep-no-such-program`"), "{m}"),
        other => panic!("expected Transport, got {other:?}"),
    }
}

#[tokio::test]
async fn shell_caps_huge_output() {
    let a = shell(&["sh", "-c", "yes | head -c 5000000"], json!({}));
    let out = execute(&executors(Config::default()), &a, "")
        .await
        .unwrap();
    assert!(out.output.summary.len() <= 64 * 1024);
    assert!(out.output.summary.len() > 60 * 1024);
    assert_eq!(out.output.extra["stdout_truncated"], json!(true));
}

/// Whether `pid` is gone. A killed process whose parent died is a zombie until
/// init reaps it, and some container inits never do; a zombie runs no code.
fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_for_pid(path: &std::path::Path) -> i32 {
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the command never wrote its pid file");
}

async fn assert_gone_soon(pid: i32) {
    for _ in 0..100 {
        if process_gone(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("background process {pid} survived the step");
}

const SPAWNS_BACKGROUND: &str = "sleep 30 & echo $! > pidfile; wait";

#[tokio::test]
async fn shell_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let a = shell(
        &["sh", "-c", SPAWNS_BACKGROUND],
        json!({"cwd": dir.path().to_str().unwrap()}),
    );
    let ex = executors(Config::default())
        .get(ExecutorKind::Shell)
        .unwrap();
    let mut c = call(&a, "");
    c.timeout = Some(Duration::from_millis(500));
    let started = Instant::now();
    match ex.execute(c).await {
        Err(Error::Failed(m)) => assert!(m.contains("timed out after 0.5s"), "{m}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let pid = wait_for_pid(&dir.path().join("pidfile")).await;
    assert_gone_soon(pid).await;
}

#[tokio::test]
async fn shell_dropped_call_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let a = shell(
        &["sh", "-c", SPAWNS_BACKGROUND],
        json!({"cwd": dir.path().to_str().unwrap()}),
    );
    let ex = executors(Config::default())
        .get(ExecutorKind::Shell)
        .unwrap();
    // The runner enforces step timeouts by dropping the executor's future.
    let r = tokio::time::timeout(Duration::from_millis(500), ex.execute(call(&a, ""))).await;
    assert!(r.is_err(), "the command should still have been running");
    let pid = wait_for_pid(&dir.path().join("pidfile")).await;
    assert_gone_soon(pid).await;
}

// ---------------------------------------------------------------- notify

#[tokio::test]
async fn notify_webhook_posts_once() {
    let peer = FakeServer::start(vec![Reply::text(200, "ok")]).await;
    let a = action(
        ExecutorKind::Notify,
        "notify",
        json!({"channel": "webhook", "url": format!("{}/notify", peer.url())}),
    );
    let out = execute(&executors(Config::default()), &a, "db-1 cleaned up")
        .await
        .unwrap();
    assert_eq!(out.output.summary, "Notification sent via webhook");
    assert_eq!(peer.count(), 1);
    let r = &peer.requests()[0];
    assert_eq!(r.path, "/notify");
    assert_eq!(r.header("idempotency-key"), Some("run-1:check:1"));
    assert_eq!(
        r.json(),
        json!({"text": "db-1 cleaned up", "run_id": "run-1", "step": "check"})
    );
}

#[tokio::test]
async fn notify_webhook_non_2xx_fails() {
    let peer = FakeServer::start(vec![Reply::text(503, "down")]).await;
    let a = action(
        ExecutorKind::Notify,
        "notify",
        json!({"channel": "webhook", "url": peer.url()}),
    );
    match execute(&executors(Config::default()), &a, "m").await {
        Err(Error::Failed(m)) => assert_eq!(m, "notify webhook returned HTTP 503: down"),
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test]
async fn notify_telegram_uses_the_configured_bot() {
    let peer = FakeServer::start(vec![Reply::json(200, json!({"ok": true}))]).await;
    let config = Config {
        telegram: Some(Telegram {
            bot_token: "123:ABC".into(),
            chat_id: "-100".into(),
            api_url: Some(peer.url()),
        }),
        ..Config::default()
    };
    let a = action(
        ExecutorKind::Notify,
        "notify",
        json!({"channel": "telegram"}),
    );
    let out = execute(&executors(config), &a, "hello ops").await.unwrap();
    assert_eq!(out.output.summary, "Notification sent via telegram");
    assert_eq!(peer.count(), 1);
    let r = &peer.requests()[0];
    assert_eq!(r.path, "/bot123:ABC/sendMessage");
    assert_eq!(r.json(), json!({"chat_id": "-100", "text": "hello ops"}));
}

#[tokio::test]
async fn notify_telegram_without_config_is_a_config_error() {
    let a = action(
        ExecutorKind::Notify,
        "notify",
        json!({"channel": "telegram"}),
    );
    let r = execute(&executors(Config::default()), &a, "m").await;
    assert!(
        matches!(r, Err(Error::Config(ref m)) if m.contains("notifications.telegram")),
        "{r:?}"
    );
}

#[tokio::test]
async fn notify_log_is_the_default() {
    let a = action(ExecutorKind::Notify, "notify", json!({}));
    let out = execute(&executors(Config::default()), &a, "m")
        .await
        .unwrap();
    assert_eq!(out.output.summary, "Notification sent via log");
    assert_eq!(out.output.confidence, 1.0);
}
