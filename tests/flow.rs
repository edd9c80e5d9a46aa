//! Every flow rule of the runner (SPEC 4, 5, 7 and the reference's section 4),
//! driven in-process with the `mock` executor: one real store in a tempdir per
//! run, the pipeline written inline, and one `check(yaml, expected)` helper that
//! runs it to the end and compares statuses, records and the run log.

mod common;
use common::engine::Scratch;

use serde_json::{json, Value};
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, DriveMode, RunEnd};
use vectorstep::store::{EventRecord, NotificationRecord, RunRecord, StepRecord, Store};

// ---------------------------------------------------------------- harness

/// Step records as (path, status).
type Records = &'static [(&'static str, &'static str)];

/// The (action, rendered text) of the one notification a run sends, if any.
type Notified = Option<(&'static str, &'static str)>;

/// What a finished run must look like. Empty fields are not checked.
#[derive(Default)]
struct Expect {
    /// The run's terminal status (always checked).
    status: &'static str,
    /// Every step record as (path, status), in store order (pipeline order).
    steps: Records,
    /// Events that must be in the run log.
    events: &'static [&'static str],
    /// Events that must not be in the run log.
    absent: &'static [&'static str],
    /// Exact number of times an event appears.
    counts: &'static [(&'static str, usize)],
    /// Attempts recorded on a step.
    attempts: &'static [(&'static str, u32)],
    /// The run's `tokens_used`.
    tokens: Option<u64>,
    /// A substring of the run's `reason`.
    reason: Option<&'static str>,
}

/// A finished run and everything the store holds about it.
struct Ran {
    id: String,
    run: RunRecord,
    steps: Vec<StepRecord>,
    events: Vec<EventRecord>,
    notifications: Vec<NotificationRecord>,
    store: Store,
    _dir: tempfile::TempDir,
}

impl Ran {
    fn step(&self, path: &str) -> &StepRecord {
        self.steps
            .iter()
            .find(|s| s.step_path == path)
            .unwrap_or_else(|| panic!("no record for step `{path}`: {:?}", self.step_list()))
    }

    fn output(&self, path: &str) -> Value {
        let rec = self.step(path);
        let text = rec
            .output_json
            .as_deref()
            .unwrap_or_else(|| panic!("step `{path}` has no output"));
        serde_json::from_str(text).unwrap()
    }

    fn summary(&self, path: &str) -> String {
        self.output(path)["summary"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn step_list(&self) -> Vec<(String, String)> {
        self.steps
            .iter()
            .map(|s| (s.step_path.clone(), s.status.to_string()))
            .collect()
    }

    fn event_names(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.event.as_str()).collect()
    }

    /// The fields of every event called `name`, in log order.
    fn fields(&self, name: &str) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.event == name)
            .map(|e| serde_json::from_str(&e.fields_json).unwrap())
            .collect()
    }

    /// Position in the log of the first event `name` whose `step` field is `step`.
    fn position(&self, name: &str, step: &str) -> Option<usize> {
        self.events.iter().position(|e| {
            e.event == name
                && serde_json::from_str::<Value>(&e.fields_json).unwrap()["step"] == step
        })
    }
}

/// Strips the common indentation so pipelines can be written indented in code.
fn dedent(text: &str) -> String {
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| if l.len() >= indent { &l[indent..] } else { "" })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Loads `pipelines` (the first one is run) into a fresh store, triggers the first
/// with `labels` and drives it to its end.
async fn run_pipelines(pipelines: &[&str], labels: &[(&str, &str)]) -> Ran {
    let files: Vec<(String, String)> = pipelines
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("p{i}"), dedent(p)))
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, y)| (n.as_str(), y.as_str()))
        .collect();
    let Scratch { engine, store, dir } = common::engine::engine_with(&files);
    let pipeline = engine
        .pipeline(&pipeline_name(pipelines[0]))
        .expect("first pipeline loaded");
    let trigger = Normalised {
        source: "generic".into(),
        pipeline: Some(pipeline.name.clone()),
        severity: Some("critical".into()),
        summary: Some("disk full".into()),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let Created::Inserted(id) = engine
        .create_run(&pipeline, &trigger, &json!({}), None, None)
        .await
        .unwrap()
    else {
        panic!("run was deduplicated")
    };
    let end = engine.drive(&id, DriveMode::New).await.unwrap();
    let run = store.run(&id).unwrap().unwrap();
    assert_eq!(end, RunEnd::Finished(run.status));
    Ran {
        steps: store.steps(&id).unwrap(),
        events: store.events(&id).unwrap(),
        notifications: store.notifications_of_run(&id).unwrap(),
        id,
        run,
        store,
        _dir: dir,
    }
}

fn pipeline_name(yaml: &str) -> String {
    dedent(yaml)
        .lines()
        .find_map(|l| l.strip_prefix("name: "))
        .expect("pipeline has a top-level name")
        .trim()
        .to_string()
}

/// Runs `yaml` and compares the result with `expect`.
async fn check(yaml: &str, expect: Expect) -> Ran {
    check_with(&[yaml], &[], expect).await
}

async fn check_with(pipelines: &[&str], labels: &[(&str, &str)], expect: Expect) -> Ran {
    let ran = run_pipelines(pipelines, labels).await;
    let ctx = format!(
        "\npipeline:\n{}\nsteps: {:?}\nevents: {:?}\nreason: {:?}",
        dedent(pipelines[0]),
        ran.step_list(),
        ran.event_names(),
        ran.run.reason
    );
    assert_eq!(ran.run.status, expect.status, "run status{ctx}");
    if !expect.steps.is_empty() {
        let want: Vec<(String, String)> = expect
            .steps
            .iter()
            .map(|(p, s)| (p.to_string(), s.to_string()))
            .collect();
        assert_eq!(ran.step_list(), want, "step records{ctx}");
    }
    for e in expect.events {
        assert!(ran.event_names().contains(e), "missing event `{e}`{ctx}");
    }
    for e in expect.absent {
        assert!(
            !ran.event_names().contains(e),
            "unexpected event `{e}`{ctx}"
        );
    }
    for (e, n) in expect.counts {
        assert_eq!(ran.fields(e).len(), *n, "count of `{e}`{ctx}");
    }
    for (path, n) in expect.attempts {
        assert_eq!(ran.step(path).attempts, *n, "attempts of `{path}`{ctx}");
    }
    if let Some(t) = expect.tokens {
        assert_eq!(ran.run.tokens_used, t, "tokens_used{ctx}");
    }
    if let Some(r) = expect.reason {
        let reason = ran.run.reason.clone().unwrap_or_default();
        assert!(reason.contains(r), "reason {reason:?} lacks {r:?}{ctx}");
    }
    ran
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

// ---------------------------------------------------------------- gate

fn gate_pipeline(conf: f64, threshold: f64, on_low: &str, proceed: bool) -> String {
    format!(
        r#"
        name: gate
        trigger: {{}}
        steps:
          - name: judge
            executor: mock
            confidence_threshold: {threshold}
            on_low_confidence: {on_low}
            executor_config:
              output: {{confidence: {conf}, summary: "judged", next_step_context: "", proceed: {proceed}, proceed_reason: "operator said no"}}
          - name: after
            executor: mock
        "#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confidence_gate_and_proceed() {
    const DONE: &[(&str, &str)] = &[("judge", "completed"), ("after", "completed")];
    #[rustfmt::skip]
    let rows: &[(f64, f64, &str, bool, &str, Records, &str)] = &[
        // confidence, threshold, on_low_confidence, proceed -> run, steps, judge's event
        (0.9, 0.75, "escalate", true, "completed", DONE, "step_completed"),
        // Strictly below: equal to the threshold passes.
        (0.75, 0.75, "escalate", true, "completed", DONE, "step_completed"),
        (0.74, 0.75, "escalate", true, "escalated", &[("judge", "escalated")], "step_escalated"),
        (0.5, 0.75, "abort", true, "aborted", &[("judge", "aborted")], "step_aborted"),
        (0.75, 0.75, "abort", true, "completed", DONE, "step_completed"),
        (0.5, 0.75, "proceed", true, "completed", DONE, "step_completed"),
        (0.9, 0.75, "escalate", false, "stopped", &[("judge", "stopped")], "step_stopped"),
        // A low-confidence escalate or abort wins over proceed=false.
        (0.1, 0.75, "escalate", false, "escalated", &[("judge", "escalated")], "step_escalated"),
        (0.1, 0.75, "abort", false, "aborted", &[("judge", "aborted")], "step_aborted"),
        // proceed lets low confidence through, then proceed=false stops.
        (0.1, 0.75, "proceed", false, "stopped", &[("judge", "stopped")], "step_stopped"),
    ];
    let all = [
        "step_completed",
        "step_escalated",
        "step_aborted",
        "step_stopped",
    ];
    for &(conf, threshold, on_low, proceed, status, steps, event) in rows {
        let yaml = gate_pipeline(conf, threshold, on_low, proceed);
        let ran = check(
            &yaml,
            Expect {
                status,
                steps,
                events: &["run_started", "step_started", "run_finished"],
                ..Default::default()
            },
        )
        .await;
        // The judge's own terminal event, and no other.
        let judge_events: Vec<&str> = all
            .iter()
            .copied()
            .filter(|e| ran.position(e, "judge").is_some())
            .collect();
        assert_eq!(
            judge_events,
            vec![event],
            "row {conf} {threshold} {on_low} {proceed}"
        );
        assert!(close(ran.step("judge").effective_confidence, conf));
        if status != "completed" {
            assert_eq!(ran.run.terminal_step.as_deref(), Some("judge"));
        }
        if status == "stopped" {
            // A stopped run's final output is the stopping step's.
            let fin: Value =
                serde_json::from_str(ran.run.final_output_json.as_deref().unwrap()).unwrap();
            assert_eq!(fin["proceed_reason"], "operator said no");
        }
    }
}

// ---------------------------------------------------------------- when

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_skips_steps_groups_and_fan_outs() {
    let ran = check_with(
        &[r#"
        name: when
        trigger: {}
        context_template: {include: [labels.service]}
        steps:
          - name: first
            executor: mock
            executor_config:
              output: {confidence: 0.9, summary: "first", next_step_context: ""}
          - name: deep-dive
            executor: mock
            when: "steps.first.confidence < 0.5"
          - name: for-checkout
            executor: mock
            when: "service == 'checkout'"
          - name: for-payments
            executor: mock
            when: "service == 'payments'"
          - parallel:
              name: g
              when: "false"
              steps:
                - {name: a, executor: mock, prompt_template: ""}
          - fan_out:
              name: fo
              when: "steps.first.summary == 'other'"
              over: '["x"]'
              executor: mock
          - name: broken-when
            executor: mock
            when: "(1 // 0) > 0"
          - name: last
            executor: mock
            executor_config:
              output:
                confidence: 1.0
                summary: "deep={{ steps.deep_dive is defined }} checkout={{ steps.for_checkout is defined }}"
                next_step_context: ""
        "#],
        &[("service", "checkout")],
        Expect {
            status: "completed",
            steps: &[
                ("first", "completed"),
                ("deep-dive", "skipped"),
                ("for-checkout", "completed"),
                ("for-payments", "skipped"),
                ("g", "skipped"),
                ("fo", "skipped"),
                // A `when` that cannot be evaluated counts as false.
                ("broken-when", "skipped"),
                ("last", "completed"),
            ],
            counts: &[("step_skipped", 5)],
            absent: &["parallel_group_started", "fan_out_started"],
            ..Default::default()
        },
    )
    .await;
    // A skipped step registers no output; the run's final output is the last step's.
    assert_eq!(ran.summary("last"), "deep=False checkout=True");
    let fin: Value = serde_json::from_str(ran.run.final_output_json.as_deref().unwrap()).unwrap();
    assert_eq!(fin["summary"], "deep=False checkout=True");
    let skipped: Vec<Value> = ran.fields("step_skipped");
    assert_eq!(skipped[0]["step"], "deep-dive");
    assert!(ran.position("step_started", "deep-dive").is_none());
}

// ---------------------------------------------------------------- failures, retry, timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_abort_and_continue() {
    // Default policy: the run fails at the step and nothing after it runs.
    let ran = check(
        r#"
        name: fail
        trigger: {}
        steps:
          - name: broken
            executor: mock
            executor_config: {fail: "disk on fire"}
          - name: after
            executor: mock
        "#,
        Expect {
            status: "failed",
            steps: &[("broken", "failed")],
            events: &["step_started", "step_failed"],
            absent: &["step_failed_continuing", "step_retrying"],
            attempts: &[("broken", 1)],
            reason: Some("disk on fire"),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.run.terminal_step.as_deref(), Some("broken"));
    assert_eq!(ran.step("broken").effective_confidence, None);
    assert!(ran
        .step("broken")
        .error
        .as_deref()
        .unwrap()
        .contains("disk on fire"));

    // Explicit abort in the block form behaves the same.
    check(
        r#"
        name: fail
        trigger: {}
        steps:
          - name: broken
            executor: mock
            on_failure: {policy: abort}
            executor_config: {fail: true}
          - name: after
            executor: mock
        "#,
        Expect {
            status: "failed",
            steps: &[("broken", "failed")],
            reason: Some("mock failure"),
            ..Default::default()
        },
    )
    .await;

    // continue: the run goes on, the failed output is registered (confidence 0,
    // error as summary) and the run completes.
    let ran = check(
        r#"
        name: fail
        trigger: {}
        steps:
          - name: broken
            executor: mock
            on_failure: continue
            executor_config: {fail: true}
          - name: after
            executor: mock
            executor_config:
              output:
                confidence: 1.0
                summary: "saw {{ steps.broken.confidence }} {{ steps.broken.summary }}"
                next_step_context: ""
        "#,
        Expect {
            status: "completed",
            steps: &[("broken", "failed"), ("after", "completed")],
            events: &["step_failed", "step_failed_continuing"],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("after"), "saw 0.0 mock failure");
    assert_eq!(ran.fields("step_failed_continuing")[0]["step"], "broken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_counts_attempts_and_backs_off() {
    #[rustfmt::skip]
    let rows: &[(&str, u32, &[f64])] = &[
        // retry block -> attempts recorded, delays of the step_retrying events
        ("", 1, &[]),
        ("retry: {attempts: 1, backoff: fixed, delay_seconds: 0.01}", 1, &[]),
        ("retry: {attempts: 3, backoff: fixed, delay_seconds: 0.01}", 3, &[0.01, 0.01]),
        ("retry: {attempts: 4, backoff: exponential, delay_seconds: 0.01}", 4, &[0.01, 0.02, 0.04]),
    ];
    for &(retry, attempts, delays) in rows {
        let yaml = format!(
            r#"
            name: retry
            trigger: {{}}
            steps:
              - name: flaky
                executor: mock
                {retry}
                executor_config: {{fail: true}}
            "#
        );
        let ran = check(
            &yaml,
            Expect {
                status: "failed",
                steps: &[("flaky", "failed")],
                ..Default::default()
            },
        )
        .await;
        assert_eq!(ran.step("flaky").attempts, attempts, "{retry}");
        let got: Vec<f64> = ran
            .fields("step_retrying")
            .iter()
            .map(|f| f["delay_seconds"].as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), delays.len(), "{retry}");
        for (g, w) in got.iter().zip(delays) {
            assert!((g - w).abs() < 1e-9, "{retry}: delays {got:?}");
        }
        // Every retry carries the same idempotency key.
        assert_eq!(
            ran.step("flaky").idempotency_key,
            format!("{}:flaky:1", ran.id)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_error_is_not_retried() {
    #[rustfmt::skip]
    let rows: &[(&str, u32, usize, &str)] = &[
        // step body -> attempts, step_retrying events, reason
        // A configuration error (the executor cannot work as configured): once.
        ("executor: shell\n    executor_config: {command: [\"true\"], cwd: /nonexistent/vectorstep-dir}",
         1, 0, "is not a directory"),
        // A template that cannot render: once. (An unknown function or filter
        // is a load error now; a missing include is found only when rendering.)
        ("executor: mock\n    prompt_template: \"{% include 'missing' %}\"", 1, 0, "template error"),
        // An error of the call itself is retried as before.
        ("executor: shell\n    executor_config: {command: [\"/nonexistent/vectorstep-program\"]}",
         3, 2, "cannot start"),
    ];
    for &(body, attempts, retries, reason) in rows {
        let yaml = format!(
            "name: config-error\ntrigger: {{}}\nsteps:\n  - name: broken\n    {body}\n    retry: {{attempts: 3, backoff: fixed, delay_seconds: 0.01}}\n"
        );
        let ran = check(
            &yaml,
            Expect {
                status: "failed",
                steps: &[("broken", "failed")],
                events: &["step_failed"],
                ..Default::default()
            },
        )
        .await;
        assert_eq!(ran.step("broken").attempts, attempts, "{body}");
        assert_eq!(ran.fields("step_retrying").len(), retries, "{body}");
        let got = ran.run.reason.clone().unwrap_or_default();
        assert!(got.contains(reason), "{body}: reason {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_fails_each_attempt() {
    let ran = check(
        r#"
        name: slow
        trigger: {}
        steps:
          - name: slow
            executor: mock
            timeout_seconds: 0.05
            retry: {attempts: 2, backoff: fixed, delay_seconds: 0.01}
            executor_config: {delay_ms: 5000}
          - name: after
            executor: mock
        "#,
        Expect {
            status: "failed",
            steps: &[("slow", "failed")],
            events: &["step_failed"],
            counts: &[("step_retrying", 1)],
            attempts: &[("slow", 2)],
            reason: Some("Step timed out after 0.05s"),
            ..Default::default()
        },
    )
    .await;
    let took = ran.step("slow").duration_ms.unwrap();
    assert!(
        took < 4000,
        "the timeout did not cut the call short: {took}ms"
    );

    // Under the timeout the step completes.
    check(
        r#"
        name: slow
        trigger: {}
        steps:
          - name: slow
            executor: mock
            timeout_seconds: 5
            executor_config: {delay_ms: 10}
        "#,
        Expect {
            status: "completed",
            steps: &[("slow", "completed")],
            ..Default::default()
        },
    )
    .await;

    // `timeout_seconds: 0` means no timeout.
    check(
        r#"
        name: slow
        trigger: {}
        steps:
          - name: slow
            executor: mock
            timeout_seconds: 0
            executor_config: {delay_ms: 20}
        "#,
        Expect {
            status: "completed",
            steps: &[("slow", "completed")],
            ..Default::default()
        },
    )
    .await;

    // A fan-out's timeout bounds each branch; timed-out branches count 0.0.
    let ran = check(
        r#"
        name: slow
        trigger: {}
        steps:
          - fan_out:
              name: fo
              over: '["a", "b"]'
              timeout_seconds: 0.05
              executor: mock
              executor_config: {delay_ms: 5000}
        "#,
        Expect {
            status: "escalated",
            steps: &[("fo", "escalated"), ("fo/0", "failed"), ("fo/1", "failed")],
            counts: &[("branch_failed", 2)],
            ..Default::default()
        },
    )
    .await;
    assert!(ran
        .step("fo/1")
        .error
        .as_deref()
        .unwrap()
        .contains("timed out"));
    assert!(close(ran.step("fo").effective_confidence, 0.0));
}

// ---------------------------------------------------------------- loop_until

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_until_converges_or_exhausts() {
    #[rustfmt::skip]
    let rows: &[(f64, f64, &str, &str, u32, usize, &str)] = &[
        // mock confidence, loop target -> step status, loop event, iterations, loop_iteration events, summary
        (0.9, 0.8, "completed", "loop_converged", 1, 0, "iteration 1 of 3 after none"),
        // The target is met at equality.
        (0.9, 0.9, "completed", "loop_converged", 1, 0, "iteration 1 of 3 after none"),
        (0.9, 0.95, "completed", "loop_exhausted", 3, 2, "iteration 3 of 3 after 0.9"),
        // The gate is applied to the last output, independently of the loop target.
        (0.5, 0.95, "escalated", "loop_exhausted", 3, 2, "iteration 3 of 3 after 0.5"),
    ];
    for &(conf, target, status, loop_event, iterations, loop_events, summary) in rows {
        let yaml = format!(
            r#"
            name: loop
            trigger: {{}}
            steps:
              - name: hypo
                executor: mock
                loop_until: {{confidence: {target}, max_iterations: 3}}
                executor_config:
                  output:
                    confidence: {conf}
                    summary: "iteration {{{{ loop.iteration }}}} of {{{{ loop.max_iterations }}}} after {{{{ loop.prior_confidence if loop.prior_confidence is not none else 'none' }}}}"
                    next_step_context: ""
            "#
        );
        let other = if loop_event == "loop_converged" {
            "loop_exhausted"
        } else {
            "loop_converged"
        };
        let ran = check(
            &yaml,
            Expect {
                status,
                steps: if status == "completed" {
                    &[("hypo", "completed")]
                } else {
                    &[("hypo", "escalated")]
                },
                ..Default::default()
            },
        )
        .await;
        let ev = ran.fields(loop_event);
        assert_eq!(ev.len(), 1, "{conf} -> {target}: {:?}", ran.event_names());
        assert_eq!(ev[0]["iterations"], iterations);
        assert!(ran.fields(other).is_empty());
        let iters: Vec<Value> = ran
            .fields("loop_iteration")
            .iter()
            .map(|f| f["iteration"].clone())
            .collect();
        let want: Vec<Value> = (2..=iterations).map(Value::from).collect();
        assert_eq!(iters, want);
        assert_eq!(iters.len(), loop_events);
        let rec = ran.step("hypo");
        assert_eq!(rec.iteration, iterations);
        assert_eq!(rec.idempotency_key, format!("{}:hypo:{iterations}", ran.id));
        assert_eq!(ran.summary("hypo"), summary);
    }

    // Each iteration sees the previous iteration's output.
    let ran = check(
        r#"
        name: loop
        trigger: {}
        steps:
          - name: hypo
            executor: mock
            loop_until: {confidence: 0.99, max_iterations: 3}
            executor_config:
              output:
                confidence: 0.9
                summary: "it{{ loop.iteration }} prev=({{ loop.prior_output.summary if loop.prior_output else '-' }})"
                next_step_context: ""
        "#,
        Expect {
            status: "completed",
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("hypo"), "it3 prev=(it2 prev=(it1 prev=(-)))");

    // max_iterations 1 runs once and logs neither loop event.
    check(
        r#"
        name: loop
        trigger: {}
        steps:
          - name: hypo
            executor: mock
            loop_until: {confidence: 0.99, max_iterations: 1}
        "#,
        Expect {
            status: "completed",
            absent: &["loop_iteration", "loop_converged", "loop_exhausted"],
            ..Default::default()
        },
    )
    .await;
}

// ---------------------------------------------------------------- parallel groups

fn parallel_pipeline(join: &str, threshold: f64, on_low: &str, b: &str) -> String {
    format!(
        r#"
        name: par
        trigger: {{}}
        steps:
          - parallel:
              name: g
              join: {join}
              confidence_threshold: {threshold}
              on_low_confidence: {on_low}
              steps:
                - name: a
                  executor: mock
                  weight: 3
                  prompt_template: ""
                  executor_config:
                    output: {{confidence: 0.9, summary: "a", next_step_context: ""}}
                - name: b
                  executor: mock
                  weight: 1
                  prompt_template: ""
                  executor_config: {b}
          - name: after
            executor: mock
        "#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_joins_and_gate() {
    const LOW_B: &str = r#"{output: {confidence: 0.6, summary: "b", next_step_context: ""}}"#;
    const FAIL_B: &str = "{fail: true}";
    #[rustfmt::skip]
    let rows: &[(&str, f64, &str, &str, f64, &str, &str)] = &[
        // join, threshold, on_low, branch b -> joined, group status, b's status
        ("all_must_pass", 0.75, "escalate", LOW_B, 0.6, "escalated", "completed"),
        ("all_must_pass", 0.6, "escalate", LOW_B, 0.6, "completed", "completed"),
        ("any_must_pass", 0.75, "escalate", LOW_B, 0.9, "completed", "completed"),
        // (0.9*3 + 0.6*1) / 4
        ("weighted_average", 0.8, "escalate", LOW_B, 0.825, "completed", "completed"),
        ("weighted_average", 0.83, "abort", LOW_B, 0.825, "aborted", "completed"),
        ("all_must_pass", 0.75, "proceed", LOW_B, 0.6, "completed", "completed"),
        // A failed branch counts as 0.0.
        ("all_must_pass", 0.75, "escalate", FAIL_B, 0.0, "escalated", "failed"),
        ("any_must_pass", 0.75, "escalate", FAIL_B, 0.9, "completed", "failed"),
        ("weighted_average", 0.6, "abort", FAIL_B, 0.675, "completed", "failed"),
        ("weighted_average", 0.7, "abort", FAIL_B, 0.675, "aborted", "failed"),
    ];
    for &(join, threshold, on_low, b, joined, status, b_status) in rows {
        let yaml = parallel_pipeline(join, threshold, on_low, b);
        let completed: &[(&str, &str)] = if b_status == "failed" {
            &[
                ("g", "completed"),
                ("g/a", "completed"),
                ("g/b", "failed"),
                ("after", "completed"),
            ]
        } else {
            &[
                ("g", "completed"),
                ("g/a", "completed"),
                ("g/b", "completed"),
                ("after", "completed"),
            ]
        };
        let ran = check(
            &yaml,
            Expect {
                status,
                steps: if status == "completed" {
                    completed
                } else {
                    &[]
                },
                events: &["parallel_group_started", "parallel_group_completed"],
                ..Default::default()
            },
        )
        .await;
        let row = format!("{join} {threshold} {on_low} {b}");
        let g = ran.step("g");
        assert_eq!(g.status, status, "{row}");
        assert!(
            close(g.effective_confidence, joined),
            "{row}: {:?}",
            g.effective_confidence
        );
        assert_eq!(ran.step("g/a").status, "completed", "{row}");
        assert_eq!(ran.step("g/b").status, b_status, "{row}");
        assert_eq!(ran.step("g/b").step_index, ran.step("g/a").step_index + 1);
        if status != "completed" {
            assert!(ran.steps.iter().all(|s| s.step_path != "after"), "{row}");
            assert_eq!(ran.run.terminal_step.as_deref(), Some("g"), "{row}");
        }
        let done = if b_status == "failed" { 1 } else { 2 };
        assert_eq!(
            ran.summary("g"),
            format!("Parallel group 'g': {done}/2 branches completed")
        );
        assert_eq!(ran.fields("branch_completed").len(), done, "{row}");
        assert_eq!(ran.fields("branch_failed").len(), 2 - done, "{row}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_ignore_their_own_proceed_and_see_no_siblings() {
    let ran = check(
        r#"
        name: par
        trigger: {}
        steps:
          - name: before
            executor: mock
            executor_config: {output: {confidence: 0.9, summary: "before", next_step_context: ""}}
          - parallel:
              name: g
              steps:
                - name: a
                  executor: mock
                  prompt_template: ""
                  executor_config:
                    output: {confidence: 0.9, summary: "a saw {{ steps.before.summary }}", next_step_context: "", proceed: false}
                - name: b
                  executor: mock
                  prompt_template: ""
                  executor_config:
                    output: {confidence: 0.9, summary: "b saw a={{ steps.a is defined }}", next_step_context: ""}
          - fan_out:
              name: fo
              over: '["x"]'
              executor: mock
              executor_config: {output: {confidence: 0.9, summary: "{{ item }}", next_step_context: "", proceed: false}}
          - name: after
            executor: mock
        "#,
        Expect {
            status: "completed",
            steps: &[
                ("before", "completed"),
                ("g", "completed"),
                ("g/a", "completed"),
                ("g/b", "completed"),
                ("fo", "completed"),
                ("fo/0", "completed"),
                ("after", "completed"),
            ],
            absent: &["step_stopped"],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("g/a"), "a saw before");
    assert_eq!(ran.summary("g/b"), "b saw a=False");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_group_timeout_fails_the_run() {
    let ran = check(
        r#"
        name: par
        trigger: {}
        steps:
          - parallel:
              name: g
              timeout_seconds: 0.2
              steps:
                - {name: fast, executor: mock, prompt_template: ""}
                - name: slow
                  executor: mock
                  prompt_template: ""
                  executor_config: {delay_ms: 10000}
          - name: after
            executor: mock
        "#,
        Expect {
            status: "failed",
            events: &["parallel_group_started"],
            absent: &["parallel_group_completed"],
            reason: Some("timed out"),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.step("g").status, "failed");
    assert_eq!(ran.step("g/fast").status, "completed");
    // The branch cut off was recorded `running` when it started, and is closed now.
    assert_eq!(ran.step("g/slow").status, "failed");
    assert!(ran.steps.iter().all(|s| s.step_path != "after"));
    assert!(ran.step("g").duration_ms.unwrap() < 5000);

    // A per-branch timeout fails only that branch.
    let ran = check(
        r#"
        name: par
        trigger: {}
        steps:
          - parallel:
              name: g
              join: any_must_pass
              steps:
                - {name: fast, executor: mock, prompt_template: ""}
                - name: slow
                  executor: mock
                  prompt_template: ""
                  timeout_seconds: 0.05
                  executor_config: {delay_ms: 10000}
        "#,
        Expect {
            status: "completed",
            steps: &[
                ("g", "completed"),
                ("g/fast", "completed"),
                ("g/slow", "failed"),
            ],
            counts: &[("branch_failed", 1)],
            ..Default::default()
        },
    )
    .await;
    assert!(ran
        .step("g/slow")
        .error
        .as_deref()
        .unwrap()
        .contains("timed out"));
}

// ---------------------------------------------------------------- fan-out

fn fan_out_pipeline(over: &str, extra: &str) -> String {
    format!(
        r#"
        name: fan
        trigger: {{}}
        steps:
          - name: src
            executor: mock
            executor_config:
              output: {{confidence: 1.0, summary: "src", next_step_context: "", services: ["checkout", "payments"], empty: []}}
          - fan_out:
              name: fo
              over: {over}
              as: svc
              {extra}
              executor: mock
              executor_config:
                output:
                  confidence: 0.9
                  summary: "{{{{ svc }}}} {{{{ fan_out_index }}}}/{{{{ fan_out_total }}}}"
                  next_step_context: ""
          - name: after
            executor: mock
            executor_config:
              output:
                confidence: 1.0
                summary: "{{{{ steps['fo/0'].summary if steps['fo/0'] is defined else '-' }}}}|{{{{ steps['fo/1'].summary if steps['fo/1'] is defined else '-' }}}}"
                next_step_context: ""
        "#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_item_lists_in_every_form() {
    const RAN: &[(&str, &str)] = &[
        ("src", "completed"),
        ("fo", "completed"),
        ("fo/0", "completed"),
        ("fo/1", "completed"),
        ("after", "completed"),
    ];
    let rows = [
        // JSON rendered from an earlier step's extra field.
        r#""{{ steps.src.services | tojson }}""#,
        // A literal JSON list.
        r#"'["checkout", "payments"]'"#,
        // A Python-style list.
        r#""['checkout', 'payments']""#,
        // A YAML list.
        "\"- checkout\\n- payments\\n\"",
        // A list rendered without `tojson`.
        r#""{{ steps.src.services }}""#,
    ];
    for over in rows {
        let ran = check(
            &fan_out_pipeline(over, ""),
            Expect {
                status: "completed",
                steps: RAN,
                events: &["fan_out_started", "fan_out_completed"],
                counts: &[("branch_completed", 2)],
                ..Default::default()
            },
        )
        .await;
        assert_eq!(ran.summary("fo/0"), "checkout 0/2", "{over}");
        assert_eq!(ran.summary("fo/1"), "payments 1/2", "{over}");
        assert_eq!(ran.summary("after"), "checkout 0/2|payments 1/2", "{over}");
        assert_eq!(ran.summary("fo"), "Fan-out 'fo': 2/2 branches completed");
        // The item list is recorded with the fan-out.
        let items: Value =
            serde_json::from_str(ran.step("fo").items_json.as_deref().unwrap()).unwrap();
        assert_eq!(items, json!(["checkout", "payments"]), "{over}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_python_literals_keep_their_types() {
    // `True`/`None` are Python values, not the strings a YAML reading would give.
    let ran = check(
        r#"
        name: fan
        trigger: {}
        steps:
          - fan_out:
              name: fo
              over: "['x', True, None, 2]"
              executor: mock
              executor_config:
                output: {confidence: 0.9, summary: "{{ item is none }}", next_step_context: ""}
        "#,
        Expect {
            status: "completed",
            steps: &[
                ("fo", "completed"),
                ("fo/0", "completed"),
                ("fo/1", "completed"),
                ("fo/2", "completed"),
                ("fo/3", "completed"),
            ],
            ..Default::default()
        },
    )
    .await;
    let items: Value = serde_json::from_str(ran.step("fo").items_json.as_deref().unwrap()).unwrap();
    assert_eq!(items, json!(["x", true, null, 2]));
    assert_eq!(ran.summary("fo/2"), "True");
    assert_eq!(ran.summary("fo/0"), "False");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_limits_and_empty_lists() {
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        Records,
        &'static str,
        Option<&'static str>,
    );
    #[rustfmt::skip]
    let rows: &[Row] = &[
        // over, extra keys -> run status, records, event, reason
        (r#""{{ steps.src.services | tojson }}""#, "max_items: 1", "failed",
            &[("src", "completed"), ("fo", "failed")], "fan_out_failed", Some("2 items exceeds max_items=1")),
        (r#""{{ steps.src.services | tojson }}""#, "max_items: 2", "completed",
            &[("src", "completed"), ("fo", "completed"), ("fo/0", "completed"), ("fo/1", "completed"), ("after", "completed")],
            "fan_out_completed", None),
        (r#""not a list""#, "", "failed", &[("src", "completed"), ("fo", "failed")], "fan_out_failed", Some("Fan-out 'fo'")),
        (r#""{{ steps.src.nothing }}""#, "", "failed", &[("src", "completed"), ("fo", "failed")], "fan_out_failed", Some("empty")),
        (r#"'{"a": 1}'"#, "", "failed", &[("src", "completed"), ("fo", "failed")], "fan_out_failed", Some("list")),
        (r#""{{ steps.src.empty | tojson }}""#, "", "completed",
            &[("src", "completed"), ("fo", "completed"), ("after", "completed")], "fan_out_empty", None),
        (r#""{{ steps.src.empty | tojson }}""#, "on_empty: complete", "completed",
            &[("src", "completed"), ("fo", "completed"), ("after", "completed")], "fan_out_empty", None),
        (r#""[]""#, "on_empty: skip", "completed",
            &[("src", "completed"), ("fo", "completed"), ("after", "completed")], "fan_out_skipped", None),
        (r#""[]""#, "on_empty: abort", "failed", &[("src", "completed"), ("fo", "failed")], "fan_out_empty", Some("empty")),
    ];
    for &(over, extra, status, steps, event, reason) in rows {
        let ran = check(
            &fan_out_pipeline(over, extra),
            Expect {
                status,
                steps,
                reason,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(
            ran.fields(event).len(),
            1,
            "{over} {extra}: {:?}",
            ran.event_names()
        );
        let fo = ran.step("fo");
        if status == "completed" && !steps.iter().any(|s| s.0 == "fo/0") {
            // An empty list completes with confidence 1.0 and runs nothing.
            assert!(close(fo.effective_confidence, 1.0), "{over} {extra}");
            assert_eq!(ran.summary("after"), "-|-");
            assert!(ran.fields("fan_out_started").is_empty());
            let other = if event == "fan_out_empty" {
                "fan_out_skipped"
            } else {
                "fan_out_empty"
            };
            assert!(ran.fields(other).is_empty(), "{over} {extra}");
        }
        if status == "failed" {
            assert_eq!(ran.run.terminal_step.as_deref(), Some("fo"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_join_and_gate() {
    // Branch confidence 0.9 against the group threshold; a failing executor makes
    // every branch count 0.0.
    #[rustfmt::skip]
    let rows: &[(f64, &str, &str, &str)] = &[
        // threshold, on_low_confidence, executor_config -> fan-out status
        (0.95, "escalate", "{output: {confidence: 0.9, summary: s, next_step_context: ''}}", "escalated"),
        (0.9, "escalate", "{output: {confidence: 0.9, summary: s, next_step_context: ''}}", "completed"),
        (0.95, "abort", "{output: {confidence: 0.9, summary: s, next_step_context: ''}}", "aborted"),
        (0.95, "proceed", "{output: {confidence: 0.9, summary: s, next_step_context: ''}}", "completed"),
        (0.5, "escalate", "{fail: true}", "escalated"),
    ];
    for &(threshold, on_low, cfg, status) in rows {
        let yaml = format!(
            r#"
            name: fan
            trigger: {{}}
            steps:
              - fan_out:
                  name: fo
                  over: '["a", "b", "c"]'
                  confidence_threshold: {threshold}
                  on_low_confidence: {on_low}
                  executor: mock
                  executor_config: {cfg}
            "#
        );
        let ran = check(
            &yaml,
            Expect {
                status,
                events: &["fan_out_started", "fan_out_completed"],
                ..Default::default()
            },
        )
        .await;
        let row = format!("{threshold} {on_low} {cfg}");
        assert_eq!(ran.step("fo").status, status, "{row}");
        assert_eq!(ran.steps.len(), 4, "{row}: {:?}", ran.step_list());
    }
}

// ---------------------------------------------------------------- budget

fn budget_pipeline(budget: &str, usage: &str, steps: usize) -> String {
    let mut yaml = format!("name: budget\ntrigger: {{}}\nbudget: {budget}\nsteps:\n");
    for i in 1..=steps {
        yaml.push_str(&format!(
            "  - {{name: s{i}, executor: mock, executor_config: {{usage: {usage}}}}}\n"
        ));
    }
    yaml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_trips_strictly_above_the_limit() {
    const TOKENS: &str = "{input_tokens: 60, output_tokens: 40}";
    const COST: &str = "{input_tokens: 1, output_tokens: 0, cost_usd: 0.25}";
    const BOTH: &str = "{input_tokens: 5, output_tokens: 0, cost_usd: 0.25}";
    type Row = (
        &'static str,
        &'static str,
        usize,
        &'static str,
        Records,
        u64,
        Option<&'static str>,
    );
    #[rustfmt::skip]
    let rows: &[Row] = &[
        // budget, usage per step, steps -> status, records, tokens, reason
        ("{max_tokens: 200}", TOKENS, 2, "completed", &[("s1", "completed"), ("s2", "completed")], 200, None),
        ("{max_tokens: 150}", TOKENS, 3, "aborted", &[("s1", "completed"), ("s2", "completed")], 200,
            Some("Token budget exceeded: 200 tokens used (limit: 150)")),
        ("{max_tokens: 1000}", TOKENS, 3, "completed", &[("s1", "completed"), ("s2", "completed"), ("s3", "completed")], 300, None),
        ("{max_usd: 0.5}", COST, 2, "completed", &[("s1", "completed"), ("s2", "completed")], 2, None),
        ("{max_usd: 0.5}", COST, 3, "aborted", &[("s1", "completed"), ("s2", "completed"), ("s3", "completed")], 3,
            Some("Cost budget exceeded: 0.75 USD used (limit: 0.50 USD)")),
        // A cost trip alone.
        ("{max_tokens: 2, max_usd: 0.1}", COST, 3, "aborted", &[("s1", "completed")], 1,
            Some("Cost budget exceeded: 0.25 USD used (limit: 0.10 USD)")),
        // Both limits broken by the same step: tokens are checked first.
        ("{max_tokens: 4, max_usd: 0.1}", BOTH, 3, "aborted", &[("s1", "completed")], 5,
            Some("Token budget exceeded: 5 tokens used (limit: 4)")),
    ];
    for &(budget, usage, n, status, steps, tokens, reason) in rows {
        let ran = check(
            &budget_pipeline(budget, usage, n),
            Expect {
                status,
                steps,
                tokens: Some(tokens),
                reason,
                ..Default::default()
            },
        )
        .await;
        let tripped = ran.fields("budget_exceeded").len();
        assert_eq!(tripped, usize::from(status == "aborted"), "{budget} x{n}");
        if status == "aborted" {
            // The step that tripped the budget keeps its completed record.
            let last = steps.last().unwrap().0;
            assert_eq!(ran.run.terminal_step.as_deref(), Some(last));
        }
    }
    // Cost is accumulated on the run.
    let ran = check(
        &budget_pipeline("{max_usd: 0.5}", COST, 2),
        Expect {
            status: "completed",
            ..Default::default()
        },
    )
    .await;
    assert!((ran.run.cost_usd - 0.5).abs() < 1e-9);
    assert_eq!(ran.step("s1").cost_usd, Some(0.25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_counts_group_branches() {
    check(
        r#"
        name: budget
        trigger: {}
        budget: {max_tokens: 150}
        steps:
          - parallel:
              name: g
              steps:
                - {name: a, executor: mock, prompt_template: "", executor_config: {usage: {input_tokens: 100}}}
                - {name: b, executor: mock, prompt_template: "", executor_config: {usage: {input_tokens: 100}}}
          - name: after
            executor: mock
        "#,
        Expect {
            status: "aborted",
            steps: &[("g", "completed"), ("g/a", "completed"), ("g/b", "completed")],
            events: &["budget_exceeded"],
            tokens: Some(200),
            reason: Some("Token budget exceeded"),
            ..Default::default()
        },
    )
    .await;
}

// ---------------------------------------------------------------- notifications

const NOTIFICATIONS: &str = r#"
notifications:
  escalate: {channel: log, template: "escalate {{ escalation_reason }} at {{ current_step }}: {{ step_summary }}"}
  stopped: {channel: log, template: "stopped at {{ current_step }}: {{ proceed_reason }}"}
  notify: {channel: log, template: "notify: {{ step_summary }}"}
  plan-rejected:
    - channel: log
      template: "rejected at {{ current_step }} ({{ confidence }} < {{ confidence_threshold }})"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ending_sends_exactly_one_notification() {
    #[rustfmt::skip]
    let rows: &[(&str, &str, Notified)] = &[
        // the step -> run status, (action, text) of the one notification
        ("{name: s, executor: mock}", "completed", None),
        ("{name: s, executor: mock, executor_config: {output: {confidence: 0.2, summary: low, next_step_context: ''}}}",
            "escalated", Some(("escalate", "escalate low_confidence at s: low"))),
        ("{name: s, executor: mock, executor_config: {fail: 'boom'}}",
            "failed", Some(("escalate", "escalate failed at s: boom"))),
        ("{name: s, executor: mock, on_low_confidence: abort, on_abort: plan-rejected, executor_config: {output: {confidence: 0.2, summary: low, next_step_context: ''}}}",
            "aborted", Some(("plan-rejected", "rejected at s (0.2 < 0.75)"))),
        // The default on_abort action is `notify`.
        ("{name: s, executor: mock, on_low_confidence: abort, executor_config: {output: {confidence: 0.2, summary: low, next_step_context: ''}}}",
            "aborted", Some(("notify", "notify: low"))),
        ("{name: s, executor: mock, executor_config: {output: {confidence: 0.9, summary: halt, next_step_context: '', proceed: false, proceed_reason: 'change freeze'}}}",
            "stopped", Some(("stopped", "stopped at s: change freeze"))),
        ("{name: s, executor: mock, executor_config: {usage: {input_tokens: 11}}}",
            "aborted", Some(("notify", "notify: Token budget exceeded: 11 tokens used (limit: 10)"))),
        // Groups and fan-outs end runs the same way.
        ("{parallel: {name: g, steps: [{name: a, executor: mock, prompt_template: '', executor_config: {output: {confidence: 0.3, summary: a, next_step_context: ''}}}]}}",
            "escalated", Some(("escalate", "escalate low_confidence at g: Parallel group 'g': 1/1 branches completed"))),
        ("{parallel: {name: g, on_low_confidence: abort, on_abort: plan-rejected, steps: [{name: a, executor: mock, prompt_template: '', executor_config: {output: {confidence: 0.3, summary: a, next_step_context: ''}}}]}}",
            "aborted", Some(("plan-rejected", "rejected at g (0.3 < 0.75)"))),
        ("{fan_out: {name: fo, over: '[1, 2]', max_items: 1, executor: mock}}",
            "failed", Some(("escalate", "escalate failed at fo: Fan-out 'fo': 2 items exceeds max_items=1"))),
    ];
    for &(step, status, want) in rows {
        let yaml = format!(
            "name: notes\ntrigger: {{}}\nstage: production\nbudget: {{max_tokens: 10}}\nsteps:\n  - {step}\n{NOTIFICATIONS}"
        );
        let ran = check(
            &yaml,
            Expect {
                status,
                ..Default::default()
            },
        )
        .await;
        match want {
            None => {
                assert!(ran.notifications.is_empty(), "{step}");
                assert!(ran.fields("notification_sent").is_empty());
            }
            Some((action, text)) => {
                assert_eq!(
                    ran.notifications.len(),
                    1,
                    "{step}: {:?}",
                    ran.notifications
                );
                let n = &ran.notifications[0];
                assert_eq!(n.action, action, "{step}");
                assert_eq!(n.channel, "log");
                assert_eq!(n.status, "sent");
                assert!(n.sent_at.is_some());
                let msg: Value = serde_json::from_str(&n.message).unwrap();
                assert_eq!(msg["text"], text, "{step}");
                let sent = ran.fields("notification_sent");
                assert_eq!(sent.len(), 1, "{step}");
                assert_eq!(sent[0]["action"], action);
                assert_eq!(sent[0]["channel"], "log");
                // Sent after the run was closed, recorded against the run.
                let finished = ran.events.iter().position(|e| e.event == "run_finished");
                let sent_at = ran
                    .events
                    .iter()
                    .position(|e| e.event == "notification_sent");
                assert!(finished < sent_at);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testing_stage_sends_through_log() {
    // Nothing listens on port 9: a real webhook delivery would fail.
    let pipeline = |stage: &str| {
        format!(
            r#"
            name: notes
            trigger: {{}}
            stage: {stage}
            steps:
              - name: s
                executor: mock
                executor_config: {{output: {{confidence: 0.1, summary: low, next_step_context: ""}}}}
            notifications:
              escalate:
                channel: webhook
                template: "escalated: {{{{ step_summary }}}}"
                config: {{url: "http://127.0.0.1:9/hook", timeout_seconds: 2}}
            "#
        )
    };
    let ran = check(
        &pipeline("testing"),
        Expect {
            status: "escalated",
            counts: &[("notification_sent", 1)],
            absent: &["notification_failed"],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.notifications.len(), 1);
    assert_eq!(ran.notifications[0].channel, "log");
    assert_eq!(ran.notifications[0].status, "sent");

    // The same pipeline in production really uses the webhook (and its failure
    // is recorded without changing the run's status).
    let ran = check(
        &pipeline("production"),
        Expect {
            status: "escalated",
            counts: &[("notification_failed", 1)],
            absent: &["notification_sent"],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.notifications.len(), 1);
    assert_eq!(ran.notifications[0].channel, "webhook");
    assert_eq!(ran.notifications[0].status, "failed");
}

// ---------------------------------------------------------------- template context

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_context_reaches_every_source() {
    let ran = check_with(
        &[r#"
        name: ctx
        trigger: {}
        vars: {env_name: prod}
        context_template: {include: [labels.service, source]}
        steps:
          - name: first-step
            executor: mock
            executor_config:
              output: {confidence: 0.9, summary: hello, next_step_context: nsc, action: restart, services: [x, y]}
          - parallel:
              name: g
              steps:
                - name: deep-look
                  executor: mock
                  prompt_template: ""
                  executor_config: {output: {confidence: 0.8, summary: "looked at {{ current_step }}", next_step_context: ""}}
          - fan_out:
              name: fo
              over: "{{ steps.first_step.services | tojson }}"
              executor: mock
              executor_config: {output: {confidence: 0.9, summary: "item {{ item }}", next_step_context: ""}}
          - name: render
            executor: mock
            executor_config:
              output:
                confidence: 1.0
                summary: "{{ steps.first_step.summary }}|{{ steps['first-step'].action }}|{{ steps.first_step.services | join(',') }}|{{ steps.first_step.next_step_context }}|{{ steps.deep_look.summary }}|{{ steps['fo/1'].summary }}"
                next_step_context: "{{ env_name }}|{{ service }}|{{ source }}|{{ labels.service }}|{{ severity | default('no-severity') }}|{{ pipeline_run_id }}|{{ current_step }}|{{ pipeline_name }}"
        "#],
        &[("service", "checkout")],
        Expect {
            status: "completed",
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ran.summary("render"),
        "hello|restart|x,y|nsc|looked at g|item y"
    );
    assert_eq!(
        ran.output("render")["next_step_context"],
        format!(
            "prod|checkout|generic|checkout|no-severity|{}|render|ctx",
            ran.id
        )
    );
}

// ---------------------------------------------------------------- sub-pipelines

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_pipeline_child_status_decides() {
    // The child escalates after an earlier confident step: the parent step fails,
    // whatever that earlier step's confidence was.
    let ran = check_with(
        &[
            r#"
            name: parent
            trigger: {}
            steps:
              - name: call
                executor: pipeline
                executor_config: {pipeline: child}
              - name: after
                executor: mock
            "#,
            r#"
            name: child
            trigger: {}
            steps:
              - name: ok
                executor: mock
                executor_config: {output: {confidence: 0.99, summary: "child ok", next_step_context: ""}}
              - name: bad
                executor: mock
                executor_config: {output: {confidence: 0.2, summary: "child unsure", next_step_context: ""}}
            "#,
        ],
        &[],
        Expect {
            status: "failed",
            steps: &[("call", "failed")],
            events: &["step_failed"],
            reason: Some("escalated"),
            ..Default::default()
        },
    )
    .await;
    let child = ran
        .store
        .child_run(&ran.id, "call")
        .unwrap()
        .expect("child run");
    assert_eq!(child.status, "escalated");
    assert_eq!(child.parent_run_id.as_deref(), Some(ran.id.as_str()));
    assert_eq!(child.source, "sub-pipeline");
    let child_steps: Vec<(String, String)> = ran
        .store
        .steps(&child.id)
        .unwrap()
        .into_iter()
        .map(|s| (s.step_path, s.status.to_string()))
        .collect();
    assert_eq!(
        child_steps,
        vec![
            ("ok".to_string(), "completed".to_string()),
            ("bad".to_string(), "escalated".to_string())
        ]
    );

    // A completed child passes its final output up, with `sub_run_id`.
    let ran = check_with(
        &[
            r#"
            name: parent
            trigger: {}
            steps:
              - name: call
                executor: pipeline
                executor_config: {pipeline: child}
              - name: after
                executor: mock
                executor_config:
                  output: {confidence: 1.0, summary: "{{ steps.call.sub_run_id }} {{ steps.call.verdict }}", next_step_context: ""}
            "#,
            r#"
            name: child
            trigger: {}
            steps:
              - name: first
                executor: mock
              - name: last
                executor: mock
                executor_config: {output: {confidence: 0.8, summary: "child done", next_step_context: "", verdict: fine}}
            "#,
        ],
        &[],
        Expect {
            status: "completed",
            steps: &[("call", "completed"), ("after", "completed")],
            ..Default::default()
        },
    )
    .await;
    let child = ran
        .store
        .child_run(&ran.id, "call")
        .unwrap()
        .expect("child run");
    assert_eq!(child.status, "completed");
    let out = ran.output("call");
    assert_eq!(out["summary"], "child done");
    assert_eq!(out["verdict"], "fine");
    assert_eq!(out["sub_run_id"], child.id.as_str());
    assert_eq!(out["sub_pipeline_status"], "completed");
    assert!(close(ran.step("call").effective_confidence, 0.8));
    assert_eq!(ran.summary("after"), format!("{} fine", child.id));

    // A child step that failed and continued is not the child's final output.
    let ran = check_with(
        &[
            r#"
            name: parent
            trigger: {}
            steps:
              - name: call
                executor: pipeline
                executor_config: {pipeline: child}
            "#,
            r#"
            name: child
            trigger: {}
            steps:
              - name: good
                executor: mock
                executor_config: {output: {confidence: 0.9, summary: "good", next_step_context: ""}}
              - name: broken
                executor: mock
                on_failure: continue
                executor_config: {fail: true}
            "#,
        ],
        &[],
        Expect {
            status: "completed",
            steps: &[("call", "completed")],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("call"), "good");

    // A child that completes without any output gives confidence 1.0.
    let ran = check_with(
        &[
            "name: parent\ntrigger: {}\nsteps:\n  - {name: call, executor: pipeline, executor_config: {pipeline: child}}\n",
            "name: child\ntrigger: {}\nsteps: []\n",
        ],
        &[],
        Expect {
            status: "completed",
            steps: &[("call", "completed")],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("call"), "Sub-pipeline 'child' completed");
    assert!(close(ran.step("call").effective_confidence, 1.0));
}

// ---------------------------------------------------------------- records

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_started_before_they_finish_and_carry_keys() {
    let ran = check(
        r#"
        name: records
        trigger: {}
        steps:
          - name: one
            executor: mock
          - name: looped
            executor: mock
            loop_until: {confidence: 1.0, max_iterations: 2}
            executor_config: {output: {confidence: 0.5, summary: s, next_step_context: ""}}
            confidence_threshold: 0.1
          - name: flaky
            executor: mock
            on_failure: continue
            retry: {attempts: 2, backoff: fixed, delay_seconds: 0.01}
            executor_config: {fail: true}
          - parallel:
              name: g
              steps:
                - {name: a, executor: mock, prompt_template: ""}
          - fan_out:
              name: fo
              over: '["x", "y"]'
              executor: mock
          - name: two
            executor: mock
        "#,
        Expect {
            status: "completed",
            steps: &[
                ("one", "completed"),
                ("looped", "completed"),
                ("flaky", "failed"),
                ("g", "completed"),
                ("g/a", "completed"),
                ("fo", "completed"),
                ("fo/0", "completed"),
                ("fo/1", "completed"),
                ("two", "completed"),
            ],
            attempts: &[
                ("one", 1),
                ("looped", 1),
                ("flaky", 2),
                ("g/a", 1),
                ("fo/0", 1),
            ],
            ..Default::default()
        },
    )
    .await;
    for (step, end) in [
        ("one", "step_completed"),
        ("looped", "step_completed"),
        ("flaky", "step_failed"),
        ("two", "step_completed"),
    ] {
        let started = ran.position("step_started", step).expect("step_started");
        let ended = ran.position(end, step).expect("terminal event");
        assert!(started < ended, "{step}: {:?}", ran.event_names());
    }
    // Steps run one after the other: each starts after the previous one ended.
    assert!(ran.position("step_completed", "one") < ran.position("step_started", "looped"));
    let group_started = ran
        .events
        .iter()
        .position(|e| e.event == "parallel_group_started");
    let branch_done = ran
        .events
        .iter()
        .position(|e| e.event == "branch_completed");
    let group_done = ran
        .events
        .iter()
        .position(|e| e.event == "parallel_group_completed");
    assert!(group_started < branch_done && branch_done < group_done);
    let fan_started = ran.events.iter().position(|e| e.event == "fan_out_started");
    let fan_done = ran
        .events
        .iter()
        .position(|e| e.event == "fan_out_completed");
    assert!(group_done < fan_started && fan_started < fan_done);
    for rec in &ran.steps {
        assert_eq!(
            rec.idempotency_key,
            format!("{}:{}:{}", ran.id, rec.step_path, rec.iteration),
            "{}",
            rec.step_path
        );
        assert!(rec.attempts >= 1, "{}", rec.step_path);
        assert!(
            rec.finished_at.unwrap() >= rec.started_at,
            "{}",
            rec.step_path
        );
    }
    assert_eq!(ran.step("looped").iteration, 2);
    assert_eq!(ran.step("one").iteration, 1);
    assert_eq!(ran.events.first().unwrap().event, "run_started");
    assert_eq!(ran.events.last().unwrap().event, "run_finished");
    assert!(ran.run.completed_at.is_some());
}

// ------------------------------------------------- groups, sub-pipeline context and timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// A group's joined output is reachable under its own name (vectorstep registers it;
/// the original did not), next to its branches.
async fn groups_register_their_joined_output_and_their_branches() {
    let ran = check(
        r#"
        name: reg
        trigger: {}
        steps:
          - parallel:
              name: g
              steps:
                - {name: a, executor: mock, prompt_template: ""}
          - fan_out:
              name: fo
              over: '["x"]'
              executor: mock
          - name: probe
            executor: mock
            executor_config:
              output:
                confidence: 1.0
                summary: "{{ steps.g is defined }} {{ steps.fo is defined }} {{ steps.a is defined }} {{ steps['fo/0'] is defined }}"
                next_step_context: ""
        "#,
        Expect {
            status: "completed",
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("probe"), "True True True True");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_pipeline_context_overrides_reach_the_child() {
    let ran = check_with(
        &[
            r#"
            name: parent
            trigger: {}
            steps:
              - name: call
                executor: pipeline
                executor_config:
                  pipeline: child
                  context:
                    summary: "from {{ pipeline_name }}"
                    labels: {service: "child-of-{{ labels.service }}"}
            "#,
            r#"
            name: child
            trigger: {}
            context_template: {include: [summary]}
            steps:
              - name: echo
                executor: mock
                executor_config:
                  output: {confidence: 0.9, summary: "{{ labels.service }} {{ labels.team }} {{ summary }}", next_step_context: ""}
            "#,
        ],
        &[("service", "checkout"), ("team", "sre")],
        Expect {
            status: "completed",
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ran.summary("call"), "child-of-checkout sre from parent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_pipeline_step_timeout_bounds_the_child() {
    check_with(
        &[
            "name: parent\ntrigger: {}\nsteps:\n  - {name: call, executor: pipeline, timeout_seconds: 0.1, executor_config: {pipeline: child}}\n",
            "name: child\ntrigger: {}\nsteps:\n  - {name: slow, executor: mock, executor_config: {delay_ms: 1500}}\n",
        ],
        &[],
        Expect {
            status: "failed",
            steps: &[("call", "failed")],
            reason: Some("timed out"),
            ..Default::default()
        },
    )
    .await;
}
