//! The wait itself: until the approval is decided, its deadline passes, the run is
//! cancelled or the process shuts down.
//!
//! Thousands of runs can sit here at once, so a wait holds only what it needs (the
//! token and the deadline), not the approval row, and it wakes on the approval's
//! signal rather than by polling; the periodic re-read is only a safety net.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::super::leases;
use super::super::unit::CallFailure;
use super::super::Services;
use super::fail;
use crate::domain::ApprovalStatus;
use crate::events::Event;
use crate::executor::{Call, Outcome};
use crate::run::{StepOutput, Usage};
use crate::runner::ApprovalChange;
use crate::store::{ApprovalRecord, Write};

/// How many re-reads per second all waiters together may cost. A waiter re-reads
/// its row without a wake-up only to notice decisions made by another process on
/// the same store (a `vectorstep run` waiting while `serve` takes the decision);
/// decisions in this process signal it at once. So the interval is 5 s with few
/// waiters and stretches to 60 s as they grow to thousands.
const REREADS_PER_SECOND: usize = 200;

fn safety_net(engine: &Services) -> Duration {
    let waiters = engine.signals.approval_waiters();
    Duration::from_secs((waiters / REREADS_PER_SECOND).clamp(5, 60) as u64)
}

/// What a waiting step keeps of its approval.
pub(super) struct Waiting {
    pub token: String,
    pub created_at: i64,
    pub deadline_at: i64,
    pub testing: bool,
}

impl Waiting {
    pub fn of(a: &ApprovalRecord) -> Waiting {
        Waiting {
            token: a.token.clone(),
            created_at: a.created_at,
            deadline_at: a.deadline_at,
            testing: a.stage == "testing",
        }
    }
}

/// Parks the run on `w` (see `park`) unless there is something to act on now.
/// `Ok(true)`: parked, the caller must return at once without writing anything;
/// `Ok(false)`: this task owns the run and waits (or acts) itself.
pub(super) async fn park(
    engine: &Arc<Services>,
    call: &Call<'_>,
    w: &Waiting,
) -> Result<bool, CallFailure> {
    if engine.is_shutting_down() || engine.is_cancelled(call.run_id) {
        return Ok(false);
    }
    // On a shared store nobody holds a parked run's lease; one this replica
    // cannot park keeps its run waiting in this task. Not parked at all when there
    // is something to act on already (an unparked run comes back decided).
    if engine.leases().is_some() {
        let due = matches!(read(engine, w), Ok(Some(_))) || engine.now_ms() >= w.deadline_at;
        if due || !leases::park_lease(&engine.store, engine.leases(), call.run_id).await {
            return Ok(false);
        }
    }
    // Registered first, checked second: a decision or cancellation that lands
    // before the registration is seen below; one after it finds the entry and
    // unparks the run. Whoever takes the entry back owns the run.
    engine.park(&w.token, call.run_id, w.deadline_at);
    let act_now = match read(engine, w) {
        Ok(state) => {
            state.is_some() || engine.now_ms() >= w.deadline_at || engine.is_cancelled(call.run_id)
        }
        Err(e) => {
            return match engine.claim_parked(&w.token) {
                // Going on here needs the lease back; lost, another replica drives.
                true if leases::claim_parked_lease(
                    &engine.store,
                    engine.leases(),
                    call.run_id,
                    None,
                )
                .await =>
                {
                    Err(e)
                }
                _ => Ok(true),
            };
        }
    };
    if act_now && engine.claim_parked(&w.token) {
        return Ok(
            !leases::claim_parked_lease(&engine.store, engine.leases(), call.run_id, None).await,
        );
    }
    Ok(true)
}

/// Waits for the outcome; an outcome (not a drain) marks the approval as used, so
/// a retry or the next loop iteration of the step asks again.
pub(super) async fn wait(
    engine: &Arc<Services>,
    call: &Call<'_>,
    w: Waiting,
) -> Result<Outcome, CallFailure> {
    let result = outcome(engine, call, &w).await;
    if !matches!(result, Err(CallFailure::Drained)) {
        engine.signals.mark_used(call.run_id, &w.token);
        // Nobody waits on this token any more.
        engine.signals.drop_approval(&w.token);
    }
    result
}

/// The step's outcome if the approval is no longer pending, `None` while it is.
fn read(
    engine: &Services,
    w: &Waiting,
) -> Result<Option<Result<Outcome, CallFailure>>, CallFailure> {
    let current = engine
        .store
        .approval(&w.token)
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("approval vanished"))?;
    let by = current.decided_by.as_deref().unwrap_or("unknown");
    Ok(Some(match current.status {
        ApprovalStatus::Approved => Ok(decided(true, by, &w.token)),
        ApprovalStatus::Rejected => Ok(decided(false, by, &w.token)),
        ApprovalStatus::Closed => Err(fail("approval closed")),
        ApprovalStatus::Timeout => Err(fail("Human approval timed out")),
        ApprovalStatus::Pending => return Ok(None),
    }))
}

async fn outcome(
    engine: &Arc<Services>,
    call: &Call<'_>,
    w: &Waiting,
) -> Result<Outcome, CallFailure> {
    let signal = engine.approval_signal(call.run_id, &w.token);
    let mut shutdown = engine.shutdown_signal();
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
        if let Some(r) = read(engine, w)? {
            return r;
        }
        let now = engine.now_ms();
        if now >= w.deadline_at {
            match deadline(engine, call, w, now).await? {
                Some(r) => return r,
                None => continue, // Someone decided at the last moment: read it.
            }
        }
        let left = Duration::from_millis((w.deadline_at - now).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(left.min(safety_net(engine))) => {}
            _ = &mut notified => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Records the deadline's decision: `timeout` in production, auto-approval in
/// testing. `None` when a decision was recorded first.
async fn deadline(
    engine: &Arc<Services>,
    call: &Call<'_>,
    w: &Waiting,
    now: i64,
) -> Result<Option<Result<Outcome, CallFailure>>, CallFailure> {
    let status = if w.testing {
        ApprovalStatus::Approved
    } else {
        ApprovalStatus::Timeout
    };
    let decide = Write::DecideApproval {
        token: w.token.clone(),
        status,
        by: Some("deadline".into()),
        at: now,
    };
    let suffix = if w.testing {
        "; auto-approved (testing stage)"
    } else {
        ""
    };
    let ev = Event::ApprovalTimedOut {
        step: call.step_path.to_string(),
        token: w.token.clone(),
        auto_approved: w.testing,
    }
    .write(
        call.run_id,
        now,
        format!(
            "Approval for {} passed its deadline{suffix}",
            call.step_path
        ),
    );
    let outcomes = crate::runner::persist::commit(engine, call.run_id, vec![decide, ev])
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !matches!(
        outcomes.first(),
        Some(crate::store::Outcome::ApprovalDecided)
    ) {
        return Ok(None);
    }
    crate::telemetry::approval_decided(call.pipeline, ApprovalStatus::Timeout.as_str());
    engine.refresh_approvals_gauge();
    engine.publish(ApprovalChange::Decided {
        token: w.token.clone(),
    });
    if w.testing {
        return Ok(Some(Ok(decided(
            true,
            "deadline (testing stage)",
            &w.token,
        ))));
    }
    let secs = (w.deadline_at - w.created_at) / 1000;
    Ok(Some(Err(fail(format!(
        "Human approval timed out after {secs}s"
    )))))
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
    output
        .extra
        .insert(ApprovalStatus::Approved.to_string(), json!(approved));
    output.extra.insert("decided_by".into(), json!(by));
    output.extra.insert("token".into(), json!(token));
    Outcome {
        output,
        usage: Usage::default(),
    }
}
