//! `replicas`, the lease columns of `pipeline_runs`, `named_leases` and
//! `schedule_ticks`: the store side of several replicas sharing one PostgreSQL
//! database (SPEC 11). The decisions (who may claim what, when to stop driving)
//! are `run::lease`; this file applies them in SQL, as `Write`s like any other.
//!
//! Two rules make the leases safe:
//! - **Every time is the database's clock** ([`Db::now_ms_sql`]), never the
//!   replica's: expiry is compared with the time of the statement that compares it,
//!   on the one clock all replicas share, so a replica whose own clock is skewed
//!   still agrees with the others on whether a lease has expired.
//! - **The fence is in the same transaction as the writes it guards.** A batch for
//!   a run starts with `Write::Fence`, which touches the run's row only if its lease
//!   is still the writer's `(owner, epoch)`. On PostgreSQL that row lock is held
//!   until the batch commits, so a `ClaimRun` by another replica waits for the
//!   fenced batch and then moves the epoch (re-checking its conditions on the row
//!   as the batch left it); the next fenced batch of the old owner finds the new
//!   epoch and is refused whole. A check made in a separate read before the batch
//!   could be overtaken by a takeover between the two; inside it, it cannot. On
//!   SQLite the single writer makes every batch atomic anyway.
//!
//! Every conditional write answers in its [`Outcome`] (claimed or lost, held or
//! busy, advanced or raced) and commits; only a refused fence fails its batch.

use std::collections::BTreeMap;

use super::connection::{query_all, query_opt, Cols};
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};
use crate::run::lease::{Lease, Replica};

/// What kind of process a replica is: a `serve` process, or a `vectorstep run`
/// process registered for the one run it drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaKind {
    Serve,
    Run,
}

impl crate::domain::Word for ReplicaKind {
    const WHAT: &'static str = "replica kind";
    const ALL: &'static [Self] = &[ReplicaKind::Serve, ReplicaKind::Run];

    fn as_str(self) -> &'static str {
        match self {
            ReplicaKind::Serve => "serve",
            ReplicaKind::Run => "run",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.as_str() == word)
    }
}

/// A row of `replicas`, with the runs it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaRecord {
    pub id: String,
    pub kind: ReplicaKind,
    /// Database clock, unix ms, like every time here.
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub stopped_at: Option<i64>,
    pub host: Option<String>,
    /// The fingerprints of the pipelines it has loaded.
    pub fingerprints: Vec<String>,
    /// Running runs leased to it and not released, oldest first (expired leases
    /// included: whether the replica is live is the caller's call, `Timing::live`).
    pub runs: Vec<String>,
}

impl From<&ReplicaRecord> for Replica {
    fn from(r: &ReplicaRecord) -> Replica {
        Replica {
            id: r.id.clone(),
            heartbeat_at: r.heartbeat_at,
            fingerprints: r.fingerprints.iter().cloned().collect(),
        }
    }
}

/// A run's lease as stored (only for runs that were ever leased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub owner: String,
    pub epoch: u64,
    /// Database clock, unix ms.
    pub expires_at: i64,
    pub released: bool,
    /// Parked: the run waits on a human and nobody holds it.
    pub parked: bool,
}

/// `lease_released`: held (0), released at a step boundary (1), parked while
/// the run waits on a human (2).
const LEASE_RELEASED: i64 = 1;
const LEASE_PARKED: i64 = 2;

impl From<LeaseRecord> for Lease {
    fn from(l: LeaseRecord) -> Lease {
        Lease {
            owner: l.owner,
            epoch: l.epoch,
            expires_at: l.expires_at,
            released: l.released,
            parked: l.parked,
        }
    }
}

/// A running run as the orphan sweep lists it (`Store::running_leases`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLeaseRow {
    pub run_id: String,
    pub pipeline: String,
    pub fingerprint: String,
    /// The `vectorstep run` process that owns it, if one does.
    pub cli_owner: Option<String>,
    pub lease: Option<LeaseRecord>,
}

/// A row of `named_leases`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedLeaseRecord {
    pub name: String,
    pub owner: String,
    pub epoch: u64,
    /// Database clock, unix ms.
    pub expires_at: i64,
}

const RUNS: &str = "pipeline_runs";

impl LeaseRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        let state: i64 = c.get("lease_released")?;
        Ok(LeaseRecord {
            owner: c.get("lease_owner")?,
            epoch: c.get("lease_epoch")?,
            expires_at: c.get("lease_expires_at")?,
            released: state == LEASE_RELEASED,
            parked: state == LEASE_PARKED,
        })
    }
}

/// The lease of every running run, or `None` for one never leased.
fn lease_of(c: &Cols) -> Result<Option<LeaseRecord>, Error> {
    let owner: Option<String> = c.get("lease_owner")?;
    owner.map(|_| LeaseRecord::decode(c)).transpose()
}

/// `Write::Heartbeat`: upserts the replica (`started_at` only when it is new; a
/// stopped replica stays stopped, ids are per process), then renews, in one
/// statement, every lease it holds on a running run that has not expired. An
/// expired lease is not renewed even if nobody took it yet: another replica may be
/// adopting it right now, and the owner must find that out through `ClaimRun` or a
/// refused fence, not paper over it.
pub(super) fn heartbeat(
    db: &impl Db,
    replica: &str,
    kind: ReplicaKind,
    fingerprints_json: &str,
    host: Option<&str>,
    lease_ms: u64,
) -> Result<Outcome, DbError> {
    use crate::domain::Word;
    let now = db.now_ms_sql();
    db.exec(
        &format!(
            "INSERT INTO replicas (id, kind, started_at, heartbeat_at, fingerprints_json, host) \
             VALUES (?1, ?2, {now}, {now}, ?3, ?4) ON CONFLICT (id) DO UPDATE SET \
             kind = excluded.kind, heartbeat_at = excluded.heartbeat_at, \
             fingerprints_json = excluded.fingerprints_json, host = excluded.host"
        ),
        &[&replica, &kind.as_str(), &fingerprints_json, &host],
    )?;
    let renewed = db.exec(
        &format!(
            "UPDATE pipeline_runs SET lease_expires_at = {now} + ?2 WHERE lease_owner = ?1 \
             AND status = 'running' AND lease_released = 0 AND lease_expires_at > {now}"
        ),
        &[&replica, &lease_ms],
    )?;
    Ok(Outcome::Renewed {
        runs: renewed as u64,
    })
}

/// `Write::ClaimRun`: compare-and-set of a running run's lease from
/// `expected_epoch` to `expected_epoch + 1`, owned by `replica` until now +
/// `lease_ms`, allowed when the lease is free (never leased, released, expired) or
/// already `replica`'s, or (`holder_gone`) whatever its expiry.
pub(super) fn claim(
    db: &impl Db,
    run_id: &str,
    replica: &str,
    expected_epoch: u64,
    lease_ms: u64,
    holder_gone: bool,
) -> Result<Outcome, DbError> {
    let now = db.now_ms_sql();
    let epoch = expected_epoch.saturating_add(1);
    let gone = if holder_gone { " OR TRUE" } else { "" };
    let free = format!(
        "id = ?1 AND status = 'running' AND lease_epoch = ?3 \
         AND (lease_owner IS NULL OR lease_released <> 0 OR lease_expires_at <= {now} \
         OR lease_owner = ?2{gone})"
    );
    // On PostgreSQL the row is taken `FOR UPDATE SKIP LOCKED`: a run whose row
    // another transaction holds (its holder's fenced batch, another replica's
    // claim) is skipped, not waited for, and this claim reports it lost; the
    // next sweep looks again. SQLite has one writer, so nothing holds a row.
    let target = if db.is_postgres() {
        format!("id = (SELECT id FROM pipeline_runs WHERE {free} FOR UPDATE SKIP LOCKED)")
    } else {
        free
    };
    let changed = db.exec(
        &format!(
            "UPDATE pipeline_runs SET lease_owner = ?2, lease_epoch = ?4, \
             lease_expires_at = {now} + ?5, lease_released = 0 WHERE {target}"
        ),
        &[&run_id, &replica, &expected_epoch, &epoch, &lease_ms],
    )?;
    if changed > 0 {
        return Ok(Outcome::Claimed { epoch });
    }
    lost(db, run_id)
}

/// Why a claim did not apply: the run is gone or finished (`NotRunning`), or its
/// lease is somebody else's or moved on (`ClaimLost`, with the lease as it is now).
fn lost(db: &impl Db, run_id: &str) -> Result<Outcome, DbError> {
    let current = db.first(
        RUNS,
        "SELECT status, lease_owner, lease_epoch FROM pipeline_runs WHERE id = ?1",
        &[&run_id],
        |c| {
            let status: crate::domain::RunStatus = c.word("status")?;
            Ok((status, c.get("lease_owner")?, c.get("lease_epoch")?))
        },
    )?;
    Ok(match current {
        Some((crate::domain::RunStatus::Running, owner, epoch)) => {
            Outcome::ClaimLost { owner, epoch }
        }
        _ => Outcome::NotRunning,
    })
}

/// `Write::LeaseNewRun` (applied only when the batch's insert won): the new run is
/// leased to its creator under epoch 1, in the commit that creates it.
pub(super) fn lease_new(
    db: &impl Db,
    run_id: &str,
    replica: &str,
    lease_ms: u64,
) -> Result<Outcome, DbError> {
    claim(db, run_id, replica, 0, lease_ms, false)
}

/// `Write::Fence`: locks the run's row if its lease is still `(replica, epoch)`
/// and not released, whatever the run's status (the batch that finishes a run is
/// fenced too); otherwise fails with [`DbError::Fenced`] naming the holder. A run
/// never leased (epoch 0, as every run of a single SQLite node) has no owner to
/// match, so every fence on it is refused: fences belong on leased runs only.
pub(super) fn fence(
    db: &impl Db,
    run_id: &str,
    replica: &str,
    epoch: u64,
) -> Result<Outcome, DbError> {
    // A no-op UPDATE rather than a SELECT: it takes the row lock a takeover needs,
    // and keeps it until this batch commits.
    let held = db.exec(
        "UPDATE pipeline_runs SET lease_epoch = lease_epoch WHERE id = ?1 \
         AND lease_owner = ?2 AND lease_epoch = ?3 AND lease_released = 0",
        &[&run_id, &replica, &epoch],
    )?;
    if held > 0 {
        return Ok(Outcome::Done);
    }
    let now = db
        .first(
            RUNS,
            "SELECT lease_owner, lease_epoch, lease_released FROM pipeline_runs WHERE id = ?1",
            &[&run_id],
            |c| {
                let state: i64 = c.get("lease_released")?;
                Ok((c.get("lease_owner")?, c.get("lease_epoch")?, state != 0))
            },
        )?
        .unwrap_or((None, 0, false));
    Err(DbError::Fenced {
        run_id: run_id.to_string(),
        owner: now.0,
        epoch: now.1,
        released: now.2,
    })
}

/// `Write::FenceNamedLease`: locks the named lease's row if it is still
/// `(owner, epoch)` and unexpired; otherwise fails with
/// [`DbError::NamedLeaseLost`] naming the holder.
pub(super) fn fence_named(
    db: &impl Db,
    name: &str,
    owner: &str,
    epoch: u64,
) -> Result<Outcome, DbError> {
    let now = db.now_ms_sql();
    let held = db.exec(
        &format!(
            "UPDATE named_leases SET epoch = epoch WHERE name = ?1 AND owner = ?2 \
             AND epoch = ?3 AND expires_at > {now}"
        ),
        &[&name, &owner, &epoch],
    )?;
    if held > 0 {
        return Ok(Outcome::Done);
    }
    let current = named(db, name).map_err(|e| DbError::Row(Box::new(e)))?;
    Err(DbError::NamedLeaseLost {
        name: name.to_string(),
        owner: current.map(|l| l.owner),
    })
}

/// `Write::ReleaseLease`: marks the lease released if it is `(replica, epoch)`
/// (again is fine); `NotHeld` otherwise.
pub(super) fn release(
    db: &impl Db,
    run_id: &str,
    replica: &str,
    epoch: u64,
) -> Result<Outcome, DbError> {
    let changed = set_lease_state(db, run_id, replica, epoch, LEASE_RELEASED, "")?;
    if changed {
        notify_work(db)?;
    }
    Ok(held_or_not(changed))
}

/// Sets `lease_released` to `state` if the lease is `(replica, epoch)` and
/// matches `only_if` (an extra condition); whether it did.
fn set_lease_state(
    db: &impl Db,
    run_id: &str,
    replica: &str,
    epoch: u64,
    state: i64,
    only_if: &str,
) -> Result<bool, DbError> {
    let changed = db.exec(
        &format!(
            "UPDATE pipeline_runs SET lease_released = {state} WHERE id = ?1 \
             AND lease_owner = ?2 AND lease_epoch = ?3{only_if}"
        ),
        &[&run_id, &replica, &epoch],
    )?;
    Ok(changed > 0)
}

fn held_or_not(changed: bool) -> Outcome {
    if changed {
        Outcome::Done
    } else {
        Outcome::NotHeld
    }
}

/// On PostgreSQL, tells the other replicas (`LISTEN`ing on the work channel) that
/// runs were freed, when this transaction commits; several notices of one
/// transaction arrive as one.
fn notify_work(db: &impl Db) -> Result<(), DbError> {
    if db.is_postgres() {
        db.exec(
            &format!("SELECT pg_notify('{}', '')", super::postgres::WORK_CHANNEL),
            &[],
        )?;
    }
    Ok(())
}

/// `Write::ParkLease`: parks the lease if it is `(replica, epoch)` and held;
/// `NotHeld` otherwise.
pub(super) fn park(
    db: &impl Db,
    run_id: &str,
    replica: &str,
    epoch: u64,
) -> Result<Outcome, DbError> {
    let changed = set_lease_state(
        db,
        run_id,
        replica,
        epoch,
        LEASE_PARKED,
        " AND lease_released = 0",
    )?;
    Ok(held_or_not(changed))
}

/// `Write::StopReplica`: records when the replica stopped (`Done` even for an
/// unknown id: there is nothing to stop).
pub(super) fn stop(db: &impl Db, replica: &str) -> Result<Outcome, DbError> {
    notify_work(db)?;
    let now = db.now_ms_sql();
    db.exec(
        &format!("UPDATE replicas SET stopped_at = {now} WHERE id = ?1"),
        &[&replica],
    )?;
    Ok(Outcome::Done)
}

/// `Write::AcquireNamedLease`: one upsert takes the lease when it is new or
/// expired (the epoch moves on when the owner changes) or renews it for its owner
/// (same epoch); then the row says who holds it.
pub(super) fn acquire_named(
    db: &impl Db,
    name: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<Outcome, DbError> {
    let now = db.now_ms_sql();
    db.exec(
        &format!(
            "INSERT INTO named_leases (name, owner, epoch, expires_at) VALUES (?1, ?2, 1, {now} + ?3) \
             ON CONFLICT (name) DO UPDATE SET \
             epoch = CASE WHEN named_leases.owner = excluded.owner THEN named_leases.epoch \
             ELSE named_leases.epoch + 1 END, \
             owner = excluded.owner, expires_at = excluded.expires_at \
             WHERE named_leases.owner = excluded.owner OR named_leases.expires_at <= {now}"
        ),
        &[&name, &owner, &lease_ms],
    )?;
    let row = named(db, name).map_err(|e| DbError::Row(Box::new(e)))?;
    Ok(match row {
        Some(l) if l.owner == owner => Outcome::NamedLeaseHeld { epoch: l.epoch },
        Some(l) => Outcome::NamedLeaseBusy {
            owner: l.owner,
            expires_at: l.expires_at,
        },
        // The upsert either inserted or found a row; a row cannot vanish inside it.
        None => Outcome::NotHeld,
    })
}

/// `Write::ReleaseNamedLease`: expires the lease now if `owner` holds it, so the
/// next acquirer takes it at once (under the next epoch); `NotHeld` otherwise.
pub(super) fn release_named(db: &impl Db, name: &str, owner: &str) -> Result<Outcome, DbError> {
    let now = db.now_ms_sql();
    let changed = db.exec(
        &format!(
            "UPDATE named_leases SET expires_at = {now} WHERE name = ?1 AND owner = ?2 \
             AND expires_at > {now}"
        ),
        &[&name, &owner],
    )?;
    Ok(if changed > 0 {
        Outcome::Done
    } else {
        Outcome::NotHeld
    })
}

/// `Write::AdvanceSchedule`: compare-and-set of a schedule's next due tick. With
/// `expected_due_at` `None` it records the first tick if the schedule has none.
pub(super) fn advance_schedule(
    db: &impl Db,
    pipeline: &str,
    expected_due_at: Option<i64>,
    next_due_at: i64,
) -> Result<Outcome, DbError> {
    let changed = match expected_due_at {
        None => db.exec(
            "INSERT INTO schedule_ticks (pipeline_name, next_due_at) VALUES (?1, ?2) \
             ON CONFLICT (pipeline_name) DO NOTHING",
            &[&pipeline, &next_due_at],
        )?,
        Some(expected) => db.exec(
            "UPDATE schedule_ticks SET next_due_at = ?3 WHERE pipeline_name = ?1 \
             AND next_due_at = ?2",
            &[&pipeline, &expected, &next_due_at],
        )?,
    };
    if changed > 0 {
        return Ok(Outcome::ScheduleAdvanced);
    }
    let next_due_at = due(db, pipeline).map_err(|e| DbError::Row(Box::new(e)))?;
    Ok(Outcome::ScheduleRaced { next_due_at })
}

/// The named lease `name`, on either backend.
pub(super) fn named(db: &impl Db, name: &str) -> Result<Option<NamedLeaseRecord>, Error> {
    query_opt(
        db,
        "named_leases",
        "SELECT name, owner, epoch, expires_at FROM named_leases WHERE name = ?1",
        &[&name],
        |c| {
            Ok(NamedLeaseRecord {
                name: c.get("name")?,
                owner: c.get("owner")?,
                epoch: c.get("epoch")?,
                expires_at: c.get("expires_at")?,
            })
        },
    )
}

/// The next due tick of `pipeline`'s schedule, on either backend.
pub(super) fn due(db: &impl Db, pipeline: &str) -> Result<Option<i64>, Error> {
    query_opt(
        db,
        "schedule_ticks",
        "SELECT next_due_at FROM schedule_ticks WHERE pipeline_name = ?1",
        &[&pipeline],
        |c| c.get("next_due_at"),
    )
}

/// Every replica with the runs it holds, by id, on either backend.
pub(super) fn all(db: &impl Db) -> Result<Vec<ReplicaRecord>, Error> {
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let runs: Vec<(String, String)> = query_all(
        db,
        RUNS,
        "SELECT id, lease_owner FROM pipeline_runs WHERE status = 'running' \
         AND lease_owner IS NOT NULL AND lease_released = 0 ORDER BY triggered_at, id",
        &[],
        |c| Ok((c.get("lease_owner")?, c.get("id")?)),
    )?;
    for (owner, id) in runs {
        held.entry(owner).or_default().push(id);
    }
    query_all(
        db,
        "replicas",
        "SELECT id, kind, started_at, heartbeat_at, stopped_at, fingerprints_json, host \
         FROM replicas ORDER BY id",
        &[],
        |c| {
            let id: String = c.get("id")?;
            let json: String = c.get("fingerprints_json")?;
            let fingerprints = serde_json::from_str(&json).map_err(|e| Error::Corrupt {
                table: "replicas",
                column: "fingerprints_json",
                detail: e.to_string(),
            })?;
            Ok(ReplicaRecord {
                runs: held.get(&id).cloned().unwrap_or_default(),
                id,
                kind: c.word("kind")?,
                started_at: c.get("started_at")?,
                heartbeat_at: c.get("heartbeat_at")?,
                stopped_at: c.get("stopped_at")?,
                host: c.get("host")?,
                fingerprints,
            })
        },
    )
}

/// The lease of run `run_id`, on either backend (`None`: no such run, or never
/// leased).
pub(super) fn lease(db: &impl Db, run_id: &str) -> Result<Option<LeaseRecord>, Error> {
    query_opt(
        db,
        RUNS,
        "SELECT lease_owner, lease_epoch, lease_expires_at, lease_released FROM pipeline_runs \
         WHERE id = ?1 AND lease_owner IS NOT NULL",
        &[&run_id],
        LeaseRecord::decode,
    )
}

/// The database's clock, unix ms, on either backend.
pub(super) fn now_ms(db: &impl Db) -> Result<i64, Error> {
    let now: Option<i64> = query_opt(
        db,
        "replicas",
        &format!("SELECT {} AS now", db.now_ms_sql()),
        &[],
        |c| c.get("now"),
    )?;
    now.ok_or_else(|| Error::Corrupt {
        table: "replicas",
        column: "now",
        detail: "the clock query returned no row".into(),
    })
}

impl Store {
    /// Every replica that ever heartbeat on this store, by id, with the running
    /// runs each holds.
    pub fn replicas(&self) -> Result<Vec<ReplicaRecord>, Error> {
        self.read(|db| all(db))
    }

    /// The lease of a run, if it was ever leased.
    pub fn lease(&self, run_id: &str) -> Result<Option<LeaseRecord>, Error> {
        self.read(|conn| lease(conn, run_id))
    }

    pub fn named_lease(&self, name: &str) -> Result<Option<NamedLeaseRecord>, Error> {
        self.read(|conn| named(conn, name))
    }

    /// The parked runs (`Write::ParkLease`) with something to act on at `now`
    /// (unix ms, the engine's clock like the deadlines): no approval of theirs is
    /// still pending before its deadline, so one was decided or timed out. Each
    /// with the epoch its claim expects.
    pub fn parked_due(&self, now: i64) -> Result<Vec<(String, u64)>, Error> {
        self.read(|conn| {
            query_all(
                conn,
                RUNS,
                "SELECT r.id, r.lease_epoch FROM pipeline_runs r WHERE r.status = 'running' \
                 AND r.lease_released = 2 AND NOT EXISTS (SELECT 1 FROM pending_approvals a \
                 WHERE a.run_id = r.id AND a.status = 'pending' AND a.deadline_at > ?1) \
                 ORDER BY r.triggered_at, r.id",
                &[&now],
                |c| Ok((c.get("id")?, c.get("lease_epoch")?)),
            )
        })
    }

    /// The next due tick recorded for `pipeline`'s schedule.
    pub fn schedule_due(&self, pipeline: &str) -> Result<Option<i64>, Error> {
        self.read(|conn| due(conn, pipeline))
    }

    /// Every running run as the orphan sweep sees it, oldest first: enough to
    /// decide who drives it, not the whole record (which is read only for the runs
    /// claimed).
    pub fn running_leases(&self) -> Result<Vec<RunLeaseRow>, Error> {
        self.read(|conn| {
            query_all(
                conn,
                RUNS,
                "SELECT id, pipeline_name, config_fingerprint, owner, lease_owner, lease_epoch, \
                 lease_expires_at, lease_released FROM pipeline_runs WHERE status = 'running' \
                 ORDER BY triggered_at, id",
                &[],
                |c| {
                    Ok(RunLeaseRow {
                        run_id: c.get("id")?,
                        pipeline: c.get("pipeline_name")?,
                        fingerprint: c.get("config_fingerprint")?,
                        cli_owner: c.get("owner")?,
                        lease: lease_of(c)?,
                    })
                },
            )
        })
    }

    /// Whether replica `replica`'s database session has ended (its liveness lock,
    /// `store::lock_replica`, is free): it was killed or lost its connection, so
    /// its leases may be taken before they expire. A probe that takes the lock
    /// only for its own statement. Always `false` on SQLite (one process).
    pub fn replica_gone(&self, replica: &str) -> Result<bool, Error> {
        let key = super::postgres::replica_lock_key(replica);
        self.read(|reader| match reader {
            super::Reader::Lite(_) => Ok(false),
            super::Reader::Pg(conn) => {
                let rows = conn
                    .query_raw("SELECT pg_try_advisory_xact_lock($1)", &[&key])
                    .map_err(super::postgres::PgError::from)?;
                Ok(rows.first().map(|r| r.get::<_, bool>(0)).unwrap_or(false))
            }
        })
    }

    /// The database's clock (unix ms): the clock every lease time is on.
    pub fn db_now_ms(&self) -> Result<i64, Error> {
        self.read(|db| now_ms(db))
    }
}
