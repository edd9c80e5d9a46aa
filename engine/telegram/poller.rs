//! The update loop: long-polls `getUpdates` for button presses and turns each into
//! a decision. The offset is stored after every batch, so a press made while the
//! service was down is applied at the next start, and a press is never applied
//! twice in a way that matters (a repeated decision is answered "already decided").

use std::time::Duration;

use super::client::{Client, Press};
use crate::config::Config;
use crate::runner::{ApprovalDelivery, ApprovalDesk, Decider};
use crate::store::{ApprovalRecord, Outcome, Write};

/// The `kv` key holding the next update id to ask for.
pub const OFFSET_KEY: &str = "telegram:update_offset";

/// Long-poll length. Short enough that a stopped service is not held by it, long
/// enough that an idle bot makes a few requests a minute.
const WAIT_SECONDS: u32 = 10;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The singleton lease the polling replica holds on a shared store.
pub const POLLER_LEASE: &str = "telegram_poller";

/// How long a long poll may last while holding a lease of `lease_ms`: it ends
/// well inside the lease (renewed before each poll), so a replica that takes the
/// lease over never polls while the old holder's request still runs (Telegram
/// answers that with 409 Conflict).
fn poll_seconds(lease_ms: u64) -> u32 {
    u32::try_from(lease_ms / 3_000)
        .unwrap_or(u32::MAX)
        .clamp(1, WAIT_SECONDS)
}

/// On a shared store, whether this replica may poll now: it takes or renews the
/// poller lease. `Some(fence)` to put before the offset's write; `None` while
/// another replica holds the lease (or the store cannot say).
async fn take_turn(desk: &ApprovalDesk, me: &str, lease_ms: u64) -> Option<Write> {
    let acquire = Write::AcquireNamedLease {
        name: POLLER_LEASE.into(),
        owner: me.to_string(),
        lease_ms,
    };
    match desk.store().commit(vec![acquire]).await {
        Ok(outcomes) => match outcomes.first() {
            Some(Outcome::NamedLeaseHeld { epoch }) => Some(Write::FenceNamedLease {
                name: POLLER_LEASE.into(),
                owner: me.to_string(),
                epoch: *epoch,
            }),
            _ => None,
        },
        Err(e) => {
            tracing::warn!(error = %e, "Cannot take the Telegram poller lease; not polling for now.");
            None
        }
    }
}

/// Polls until shutdown begins. Never returns early on an error: a failing Bot API
/// is retried with backoff, because approvals depend on this loop. On a shared
/// store only the replica holding the poller lease polls; the others wait to
/// take it over.
pub async fn run(desk: ApprovalDesk, client: Client) {
    let mut stop = desk.shutdown_signal();
    let mut offset = load_offset(&desk);
    let mut backoff = FIRST_BACKOFF;
    let replica = desk.replica();
    // The lease epoch this replica polls under, if it does.
    let mut polling_under: Option<u64> = None;
    if replica.is_none() {
        tracing::info!(offset, "Polling Telegram for approval button presses.");
    }
    loop {
        if *stop.borrow() {
            break;
        }
        let mut wait = WAIT_SECONDS;
        let mut fence = None;
        if let Some((me, lease_ms, heartbeat)) = &replica {
            fence = take_turn(&desk, me, *lease_ms).await;
            let epoch = match &fence {
                Some(Write::FenceNamedLease { epoch, .. }) => Some(*epoch),
                _ => None,
            };
            if epoch != polling_under {
                if epoch.is_some() {
                    // The previous holder may have moved the offset on.
                    offset = load_offset(&desk);
                    tracing::info!(offset, replica = %me, "This replica polls Telegram for approval button presses now.");
                } else {
                    tracing::info!(replica = %me, "Another replica polls Telegram now.");
                }
                polling_under = epoch;
            }
            if epoch.is_none() {
                tokio::select! {
                    _ = tokio::time::sleep(*heartbeat) => {}
                    _ = stop.changed() => break,
                }
                continue;
            }
            wait = poll_seconds(*lease_ms);
        }
        let result = tokio::select! {
            r = client.updates(offset, wait) => r,
            _ = stop.changed() => break,
        };
        let updates = match result {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "Telegram getUpdates failed; retrying.");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => break,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = FIRST_BACKOFF;
        if updates.is_empty() {
            continue;
        }
        let mut next = offset.unwrap_or(0);
        for (id, press) in updates {
            if let Some(p) = press {
                handle(&desk, &client, p).await;
            }
            next = next.max((i64::from(id) + 1).min(i64::from(i32::MAX)) as i32);
        }
        offset = Some(next);
        let mut writes: Vec<Write> = fence.into_iter().collect();
        writes.push(Write::SetKv {
            key: OFFSET_KEY.into(),
            value: next.to_string(),
        });
        if let Err(e) = desk.store().commit(writes).await {
            // The offset stays advanced in memory; after a restart (or a takeover)
            // the batch comes again and each decision is answered "already decided".
            tracing::warn!(error = %e, "Cannot store the Telegram update offset.");
        }
    }
    // Hand the polling over at once rather than when the lease runs out.
    if let (Some((me, _, _)), Some(_)) = (&replica, polling_under) {
        let release = Write::ReleaseNamedLease {
            name: POLLER_LEASE.into(),
            owner: me.clone(),
        };
        let _ = desk.store().commit(vec![release]).await;
    }
}

fn load_offset(desk: &ApprovalDesk) -> Option<i32> {
    match desk.store().kv(OFFSET_KEY) {
        Ok(v) => v.and_then(|s| s.parse().ok()),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read the Telegram update offset; starting from Telegram's.");
            None
        }
    }
}

/// `approve:<token>` / `reject:<token>`.
pub fn parse_data(data: &str) -> Option<(bool, &str)> {
    let (action, token) = data.split_once(':')?;
    let approve = match action {
        "approve" => true,
        "reject" => false,
        _ => return None,
    };
    (!token.is_empty()).then_some((approve, token))
}

/// Whether `press` may decide `a`: the button must sit in a chat approvals are sent
/// to, and the user must be on `human_approval.approvers` when that list is set.
/// `Err` holds the answer the user sees.
pub fn authorise(config: &Config, press: &Press, a: &ApprovalRecord) -> Result<(), &'static str> {
    let delivered = a
        .delivery_json
        .as_deref()
        .and_then(ApprovalDelivery::parse)
        .and_then(|d| d.telegram_message());
    let chat_ok = press.chat_id.is_some_and(|chat| {
        delivered.is_some_and(|(c, _)| c == chat) || configured_chats(config).any(|c| c == chat)
    });
    if !chat_ok {
        return Err("Approvals cannot be decided from this chat.");
    }
    let approvers = &config.human_approval.approvers;
    if !approvers.is_empty()
        && !approvers
            .iter()
            .any(|id| id.trim() == press.user_id.to_string())
    {
        return Err("You are not on the approvers list; nothing was decided.");
    }
    Ok(())
}

/// Numeric chat ids from `notifications.telegram` and the telegram routes.
fn configured_chats(config: &Config) -> impl Iterator<Item = i64> + '_ {
    let ha = &config.human_approval;
    config
        .telegram
        .iter()
        .map(|t| t.chat_id.as_str())
        .chain(
            ha.default
                .iter()
                .chain(ha.teams.values())
                .filter_map(|r| r.chat_id.as_deref()),
        )
        .filter_map(|c| c.trim().parse().ok())
}

async fn handle(desk: &ApprovalDesk, client: &Client, press: Press) {
    let answer = decide(desk, &press).await;
    // Answered in the background: a slow answer must not hold up the next press.
    let client = client.clone();
    tokio::spawn(async move {
        if let Err(e) = client.answer(&press.callback_id, answer).await {
            // Telegram refuses answers to presses older than a few minutes (for
            // example one made while the service was down); the decision stands.
            tracing::debug!(error = %e, "Cannot answer a Telegram button press.");
        }
    });
}

async fn decide(desk: &ApprovalDesk, press: &Press) -> &'static str {
    let Some((approve, token)) = press.data.as_deref().and_then(parse_data) else {
        return "This button is not a vectorstep approval.";
    };
    let a = match desk.store().approval(token) {
        Ok(Some(a)) => a,
        Ok(None) => return "Unknown or expired approval.",
        Err(e) => {
            tracing::error!(error = %e, "Cannot read an approval for a Telegram press.");
            return "Could not record the decision; please try again.";
        }
    };
    if let Err(why) = authorise(desk.config(), press, &a) {
        tracing::warn!(run_id = %a.run_id, step = %a.step_path, user_id = press.user_id, user = %press.user_name,
            chat_id = ?press.chat_id, "Refused a Telegram approval press: {why}");
        return why;
    }
    let by = format!("{} (Telegram {})", press.user_name, press.user_id);
    let decider = Decider {
        by,
        via: Some("telegram"),
        client: None,
    };
    match desk.decide(token, approve, &decider).await {
        Ok(Outcome::ApprovalDecided) if approve => "Approved",
        Ok(Outcome::ApprovalDecided) => "Rejected",
        Ok(Outcome::ApprovalAlreadyDecided { .. }) => "Already decided.",
        Ok(_) => "Unknown or expired approval.",
        Err(e) => {
            tracing::error!(error = %e, "Cannot record a Telegram approval decision.");
            "Could not record the decision; please try again."
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_poll_ends_well_inside_the_poller_lease() {
        for (lease_ms, want) in [
            (30_000, 10),
            (3_000, 1),
            (1_000, 1),
            (9_000, 3),
            (600_000, 10),
        ] {
            assert_eq!(poll_seconds(lease_ms), want, "lease {lease_ms} ms");
        }
    }

    #[test]
    fn callback_data() {
        let check = |data: &str, expected: Option<(bool, &str)>| {
            assert_eq!(parse_data(data), expected, "{data}");
        };
        check("approve:abc", Some((true, "abc")));
        check("reject:abc", Some((false, "abc")));
        check("approve:", None);
        check("approve", None);
        check("run:abc", None);
        check("reject:a:b", Some((false, "a:b")));
    }

    fn approval(delivery: Option<&str>) -> ApprovalRecord {
        ApprovalRecord {
            token: "t".into(),
            run_id: "r".into(),
            step_path: "s".into(),
            pipeline_name: "p".into(),
            message: "m".into(),
            team: None,
            stage: "production".into(),
            channel: Some("telegram".into()),
            created_at: 0,
            deadline_at: 1,
            status: crate::domain::ApprovalStatus::Pending,
            decided_by: None,
            decided_at: None,
            delivery_json: delivery.map(str::to_string),
        }
    }

    #[test]
    fn who_may_decide() {
        let mut config = Config::default();
        config.telegram = Some(crate::config::Telegram {
            bot_token: "1:x".into(),
            chat_id: "-100".into(),
            api_url: None,
        });
        let press = |user: u64, chat: Option<i64>| Press {
            callback_id: "c".into(),
            user_id: user,
            user_name: "@u".into(),
            chat_id: chat,
            message_id: Some(1),
            data: Some("approve:t".into()),
        };
        let sent = r#"{"channel":"telegram","chat_id":-200,"message_id":5}"#;
        let check = |config: &Config, p: Press, delivery: Option<&str>, ok: bool| {
            let got = authorise(config, &p, &approval(delivery));
            assert_eq!(got.is_ok(), ok, "{p:?} {delivery:?}: {got:?}");
        };
        check(&config, press(7, Some(-100)), None, true);
        check(&config, press(7, Some(-200)), Some(sent), true);
        check(&config, press(7, Some(-300)), Some(sent), false);
        check(&config, press(7, None), Some(sent), false);
        config.human_approval.approvers = vec!["42".into(), " 43 ".into()];
        check(&config, press(7, Some(-100)), None, false);
        check(&config, press(42, Some(-100)), None, true);
        check(&config, press(43, Some(-100)), None, true);
    }
}
