//! Harness for the service tests: [`Intake`] starts `vectorstep serve` (through the
//! crash-test harness) on a scratch folder with a config and pipelines of the test's
//! choosing, and talks to it over HTTP; payload and pipeline builders; the hostile
//! body generator; a small Prometheus text-format parser.

// Each test uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::service::{Scratch, Service};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

pub const FIRING_CRITICAL: &str =
    include_str!("../../samples/alerts/alertmanager-firing-critical.json");
pub const FIRING_WARNING: &str =
    include_str!("../../samples/alerts/alertmanager-firing-warning.json");
pub const RESOLVED: &str = include_str!("../../samples/alerts/alertmanager-resolved.json");
pub const GROUPED: &str = include_str!("../../samples/alerts/alertmanager-grouped.json");
pub const GENERIC_RUN: &str = include_str!("../../samples/alerts/generic-run.json");
pub const GENERIC_ESCALATION: &str =
    include_str!("../../samples/alerts/generic-incident-escalation.json");

pub const SAMPLES: &[&str] = &[
    FIRING_CRITICAL,
    FIRING_WARNING,
    RESOLVED,
    GROUPED,
    GENERIC_RUN,
    GENERIC_ESCALATION,
];

pub const WAIT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------
// The service under test.
// ---------------------------------------------------------------------------

/// One `vectorstep serve` on its own scratch folder. `svc` is declared first so the
/// process is gone before the folder is removed.
pub struct Intake {
    pub svc: Service,
    _scratch: Scratch,
    pub http: reqwest::Client,
    /// Sent on `get` (runs, metrics) when the service has auth configured.
    pub bearer: Option<String>,
}

/// What the service answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub text: String,
    pub json: Value,
}

impl Answer {
    /// Asserts a 4xx with SPEC's error shape `{"error": "...", "detail": ...}`.
    pub fn assert_error(&self, status: u16) -> &Answer {
        assert_eq!(self.status, status, "{self:?}");
        assert!(
            self.json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "error body without a non-empty `error`: {self:?}"
        );
        assert!(
            self.json.get("detail").is_some(),
            "error body without `detail`: {self:?}"
        );
        self
    }

    pub fn assert_status(&self, http: u16, status: &str) -> &Answer {
        assert_eq!(self.status, http, "{self:?}");
        assert_eq!(self.json["status"], status, "{self:?}");
        self
    }

    pub fn run_id(&self) -> String {
        self.json["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no run_id in {self:?}"))
            .to_string()
    }
}

impl Intake {
    /// Writes `config.yaml` (server on port 0 plus `server_extra`, then the
    /// top-level keys in `extra`) and `pipelines/<file>.yaml` for each entry, and
    /// starts the service.
    pub async fn start(server_extra: &str, extra: &str, pipelines: &[(&str, String)]) -> Intake {
        Intake::start_logging("warn", server_extra, extra, pipelines).await
    }

    /// [`Intake::start`] with the service logging at `level` ([`Intake::log`]).
    pub async fn start_logging(
        level: &str,
        server_extra: &str,
        extra: &str,
        pipelines: &[(&str, String)],
    ) -> Intake {
        let scratch = Scratch::new();
        let root = &scratch.root;
        let text = format!(
            "server: {{host: 127.0.0.1, port: 0{server_extra}}}\n\
             pipeline_config_dir: {pipelines:?}\n\
             step_library_dir: {steps:?}\n\
             {db}\n\
             logging: {{level: {level}}}\n\
             {extra}\n",
            pipelines = root.join("pipelines").display().to_string(),
            steps = root.join("steps").display().to_string(),
            db = scratch.database.yaml(),
        );
        std::fs::write(scratch.config_path(), text).unwrap();
        for (file, yaml) in pipelines {
            scratch.write_pipeline(file, yaml);
        }
        let svc = Service::start(&scratch.root).await;
        Intake {
            svc,
            _scratch: scratch,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            bearer: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        self.svc.url(path)
    }

    /// Everything the service logged so far.
    pub fn log(&self) -> String {
        self.svc.log_text()
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let resp = req.send().await.expect("request reaches the service");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer { status, text, json }
    }

    /// `POST path` with a raw body and extra headers.
    pub async fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
        let mut req = self.http.post(self.url(path)).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// `POST path` with a JSON body (and the operator token when one is set).
    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        let auth = self.bearer.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        self.post_raw(path, &headers, body.to_string().into_bytes())
            .await
    }

    pub async fn alert(&self, body: &Value) -> Answer {
        self.post("/webhook?source=alertmanager", body).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        let req = self.http.get(self.url(path));
        let req = match &self.bearer {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        self.send(req).await
    }

    pub async fn run(&self, id: &str) -> Value {
        let a = self.get(&format!("/runs/{id}")).await;
        assert_eq!(a.status, 200, "GET /runs/{id}: {a:?}");
        a.json
    }

    /// Every stored run (of `pipeline`, when given).
    pub async fn runs(&self, pipeline: Option<&str>) -> Vec<Value> {
        let path = match pipeline {
            Some(p) => format!("/runs?limit=500&pipeline={p}"),
            None => "/runs?limit=500".to_string(),
        };
        let a = self.get(&path).await;
        assert_eq!(a.status, 200, "GET {path}: {a:?}");
        a.json["runs"].as_array().cloned().unwrap_or_default()
    }

    pub async fn run_count(&self) -> usize {
        self.runs(None).await.len()
    }

    /// Polls `GET /runs/{id}` until `pred` holds (bounded).
    pub async fn wait_run(&self, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let run = self.run(id).await;
            if pred(&run) {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {id}: not {what} within {WAIT:?}; last seen {run:#}\n{}",
                self.svc.log_tail()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    pub async fn wait_terminal(&self, id: &str) -> Value {
        self.wait_run(id, "finished", |r| r["status"] != "running")
            .await
    }

    /// Scrapes and parses `/metrics`.
    pub async fn metrics(&self) -> Vec<Sample> {
        let a = self.get("/metrics").await;
        assert_eq!(a.status, 200, "GET /metrics: {a:?}");
        parse_prometheus(&a.text)
    }
}

/// Sends `bodies` concurrently to `path`, one request each.
pub async fn burst(intake: &Intake, path: &str, bodies: Vec<Value>) -> Vec<Answer> {
    let mut tasks = Vec::new();
    for body in bodies {
        let req = intake.http.post(intake.url(path)).json(&body);
        tasks.push(tokio::spawn(async move {
            let resp = req.send().await.expect("request reaches the service");
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            let json = serde_json::from_str(&text).unwrap_or(Value::Null);
            Answer { status, text, json }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

// ---------------------------------------------------------------------------
// Pipelines and payloads.
// ---------------------------------------------------------------------------

/// A pipeline of mock steps (`(name, delay_ms)`), with `trigger` as the
/// YAML block under `trigger:` (indented by two spaces).
pub fn pipeline(name: &str, stage: &str, trigger: &str, steps: &[(&str, u64)]) -> String {
    let mut s = format!("name: {name}\nstage: {stage}\ntrigger:\n{trigger}\nsteps:\n");
    for (step, delay) in steps {
        s.push_str(&format!(
            "  - name: {step}\n    executor: mock\n    executor_config:\n      output: {{confidence: 0.9, summary: \"{step} done\", next_step_context: \"\"}}\n      delay_ms: {delay}\n"
        ));
    }
    s
}

pub fn sample(text: &str) -> Value {
    serde_json::from_str(text).expect("sample parses")
}

/// A one-alert Alertmanager notification.
pub fn alert(status: &str, fingerprint: &str, labels: Value) -> Value {
    json!({
        "version": "4",
        "groupKey": format!("{{}}:{{fp=\"{fingerprint}\"}}"),
        "status": status,
        "receiver": "vectorstep",
        "groupLabels": {},
        "commonLabels": labels,
        "commonAnnotations": {"summary": format!("alert {fingerprint}")},
        "externalURL": "http://alertmanager.example.invalid:9093",
        "alerts": [{
            "status": status,
            "labels": labels,
            "annotations": {"summary": format!("alert {fingerprint}")},
            "startsAt": "2024-11-28T14:08:12.304Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": fingerprint,
        }]
    })
}

pub fn assert_accepted(a: &Answer, pipeline: &str) -> String {
    a.assert_status(202, "accepted");
    assert_eq!(a.json["pipeline"], pipeline, "{a:?}");
    a.run_id()
}

pub fn assert_deduplicated(a: &Answer, of: &str) {
    a.assert_status(202, "deduplicated");
    assert_eq!(a.json["run_id"], of, "{a:?}");
    assert!(
        a.json["reason"].as_str().is_some_and(|r| r.contains(of)),
        "the reason names the existing run: {a:?}"
    );
}

/// Polls `/metrics` until `vectorstep_runs_in_progress` is 0.
pub async fn wait_idle(s: &Intake) {
    let deadline = Instant::now() + WAIT;
    loop {
        let m = s.metrics().await;
        if value(&m, "vectorstep_runs_in_progress", &[]) == Some(0.0) {
            return;
        }
        assert!(Instant::now() < deadline, "never idle: {m:?}");
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------
// Hostile bodies.
// ---------------------------------------------------------------------------

/// A random JSON value of any type; objects favour the keys the normalisers read.
pub fn random_value(rng: &mut impl Rng, depth: u32) -> Value {
    const KEYS: &[&str] = &[
        "alerts",
        "labels",
        "annotations",
        "pipeline",
        "data",
        "status",
        "fingerprint",
        "severity",
        "summary",
        "groupKey",
        "commonLabels",
        "commonAnnotations",
        "event",
        "idempotency_key",
        "source",
        "alertname",
        "\u{0}",
        "ключ",
    ];
    let leaf_only = depth == 0;
    match rng.gen_range(0..if leaf_only { 6 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.gen()),
        2 => json!(rng.gen::<i64>()),
        3 => json!([1e308, -1e308, 0.0, u64::MAX as f64, 1e-300][rng.gen_range(0..5)]),
        4 => json!(u64::MAX),
        5 => {
            let len = rng.gen_range(0..12);
            Value::String(
                (0..len)
                    .map(|_| {
                        ['a', 'Z', '0', ' ', '"', '\\', '\n', 'é', '🚨', '\u{0}', '{']
                            [rng.gen_range(0..11)]
                    })
                    .collect(),
            )
        }
        6 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.gen_range(0..5))
                .map(|_| {
                    (
                        KEYS[rng.gen_range(0..KEYS.len())].to_string(),
                        random_value(rng, depth - 1),
                    )
                })
                .collect(),
        ),
    }
}

pub fn nested(depth: usize, open: &str, close: &str, inner: &str) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

/// Several hundred bodies that are truncated, random, mistyped, deep or huge.
pub fn hostile_bodies() -> Vec<Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7e57_b0d1);
    let mut out: Vec<Vec<u8>> = Vec::new();
    // Every sample cut at many offsets (a few dozen per sample).
    for s in SAMPLES {
        let bytes = s.as_bytes();
        let step = (bytes.len() / 40).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            out.push(bytes[..cut].to_vec());
        }
    }
    // Random bytes.
    for _ in 0..60 {
        let len = rng.gen_range(0..400);
        out.push((0..len).map(|_| rng.gen::<u8>()).collect());
    }
    // Random JSON values of every type.
    for _ in 0..120 {
        out.push(random_value(&mut rng, 4).to_string().into_bytes());
    }
    // Each field the normalisers read, with a value of each wrong type, at the top
    // level and inside an alert.
    let wrong = [
        json!(null),
        json!(true),
        json!(7),
        json!(-1.5),
        json!("text"),
        json!([]),
        json!({}),
        json!([1, "x", null, {"a": []}]),
        json!({"a": {"b": [1.0e300]}}),
    ];
    for key in [
        "alerts",
        "labels",
        "annotations",
        "pipeline",
        "data",
        "status",
        "fingerprint",
        "groupKey",
        "commonLabels",
        "commonAnnotations",
        "event",
        "summary",
        "idempotency_key",
        "source",
        "severity",
    ] {
        for w in &wrong {
            let mut top = json!({"pipeline": "catch-all", "status": "firing",
                "alerts": [{"labels": {"alertname": "X"}, "fingerprint": "f"}]});
            top[key] = w.clone();
            out.push(top.to_string().into_bytes());
            let mut inner = json!({"status": "firing", "alerts": [{"labels": {"alertname": "X", "severity": "warning"},
                "annotations": {"summary": "s"}, "fingerprint": "f"}]});
            inner["alerts"][0][key] = w.clone();
            out.push(inner.to_string().into_bytes());
            let mut label = json!({"status": "firing", "alerts": [{"labels": {"alertname": "X"}}]});
            label["alerts"][0]["labels"][key] = w.clone();
            out.push(label.to_string().into_bytes());
        }
    }
    // Deep nesting, beyond and just below the parser's recursion limit.
    for depth in [64, 120, 127, 128, 129, 200, 1_000] {
        out.push(nested(depth, "[", "]", "").into_bytes());
        out.push(nested(depth, "{\"a\":", "}", "1").into_bytes());
        out.push(format!("{{\"alerts\": {}}}", nested(depth, "[", "]", "")).into_bytes());
        out.push(
            format!(
                "{{\"status\": \"firing\", \"alerts\": [{{\"labels\": {{\"alertname\": {}}}}}]}}",
                nested(depth, "[", "]", "\"x\"")
            )
            .into_bytes(),
        );
        out.push(
            format!(
                "{{\"pipeline\": \"catch-all\", \"data\": {{\"d\": {}}}}}",
                nested(depth, "{\"a\":", "}", "null")
            )
            .into_bytes(),
        );
    }
    // Huge numbers, huge strings, odd encodings.
    for raw in [
        "1e400",
        "-1e400",
        "123456789012345678901234567890123456789",
        "{\"alerts\": [{\"labels\": {\"severity\": 1e400}}]}",
        "{\"alerts\": [{\"labels\": {\"replicas\": 123456789012345678901234567890}, \"fingerprint\": 1e308}]}",
        "{\"pipeline\": \"catch-all\", \"idempotency_key\": 1e308}",
        "{\"pipeline\": 1e999}",
        "{\"status\": \"firing\", \"alerts\": [{\"labels\": {\"alertname\": \"\\ud800\"}}]}",
        "{\"status\": \"firing\", \"alerts\": [{\"labels\": {\"alertname\": \"a\\u0000b\"}}]}",
        "\u{feff}{\"pipeline\": \"catch-all\"}",
        "{\"pipeline\": \"catch-all\"} trailing",
        "{\"pipeline\": \"catch-all\",}",
        "",
        " ",
        "null",
        "\"just a string\"",
    ] {
        out.push(raw.as_bytes().to_vec());
    }
    out.push(b"{\"pipeline\": \"catch-all\", \"summary\": \"\xff\xfe\"}".to_vec());
    out.push(
        json!({"status": "firing", "alerts": [{"labels": {"alertname": "big", "note": "n".repeat(200_000)}}]})
            .to_string()
            .into_bytes(),
    );
    out.push(
        json!({"status": "firing", "alerts": (0..2_000).map(|i| json!({"labels": {"alertname": format!("a{i}")}})).collect::<Vec<_>>()})
            .to_string()
            .into_bytes(),
    );
    out
}

// ---------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The Prometheus text format: `name{label="value",...} value [timestamp]`.
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fail = |why: &str| -> ! { panic!("/metrics line {}: {why}: {line}", n + 1) };
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or_else(|| fail("no value"));
        let name = line[..name_end].to_string();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let end = loop {
                while chars.next_if(|(_, c)| *c == ',' || *c == ' ').is_some() {}
                let Some((i, c)) = chars.next() else {
                    fail("unterminated labels")
                };
                if c == '}' {
                    break i;
                }
                let mut key = String::from(c);
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                if chars.next().map(|(_, c)| c) != Some('"') {
                    fail("label value not quoted");
                }
                let mut value = String::new();
                loop {
                    match chars.next() {
                        Some((_, '"')) => break,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c)) => value.push(c),
                            None => fail("dangling escape"),
                        },
                        Some((_, c)) => value.push(c),
                        None => fail("unterminated label value"),
                    }
                }
                labels.insert(key.trim().to_string(), value);
            };
            rest = &body[end + 1..];
        }
        let value = rest
            .split_whitespace()
            .next()
            .unwrap_or_else(|| fail("no value"));
        let value: f64 = value.parse().unwrap_or_else(|_| fail("bad value"));
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// The sum over samples named `name` whose labels include `labels`; `None` if none.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .collect();
    (!found.is_empty()).then(|| found.iter().sum())
}
