//! `executor: human`: an approval request that parks the step until someone
//! decides, the deadline passes, or the run ends.
//!
//! The `pending_approvals` row (token, message, absolute deadline) and the step's
//! `waiting` status are committed before anything is sent. After a restart the
//! same row is found by (run, step path) and re-armed: same token, the time left
//! until the original deadline, nothing sent again. A row decided while no process
//! was waiting on it (a button pressed during the restart, or a crash between the
//! decision and the step's record) is found the same way and its decision used, so
//! nobody is asked twice; the engine remembers which rows a step already used, so a
//! retry or the next loop iteration does ask again.
//!
//! Production requests are then delivered to their channel (Telegram, a chat
//! webhook) by a background task; see `delivery`. Testing requests are never sent
//! anywhere: they are decided on the approvals page or auto-approved at the deadline.

use std::sync::Arc;

use rand::RngCore;

use super::unit::{CallFailure, HumanMode, UnitFacts};
use super::{ApprovalChange, Services};
use crate::domain::{ApprovalStatus, StepStatus};
use crate::events::Event;
use crate::executor::{BoxFuture, Call, Outcome};
use crate::store::{ApprovalRecord, Write};
use wait::Waiting;

mod delivery;
pub(super) mod tool;
mod wait;

/// An unguessable approval token: 128 random bits, hex.
pub fn new_token() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn fail(msg: impl Into<String>) -> CallFailure {
    CallFailure::Error(msg.into())
}

/// Requests (or re-arms) the approval, then parks the run (`serve`) or waits for
/// its outcome in this task.
///
/// Boxed, and so is the request, so that a step waiting in its task costs its
/// caller a pointer and the wait only its small state.
pub(super) fn run<'a>(
    engine: &'a Arc<Services>,
    call: &'a Call<'a>,
    mode: HumanMode,
    facts: UnitFacts<'a>,
) -> BoxFuture<'a, Result<Outcome, CallFailure>> {
    Box::pin(async move {
        let waiting = Box::pin(request(engine, call, mode.unparked, &facts)).await?;
        if mode.may_park && wait::park(engine, call, &waiting).await? {
            return Err(CallFailure::Parked);
        }
        wait::wait(engine, call, waiting).await
    })
}

/// Finds the approval this step waits on (re-arming it after a restart, or simply
/// picking it up again when the run was `unparked`) or creates and commits a new
/// one, and starts its delivery.
async fn request(
    engine: &Arc<Services>,
    call: &Call<'_>,
    unparked: bool,
    facts: &UnitFacts<'_>,
) -> Result<Waiting, CallFailure> {
    let now = engine.now_ms();
    // The newest row of this step is the one an interrupted wait was waiting on,
    // unless this process already used its outcome.
    let existing = engine
        .store
        .approvals_of_run(call.run_id)
        .map_err(|e| fail(e.to_string()))?
        .into_iter()
        .rfind(|a| a.step_path == call.step_path)
        .filter(|a| a.status != ApprovalStatus::Closed && !used(engine, &a.token));
    match existing {
        // The same process parked this wait: nothing to log, nothing owed.
        Some(a) if unparked => Ok(Waiting::of(&a)),
        Some(a) => rearm(engine, call, a, facts, now).await,
        None => create(engine, call, facts, now).await,
    }
}

/// After a restart every waiting run comes through here at once, so it reads and
/// keeps as little as it can: the row is reduced to its wait state before the
/// commit, and kept whole only when its message is still owed.
async fn rearm(
    engine: &Arc<Services>,
    call: &Call<'_>,
    a: ApprovalRecord,
    facts: &UnitFacts<'_>,
    now: i64,
) -> Result<Waiting, CallFailure> {
    let msg = if a.status == ApprovalStatus::Pending {
        format!(
            "Re-armed approval for {} after restart; the message was not sent again",
            call.step_path
        )
    } else {
        format!(
            "Approval for {} was decided ({}) while no process was waiting; using that decision",
            call.step_path, a.status
        )
    };
    let ev = Event::ApprovalRearmed {
        step: call.step_path.to_string(),
        token: a.token.clone(),
        deadline_at: crate::clock::rfc3339(a.deadline_at),
        status: a.status,
    }
    .write(call.run_id, now, msg);
    let w = Waiting::of(&a);
    // The previous process chose a channel but never confirmed a send.
    let owed = delivery::undelivered(&a).then_some(a);
    let writes = vec![waiting(facts), ev];
    crate::runner::persist::commit(engine, call.run_id, writes)
        .await
        .map_err(|e| fail(e.to_string()))?;
    tracing::warn!(run_id = %call.run_id, step = %call.step_path, token = %w.token, "Re-armed human approval after restart; message not re-sent.");
    if let Some(a) = owed {
        delivery::spawn(engine, a);
    }
    Ok(w)
}

async fn create(
    engine: &Arc<Services>,
    call: &Call<'_>,
    facts: &UnitFacts<'_>,
    now: i64,
) -> Result<Waiting, CallFailure> {
    let (team, stage) = (facts.team.map(str::to_string), facts.stage.to_string());
    let timeout_ms = (call.action.timeout_seconds.unwrap_or(300.0) * 1000.0) as i64;
    let production = stage != "testing";
    // The channel is chosen (and stored) with the request, so a restart before the
    // send completes knows that a message is still owed.
    let route = delivery::route(&engine.config, team.as_deref());
    let a = ApprovalRecord {
        token: new_token(),
        run_id: call.run_id.to_string(),
        step_path: call.step_path.to_string(),
        pipeline_name: call.pipeline.to_string(),
        message: call.prompt.clone(),
        team,
        stage,
        channel: production.then(|| route.channel().to_string()),
        created_at: now,
        deadline_at: now + timeout_ms,
        status: ApprovalStatus::Pending,
        decided_by: None,
        decided_at: None,
        delivery_json: None,
    };
    let url = delivery::page_url(&engine.config, &a.token);
    let ev = Event::ApprovalRequested {
        step: call.step_path.to_string(),
        token: a.token.clone(),
        deadline_at: crate::clock::rfc3339(a.deadline_at),
        url: url.clone(),
    }
    .write(
        call.run_id,
        now,
        format!("Approval requested for {}: {url}", call.step_path),
    );
    crate::runner::persist::commit(
        engine,
        call.run_id,
        vec![Write::InsertApproval(a.clone()), waiting(facts), ev],
    )
    .await
    .map_err(|e| fail(e.to_string()))?;
    engine.refresh_approvals_gauge();
    engine.publish(ApprovalChange::Requested {
        run_id: a.run_id.clone(),
        token: a.token.clone(),
    });
    tracing::warn!(target: "vectorstep::approval", run_id = %call.run_id, step = %call.step_path, url = %url, "Approval requested: {}", a.message);
    let w = Waiting::of(&a);
    if production {
        delivery::spawn(engine, a);
    }
    Ok(w)
}

/// The step record's `waiting` state: the unit's `running` record as committed,
/// keeping its identity fields.
fn waiting(facts: &UnitFacts<'_>) -> Write {
    let mut rec = facts.record.clone();
    rec.status = StepStatus::Waiting;
    Write::UpsertStep(rec)
}

fn used(engine: &Services, token: &str) -> bool {
    engine.signals.is_used(token)
}
