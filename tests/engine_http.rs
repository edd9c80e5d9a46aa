//! The engine driving real HTTP executors against local fake peers: one request per
//! step attempt, retries reuse the idempotency key with a higher attempt, agent usage
//! and pricing reach the run, and bad agent output fails the step with a clear
//! error in the run log.

mod common;
use common::engine::Scratch;
use common::support;

use serde_json::{json, Value};
use support::{completion, FakeLlm, FakeServer, Reply};
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, DriveMode, RunEnd};
use vectorstep::store::{EventRecord, RunRecord, StepRecord};

struct Ran {
    run: RunRecord,
    steps: Vec<StepRecord>,
    events: Vec<EventRecord>,
}

/// Runs the only pipeline in `yaml` with a config that points agents at `llm`.
async fn run(yaml: &str, llm_base: &str) -> Ran {
    let config = format!(
        "providers: {{fake: {{base_url: \"{llm_base}\", api_key: sk-test}}}}\n\
         agents: {{triage: {{provider: fake, model: m1, system_prompt: \"You triage.\"}}}}\n\
         pricing: {{m1: {{input_per_mtok: 2.0, output_per_mtok: 10.0}}}}\n"
    );
    let Scratch {
        engine,
        store,
        dir: _dir,
    } = common::engine::engine_with_config(&[("p", yaml)], &config);
    let pipeline = engine.pipelines().pipelines[0].clone();
    let trigger = Normalised {
        source: "test".into(),
        pipeline: Some(pipeline.name.clone()),
        ..Default::default()
    };
    let Created::Inserted(id) = engine
        .create_run(&pipeline, &trigger, &json!({}), None, None)
        .await
        .unwrap()
    else {
        panic!("not created")
    };
    let end = engine.drive(&id, DriveMode::New).await.unwrap();
    assert!(matches!(end, RunEnd::Finished(_)));
    Ran {
        run: store.run(&id).unwrap().unwrap(),
        steps: store.steps(&id).unwrap(),
        events: store.events(&id).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_step_is_requested_once_per_attempt_with_one_key() {
    let peer = FakeServer::start(vec![
        Reply::text(503, "busy"),
        Reply::json(200, json!({"confidence": 0.9, "summary": "ticket opened", "next_step_context": "", "ticket": "T-1"})),
    ])
    .await;
    let yaml = format!(
        "name: hook\ntrigger: {{}}\nsteps:\n  - name: open-ticket\n    executor: webhook\n    retry: {{attempts: 3, backoff: fixed, delay_seconds: 0.01}}\n    executor_config: {{url: \"{}/tickets\"}}\n    prompt_template: '{{\"run\": \"{{{{ pipeline_run_id }}}}\"}}'\n  - name: after\n    executor: mock\n    executor_config: {{output: {{confidence: 1.0, summary: \"saw {{{{ steps.open_ticket.ticket }}}}\"}}}}\n",
        peer.url()
    );
    let ran = run(&yaml, "http://127.0.0.1:9").await;
    assert_eq!(ran.run.status, "completed", "{:?}", ran.run.reason);
    let requests = peer.requests();
    assert_eq!(
        requests.len(),
        2,
        "one failed attempt, one success, nothing more"
    );
    let key = format!("{}:open-ticket:1", ran.run.id);
    for (i, r) in requests.iter().enumerate() {
        assert_eq!(r.header("idempotency-key"), Some(key.as_str()));
        assert_eq!(
            r.header("x-vectorstep-attempt"),
            Some((i + 1).to_string().as_str())
        );
        assert_eq!(
            r.json()["run"],
            ran.run.id.as_str(),
            "the body is the rendered prompt"
        );
    }
    let step = &ran.steps[0];
    assert_eq!((step.status.as_str(), step.attempts), ("completed", 2));
    assert_eq!(
        ran.events
            .iter()
            .filter(|e| e.event == "step_retrying")
            .count(),
        1
    );
    let after: Value = serde_json::from_str(ran.steps[1].output_json.as_deref().unwrap()).unwrap();
    assert_eq!(
        after["summary"], "saw T-1",
        "extra response fields reach later templates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_usage_and_pricing_reach_the_run() {
    let llm = FakeLlm::start(
        r#"Sure! ```json
{"confidence": 0.88, "summary": "disk full on db-1", "next_step_context": "clean /var/log"}
```"#,
        1_000,
        200,
    )
    .await;
    let yaml = "name: triage\ntrigger: {}\nsteps:\n  - name: triage\n    executor: agent\n    executor_config: {agent: triage}\n    prompt_template: \"Triage {{ pipeline_name }}\"\n";
    let ran = run(yaml, &llm.base_url()).await;
    assert_eq!(ran.run.status, "completed", "{:?}", ran.run.reason);
    assert_eq!(llm.server.count(), 1);
    let req = &llm.server.requests()[0];
    assert_eq!(
        req.header("idempotency-key"),
        Some(format!("{}:triage:1", ran.run.id).as_str())
    );
    assert_eq!(req.header("authorization"), Some("Bearer sk-test"));
    let step = &ran.steps[0];
    assert_eq!((step.input_tokens, step.output_tokens), (1_000, 200));
    // 1,000 × $2/M + 200 × $10/M = $0.004.
    assert!(
        (step.cost_usd.unwrap() - 0.004).abs() < 1e-12,
        "{:?}",
        step.cost_usd
    );
    assert_eq!(ran.run.tokens_used, 1_200);
    assert!((ran.run.cost_usd - 0.004).abs() < 1e-12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_agent_output_fails_the_step_with_a_clear_error() {
    let cases = [
        ("the disk looks full to me", "JSON"),
        (r#"{"summary": "no confidence"}"#, "missing `confidence`"),
        (r#"{"confidence": 7, "summary": "too sure"}"#, "within 0..1"),
        (
            r#"{"confidence": 0.5, "summary": "s", "reasoning": "because"}"#,
            "`reasoning` must be a mapping",
        ),
    ];
    for (content, want) in cases {
        let llm = FakeLlm::with_replies(vec![completion(content, 10, 5)]).await;
        let yaml = "name: triage\ntrigger: {}\nsteps:\n  - {name: triage, executor: agent, executor_config: {agent: triage}}\n  - {name: never, executor: mock}\n";
        let ran = run(yaml, &llm.base_url()).await;
        assert_eq!(ran.run.status, "failed", "{content}");
        assert_eq!(
            ran.steps.len(),
            1,
            "nothing runs after the failed step: {content}"
        );
        let failed = ran
            .events
            .iter()
            .find(|e| e.event == "step_failed")
            .expect("step_failed in the run log");
        assert!(
            failed.msg.contains(want),
            "{content}: run log says `{}`, want `{want}`",
            failed.msg
        );
        assert!(ran.steps[0].error.as_deref().unwrap_or("").contains(want));
    }
}
