//! Webhook intake end to end (SPEC 2, 3, 8; reference sections 7 and 8): the real
//! `vectorstep serve` binary on a scratch folder, spoken to over HTTP on 127.0.0.1.
//! Alertmanager and generic payloads are routed by `trigger.match`, deduplicated by
//! fingerprint, gated by auth, body size, stage and the concurrency cap; every
//! rejection answers `{"error", "detail"}` with a 4xx status and stores nothing;
//! hostile bodies never earn a 5xx; `/metrics` counts what happened.
//!
//! Runs use the `mock` executor, with a `delay_ms` where a test needs a run to be
//! observably in flight. The only waits are bounded polls of the service.

mod common;
use common::{crash_support, service_support};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crash_support::events;
use serde_json::json;
use service_support::*;

// ---------------------------------------------------------------------------
// Routing and dedup.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_payloads_route_by_match_operators_and_deduplicate_by_fingerprint() {
    let pipelines = [
        (
            "10-critical-checkout",
            pipeline(
                "critical-checkout",
                "production",
                "  match:\n    severity: {in: [critical]}\n    service: {regex: \"^check\"}",
                &[("triage", 50)],
            ),
        ),
        (
            "20-latency-warning",
            pipeline(
                "latency-warning",
                "production",
                "  match:\n    severity: {not_in: [critical, info]}\n    alertname: {regex: Latency}",
                &[("triage", 50)],
            ),
        ),
        (
            // Takes resolved notifications only; the others take firing ones
            // only, having no `status` in their match.
            "25-checkout-resolved",
            pipeline(
                "checkout-resolved",
                "production",
                "  match:\n    status: resolved\n    service: {regex: \"^check\"}",
                &[("note", 10)],
            ),
        ),
        (
            "30-scaling",
            pipeline(
                "scaling",
                "production",
                "  match:\n    replicas: {gt: 3}\n    severity: {ne: critical}",
                &[("triage", 50)],
            ),
        ),
        (
            "40-namespace-group",
            pipeline(
                "namespace-group",
                "production",
                "  match:\n    namespace: prod-shop",
                &[("triage", 50)],
            ),
        ),
    ];
    let s = Intake::start(
        "",
        "dedup: {enabled: true, window_seconds: 300}",
        &pipelines,
    )
    .await;

    // A firing critical checkout alert: `in` and `regex` hold.
    let a = s.alert(&sample(FIRING_CRITICAL)).await;
    let first = assert_accepted(&a, "critical-checkout");
    assert_eq!(a.json["source"], "alertmanager", "{a:?}");
    assert_eq!(a.json["severity"], "critical", "{a:?}");
    assert_eq!(
        a.json["summary"], "checkout 5xx rate is 12.4% (threshold 5%)",
        "{a:?}"
    );
    let run = s.run(&first).await;
    assert_eq!(run["pipeline_name"], "critical-checkout");
    assert_eq!(run["source"], "alertmanager");

    // The same alert again is a duplicate of a run that exists.
    let again = s.alert(&sample(FIRING_CRITICAL)).await;
    assert_deduplicated(&again, &first);
    s.run(&first).await;

    // Its resolve goes past critical-checkout (no `status` in its match: firing
    // only) to the pipeline that matches `status: resolved`.
    let a = s.alert(&sample(RESOLVED)).await;
    let resolved = assert_accepted(&a, "checkout-resolved");
    assert_ne!(resolved, first);
    // A resolve that only status-less pipelines would take starts nothing.
    let before = s.run_count().await;
    let mut warning_resolved = sample(FIRING_WARNING);
    warning_resolved["status"] = json!("resolved");
    let a = s.alert(&warning_resolved).await;
    assert_eq!(a.status, 202, "{a:?}");
    assert_eq!(a.json["status"], "ignored_resolved", "{a:?}");
    assert_eq!(a.json["pipeline"], "latency-warning", "{a:?}");
    assert_eq!(
        s.run_count().await,
        before,
        "an ignored resolve stores nothing"
    );

    // Warning: `not_in` and `regex` hold; `in [critical]` does not.
    let a = s.alert(&sample(FIRING_WARNING)).await;
    let warning = assert_accepted(&a, "latency-warning");
    assert_eq!(a.json["severity"], "warning");

    // Grouped, most_severe (default): the critical checkout alert is chosen, and its
    // fingerprint is that of the first run.
    let a = s.alert(&sample(GROUPED)).await;
    assert_deduplicated(&a, &first);

    // Grouped, common_labels: no severity and no alertname; only the plain equality
    // on `namespace` holds.
    let a = s
        .post(
            "/webhook?source=alertmanager&strategy=common_labels",
            &sample(GROUPED),
        )
        .await;
    let grouped = assert_accepted(&a, "namespace-group");
    assert!(a.json["severity"].is_null(), "{a:?}");

    // `gt` compares a numeric label; a non-numeric or smaller value does not match.
    let a = s
        .alert(&alert(
            "firing",
            "scale-1",
            json!({"alertname": "ReplicasHigh", "severity": "warning", "replicas": "5", "namespace": "dev"}),
        ))
        .await;
    let scaling = assert_accepted(&a, "scaling");
    let before = s.run_count().await;
    for replicas in ["2", "five", "3"] {
        let a = s
            .alert(&alert(
                "firing",
                &format!("scale-{replicas}"),
                json!({"alertname": "ReplicasHigh", "severity": "warning", "replicas": replicas, "namespace": "dev"}),
            ))
            .await;
        // 200, not 422: Alertmanager re-sends every 4xx.
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.json["status"], "no_match", "{a:?}");
    }
    // `ne: critical` excludes a critical alert even with many replicas.
    let a = s
        .alert(&alert(
            "firing",
            "scale-crit",
            json!({"alertname": "ReplicasHigh", "severity": "critical", "replicas": "9", "namespace": "dev"}),
        ))
        .await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (200, &json!("no_match")),
        "{a:?}"
    );
    assert_eq!(s.run_count().await, before, "a no_match stores nothing");

    // A `pipeline` label narrows routing to that pipeline, whose match must
    // still hold: the critical checkout alert labelled for latency-warning (an
    // alert about vectorstep's own metrics carries `pipeline`) starts nothing.
    let mut explicit = sample(FIRING_CRITICAL);
    explicit["alerts"][0]["labels"]["pipeline"] = json!("latency-warning");
    let a = s.alert(&explicit).await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (200, &json!("no_match")),
        "{a:?}"
    );
    assert_eq!(s.run_count().await, before, "a failed match stores nothing");
    // Labelled for the pipeline whose match holds, it routes there; dedup is per
    // pipeline, so the same fingerprint as a run of critical-checkout starts one.
    let mut labelled = sample(FIRING_WARNING);
    labelled["alerts"][0]["labels"]["pipeline"] = json!("latency-warning");
    labelled["alerts"][0]["fingerprint"] = json!("3f9d1c2b7a6e5d40");
    let a = s.alert(&labelled).await;
    let routed = assert_accepted(&a, "latency-warning");
    explicit["alerts"][0]["labels"]["pipeline"] = json!("no-such-pipeline");
    let a = s.alert(&explicit).await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (200, &json!("no_match")),
        "{a:?}"
    );

    for id in [&first, &resolved, &warning, &grouped, &scaling, &routed] {
        let run = s.wait_terminal(id).await;
        assert_eq!(run["status"], "completed", "{run:#}");
    }
    // Inside the window a finished run still suppresses its duplicate.
    let a = s.alert(&sample(FIRING_CRITICAL)).await;
    assert_deduplicated(&a, &first);
    assert!(
        a.json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("completed")),
        "{a:?}"
    );

    assert_eq!(s.run_count().await, 6);
    let critical = s.runs(Some("critical-checkout")).await;
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(s.runs(Some("checkout-resolved")).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_read_the_chosen_alert_and_fan_out_over_every_alert_and_testing_skips_are_logged()
{
    let context = r#"name: am-context
stage: production
trigger:
  match: {alertname: HighErrorRate}
steps:
  - name: read
    executor: mock
    executor_config:
      output:
        confidence: 0.9
        next_step_context: ""
        summary: "runbook={{ alert.annotations.runbook_url }} fp={{ alert.fingerprint }} of={{ alerts | length }} since={{ alert.starts_at }}"
  - fan_out:
      name: per-alert
      over: "{{ alerts | tojson }}"
      as: a
      executor: mock
      executor_config:
        output: {confidence: 0.9, next_step_context: "", summary: "looked at {{ a.labels.service }}"}
"#;
    let pipelines = [
        ("10-am-context", context.to_string()),
        (
            "20-rehearsal",
            pipeline(
                "rehearsal",
                "testing",
                "  match: {alertname: Rehearsal}",
                &[("triage", 10)],
            ),
        ),
    ];
    let s = Intake::start_logging("info", "", "", &pipelines).await;

    let mut notification = sample(FIRING_CRITICAL);
    let first = notification["alerts"][0].clone();
    for service in ["payments", "search"] {
        let mut other = first.clone();
        other["labels"]["service"] = json!(service);
        other["labels"]["severity"] = json!("warning");
        other["fingerprint"] = json!(format!("fp-{service}"));
        notification["alerts"].as_array_mut().unwrap().push(other);
    }
    let a = s.alert(&notification).await;
    let id = assert_accepted(&a, "am-context");
    let run = s.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    // The run JSON shows what started it.
    assert_eq!(run["trigger"]["labels"]["service"], "checkout", "{run:#}");
    assert_eq!(
        run["trigger"]["fingerprint"], first["fingerprint"],
        "{run:#}"
    );
    assert_eq!(run["trigger"]["status"], "firing", "{run:#}");
    let summary = |path: &str| {
        run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|st| st["step_name"] == path)
            .map(|st| st["output"]["summary"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("no step {path}: {run:#}"))
    };
    assert_eq!(
        summary("read"),
        format!(
            "runbook={} fp={} of=3 since={}",
            first["annotations"]["runbook_url"].as_str().unwrap(),
            first["fingerprint"].as_str().unwrap(),
            first["startsAt"].as_str().unwrap()
        )
    );
    assert_eq!(summary("per-alert/0"), "looked at checkout");
    assert_eq!(summary("per-alert/1"), "looked at payments");
    assert_eq!(summary("per-alert/2"), "looked at search");
    assert!(
        run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|st| st["step_name"] != "per-alert/3"),
        "one branch per alert: {run:#}"
    );

    // A testing-stage pipeline: skipped, logged at INFO with pipeline and source,
    // and counted.
    let a = s
        .alert(&alert(
            "firing",
            "rehearse",
            json!({"alertname": "Rehearsal"}),
        ))
        .await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (202, &json!("skipped_testing")),
        "{a:?}"
    );
    let log = s.log();
    assert!(
        log.lines().any(|l| l.contains("INFO")
            && l.contains("stage testing")
            && l.contains("rehearsal")
            && l.contains("alertmanager")),
        "no INFO line for the skip:\n{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI colour codes in a log that is not a terminal:\n{log}"
    );
    let m = s.metrics().await;
    assert_eq!(
        value(
            &m,
            "vectorstep_webhooks_total",
            &[("source", "alertmanager"), ("status", "skipped_testing")]
        ),
        Some(1.0),
        "{m:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_identical_alerts_starts_exactly_one_run() {
    let pipelines = [
        (
            "burst",
            pipeline(
                "burst",
                "production",
                "  match: {alertname: BurstTest}",
                &[("triage", 20)],
            ),
        ),
        (
            "burst-no-dedup",
            pipeline(
                "burst-no-dedup",
                "production",
                "  match: {alertname: BurstNoDedup}\n  dedup: {enabled: false}",
                &[("slow", 5_000)],
            ),
        ),
    ];
    let s = Intake::start("", "concurrency: {max_runs: 500}", &pipelines).await;

    let body = alert("firing", "burst-1", json!({"alertname": "BurstTest"}));
    let answers = burst(&s, "/webhook?source=alertmanager", vec![body; 200]).await;
    let accepted: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.json["status"] == "accepted")
        .collect();
    assert_eq!(accepted.len(), 1, "exactly one accepted: {answers:#?}");
    let id = accepted[0].run_id();
    for a in &answers {
        assert_eq!(a.status, 202, "{a:?}");
        assert_eq!(a.json["run_id"], id.as_str(), "{a:?}");
    }
    let runs = s.runs(Some("burst")).await;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["id"], id.as_str());

    // With dedup disabled a running run of the same fingerprint still suppresses
    // (the store's guard), and every answer names a run that exists.
    let body = alert("firing", "burst-2", json!({"alertname": "BurstNoDedup"}));
    let answers = burst(&s, "/webhook?source=alertmanager", vec![body; 100]).await;
    let accepted: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.json["status"] == "accepted")
        .collect();
    assert_eq!(accepted.len(), 1, "exactly one accepted: {answers:#?}");
    let id = accepted[0].run_id();
    for a in &answers {
        assert_eq!(a.status, 202, "{a:?}");
        assert_eq!(a.json["run_id"], id.as_str(), "{a:?}");
    }
    // Still running now, so it was running for the whole burst.
    assert_eq!(s.run(&id).await["status"], "running");
    assert_eq!(s.runs(Some("burst-no-dedup")).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_window_zero_disabled_and_per_field_fallback() {
    let pipelines = [
        (
            "window-zero",
            pipeline(
                "window-zero",
                "production",
                "  match: {alertname: WindowZero}\n  dedup: {enabled: true, window_seconds: 0}",
                &[("slow", 1_500)],
            ),
        ),
        (
            "dedup-off",
            pipeline(
                "dedup-off",
                "production",
                "  match: {alertname: DedupOff}\n  dedup: {enabled: false}",
                &[("slow", 1_500)],
            ),
        ),
        (
            "override-on",
            pipeline(
                "override-on",
                "production",
                "  match: {alertname: OverrideOn}\n  dedup: {enabled: true}",
                &[("quick", 0)],
            ),
        ),
        (
            "inherit-off",
            pipeline(
                "inherit-off",
                "production",
                "  match: {alertname: InheritOff}",
                &[("quick", 0)],
            ),
        ),
    ];
    // Service-wide dedup is off; `override-on` turns it on and inherits the window.
    let s = Intake::start(
        "",
        "dedup: {enabled: false, window_seconds: 300}",
        &pipelines,
    )
    .await;

    for (name, alertname) in [("window-zero", "WindowZero"), ("dedup-off", "DedupOff")] {
        let body = alert(
            "firing",
            &format!("fp-{name}"),
            json!({"alertname": alertname}),
        );
        let first = assert_accepted(&s.alert(&body).await, name);
        // A running run always suppresses, whatever the window or the flag.
        let a = s.alert(&body).await;
        assert_deduplicated(&a, &first);
        assert!(
            a.json["reason"]
                .as_str()
                .is_some_and(|r| r.contains("running")),
            "{a:?}"
        );
        assert_eq!(s.wait_terminal(&first).await["status"], "completed");
        // Finished, and no window holds it: a new run.
        let second = assert_accepted(&s.alert(&body).await, name);
        assert_ne!(second, first);
        assert_eq!(s.runs(Some(name)).await.len(), 2);
    }

    let body = alert("firing", "fp-override", json!({"alertname": "OverrideOn"}));
    let first = assert_accepted(&s.alert(&body).await, "override-on");
    s.wait_terminal(&first).await;
    assert_deduplicated(&s.alert(&body).await, &first);

    let body = alert("firing", "fp-inherit", json!({"alertname": "InheritOff"}));
    let first = assert_accepted(&s.alert(&body).await, "inherit-off");
    s.wait_terminal(&first).await;
    let second = assert_accepted(&s.alert(&body).await, "inherit-off");
    assert_ne!(second, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_payloads_by_query_by_header_and_by_pipeline_route() {
    let pipelines = [(
        "offline-demo",
        pipeline(
            "offline-demo",
            "production",
            "  match: {source: nothing-matches-this}",
            &[("first", 10), ("second", 10)],
        ),
    )];
    let s = Intake::start("", "", &pipelines).await;

    // `?source=generic`: explicit routing by name, `trigger.match` ignored.
    let a = s
        .post("/webhook?source=generic", &sample(GENERIC_RUN))
        .await;
    let by_query = assert_accepted(&a, "offline-demo");
    assert_eq!(a.json["source"], "generic");
    assert!(a.json["severity"].is_null(), "{a:?}");
    assert_eq!(
        a.json["summary"],
        "Checkout error rate looks elevated after the 14:05 deploy (demo run)"
    );
    // The same idempotency key is a duplicate.
    let a = s
        .post_raw(
            "/webhook",
            &[("X-Pipeline-Source", "generic")],
            GENERIC_RUN.as_bytes().to_vec(),
        )
        .await;
    assert_deduplicated(&a, &by_query);

    // The header alone names the source; without an idempotency key nothing dedups.
    let body = json!({"pipeline": "offline-demo", "event": "deploy", "summary": "header", "data": {"k": "v"}});
    let mut header_runs = Vec::new();
    for _ in 0..2 {
        let a = s
            .post_raw(
                "/webhook",
                &[("X-Pipeline-Source", "generic")],
                body.to_string().into_bytes(),
            )
            .await;
        header_runs.push(assert_accepted(&a, "offline-demo"));
    }
    assert_ne!(header_runs[0], header_runs[1]);

    // The query wins over the header.
    let a = s
        .post_raw(
            "/webhook?source=generic",
            &[("X-Pipeline-Source", "alertmanager")],
            body.to_string().into_bytes(),
        )
        .await;
    let query_wins = assert_accepted(&a, "offline-demo");
    assert_eq!(a.json["source"], "generic");

    // `POST /pipelines/{name}/run`: the body is a generic payload, the name is forced.
    let a = s
        .post(
            "/pipelines/offline-demo/run",
            &json!({"pipeline": "something-else", "summary": "manual run"}),
        )
        .await;
    let manual = assert_accepted(&a, "offline-demo");
    let a = s
        .post_raw("/pipelines/offline-demo/run", &[], Vec::new())
        .await;
    let empty = assert_accepted(&a, "offline-demo");

    // Unknown names: 404 for the named route, 422 no_match for a generic
    // payload; nothing stored.
    let before = s.run_count().await;
    let a = s.post("/pipelines/nope/run", &json!({})).await;
    a.assert_error(404);
    assert!(
        a.json["detail"]
            .as_str()
            .is_some_and(|d| d.contains("`nope`")),
        "{a:?}"
    );
    let a = s
        .post("/webhook?source=generic", &sample(GENERIC_ESCALATION))
        .await;
    a.assert_error(422);
    assert_eq!(a.json["status"], "no_match");
    assert_eq!(s.run_count().await, before);

    for id in [
        &by_query,
        &header_runs[0],
        &header_runs[1],
        &query_wins,
        &manual,
        &empty,
    ] {
        let run = s.wait_terminal(id).await;
        assert_eq!(run["status"], "completed", "{run:#}");
        assert_eq!(run["pipeline_name"], "offline-demo");
        assert_eq!(run["stage"], "production");
        assert!(run["team"].is_null(), "{run:#}");
        let steps: Vec<&str> = run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|st| st["step_name"].as_str().unwrap())
            .collect();
        assert_eq!(steps, ["first", "second"], "{run:#}");
    }
    assert_eq!(s.run_count().await, 6);
}

// ---------------------------------------------------------------------------
// Rejections.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_requests_answer_the_error_shape_and_store_nothing() {
    let pipelines = [
        (
            "prod",
            pipeline(
                "prod",
                "production",
                "  match: {alertname: {in: [HighErrorRate, HighLatencyP99]}}",
                &[("triage", 0)],
            ),
        ),
        (
            "staging",
            pipeline(
                "staging",
                "testing",
                "  match: {alertname: StagingAlert}",
                &[("triage", 0)],
            ),
        ),
    ];
    let mut s = Intake::start(
        ", max_body_bytes: 2048",
        "auth: {teams: [{name: sre, token: secret}, {name: payments, token: pay-token}], operators: [{name: ops, token: op-token}]}",
        &pipelines,
    )
    .await;
    // Reading runs is an operator route.
    s.bearer = Some("op-token".into());
    let sre = [("Authorization", "Bearer secret")];
    let critical = serde_json::to_vec(&sample(FIRING_CRITICAL)).unwrap();
    assert!(critical.len() < 2048);

    struct Case {
        what: &'static str,
        path: String,
        headers: Vec<(&'static str, &'static str)>,
        body: Vec<u8>,
        status: u16,
        /// A fragment the `error` or `detail` must contain.
        mentions: &'static str,
    }
    let case = |what,
                path: &str,
                headers: &[(&'static str, &'static str)],
                body: Vec<u8>,
                status,
                mentions| Case {
        what,
        path: path.to_string(),
        headers: headers.to_vec(),
        body,
        status,
        mentions,
    };
    let mut oversized = sample(FIRING_CRITICAL);
    oversized["commonAnnotations"]["padding"] = json!("x".repeat(1_000));
    let oversized = serde_json::to_vec(&oversized).unwrap();
    assert!(oversized.len() > 2048);
    let cases = vec![
        case(
            "no token",
            "/webhook?source=alertmanager",
            &[],
            critical.clone(),
            401,
            "",
        ),
        case(
            "wrong token",
            "/webhook?source=alertmanager",
            &[("Authorization", "Bearer wrong")],
            critical.clone(),
            401,
            "",
        ),
        case(
            "token without Bearer",
            "/webhook?source=alertmanager",
            &[("Authorization", "secret")],
            critical.clone(),
            401,
            "",
        ),
        case(
            "token prefix",
            "/webhook?source=alertmanager",
            &[("Authorization", "Bearer secre")],
            critical.clone(),
            401,
            "",
        ),
        case(
            "run route without token",
            "/pipelines/prod/run",
            &[],
            b"{}".to_vec(),
            401,
            "",
        ),
        case(
            "malformed JSON",
            "/webhook?source=alertmanager",
            &sre,
            b"{\"alerts\": [".to_vec(),
            400,
            "",
        ),
        case(
            "not JSON at all",
            "/webhook?source=generic",
            &sre,
            b"pipeline=prod".to_vec(),
            400,
            "",
        ),
        case(
            "missing source",
            "/webhook",
            &sre,
            critical.clone(),
            400,
            "source",
        ),
        case(
            "empty source",
            "/webhook?source=",
            &sre,
            critical.clone(),
            400,
            "source",
        ),
        case(
            "unknown source",
            "/webhook?source=pagerduty",
            &sre,
            critical.clone(),
            400,
            "pagerduty",
        ),
        case(
            "unknown source by header",
            "/webhook",
            &[
                ("Authorization", "Bearer secret"),
                ("X-Pipeline-Source", "datadog"),
            ],
            critical.clone(),
            400,
            "datadog",
        ),
        case(
            "generic without pipeline",
            "/webhook?source=generic",
            &sre,
            br#"{"event": "deploy", "summary": "x"}"#.to_vec(),
            400,
            "pipeline",
        ),
        case(
            "generic pipeline not a string",
            "/webhook?source=generic",
            &sre,
            br#"{"pipeline": 42}"#.to_vec(),
            400,
            "pipeline",
        ),
        case(
            "generic payload not an object",
            "/webhook?source=generic",
            &sre,
            b"[1, 2]".to_vec(),
            400,
            "",
        ),
        case(
            "alerts not a list",
            "/webhook?source=alertmanager",
            &sre,
            br#"{"status": "firing", "alerts": {"a": 1}}"#.to_vec(),
            400,
            "alerts",
        ),
        case(
            "unknown strategy",
            "/webhook?source=alertmanager&strategy=loudest",
            &sre,
            critical.clone(),
            400,
            "loudest",
        ),
        case(
            "body over max_body_bytes",
            "/webhook?source=alertmanager",
            &sre,
            oversized.clone(),
            413,
            "",
        ),
        case(
            "run route body over max_body_bytes",
            "/pipelines/prod/run",
            &sre,
            oversized,
            413,
            "",
        ),
        case(
            "a generic payload naming no loaded pipeline",
            "/webhook?source=generic",
            &sre,
            br#"{"pipeline": "no-such-pipeline"}"#.to_vec(),
            422,
            "",
        ),
        case(
            "the run route of a pipeline that is not loaded",
            "/pipelines/no-such-pipeline/run",
            &sre,
            Vec::new(),
            404,
            "no-such-pipeline",
        ),
    ];
    for c in cases {
        let before = s.run_count().await;
        let a = s.post_raw(&c.path, &c.headers, c.body).await;
        assert_eq!(a.status, c.status, "{}: {a:?}", c.what);
        a.assert_error(c.status);
        let said = format!("{} {}", a.json["error"], a.json["detail"]).to_lowercase();
        assert!(said.contains(c.mentions), "{}: {a:?}", c.what);
        if c.status == 422 {
            assert_eq!(a.json["status"], "no_match", "{}: {a:?}", c.what);
        }
        assert_eq!(
            s.run_count().await,
            before,
            "{}: something was stored",
            c.what
        );
    }

    // A testing pipeline is skipped unless asked for, and then runs with stage testing.
    let staging = serde_json::to_vec(&alert(
        "firing",
        "staging-1",
        json!({"alertname": "StagingAlert"}),
    ))
    .unwrap();
    let before = s.run_count().await;
    let a = s
        .post_raw("/webhook?source=alertmanager", &sre, staging.clone())
        .await;
    a.assert_status(202, "skipped_testing");
    assert_eq!(a.json["pipeline"], "staging");
    assert!(a.json.get("run_id").is_none(), "{a:?}");
    assert_eq!(s.run_count().await, before);
    let a = s
        .post_raw(
            "/webhook?source=alertmanager&allow_testing=true",
            &sre,
            staging,
        )
        .await;
    let testing = assert_accepted(&a, "staging");
    let run = s.wait_terminal(&testing).await;
    assert_eq!(run["stage"], "testing");
    assert_eq!(run["team"], "sre");

    // The token's team is recorded on the run.
    let a = s
        .post_raw("/webhook?source=alertmanager", &sre, critical.clone())
        .await;
    let sre_run = assert_accepted(&a, "prod");
    let a = s
        .post_raw(
            "/webhook?source=alertmanager",
            &[("Authorization", "Bearer pay-token")],
            serde_json::to_vec(&sample(FIRING_WARNING)).unwrap(),
        )
        .await;
    let payments_run = assert_accepted(&a, "prod");
    let a = s
        .post_raw(
            "/pipelines/prod/run",
            &[("Authorization", "Bearer pay-token")],
            b"{}".to_vec(),
        )
        .await;
    let manual_run = assert_accepted(&a, "prod");
    assert_eq!(s.wait_terminal(&sre_run).await["team"], "sre");
    assert_eq!(s.wait_terminal(&payments_run).await["team"], "payments");
    assert_eq!(s.wait_terminal(&manual_run).await["team"], "payments");

    // Runs and approvals routes.
    let before = s.run_count().await;
    s.get("/runs/no-such-run").await.assert_error(404);
    s.get("/runs?limit=many").await.assert_error(400);
    s.post("/runs/no-such-run/cancel", &json!({}))
        .await
        .assert_error(404);
    let a = s.post(&format!("/runs/{sre_run}/cancel"), &json!({})).await;
    a.assert_error(409);
    assert!(a.text.contains("completed"), "{a:?}");
    assert_eq!(s.run(&sre_run).await["status"], "completed");
    s.post(
        "/approvals/no-such-token",
        &json!({"decision": "approve", "by": "alice"}),
    )
    .await
    .assert_error(404);
    assert_eq!(s.run_count().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_429_and_cancel_ends_a_running_run() {
    let pipelines = [
        (
            "slow",
            pipeline(
                "slow",
                "production",
                "  match: {alertname: Slow}",
                &[("first", 3_000), ("second", 0)],
            ),
        ),
        (
            "quick",
            pipeline(
                "quick",
                "production",
                "  match: {alertname: Quick}",
                &[("only", 0)],
            ),
        ),
    ];
    let s = Intake::start("", "concurrency: {max_runs: 1}", &pipelines).await;

    let slow = alert("firing", "slow-1", json!({"alertname": "Slow"}));
    let id = assert_accepted(&s.alert(&slow).await, "slow");
    // The step record is written by the driver, so the run counts as active now.
    s.wait_run(&id, "in its first step", |r| {
        r["steps"]
            .as_array()
            .is_some_and(|st| st.iter().any(|x| x["step_name"] == "first"))
    })
    .await;

    let before = s.run_count().await;
    let quick = alert("firing", "quick-1", json!({"alertname": "Quick"}));
    let a = s.alert(&quick).await;
    a.assert_error(429);
    assert_eq!(a.json["status"], "overloaded", "{a:?}");
    let a = s.post("/pipelines/quick/run", &json!({})).await;
    a.assert_error(429);
    assert_eq!(s.run_count().await, before);

    // Cancel: the step in flight finishes and is kept; nothing after it runs.
    let a = s.post(&format!("/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(a.status, 200, "{a:?}");
    let run = s.wait_terminal(&id).await;
    assert_eq!(run["status"], "cancelled", "{run:#}");
    assert_eq!(events(&run, "run_cancelled").len(), 1, "{run:#}");
    let steps: Vec<&str> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["step_name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["first"], "{run:#}");
    s.post(&format!("/runs/{id}/cancel"), &json!({}))
        .await
        .assert_error(409);

    // Once idle, runs are taken again.
    wait_idle(&s).await;
    let done = assert_accepted(&s.alert(&quick).await, "quick");
    assert_eq!(s.wait_terminal(&done).await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_never_earn_a_server_error() {
    let pipelines = [
        (
            "catch-all",
            pipeline("catch-all", "production", "  match: {}", &[("only", 0)]),
        ),
        (
            "numbers",
            pipeline(
                "numbers",
                "production",
                "  match:\n    replicas: {gte: 1}",
                &[("only", 0)],
            ),
        ),
    ];
    let s = Intake::start("", "concurrency: {max_runs: 1000}", &pipelines).await;
    let bodies = hostile_bodies();
    assert!(bodies.len() >= 500, "only {} bodies", bodies.len());
    let routes: &[(&str, &[(&str, &str)])] = &[
        ("/webhook?source=alertmanager", &[]),
        ("/webhook?source=generic", &[]),
        ("/webhook?source=alertmanager&strategy=common_labels", &[]),
        ("/webhook", &[("X-Pipeline-Source", "generic")]),
        ("/pipelines/catch-all/run", &[]),
    ];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut sent = 0usize;
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for (i, body) in bodies.iter().enumerate() {
        // The first two routes get every body, the others take turns.
        let extra = 2 + i % (routes.len() - 2);
        for (path, headers) in [routes[0], routes[1], routes[extra]] {
            let a = s.post_raw(path, headers, body.clone()).await;
            sent += 1;
            *by_status.entry(a.status).or_default() += 1;
            assert!(
                (200..500).contains(&a.status),
                "POST {path} answered {} for body {:?}: {}\n{}",
                a.status,
                String::from_utf8_lossy(&body[..body.len().min(300)]),
                a.text,
                s.svc.log_tail()
            );
            if a.status >= 400 && a.status != 422 {
                a.assert_error(a.status);
            }
        }
        assert!(
            Instant::now() < deadline,
            "only {sent} requests in the time bound"
        );
    }
    // Odd sources and query strings.
    for (path, headers) in [
        ("/webhook?source=%FF", &[][..]),
        ("/webhook?source=%ZZ", &[]),
        ("/webhook?source=alertmanager&source=generic", &[]),
        ("/webhook?source", &[]),
        ("/webhook?strategy=&source=alertmanager", &[]),
        ("/webhook?allow_testing=maybe&source=alertmanager", &[]),
        ("/webhook", &[("X-Pipeline-Source", "")]),
        ("/webhook", &[("X-Pipeline-Source", "ALERTMANAGER")]),
    ] {
        let a = s
            .post_raw(path, headers, FIRING_CRITICAL.as_bytes().to_vec())
            .await;
        sent += 1;
        assert!((200..500).contains(&a.status), "POST {path}: {a:?}");
        if a.status >= 400 {
            a.assert_error(a.status);
        }
    }
    let mut req = s
        .http
        .post(s.url("/webhook"))
        .body(FIRING_CRITICAL.as_bytes().to_vec());
    req = req.header(
        "X-Pipeline-Source",
        reqwest::header::HeaderValue::from_bytes(b"al\xffert").unwrap(),
    );
    let a = s.send(req).await;
    a.assert_error(400);

    assert!(sent >= 1_000, "only {sent} requests sent");
    let health = s.get("/healthz").await;
    assert_eq!(health.status, 200, "{health:?}");
    eprintln!("hostile bodies: {sent} requests, answers by status {by_status:?}");
}

// ---------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------

#[test]
fn the_prometheus_parser_reads_labels_escapes_and_special_values() {
    let text = "# HELP x y\n# TYPE a counter\na_total 3\n\
                b{pipeline=\"p\\\"q\",status=\"ok\"} 1.5 1700000000\n\
                c{le=\"+Inf\",x=\"a,b}\\\\\"} +Inf\n\n";
    let got = parse_prometheus(text);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(value(&got, "a_total", &[]), Some(3.0));
    assert_eq!(
        value(&got, "b", &[("pipeline", "p\"q"), ("status", "ok")]),
        Some(1.5)
    );
    assert_eq!(got[2].labels["x"], "a,b}\\");
    assert_eq!(got[2].value, f64::INFINITY);
    assert_eq!(value(&got, "b", &[("status", "failed")]), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_runs_steps_and_webhooks() {
    let mut failing = pipeline("breaks", "production", "  match: {source: generic}", &[]);
    failing.push_str(
        "  - name: boom\n    executor: mock\n    executor_config: {fail: \"disk on fire\"}\n",
    );
    let pipelines = [
        (
            "two-steps",
            pipeline(
                "two-steps",
                "production",
                "  match: {alertname: Two}",
                &[("first", 0), ("second", 0)],
            ),
        ),
        ("z-breaks", failing),
        (
            "z-idle",
            pipeline(
                "idle",
                "production",
                "  match: {alertname: Never}",
                &[("x", 0)],
            ),
        ),
    ];
    let s = Intake::start("", "", &pipelines).await;

    // Before any event: every loaded pipeline's counters are there at 0, and
    // every metric family has its # HELP.
    let text = s.get("/metrics").await.text;
    let zero = parse_prometheus(&text);
    for p in ["two-steps", "breaks", "idle"] {
        for (name, labels) in [
            ("vectorstep_runs_started_total", vec![("pipeline", p)]),
            (
                "vectorstep_runs_finished_total",
                vec![("pipeline", p), ("status", "completed")],
            ),
            (
                "vectorstep_runs_finished_total",
                vec![("pipeline", p), ("status", "interrupted")],
            ),
            ("vectorstep_runs_resumed_total", vec![("pipeline", p)]),
        ] {
            assert_eq!(
                value(&zero, name, &labels),
                Some(0.0),
                "{name} {labels:?}:\n{text}"
            );
        }
    }

    let mut ids = Vec::new();
    for i in 0..3 {
        let body = alert("firing", &format!("two-{i}"), json!({"alertname": "Two"}));
        ids.push(assert_accepted(&s.alert(&body).await, "two-steps"));
    }
    // A duplicate, a no_match, a bad source, a missing pipeline.
    let dup = alert("firing", "two-0", json!({"alertname": "Two"}));
    assert_deduplicated(&s.alert(&dup).await, &ids[0]);
    let a = s
        .alert(&alert("firing", "none", json!({"alertname": "Nothing"})))
        .await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (200, &json!("no_match")),
        "{a:?}"
    );
    s.post("/webhook?source=bogus", &json!({}))
        .await
        .assert_error(400);
    s.post("/webhook?source=generic", &json!({"event": "x"}))
        .await
        .assert_error(400);
    // Two generic runs of the failing pipeline.
    ids.push(assert_accepted(
        &s.post("/webhook?source=generic", &json!({"pipeline": "breaks"}))
            .await,
        "breaks",
    ));
    ids.push(assert_accepted(
        &s.post("/pipelines/breaks/run", &json!({})).await,
        "breaks",
    ));
    let mut breaks_status = String::new();
    for id in &ids {
        let run = s.wait_terminal(id).await;
        if run["pipeline_name"] == "breaks" {
            breaks_status = run["status"].as_str().unwrap().to_string();
            assert_ne!(breaks_status, "completed", "{run:#}");
        } else {
            assert_eq!(run["status"], "completed", "{run:#}");
        }
    }
    wait_idle(&s).await;

    // Counters are bumped just after the store commit the run view reflects, so poll
    // (bounded) for the last of them.
    let deadline = Instant::now() + WAIT;
    let m = loop {
        let m = s.metrics().await;
        let finished = value(&m, "vectorstep_runs_finished_total", &[]).unwrap_or(0.0);
        if finished >= 5.0 || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(POLL).await;
    };
    let v = |name: &str, labels: &[(&str, &str)]| value(&m, name, labels);
    assert_eq!(
        v(
            "vectorstep_runs_started_total",
            &[("pipeline", "two-steps")]
        ),
        Some(3.0)
    );
    assert_eq!(
        v("vectorstep_runs_started_total", &[("pipeline", "breaks")]),
        Some(2.0)
    );
    assert_eq!(v("vectorstep_runs_started_total", &[]), Some(5.0));
    assert_eq!(
        v(
            "vectorstep_runs_finished_total",
            &[("pipeline", "two-steps"), ("status", "completed")]
        ),
        Some(3.0)
    );
    assert_eq!(
        v(
            "vectorstep_runs_finished_total",
            &[("pipeline", "breaks"), ("status", &breaks_status)]
        ),
        Some(2.0)
    );
    assert_eq!(v("vectorstep_runs_finished_total", &[]), Some(5.0));
    for step in ["first", "second"] {
        assert_eq!(
            v(
                "vectorstep_steps_total",
                &[
                    ("pipeline", "two-steps"),
                    ("step", step),
                    ("executor", "mock"),
                    ("status", "completed")
                ]
            ),
            Some(3.0),
            "{m:#?}"
        );
    }
    assert_eq!(
        v(
            "vectorstep_steps_total",
            &[
                ("pipeline", "breaks"),
                ("step", "boom"),
                ("executor", "mock"),
                ("status", "failed")
            ]
        ),
        Some(2.0),
        "{m:#?}"
    );
    assert_eq!(v("vectorstep_steps_total", &[]), Some(8.0), "{m:#?}");
    let hooks = |source: &str, status: &str| {
        v(
            "vectorstep_webhooks_total",
            &[("source", source), ("status", status)],
        )
    };
    assert_eq!(hooks("alertmanager", "accepted"), Some(3.0), "{m:#?}");
    assert_eq!(hooks("alertmanager", "deduplicated"), Some(1.0), "{m:#?}");
    assert_eq!(hooks("alertmanager", "no_match"), Some(1.0), "{m:#?}");
    assert_eq!(hooks("generic", "accepted"), Some(2.0), "{m:#?}");
    // Refusals are counted by answer word, never by HTTP code.
    assert_eq!(hooks("bogus", "bad_request"), Some(1.0), "{m:#?}");
    assert_eq!(hooks("generic", "bad_request"), Some(1.0), "{m:#?}");
    assert!(
        m.iter()
            .filter(|x| x.name == "vectorstep_webhooks_total")
            .all(|x| x
                .labels
                .get("status")
                .is_some_and(|st| !st.chars().all(|c| c.is_ascii_digit()))),
        "a status label that is an HTTP code: {m:#?}"
    );
    assert_eq!(
        v("vectorstep_webhooks_total", &[("source", "bogus")]),
        Some(1.0),
        "{m:#?}"
    );
    assert_eq!(
        v("vectorstep_webhooks_total", &[("source", "generic")]),
        Some(3.0),
        "{m:#?}"
    );
    assert_eq!(v("vectorstep_webhooks_total", &[]), Some(9.0), "{m:#?}");
    assert_eq!(v("vectorstep_runs_in_progress", &[]), Some(0.0));
    // Each step duration was observed once per step run, into a histogram.
    assert_eq!(
        v(
            "vectorstep_step_duration_seconds_count",
            &[("pipeline", "two-steps"), ("step", "first")]
        ),
        Some(3.0),
        "{m:#?}"
    );
    for (le, want) in [("0.05", 3.0), ("3600", 3.0), ("+Inf", 3.0)] {
        assert_eq!(
            v(
                "vectorstep_step_duration_seconds_bucket",
                &[("pipeline", "two-steps"), ("step", "first"), ("le", le)]
            ),
            Some(want),
            "le={le}: {m:#?}"
        );
    }
    let text = s.get("/metrics").await.text;
    assert!(
        text.contains("# TYPE vectorstep_step_duration_seconds histogram"),
        "{text}"
    );
    let families: std::collections::BTreeSet<&str> = m
        .iter()
        .map(|x| {
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| {
                    x.name
                        .strip_suffix(suffix)
                        .filter(|_| x.name.starts_with("vectorstep_step_duration"))
                })
                .unwrap_or(&x.name)
        })
        .collect();
    for family in families {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no # HELP for {family}:\n{text}"
        );
    }
    promtool_check(&text);
}

/// `promtool check metrics` (Debian package `prometheus`) finds nothing wrong.
fn promtool_check(text: &str) {
    use std::io::Write as _;
    let mut child = match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!(
            "promtool is needed to check /metrics ({e}); install it: sudo apt-get install -y prometheus \
             (tests/run.sh does)"
        ),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_is_deduplicated_even_when_overloaded() {
    let pipelines = [(
        "slow",
        pipeline(
            "slow",
            "production",
            "  match: {alertname: Slow}",
            &[("first", 3_000)],
        ),
    )];
    let s = Intake::start("", "concurrency: {max_runs: 1}", &pipelines).await;
    let body = alert("firing", "slow-dup", json!({"alertname": "Slow"}));
    let id = assert_accepted(&s.alert(&body).await, "slow");
    s.wait_run(&id, "in its first step", |r| {
        r["steps"].as_array().is_some_and(|st| !st.is_empty())
    })
    .await;
    // Reference 7.1: dedup (step 7) is decided before the concurrency cap (step 8),
    // so Alertmanager's retries of a running alert are answered, not refused.
    assert_deduplicated(&s.alert(&body).await, &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_cap_holds_under_a_burst_of_distinct_alerts() {
    let pipelines = [(
        "slow",
        pipeline(
            "slow",
            "production",
            "  match: {alertname: Slow}",
            &[("first", 3_000)],
        ),
    )];
    let s = Intake::start("", "concurrency: {max_runs: 2}", &pipelines).await;
    let bodies = (0..40)
        .map(|i| alert("firing", &format!("slow-{i}"), json!({"alertname": "Slow"})))
        .collect();
    let answers = burst(&s, "/webhook?source=alertmanager", bodies).await;
    let accepted = answers
        .iter()
        .filter(|a| a.json["status"] == "accepted")
        .count();
    for a in &answers {
        assert!(
            a.json["status"] == "accepted" || a.json["status"] == "overloaded",
            "{a:?}"
        );
    }
    assert!(
        (1..=2).contains(&accepted),
        "{accepted} runs accepted at max_runs 2"
    );
    assert_eq!(s.run_count().await, accepted);
}
