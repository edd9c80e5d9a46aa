//! `executor: human`: an approval request that parks the step until someone
//! decides, the deadline passes, or the run ends.
//!
//! The `pending_approvals` row (token, message, absolute deadline) and the step's
//! `waiting` status are committed before anything is sent. After a restart the
//! same row is found by (run, step path) and re-armed: same token, the time left
//! until the original deadline, nothing sent again.

use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use serde_json::json;

use super::records::event;
use super::step::CallFailure;
use super::Engine;
use crate::executor::{Call, Outcome};
use crate::run::{StepOutput, Usage};
use crate::store::{ApprovalRecord, Write};

/// An unguessable approval token: 128 random bits, hex.
pub fn new_token() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn fail(msg: impl Into<String>) -> CallFailure {
    CallFailure::Error(msg.into())
}

pub(super) async fn run(engine: &Arc<Engine>, call: &Call<'_>) -> Result<Outcome, CallFailure> {
    let now = engine.now_ms();
    let run = engine
        .store
        .run(call.run_id)
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("run vanished"))?;
    let existing = engine
        .store
        .approvals_of_run(call.run_id)
        .map_err(|e| fail(e.to_string()))?
        .into_iter()
        .find(|a| a.step_path == call.step_path && a.status == "pending");
    let approval = match existing {
        Some(a) => {
            let ev = event(
                call.run_id,
                now,
                "warn",
                "approval_rearmed",
                format!(
                    "Re-armed approval for {} after restart; the message was not sent again",
                    call.step_path
                ),
                json!({"step": call.step_path, "token": a.token, "deadline_at": crate::clock::rfc3339(a.deadline_at)}),
            );
            engine
                .store
                .commit(vec![waiting(engine, call, now), ev])
                .await
                .map_err(|e| fail(e.to_string()))?;
            tracing::warn!(run_id = %call.run_id, step = %call.step_path, token = %a.token, "Re-armed human approval after restart; message not re-sent.");
            a
        }
        None => {
            let timeout_ms = (call.action.timeout_seconds.unwrap_or(300.0) * 1000.0) as i64;
            let a = ApprovalRecord {
                token: new_token(),
                run_id: call.run_id.to_string(),
                step_path: call.step_path.to_string(),
                pipeline_name: call.pipeline.to_string(),
                message: call.prompt.clone(),
                team: run.team.clone(),
                stage: run.stage.clone(),
                channel: None,
                created_at: now,
                deadline_at: now + timeout_ms,
                status: "pending".into(),
                decided_by: None,
                decided_at: None,
                delivery_json: None,
            };
            let url = format!(
                "{}/approvals/{}",
                engine
                    .config
                    .human_approval
                    .ui_base_url
                    .trim_end_matches('/'),
                a.token
            );
            let ev = event(
                call.run_id,
                now,
                "info",
                "approval_requested",
                format!("Approval requested for {}: {url}", call.step_path),
                json!({"step": call.step_path, "token": a.token, "deadline_at": crate::clock::rfc3339(a.deadline_at), "url": url}),
            );
            engine
                .store
                .commit(vec![
                    Write::InsertApproval(a.clone()),
                    waiting(engine, call, now),
                    ev,
                ])
                .await
                .map_err(|e| fail(e.to_string()))?;
            engine.refresh_approvals_gauge();
            tracing::warn!(target: "vectorstep::approval", run_id = %call.run_id, step = %call.step_path, url = %url, "Approval requested: {}", a.message);
            a
        }
    };
    wait(engine, call, &approval).await
}

/// The step record's `waiting` state, keeping its identity fields.
fn waiting(engine: &Arc<Engine>, call: &Call<'_>, now: i64) -> Write {
    let mut rec = engine
        .store
        .steps(call.run_id)
        .ok()
        .and_then(|s| s.into_iter().find(|r| r.step_path == call.step_path))
        .unwrap_or_else(|| {
            super::records::running(super::records::NewRecord {
                run_id: call.run_id,
                path: call.step_path,
                index: 0,
                kind: "step",
                action: Some(call.action),
                started_at: now,
                attempt: call.attempt,
                iteration: 1,
            })
        });
    rec.status = "waiting".into();
    Write::UpsertStep(rec)
}

async fn wait(
    engine: &Arc<Engine>,
    call: &Call<'_>,
    a: &ApprovalRecord,
) -> Result<Outcome, CallFailure> {
    let signal = engine.approval_signal(&a.token);
    loop {
        // Register for a wake-up before reading, so a decision between the read and
        // the wait is not missed.
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if engine.is_shutting_down() {
            return Err(CallFailure::Drained);
        }
        if engine.is_cancelled(call.run_id) {
            return Err(fail("run cancelled while waiting for approval"));
        }
        let current = engine
            .store
            .approval(&a.token)
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| fail("approval vanished"))?;
        let by = current
            .decided_by
            .clone()
            .unwrap_or_else(|| "unknown".into());
        match current.status.as_str() {
            "approved" => return Ok(decided(true, &by, &a.token)),
            "rejected" => return Ok(decided(false, &by, &a.token)),
            "closed" => return Err(fail("approval closed")),
            "timeout" => return Err(fail("Human approval timed out")),
            _ => {}
        }
        let now = engine.now_ms();
        if now >= a.deadline_at {
            let testing = a.stage == "testing";
            let status = if testing { "approved" } else { "timeout" };
            let decide = Write::DecideApproval {
                token: a.token.clone(),
                status: status.into(),
                by: Some("deadline".into()),
                at: now,
            };
            let ev = event(
                call.run_id,
                now,
                "warn",
                "approval_timed_out",
                format!(
                    "Approval for {} passed its deadline{}",
                    call.step_path,
                    if testing {
                        "; auto-approved (testing stage)"
                    } else {
                        ""
                    }
                ),
                json!({"step": call.step_path, "token": a.token, "auto_approved": testing}),
            );
            let outcomes = engine
                .store
                .commit(vec![decide, ev])
                .await
                .map_err(|e| fail(e.to_string()))?;
            if matches!(
                outcomes.first(),
                Some(crate::store::Outcome::ApprovalDecided)
            ) {
                crate::telemetry::approval_decided(call.pipeline, "timeout");
                engine.refresh_approvals_gauge();
                if testing {
                    return Ok(decided(true, "deadline (testing stage)", &a.token));
                }
                let secs = (a.deadline_at - a.created_at) / 1000;
                return Err(fail(format!("Human approval timed out after {secs}s")));
            }
            continue; // Someone decided at the last moment: read it.
        }
        let left = Duration::from_millis((a.deadline_at - now).max(0) as u64);
        let mut shutdown = engine.shutdown_signal();
        tokio::select! {
            _ = tokio::time::sleep(left.min(Duration::from_secs(5))) => {}
            _ = &mut notified => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn decided(approved: bool, by: &str, token: &str) -> Outcome {
    let mut output = if approved {
        StepOutput::new(1.0, format!("Approved by {by}"))
    } else {
        StepOutput::new(0.0, format!("Rejected by {by}"))
    };
    output.next_step_context = if approved {
        "Human reviewed and approved this step.".into()
    } else {
        "Human rejected this step.".into()
    };
    output.extra.insert("approved".into(), json!(approved));
    output.extra.insert("decided_by".into(), json!(by));
    output.extra.insert("token".into(), json!(token));
    Outcome {
        output,
        usage: Usage::default(),
    }
}
