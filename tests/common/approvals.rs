//! Shared set-up for the approval tests: a scratch service whose
//! `notifications.telegram.api_url` points at a [`FakeTelegram`], pipelines with a
//! human step, and readers for approvals, deliveries and metrics.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;

use super::service::{Scratch, Service};
use super::telegram::FakeTelegram;

pub const APPROVER: u64 = 42;
pub const STRANGER: u64 = 7;
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(25);

/// A pipeline `name`: a human step `approve` (escalates on reject) then a mock step.
pub fn gate(name: &str, stage: &str, timeout_seconds: f64) -> String {
    format!(
        "name: {name}\nstage: {stage}\ndurable: true\ntrigger: {{match: {{source: generic}}}}\nsteps:\n\
         \x20 - name: approve\n    executor: human\n    timeout_seconds: {timeout_seconds}\n\
         \x20   prompt_template: \"<b>Restart the web tier?</b> ({{{{ pipeline_name }}}})\"\n\
         \x20 - name: after\n    executor: mock\n\
         \x20   executor_config: {{output: {{confidence: 0.9, summary: after, next_step_context: \"\"}}}}\n"
    )
}

/// A pipeline `name` whose only entry is a fan-out of human steps over `items`.
pub fn fan_out_gate(name: &str, items: &str) -> String {
    format!(
        "name: {name}\nstage: production\ndurable: true\ntrigger: {{match: {{source: generic}}}}\nsteps:\n\
         \x20 - fan_out:\n      name: each\n      over: '{items}'\n      executor: human\n\
         \x20     timeout_seconds: 120\n      prompt_template: \"Restart {{{{ item }}}}?\"\n"
    )
}

/// A running service, its folder, and the fake Bot API it talks to.
pub struct Harness {
    pub svc: Service,
    pub dir: Scratch,
    pub tg: FakeTelegram,
    pub http: reqwest::Client,
    store: vectorstep::store::Store,
}

impl Harness {
    /// `extra` holds more top-level config keys; `human_approval` always names
    /// [`APPROVER`] and a fixed `ui_base_url`.
    pub async fn start(pipelines: &[(&str, String)], extra: &str) -> Harness {
        Harness::start_with(pipelines, extra, "approvers: [\"42\"]").await
    }

    pub async fn start_with(pipelines: &[(&str, String)], extra: &str, approval: &str) -> Harness {
        Harness::start_env(pipelines, extra, approval, &[]).await
    }

    /// [`Harness::start_with`], with `env` set for the first `serve` process only.
    pub async fn start_env(
        pipelines: &[(&str, String)],
        extra: &str,
        approval: &str,
        env: &[(&str, &str)],
    ) -> Harness {
        let tg = FakeTelegram::start().await;
        let dir = Scratch::new();
        dir.write_config(&format!(
            "{}human_approval:\n  ui_base_url: \"http://vs.example/\"\n  {approval}\n{extra}",
            tg.config()
        ));
        for (name, yaml) in pipelines {
            dir.write_pipeline(name, yaml);
        }
        let svc = Service::start_with_env(&dir.root, env).await;
        let store = dir.open_store();
        Harness {
            svc,
            dir,
            tg,
            http: reqwest::Client::new(),
            store,
        }
    }

    /// The approval row of `run_id`'s step `path`, once it exists.
    pub async fn approval(&self, run_id: &str, path: &str) -> vectorstep::store::ApprovalRecord {
        self.wait("the approval row", || {
            self.store
                .approvals_of_run(run_id)
                .ok()?
                .into_iter()
                .find(|a| a.step_path == path)
        })
        .await
    }

    /// The Telegram message `(chat, message_id)` of `token`, once its delivery is stored.
    pub async fn delivered(&self, token: &str) -> (i64, i64) {
        self.wait("a stored delivery", || {
            let a = self.store.approval(token).ok()??;
            let d: Value = serde_json::from_str(a.delivery_json.as_deref()?).ok()?;
            assert_eq!(a.channel.as_deref(), Some("telegram"), "{a:?}");
            Some((d["chat_id"].as_i64()?, d["message_id"].as_i64()?))
        })
        .await
    }

    pub async fn wait<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "waited {WAIT:?} for {what}\n{}",
                self.svc.log_tail()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// `POST /approvals/{token}` with a JSON decision; returns the status code.
    pub async fn decide(&self, token: &str, decision: &str) -> u16 {
        let req = self.http.post(self.svc.url(&format!("/approvals/{token}")));
        // With auth configured, deciding through the API is an operator's.
        let req = match &self.svc.bearer {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        req.json(&serde_json::json!({"decision": decision, "by": "alice"}))
            .send()
            .await
            .expect("POST /approvals")
            .status()
            .as_u16()
    }

    /// The value of the `/metrics` sample whose line starts with `name` and contains
    /// every one of `labels`.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> Option<f64> {
        let text = self
            .http
            .get(self.svc.url("/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter(|l| labels.iter().all(|x| l.contains(x)))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
    }
}

/// Seconds between two RFC 3339 times (`b - a`).
pub fn seconds_between(a: &str, b: &str) -> f64 {
    let a = chrono::DateTime::parse_from_rfc3339(a).expect("rfc3339");
    let b = chrono::DateTime::parse_from_rfc3339(b).expect("rfc3339");
    (b - a).num_milliseconds() as f64 / 1000.0
}
