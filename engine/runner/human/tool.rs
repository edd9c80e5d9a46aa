//! Approvals of agent tool calls (`approval: required`): the same approval rows,
//! delivery, page, API and deadline as a `human` step, asked for one tool call.
//! The agent loop commits the request together with the call's `waiting` record.
//! In `serve`, a top-level agent step then parks its run exactly like a human step
//! (the step record `waiting`, no task until the decision, the deadline or a
//! cancel; see `runner::park`); elsewhere it waits here in its task. Either way the
//! model is handed a rejection or a timeout as the call's result.

use std::sync::Arc;

use super::super::unit::CallFailure;
use super::super::{ApprovalChange, Services};
use super::wait::{self, Waiting};
use super::{delivery, fail, new_token};
use crate::domain::ApprovalStatus;
use crate::domain::StepStatus;
use crate::executor::Call;
use crate::run::turns::Decision;
use crate::store::{ApprovalRecord, StepRecord, Write};

/// A tool call's approval, as the agent loop asks for it.
pub(crate) struct ToolRequest<'a> {
    pub tool: &'a str,
    pub arguments: &'a serde_json::Value,
    pub team: Option<&'a str>,
    pub stage: &'a str,
    pub timeout_seconds: u64,
}

/// A new approval row for the call: the caller commits it with the call's
/// `waiting` record (see [`requested`] for what follows the commit).
pub(crate) fn new_request(
    engine: &Services,
    call: &Call<'_>,
    req: &ToolRequest<'_>,
    now: i64,
) -> ApprovalRecord {
    let production = req.stage != "testing";
    let route = delivery::route(&engine.config, req.team);
    // The model chose the arguments: escaped, they cannot add markup to the message.
    let args = crate::view::escape_html(&req.arguments.to_string());
    let message = format!(
        "Step <b>{}</b> of pipeline <b>{}</b> wants to run the tool <b>{}</b> with\n<code>{args}</code>\nApprove?",
        crate::view::escape_html(call.step_path),
        crate::view::escape_html(call.pipeline),
        crate::view::escape_html(req.tool),
    );
    ApprovalRecord {
        token: new_token(),
        run_id: call.run_id.to_string(),
        step_path: call.step_path.to_string(),
        pipeline_name: call.pipeline.to_string(),
        message,
        team: req.team.map(str::to_string),
        stage: req.stage.to_string(),
        channel: production.then(|| route.channel().to_string()),
        created_at: now,
        deadline_at: now + (req.timeout_seconds as i64) * 1000,
        status: ApprovalStatus::Pending,
        decided_by: None,
        decided_at: None,
        delivery_json: None,
    }
}

/// After the request's commit: announce it and start its delivery.
pub(crate) fn requested(engine: &Arc<Services>, a: &ApprovalRecord) {
    engine.refresh_approvals_gauge();
    engine.publish(ApprovalChange::Requested {
        run_id: a.run_id.clone(),
        token: a.token.clone(),
    });
    let url = delivery::page_url(&engine.config, &a.token);
    tracing::warn!(target: "vectorstep::approval", run_id = %a.run_id, step = %a.step_path, url = %url, "Tool approval requested: {}", a.message);
    if a.stage != "testing" {
        delivery::spawn(engine, a.clone());
    }
}

/// The write that records an approval row (for the caller's commit).
pub(crate) fn insert(a: &ApprovalRecord) -> Write {
    Write::InsertApproval(a.clone())
}

/// Waits for the decision on `token` (re-armed after a restart from its row).
pub(crate) async fn decision(
    engine: &Arc<Services>,
    call: &Call<'_>,
    token: &str,
) -> Result<Decision, CallFailure> {
    let a = engine
        .store
        .approval(token)
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail(format!("the approval of this tool call ({token}) vanished")))?;
    match wait::wait(engine, call, Waiting::of(&a)).await {
        Ok(o) => {
            let approved = o
                .output
                .extra
                .get(ApprovalStatus::Approved.as_str())
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false);
            let by = o
                .output
                .extra
                .get("decided_by")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("unknown")
                .to_string();
            Ok(if approved {
                Decision::Approved
            } else {
                Decision::Rejected { by }
            })
        }
        // The row says whether the wait ended on its deadline.
        Err(CallFailure::Error(e)) => match engine.store.approval(token) {
            Ok(Some(a)) if a.status == ApprovalStatus::Timeout => Ok(Decision::TimedOut),
            _ => Err(CallFailure::Error(e)),
        },
        Err(e) => Err(e),
    }
}

/// The step's record while its run is parked on a tool approval.
pub(crate) fn waiting_record(record: &StepRecord) -> Write {
    let mut rec = record.clone();
    rec.status = StepStatus::Waiting;
    Write::UpsertStep(rec)
}

/// Parks the run on approval `a` unless it is decided, due or cancelled already
/// (`Ok(false)`: the caller waits, or acts, itself).
pub(crate) async fn park(
    engine: &Arc<Services>,
    call: &Call<'_>,
    a: &ApprovalRecord,
) -> Result<bool, CallFailure> {
    wait::park(engine, call, &Waiting::of(a)).await
}

/// A tool call's approval found waiting after a restart: its message is sent now
/// if the previous process chose a channel but never confirmed the send (as for a
/// human step); otherwise nothing is sent again.
pub(crate) fn rearmed(
    engine: &Arc<Services>,
    run_id: &str,
    token: &str,
) -> Result<(), CallFailure> {
    let Some(a) = engine
        .store
        .approval(token)
        .map_err(|e| fail(e.to_string()))?
    else {
        return Ok(());
    };
    if a.status == ApprovalStatus::Pending && a.stage != "testing" && delivery::undelivered(&a) {
        tracing::warn!(run_id = %run_id, step = %a.step_path, token = %token, "Re-armed tool approval after restart; its message was never confirmed sent, sending it now.");
        delivery::spawn(engine, a);
    } else {
        tracing::warn!(run_id = %run_id, step = %a.step_path, token = %token, "Re-armed tool approval after restart; message not re-sent.");
    }
    Ok(())
}
