//! The leases of several replicas (SPEC 11, `store::replicas`) on both backends:
//! every lease write applied to SQLite (the store) and to a real, throwaway
//! PostgreSQL in the same sequence gives the same outcomes, refuses the same
//! batches whole and leaves the same rows; lease times are the database's clock
//! plus the lease; and on PostgreSQL a takeover and a fenced batch of the old
//! owner cannot interleave.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::postgres::{postgres_client, Postgres};
use vectorstep::domain::{RunStatus, StepKind, StepStatus};
use vectorstep::store::{
    Error, EventRecord, LeaseRecord, Outcome, ReplicaKind, RunRecord, StepRecord, Store, Write,
};

const T0: i64 = 1_764_633_600_000;
const MINUTE: u64 = 60_000;

/// Every batch reaches PostgreSQL through here, so the way it does can be
/// switched in one place.
fn pg_apply(store: &Store, writes: &[Write]) -> Result<Vec<Outcome>, Error> {
    store.commit_blocking(writes.to_vec())
}

/// A PostgreSQL store whose connections carry `name` (seen in
/// `pg_stat_activity`).
fn named_store(url: &str, name: &str) -> Store {
    Store::open_postgres(&format!("{url}?application_name={name}"), 1).expect("PostgreSQL store")
}

fn run(id: &str, fingerprint: Option<&str>, at: i64) -> RunRecord {
    RunRecord {
        id: id.into(),
        pipeline_name: "p".into(),
        status: RunStatus::Running,
        source: "alertmanager".into(),
        team: None,
        stage: "production".into(),
        triggered_at: at,
        completed_at: None,
        resumed_at: None,
        resume_count: 0,
        config_fingerprint: "f1".into(),
        parent_run_id: None,
        parent_step_path: None,
        dedup_fingerprint: fingerprint.map(str::to_string),
        context_json: "{}".into(),
        payload_json: "{}".into(),
        tokens_used: 0,
        cost_usd: 0.0,
        terminal_step: None,
        reason: None,
        final_output_json: None,
        replay_of: None,
    }
}

fn step(run_id: &str, path: &str, status: StepStatus) -> StepRecord {
    StepRecord {
        run_id: run_id.into(),
        step_path: path.into(),
        step_index: 0,
        kind: StepKind::Step,
        executor: "mock".into(),
        agent: None,
        status,
        attempts: 1,
        iteration: 1,
        idempotency_key: format!("{run_id}:{path}:1"),
        started_at: T0,
        finished_at: None,
        duration_ms: None,
        primary_confidence: None,
        effective_confidence: None,
        output_json: None,
        error: None,
        input_tokens: 0,
        output_tokens: 0,
        cost_usd: None,
        items_json: None,
    }
}

fn event(run_id: &str, name: &str) -> Write {
    Write::AppendEvent(EventRecord {
        id: 0,
        run_id: run_id.into(),
        ts: T0,
        level: "INFO".into(),
        event: name.into(),
        msg: "m".into(),
        fields_json: "{}".into(),
    })
}

fn lease_new(run_id: &str, replica: &str, lease_ms: u64) -> Write {
    Write::LeaseNewRun {
        run_id: run_id.into(),
        replica: replica.into(),
        lease_ms,
    }
}

fn claim(run_id: &str, replica: &str, expected_epoch: u64, lease_ms: u64) -> Write {
    Write::ClaimRun {
        run_id: run_id.into(),
        replica: replica.into(),
        expected_epoch,
        lease_ms,
        holder_gone: false,
    }
}

/// A claim by a replica that has seen the holder's session end.
fn take_over(run_id: &str, replica: &str, expected_epoch: u64, lease_ms: u64) -> Write {
    Write::ClaimRun {
        run_id: run_id.into(),
        replica: replica.into(),
        expected_epoch,
        lease_ms,
        holder_gone: true,
    }
}

fn fence(run_id: &str, replica: &str, epoch: u64) -> Write {
    Write::Fence {
        run_id: run_id.into(),
        replica: replica.into(),
        epoch,
    }
}

fn release(run_id: &str, replica: &str, epoch: u64) -> Write {
    Write::ReleaseLease {
        run_id: run_id.into(),
        replica: replica.into(),
        epoch,
    }
}

fn heartbeat(replica: &str, fingerprints: &[&str]) -> Write {
    Write::Heartbeat {
        replica: replica.into(),
        kind: ReplicaKind::Serve,
        fingerprints_json: serde_json::to_string(fingerprints).expect("json"),
        host: Some("host-1".into()),
        lease_ms: MINUTE,
    }
}

fn finish(run_id: &str) -> Write {
    Write::FinishRun {
        run_id: run_id.into(),
        status: RunStatus::Completed,
        completed_at: T0 + 10,
        terminal_step: None,
        reason: None,
        final_output_json: None,
    }
}

fn acquire(name: &str, owner: &str, lease_ms: u64) -> Write {
    Write::AcquireNamedLease {
        name: name.into(),
        owner: owner.into(),
        lease_ms,
    }
}

fn release_named(name: &str, owner: &str) -> Write {
    Write::ReleaseNamedLease {
        name: name.into(),
        owner: owner.into(),
    }
}

fn advance(pipeline: &str, expected_due_at: Option<i64>, next_due_at: i64) -> Write {
    Write::AdvanceSchedule {
        pipeline: pipeline.into(),
        expected_due_at,
        next_due_at,
    }
}

/// The database clock of PostgreSQL, read directly.
fn pg_now(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        &[],
    )
    .expect("clock")
    .get(0)
}

fn pg_lease(c: &mut postgres::Client, run_id: &str) -> Option<LeaseRecord> {
    c.query_opt(
        "SELECT lease_owner, lease_epoch, lease_expires_at, lease_released FROM pipeline_runs \
         WHERE id = $1 AND lease_owner IS NOT NULL",
        &[&run_id],
    )
    .expect("lease")
    .map(|r| LeaseRecord {
        owner: r.get(0),
        epoch: r.get::<_, i64>(1) as u64,
        expires_at: r.get(2),
        released: r.get::<_, i64>(3) == 1,
        parked: r.get::<_, i64>(3) == 2,
    })
}

/// What a batch came to, comparable across backends: the outcomes (a busy named
/// lease's expiry, a time of the database's own clock, checked against the clock
/// and then left out), or which write failed and how. A refused fence is never
/// retriable and names who holds the run.
fn answer(result: Result<Vec<Outcome>, Error>, clock: (i64, i64)) -> Result<Vec<Outcome>, String> {
    match result {
        Ok(outcomes) => Ok(outcomes
            .into_iter()
            .map(|o| match o {
                Outcome::NamedLeaseBusy { owner, expires_at } => {
                    assert!(
                        expires_at > clock.0 && expires_at <= clock.1 + MINUTE as i64,
                        "busy until {expires_at}, the clock read {clock:?}"
                    );
                    Outcome::NamedLeaseBusy {
                        owner,
                        expires_at: 0,
                    }
                }
                o => o,
            })
            .collect()),
        Err(e) => {
            let text = e.to_string();
            assert!(!e.is_retriable(), "{text}");
            Err(match e {
                Error::Fenced {
                    run_id,
                    owner,
                    epoch,
                    released,
                } => {
                    if let Some(o) = &owner {
                        assert!(text.contains(o.as_str()), "{text}");
                    }
                    format!("fenced {run_id}: {owner:?} epoch {epoch} released {released}")
                }
                Error::Write { index, write, .. } => format!("write #{index} {write}"),
                other => format!("other: {other}"),
            })
        }
    }
}

/// Both backends, fed the same batches.
struct Both {
    dir: PathBuf,
    path: PathBuf,
    store: Store,
    /// Raw SQL on PostgreSQL (its rows, its clock).
    pg: postgres::Client,
    /// The store on PostgreSQL, as the engine uses it: every batch goes through it.
    pg_store: Store,
    /// The clock of each backend (SQLite, PostgreSQL) just before and just after
    /// the last batch.
    clocks: [(i64, i64); 2],
}

impl Both {
    fn new() -> Both {
        let dir = std::env::temp_dir().join(format!("vs-leases-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("vs.db");
        let store = Store::open(&path).expect("SQLite store");
        let url = Postgres::shared().database();
        let pg_store = Store::open_postgres(&url, 2).expect("PostgreSQL store");
        let pg = postgres_client(&url).expect("connect");
        Both {
            dir,
            path,
            store,
            pg,
            pg_store,
            clocks: [(0, 0); 2],
        }
    }

    fn apply(&mut self, batch: Vec<Write>) -> Result<Vec<Outcome>, String> {
        let before = self.store.db_now_ms().expect("clock");
        let lite = self.store.commit_blocking(batch.clone());
        let lite_clock = (before, self.store.db_now_ms().expect("clock"));
        let before = pg_now(&mut self.pg);
        let post = pg_apply(&self.pg_store, &batch);
        let pg_clock = (before, pg_now(&mut self.pg));
        self.clocks = [lite_clock, pg_clock];
        let lite = answer(lite, lite_clock);
        let post = answer(post, pg_clock);
        assert_eq!(post, lite, "{batch:?}");
        lite
    }

    fn expect(&mut self, batch: Vec<Write>, want: Result<Vec<Outcome>, &str>) {
        let got = self.apply(batch.clone());
        assert_eq!(got, want.map_err(str::to_string), "{batch:?}");
    }

    /// The run's lease on both backends is `(owner, epoch, released)`, and it
    /// expires `lease_ms` after the database clock during the last batch.
    fn assert_lease(&mut self, run_id: &str, owner: &str, epoch: u64, lease_ms: u64) {
        let leases = [
            self.store.lease(run_id).expect("lease"),
            pg_lease(&mut self.pg, run_id),
        ];
        for (lease, (before, after)) in leases.into_iter().zip(self.clocks) {
            let l = lease.unwrap_or_else(|| panic!("{run_id} is leased"));
            assert_eq!(
                (l.owner.as_str(), l.epoch, l.released),
                (owner, epoch, false)
            );
            let lease_ms = lease_ms as i64;
            assert!(
                before + lease_ms <= l.expires_at && l.expires_at <= after + lease_ms,
                "{run_id} expires at {}, the clock read {before}..{after}",
                l.expires_at
            );
        }
    }

    /// The run's lease has expired on both backends.
    fn assert_expired(&mut self, run_id: &str) {
        let lite_now = self.store.db_now_ms().expect("clock");
        let pg_now = pg_now(&mut self.pg);
        let lite = self.store.lease(run_id).expect("lease").expect("leased");
        let post = pg_lease(&mut self.pg, run_id).expect("leased");
        assert!(lite.expires_at <= lite_now, "{lite:?}");
        assert!(post.expires_at <= pg_now, "{post:?}");
    }

    /// Every row of the lease tables is the same on both backends; the columns
    /// holding the database's clock only say whether they are set.
    fn compare_rows(&mut self) {
        let conn = rusqlite::Connection::open(&self.path).expect("open");
        for (table, order) in TABLES {
            let lite = sqlite_rows(&conn, table, order);
            let post = postgres_rows(&mut self.pg, table, order);
            assert_eq!(post, lite, "rows of {table}");
            assert!(!lite.is_empty(), "{table} is empty");
        }
    }
}

impl Drop for Both {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const TABLES: [(&str, &str); 6] = [
    ("pipeline_runs", "id"),
    ("pipeline_steps", "run_id, step_path"),
    ("run_events", "id"),
    ("replicas", "id"),
    ("named_leases", "name"),
    ("schedule_ticks", "pipeline_name"),
];

/// Columns holding the database's clock: the backends' clocks differ by the time
/// between applying the same batch on one and on the other.
fn clock_column(table: &str, column: &str) -> bool {
    matches!(
        (table, column),
        ("pipeline_runs", "lease_expires_at")
            | ("replicas", "started_at" | "heartbeat_at" | "stopped_at")
            | ("named_leases", "expires_at")
    )
}

fn cell(table: &str, column: &str, value: Option<String>) -> String {
    match value {
        None => "∅".into(),
        Some(_) if clock_column(table, column) => "clock".into(),
        Some(v) => v,
    }
}

fn sqlite_rows(conn: &rusqlite::Connection, table: &str, order: &str) -> Vec<Vec<String>> {
    use rusqlite::types::ValueRef;
    let mut stmt = conn
        .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
        .expect("select");
    let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    let rows = stmt
        .query_map([], |r| {
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let v = match r.get_ref(i)? {
                        ValueRef::Null => None,
                        ValueRef::Integer(v) => Some(v.to_string()),
                        ValueRef::Real(v) => Some(v.to_string()),
                        ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into()),
                        ValueRef::Blob(_) => Some("blob".into()),
                    };
                    Ok(cell(table, name, v))
                })
                .collect()
        })
        .expect("rows");
    rows.collect::<Result<_, _>>().expect("rows")
}

fn postgres_rows(c: &mut postgres::Client, table: &str, order: &str) -> Vec<Vec<String>> {
    use postgres::types::Type;
    let rows = c
        .query(&format!("SELECT * FROM {table} ORDER BY {order}"), &[])
        .expect("select");
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    let col = &r.columns()[i];
                    let v = if *col.type_() == Type::INT8 {
                        r.get::<_, Option<i64>>(i).map(|v| v.to_string())
                    } else if *col.type_() == Type::FLOAT8 {
                        r.get::<_, Option<f64>>(i).map(|v| v.to_string())
                    } else {
                        r.get::<_, Option<String>>(i)
                    };
                    cell(table, col.name(), v)
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_lease_write_has_the_same_outcome_and_leaves_the_same_rows_on_both_backends() {
    use Outcome::*;
    let mut b = Both::new();
    let (a, bee) = ("replica-a", "replica-b");

    // A run its replica creates is leased to it from its first commit; a
    // deduplicated insert leases nothing.
    b.expect(
        vec![
            Write::InsertRun(run("r1", Some("fp"), T0)),
            lease_new("r1", a, MINUTE),
            Write::UpsertStepIfInserted(step("r1", "s", StepStatus::Running)),
        ],
        Ok(vec![RunInserted, Claimed { epoch: 1 }, Done]),
    );
    b.assert_lease("r1", a, 1, MINUTE);
    b.expect(
        vec![
            Write::InsertRun(run("r2", Some("fp"), T0 + 1)),
            lease_new("r2", a, MINUTE),
        ],
        Ok(vec![
            DuplicateRunning {
                existing_run_id: "r1".into(),
            },
            Done,
        ]),
    );
    b.expect(
        vec![Write::InsertRun(run("r3", None, T0 + 2))],
        Ok(vec![RunInserted]),
    );
    b.expect(
        vec![
            Write::InsertRun(run("r4", None, T0 + 3)),
            lease_new("r4", a, MINUTE),
        ],
        Ok(vec![RunInserted, Claimed { epoch: 1 }]),
    );
    b.expect(
        vec![
            Write::InsertRun(run("r5", None, T0 + 4)),
            lease_new("r5", bee, MINUTE),
        ],
        Ok(vec![RunInserted, Claimed { epoch: 1 }]),
    );

    // A run never leased (a single node's) refuses every fence, the batch whole.
    b.expect(
        vec![
            fence("r3", a, 0),
            Write::UpsertStep(step("r3", "s", StepStatus::Running)),
        ],
        Err("fenced r3: None epoch 0 released false"),
    );

    // Another replica's live lease cannot be claimed, nor an epoch that moved on.
    let lost_to_a = ClaimLost {
        owner: Some(a.into()),
        epoch: 1,
    };
    b.expect(
        vec![claim("r1", bee, 1, MINUTE)],
        Ok(vec![lost_to_a.clone()]),
    );
    b.expect(vec![claim("r1", bee, 0, MINUTE)], Ok(vec![lost_to_a]));
    b.expect(
        vec![claim("r3", bee, 1, MINUTE)],
        Ok(vec![ClaimLost {
            owner: None,
            epoch: 0,
        }]),
    );
    b.expect(vec![claim("nope", bee, 0, MINUTE)], Ok(vec![NotRunning]));
    // A holder seen gone loses even an unexpired lease, but only at its epoch.
    b.expect(
        vec![take_over("r1", bee, 0, MINUTE)],
        Ok(vec![ClaimLost {
            owner: Some(a.into()),
            epoch: 1,
        }]),
    );

    // The holder's fenced batch applies.
    b.expect(
        vec![
            fence("r1", a, 1),
            Write::UpsertStep(step("r1", "s", StepStatus::Completed)),
            event("r1", "step_completed"),
        ],
        Ok(vec![Done, Done, Done]),
    );

    // a's lease on r1 runs out (re-claimed for 0 ms): its heartbeat renews r4, not
    // the expired r1 (someone may be adopting it) nor b's r5.
    b.expect(vec![claim("r1", a, 1, 0)], Ok(vec![Claimed { epoch: 2 }]));
    b.expect(vec![heartbeat(a, &["f1"])], Ok(vec![Renewed { runs: 1 }]));
    b.assert_lease("r4", a, 1, MINUTE);
    b.assert_expired("r1");

    // b adopts it; a's next batch for it is refused whole, naming b.
    b.expect(
        vec![claim("r1", bee, 2, MINUTE)],
        Ok(vec![Claimed { epoch: 3 }]),
    );
    b.assert_lease("r1", bee, 3, MINUTE);
    b.expect(
        vec![
            fence("r1", a, 2),
            Write::UpsertStep(step("r1", "t", StepStatus::Running)),
            finish("r1"),
        ],
        Err("fenced r1: Some(\"replica-b\") epoch 3 released false"),
    );
    let r1 = b.store.run("r1").expect("read").expect("r1");
    assert_eq!(
        r1.status,
        RunStatus::Running,
        "nothing of the batch applied"
    );
    assert_eq!(b.store.steps("r1").expect("steps").len(), 1);

    // b finishes it, fenced; a finished run still accepts its holder's fence, and
    // cannot be claimed.
    b.expect(
        vec![fence("r1", bee, 3), finish("r1")],
        Ok(vec![Done, Done]),
    );
    b.expect(
        vec![fence("r1", bee, 3), event("r1", "run_completed")],
        Ok(vec![Done, Done]),
    );
    b.expect(vec![claim("r1", a, 3, MINUTE)], Ok(vec![NotRunning]));

    // SIGTERM handoff of r4: released (again is fine, by another is not), no longer
    // renewed nor accepting a's fence, and taken by b at once though unexpired.
    b.expect(
        vec![
            release("r4", bee, 1),
            release("r4", a, 1),
            release("r4", a, 1),
        ],
        Ok(vec![NotHeld, Done, Done]),
    );
    b.expect(
        vec![fence("r4", a, 1), event("r4", "step_started")],
        Err("fenced r4: Some(\"replica-a\") epoch 1 released true"),
    );
    b.expect(vec![heartbeat(a, &["f1"])], Ok(vec![Renewed { runs: 0 }]));
    b.expect(
        vec![claim("r4", bee, 1, MINUTE)],
        Ok(vec![Claimed { epoch: 2 }]),
    );
    b.expect(
        vec![heartbeat(bee, &["f1", "f2"])],
        Ok(vec![Renewed { runs: 2 }]),
    );
    b.assert_lease("r5", bee, 1, MINUTE);
    b.expect(
        vec![Write::StopReplica { replica: a.into() }],
        Ok(vec![Done]),
    );
    // a, having seen b's session end, takes b's unexpired r5 under the next epoch;
    // b's next batch for it is refused.
    b.expect(
        vec![claim("r5", a, 1, MINUTE)],
        Ok(vec![ClaimLost {
            owner: Some(bee.into()),
            epoch: 1,
        }]),
    );
    b.expect(
        vec![take_over("r5", a, 1, MINUTE)],
        Ok(vec![Claimed { epoch: 2 }]),
    );
    b.expect(
        vec![fence("r5", bee, 1), event("r5", "step_started")],
        Err("fenced r5: Some(\"replica-a\") epoch 2 released false"),
    );

    // One Telegram poller: busy while held, renewed by its owner under the same
    // epoch, taken under the next once expired or released.
    b.expect(
        vec![acquire("telegram", a, MINUTE)],
        Ok(vec![NamedLeaseHeld { epoch: 1 }]),
    );
    b.expect(
        vec![acquire("telegram", bee, MINUTE)],
        Ok(vec![NamedLeaseBusy {
            owner: a.into(),
            expires_at: 0,
        }]),
    );
    b.expect(
        vec![acquire("telegram", a, MINUTE), acquire("telegram", a, 0)],
        Ok(vec![
            NamedLeaseHeld { epoch: 1 },
            NamedLeaseHeld { epoch: 1 },
        ]),
    );
    b.expect(
        vec![
            acquire("telegram", bee, MINUTE),
            release_named("telegram", a),
        ],
        Ok(vec![NamedLeaseHeld { epoch: 2 }, NotHeld]),
    );
    b.expect(
        vec![
            release_named("telegram", bee),
            acquire("telegram", a, MINUTE),
        ],
        Ok(vec![Done, NamedLeaseHeld { epoch: 3 }]),
    );

    // A cron tick fires once: the second compare-and-set of the same tick races.
    b.expect(
        vec![advance("p", None, T0), advance("p", None, T0 + 1)],
        Ok(vec![
            ScheduleAdvanced,
            ScheduleRaced {
                next_due_at: Some(T0),
            },
        ]),
    );
    let next = T0 + MINUTE as i64;
    b.expect(
        vec![advance("p", Some(T0), next), advance("p", Some(T0), next)],
        Ok(vec![
            ScheduleAdvanced,
            ScheduleRaced {
                next_due_at: Some(next),
            },
        ]),
    );
    b.expect(
        vec![advance("q", Some(1), 2)],
        Ok(vec![ScheduleRaced { next_due_at: None }]),
    );
    // A tick's run commits after its advance, in one batch: raced, the batch
    // writes nothing more (the run `tick-raced` is not inserted; `tick-won` is).
    b.expect(
        vec![
            advance("p", Some(T0), next + MINUTE as i64),
            Write::InsertRun(run("tick-raced", None, T0)),
            event("tick-raced", "run_started"),
        ],
        Ok(vec![
            ScheduleRaced {
                next_due_at: Some(next),
            },
            Done,
            Done,
        ]),
    );
    b.expect(
        vec![
            advance("p", Some(next), next + MINUTE as i64),
            Write::InsertRun(run("tick-won", None, T0)),
        ],
        Ok(vec![ScheduleAdvanced, RunInserted]),
    );

    b.compare_rows();

    // What the store reads back.
    let replicas = b.store.replicas().expect("replicas");
    let view: Vec<_> = replicas
        .iter()
        .map(|r| {
            (
                r.id.as_str(),
                r.kind,
                r.fingerprints.clone(),
                r.runs.clone(),
                r.stopped_at.is_some(),
                r.host.as_deref(),
            )
        })
        .collect();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        view,
        [
            (
                a,
                ReplicaKind::Serve,
                strings(&["f1"]),
                strings(&["r5"]),
                true,
                Some("host-1")
            ),
            (
                bee,
                ReplicaKind::Serve,
                strings(&["f1", "f2"]),
                strings(&["r4"]),
                false,
                Some("host-1")
            ),
        ]
    );
    for r in &replicas {
        assert!(r.started_at <= r.heartbeat_at, "{r:?}");
    }
    let running: Vec<_> = b
        .store
        .running_leases()
        .expect("running")
        .into_iter()
        .map(|row| {
            (
                row.run_id,
                row.lease.map(|l| (l.owner, l.epoch, l.released)),
            )
        })
        .collect();
    assert_eq!(
        running,
        [
            // The tick's run, inserted with its advance.
            ("tick-won".to_string(), None),
            ("r3".to_string(), None),
            ("r4".to_string(), Some((bee.to_string(), 2, false))),
            ("r5".to_string(), Some((a.to_string(), 2, false))),
        ]
    );
    let telegram = b
        .store
        .named_lease("telegram")
        .expect("read")
        .expect("held");
    assert_eq!((telegram.owner.as_str(), telegram.epoch), (a, 3));
    assert_eq!(
        b.store.schedule_due("p").expect("due"),
        Some(next + MINUTE as i64),
        "advanced by the tick that won with its run"
    );
    assert_eq!(b.store.schedule_due("q").expect("due"), None);
}

/// Waits until the backend of client `name` is waiting for a lock (another
/// transaction's row), and fails after ten seconds.
fn wait_for_lock(c: &mut postgres::Client, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = c
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND wait_event_type = 'Lock'",
                &[&name],
            )
            .expect("activity")
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never waited for a lock");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Holds the `kv` row `key` in an open transaction of its own client, so that a
/// batch writing that key stops there, midway, with its earlier writes' locks held.
fn gate(url: &str, key: &str) -> postgres::Client {
    let mut c = postgres_client(url).expect("connect");
    c.batch_execute(&format!(
        "BEGIN; UPDATE kv SET value = 'held' WHERE key = '{key}'"
    ))
    .expect("hold the gate");
    c
}

fn fenced(result: Result<Vec<Outcome>, Error>) -> (Option<String>, u64) {
    match result {
        Err(Error::Fenced { owner, epoch, .. }) => (owner, epoch),
        other => panic!("expected a refused fence, got {other:?}"),
    }
}

#[test]
fn on_postgres_a_takeover_and_a_fenced_batch_never_interleave() {
    let url = Postgres::shared().database();
    let setup_store = Store::open_postgres(&url, 2).expect("PostgreSQL store");
    let mut setup = postgres_client(&url).expect("connect");
    let set = |key: &str, value: &str| Write::SetKv {
        key: key.into(),
        value: value.into(),
    };
    // Both runs' leases expire at once, so another replica may claim them as soon
    // as nothing holds their rows.
    let created = pg_apply(
        &setup_store,
        &[
            Write::InsertRun(run("x", None, T0)),
            lease_new("x", "a", 0),
            Write::InsertRun(run("y", None, T0 + 1)),
            Write::LeaseNewRun {
                run_id: "y".into(),
                replica: "a".into(),
                lease_ms: 0,
            },
            set("gate-a", "-"),
            set("gate-b", "-"),
        ],
    )
    .expect("set up");
    assert_eq!(created[1], Outcome::Claimed { epoch: 1 });

    // a's fenced batch for x stops midway, holding x's row: b's claim skips the
    // locked row (`FOR UPDATE SKIP LOCKED`) rather than waiting, and reports it
    // lost; once the batch committed, having moved nothing, b's next claim wins.
    let mut gate_a = gate(&url, "gate-a");
    let a = {
        let url = url.clone();
        let batch = vec![fence("x", "a", 1), set("gate-a", "a"), event("x", "step")];
        std::thread::spawn(move || pg_apply(&named_store(&url, "vs-a"), &batch))
    };
    wait_for_lock(&mut setup, "vs-a");
    let b_store = named_store(&url, "vs-b");
    let skipped = pg_apply(&b_store, &[claim("x", "b", 1, MINUTE)]).expect("b's claim");
    assert_eq!(
        skipped,
        [Outcome::ClaimLost {
            owner: Some("a".into()),
            epoch: 1
        }],
        "the claim skips the row the fenced batch holds"
    );
    assert!(!a.is_finished(), "a's batch is still open");
    gate_a.batch_execute("COMMIT").expect("open the gate");
    let a = a.join().expect("thread a").expect("a's batch");
    assert_eq!(a, [Outcome::Done, Outcome::Done, Outcome::Done]);
    let b = pg_apply(&b_store, &[claim("x", "b", 1, MINUTE)]).expect("b's claim");
    assert_eq!(b, [Outcome::Claimed { epoch: 2 }]);
    // a's next batch is refused whole.
    let refused = pg_apply(&setup_store, &[fence("x", "a", 1), event("x", "late")]);
    assert_eq!(fenced(refused), (Some("b".into()), 2));

    // The other order: b's claim of y stops midway, holding y's row; a's fenced
    // batch waits for it and, once it committed, finds the new epoch and is refused.
    let mut gate_b = gate(&url, "gate-b");
    let b = {
        let url = url.clone();
        let batch = vec![claim("y", "b", 1, MINUTE), set("gate-b", "b")];
        std::thread::spawn(move || pg_apply(&named_store(&url, "vs-b2"), &batch))
    };
    wait_for_lock(&mut setup, "vs-b2");
    let a = {
        let url = url.clone();
        std::thread::spawn(move || {
            pg_apply(
                &named_store(&url, "vs-a2"),
                &[fence("y", "a", 1), event("y", "step")],
            )
        })
    };
    wait_for_lock(&mut setup, "vs-a2");
    assert!(!a.is_finished(), "the fence waits for the claim");
    gate_b.batch_execute("COMMIT").expect("open the gate");
    let b = b.join().expect("thread b").expect("b's claim");
    assert_eq!(b, [Outcome::Claimed { epoch: 2 }, Outcome::Done]);
    assert_eq!(fenced(a.join().expect("thread a")), (Some("b".into()), 2));

    // Exactly the accepted batches landed.
    let events: Vec<(String, String)> = setup
        .query("SELECT run_id, event FROM run_events ORDER BY id", &[])
        .expect("events")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(events, [("x".to_string(), "step".to_string())]);
}
