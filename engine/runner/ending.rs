//! How runs end and restart: `finish` closes a run together with what it owes,
//! `close_terminal` closes a run whose ending unit was recorded without it, and
//! `announce_resume` audits a resume (SPEC 6.5).

use serde_json::{Map, Value};

use super::unit::RunState;
use super::{outbox, Error, RunEnd};
use crate::domain::{RunStatus, StepStatus};
use crate::events::Event;
use crate::pipeline::Entry;
use crate::run::plan::ResumePlan;
use crate::store::Write;

/// Ends the run: `run_finished`, the terminal status and the notifications owed are
/// committed together with `writes`, then the notifications are delivered.
pub(super) async fn finish(
    rs: &mut RunState,
    status: RunStatus,
    terminal_step: Option<&str>,
    reason: Option<String>,
    mut writes: Vec<Write>,
) -> Result<RunEnd, Error> {
    let now = rs.now();
    writes.push(rs.ev(
        Event::RunFinished {
            status,
            terminal_step: terminal_step.map(str::to_string),
            reason: reason.clone(),
        },
        format!("Pipeline finished: {status}"),
    ));
    writes.push(Write::FinishRun {
        run_id: rs.id().to_string(),
        status,
        completed_at: now,
        terminal_step: terminal_step.map(str::to_string),
        reason: reason.clone(),
        final_output_json: rs.final_output.as_ref().map(Value::to_string),
    });
    if status != RunStatus::Completed {
        writes.push(Write::CloseApprovalsOfRun {
            run_id: rs.id().to_string(),
            at: now,
        });
    }
    let owes_notifications = writes
        .iter()
        .chain(rs.deferred.iter())
        .any(|w| matches!(w, Write::InsertNotification(_)));
    rs.commit(writes).await?;
    if status != RunStatus::Completed {
        // Chat messages of the approvals just closed say so (in the background).
        rs.services.publish(super::ApprovalChange::Closed {
            run_id: rs.id().to_string(),
        });
    }
    crate::telemetry::run_finished(&rs.pipeline.name, status.as_str());
    tracing::info!(run_id = %rs.id(), pipeline = %rs.pipeline.name, status = %status, "Run finished.");
    if owes_notifications {
        outbox::deliver_run(&rs.services, rs.id()).await;
    }
    Ok(RunEnd::Finished(status))
}

/// A unit that ended the run was recorded but the run was not closed (a store from
/// an older build, or a partial write): close it now without running anything.
pub(super) async fn close_terminal(
    rs: &mut RunState,
    entry: &Entry,
    status: StepStatus,
    output: Option<Value>,
    reason: Option<String>,
) -> Result<RunEnd, Error> {
    let name = entry.name().to_string();
    let mut extra = Map::new();
    let summary = output
        .as_ref()
        .and_then(|o| o.get("summary"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    extra.insert("step_summary".into(), Value::from(summary.clone()));
    let action = crate::run::settle::notification(status, entry.gate());
    let writes = outbox::record(rs, &action, &name, &extra);
    if status == StepStatus::Stopped {
        rs.final_output = output;
    }
    finish(
        rs,
        status.run_ending(),
        Some(&name),
        reason.or(Some(summary)),
        writes,
    )
    .await
}

pub(super) async fn announce_resume(rs: &mut RunState, plan: &ResumePlan) -> Result<(), Error> {
    // On a shared store: who drove it before, and whether it was handed over
    // cleanly (not counted toward `max_resume_attempts`).
    let book = rs.services.leases();
    let adoption = book.and_then(|b| b.take_adoption(rs.id()));
    let counted = !adoption.as_ref().is_some_and(|a| a.clean_handoff);
    let count = rs.run.resume_count + u32::from(counted);
    let event = Event::RunResumed {
        steps_skipped: plan.steps_skipped,
        branches_skipped: plan.branches_skipped,
        in_flight: plan.in_flight.clone(),
        on_interrupted: plan.on_interrupted.as_str().to_string(),
        resume_count: count,
        from_replica: adoption.and_then(|a| a.from_replica),
        replica: book.map(|b| b.replica().to_string()),
    };
    tracing::warn!(
        run_id = %rs.id(),
        pipeline = %rs.pipeline.name,
        steps_skipped = plan.steps_skipped,
        branches_skipped = plan.branches_skipped,
        in_flight = %crate::telemetry::json_text(&plan.in_flight),
        on_interrupted = plan.on_interrupted.as_str(),
        resume_count = count,
        "Resuming run after restart."
    );
    let msg = format!(
        "Run resumed after restart: {} step(s) and {} branch(es) kept, in flight: {:?}, on_interrupted={}",
        plan.steps_skipped,
        plan.branches_skipped,
        plan.in_flight,
        plan.on_interrupted.as_str()
    );
    let now = rs.now();
    // Deferred: it rides in the run's next commit, which always comes before any
    // executor is called (a resume that gets no further is simply not counted).
    rs.defer(vec![
        rs.ev(event, msg),
        Write::MarkResumed {
            run_id: rs.id().to_string(),
            at: now,
            counted,
        },
    ]);
    rs.run.resume_count = count;
    crate::telemetry::run_resumed(&rs.pipeline.name);
    Ok(())
}
