//! Who may call which route. Every route the router serves is declared in
//! [`super::routes`] together with its [`RouteClass`], so a route cannot exist
//! without one; [`authorize`] is the one middleware that enforces it.
//!
//! The decision itself, [`decide`], is pure: given the class, the configured
//! tokens and the presented one, it answers allowed (as whom) or 401/403. It is
//! table-tested below; the HTTP tests drive the same table through the binary.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::secret::same_secret;
use super::session::{self, Holder, Session};
use super::{ApiError, AppState};
use crate::config::{Config, TeamToken};

/// The access class of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    /// `/healthz`, `/readyz`: anyone.
    Open,
    /// `/metrics`: anyone, unless `auth.protect_metrics`; then a scraper or operator.
    Metrics,
    /// Starting runs: a team or an operator token.
    Trigger,
    /// Reading runs, listing and deciding approvals through the API, cancel, ...
    Operator,
    /// `GET`/`POST /approvals/{token}`: the approval token in the link is the
    /// credential for that one decision (the handler checks the page's CSRF token);
    /// a bearer token or the session cookie, when sent, is still checked and
    /// identifies an operator.
    ApprovalLink,
    /// The web UI's pages and forms (`/ui/...`): an operator, by the session
    /// cookie or a bearer token, when auth is configured; without one a page
    /// redirects to the token form. Every POST carries the CSRF token.
    Ui,
    /// The UI's token form (`/ui/login`): anyone; its POST carries the CSRF token
    /// of the browser's anonymous session.
    UiLogin,
}

impl RouteClass {
    /// Whether the operator session cookie counts as a credential here (SPEC 2:
    /// `GET` routes and the UI; POSTs with it carry the CSRF token).
    pub fn takes_session(self) -> bool {
        matches!(
            self,
            RouteClass::Operator | RouteClass::ApprovalLink | RouteClass::Ui
        )
    }
}

/// What a request's body is, as far as CSRF is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `application/json`: a page of another site cannot send it without a CORS
    /// preflight, which this server never grants.
    Json,
    /// `application/x-www-form-urlencoded`: what an HTML form sends.
    Form,
    /// No content type and no sign of a browser (every browser sends `Origin`,
    /// or `Sec-Fetch-Site`, with a POST): `curl -X POST`, a script.
    Bare,
    /// Anything else: text, multipart, or no content type from a browser.
    Other,
}

/// Whether a request must carry the CSRF token of its session (SPEC 12, 13).
/// A bearer token is never sent by a browser on its own, so it needs none; a
/// cookie is, so every POST that a cookie could authorise needs one. The
/// approval page's form carries its own token, checked by its handler.
pub fn csrf_needed(class: RouteClass, post: bool, bearer: bool, cookie: bool, body: Body) -> bool {
    if !post {
        return false;
    }
    if class == RouteClass::UiLogin {
        // Signing in is where a session begins: no bearer token stands in for it.
        return true;
    }
    if bearer {
        return false;
    }
    match class {
        RouteClass::Open | RouteClass::Metrics | RouteClass::Trigger => false,
        RouteClass::ApprovalLink => cookie && body != Body::Form,
        RouteClass::Operator => cookie || !matches!(body, Body::Json | Body::Bare),
        RouteClass::Ui | RouteClass::UiLogin => true,
    }
}

/// Who is calling, as far as the credential says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// No auth is configured, or an open route was called without a token.
    Anonymous,
    Team(String),
    Operator(String),
    Scraper(String),
}

impl Principal {
    /// The operator's name, for `by` on decisions and cancels.
    pub fn operator(&self) -> Option<&str> {
        match self {
            Principal::Operator(name) => Some(name),
            _ => None,
        }
    }

    /// The team whose token started a run, if any.
    pub fn team(&self) -> Option<&str> {
        match self {
            Principal::Team(name) => Some(name),
            _ => None,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no token, or one that matches nothing.
    Unauthenticated,
    /// 403: a valid token of the wrong kind for this route.
    Forbidden { needs: &'static str },
}

/// The configured tokens, by kind.
pub struct Tokens<'a> {
    pub teams: &'a [TeamToken],
    pub operators: &'a [TeamToken],
    pub scrapers: &'a [TeamToken],
    pub protect_metrics: bool,
}

impl<'a> Tokens<'a> {
    pub fn of(config: &'a Config) -> Self {
        Tokens {
            teams: &config.auth_teams,
            operators: &config.auth_operators,
            scrapers: &config.auth_scrapers,
            protect_metrics: config.protect_metrics,
        }
    }

    fn api_protected(&self) -> bool {
        !self.teams.is_empty() || !self.operators.is_empty()
    }

    /// Who `given` belongs to. Every configured token is compared in full, in
    /// constant time, so the time taken says nothing about which one matched.
    fn identify(&self, given: &str) -> Option<Principal> {
        let mut found = None;
        let lists: [(&[TeamToken], MakePrincipal); 3] = [
            (self.teams, Principal::Team),
            (self.operators, Principal::Operator),
            (self.scrapers, Principal::Scraper),
        ];
        for (list, make) in lists {
            for t in list {
                if same_secret(given.as_bytes(), t.token.as_bytes()) {
                    found = Some(make(t.name.clone()));
                }
            }
        }
        found
    }
}

/// The operator whose token `given` is (every operator's compared in full, in
/// constant time), for the UI's token form.
pub fn operator_with_token<'a>(config: &'a Config, given: &str) -> Option<&'a TeamToken> {
    let mut found = None;
    for t in &config.auth_operators {
        if same_secret(given.as_bytes(), t.token.as_bytes()) {
            found = Some(t);
        }
    }
    found.filter(|_| !given.is_empty())
}

/// Builds a [`Principal`] from the name of the token that matched.
type MakePrincipal = fn(String) -> Principal;

/// The decision: may a caller presenting `bearer` use a route of `class`?
pub fn decide(
    class: RouteClass,
    tokens: &Tokens<'_>,
    bearer: Option<&str>,
) -> Result<Principal, Refusal> {
    let required = match class {
        RouteClass::Open | RouteClass::ApprovalLink | RouteClass::UiLogin => false,
        RouteClass::Metrics => tokens.protect_metrics,
        RouteClass::Trigger | RouteClass::Operator | RouteClass::Ui => tokens.api_protected(),
    };
    // A token that matches nothing only matters where a credential is required:
    // a health checker with a stale token still gets its answer.
    let Some(who) = bearer.and_then(|b| tokens.identify(b)) else {
        return if required {
            Err(Refusal::Unauthenticated)
        } else {
            Ok(Principal::Anonymous)
        };
    };
    let fits = match class {
        RouteClass::Open | RouteClass::ApprovalLink | RouteClass::UiLogin => true,
        RouteClass::Metrics => matches!(who, Principal::Scraper(_) | Principal::Operator(_)),
        RouteClass::Trigger => matches!(who, Principal::Team(_) | Principal::Operator(_)),
        RouteClass::Operator | RouteClass::Ui => matches!(who, Principal::Operator(_)),
    };
    if fits {
        return Ok(who);
    }
    if !required {
        // A token of another kind counts for nothing here: a scraper token
        // never makes an operator.
        return Ok(Principal::Anonymous);
    }
    Err(Refusal::Forbidden {
        needs: match class {
            RouteClass::Metrics => "a scraper or operator token",
            RouteClass::Trigger => "a team or operator token",
            _ => "an operator token",
        },
    })
}

/// The bearer token of a request, if it sent one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The middleware: refuses the request or hands the handler its [`Principal`]
/// (and, on routes that take it, the verified [`Session`]) as request
/// extensions. A UI page without a session gets an anonymous one, so its forms
/// can carry a CSRF token.
pub async fn authorize(
    State((state, class)): State<(Arc<AppState>, RouteClass)>,
    req: Request,
    next: Next,
) -> Response {
    let config = &state.engine.config;
    let tokens = Tokens::of(config);
    let has_bearer = bearer(req.headers()).is_some();
    let cookie_value = req
        .headers()
        .get("cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|h| session::cookie(h, session::COOKIE))
        .map(str::to_string);
    let wants_session = class.takes_session() || class == RouteClass::UiLogin;
    let key = match (
        wants_session,
        cookie_value.is_some() || matches!(class, RouteClass::Ui | RouteClass::UiLogin),
    ) {
        (true, true) => match state.page_key().await {
            Ok(k) => Some(k),
            Err(e) => return e.into_response(),
        },
        _ => None,
    };
    let now = state.engine.now_ms() / 1000;
    let verified = match (&key, &cookie_value) {
        (Some(k), Some(v)) => session::verify(k, v, &config.auth_operators, now),
        _ => None,
    };
    let mut decided = decide(class, &tokens, bearer(req.headers()));
    if !has_bearer && class.takes_session() {
        if let Some(Session {
            holder: Holder::Operator(name),
            ..
        }) = &verified
        {
            decided = Ok(Principal::Operator(name.clone()));
        }
    }
    let path = req.uri().path().to_string();
    let who = match decided {
        Ok(who) => who,
        Err(Refusal::Unauthenticated) if class == RouteClass::Ui => {
            return redirect_to_sign_in(req.uri());
        }
        Err(refusal) => {
            if class == RouteClass::Trigger {
                crate::telemetry::webhook(
                    &super::intake::source_label(req.uri(), req.headers()),
                    super::intake::refusal_word(if refusal == Refusal::Unauthenticated {
                        StatusCode::UNAUTHORIZED
                    } else {
                        StatusCode::FORBIDDEN
                    }),
                );
            }
            return refuse(refusal, &path);
        }
    };
    let body_kind = body_kind(req.headers());
    let post = req.method() == axum::http::Method::POST;
    let mut req = req;
    if csrf_needed(class, post, has_bearer, cookie_value.is_some(), body_kind) {
        let (checked, rebuilt) = check_csrf(req, key.as_ref(), verified.as_ref(), body_kind).await;
        match checked {
            Ok(()) => req = rebuilt,
            Err(why) => return csrf_refused(why, body_kind),
        }
    }
    // A browser on the UI without a session gets an anonymous one.
    let fresh = match (&verified, &key) {
        (None, Some(k)) if matches!(class, RouteClass::Ui | RouteClass::UiLogin) => {
            let value = session::issue(k, None, rand::random(), now);
            Some(Session {
                holder: Holder::Anonymous,
                expires: now + session::LIFETIME_SECS,
                value,
            })
        }
        _ => None,
    };
    if let Some(s) = verified.clone().or_else(|| fresh.clone()) {
        req.extensions_mut().insert(s);
    }
    let secure = forwarded_https(req.headers());
    req.extensions_mut().insert(who);
    let mut response = next.run(req).await;
    if let Some(s) = fresh {
        if !response.headers().contains_key("set-cookie") {
            if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&s.value, secure)) {
                response.headers_mut().append("set-cookie", v);
            }
        }
    }
    response
}

/// Whether the client reached us over HTTPS (a proxy in front says so).
pub fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

fn body_kind(headers: &HeaderMap) -> Body {
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ct.starts_with("application/json") {
        Body::Json
    } else if ct.starts_with("application/x-www-form-urlencoded") {
        Body::Form
    } else if ct.is_empty()
        && !headers.contains_key("origin")
        && !headers.contains_key("sec-fetch-site")
    {
        Body::Bare
    } else {
        Body::Other
    }
}

/// The largest form the CSRF check reads (the UI's forms are a few fields).
const MAX_FORM_BYTES: usize = 64 * 1024;

/// Checks the CSRF token of a request: the `X-CSRF-Token` header, or a form's
/// `csrf` field (the body is read and handed on unchanged).
async fn check_csrf(
    req: Request,
    key: Option<&[u8; 32]>,
    session: Option<&Session>,
    body: Body,
) -> (Result<(), &'static str>, Request) {
    let header = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (parts, req_body) = req.into_parts();
    let (given, rebuilt) = match (header, body) {
        (Some(h), _) => (Some(h), Request::from_parts(parts, req_body)),
        (None, Body::Form) => match axum::body::to_bytes(req_body, MAX_FORM_BYTES).await {
            Ok(bytes) => {
                let given = super::forms::field(&bytes, "csrf");
                (
                    given,
                    Request::from_parts(parts, axum::body::Body::from(bytes)),
                )
            }
            Err(_) => {
                return (
                    Err("the form is too large"),
                    Request::from_parts(parts, axum::body::Body::empty()),
                )
            }
        },
        (None, _) => {
            return (
                Err("the CSRF token is missing"),
                Request::from_parts(parts, req_body),
            )
        }
    };
    let valid = match (key, session, given) {
        (Some(k), Some(s), Some(g)) => session::csrf_valid(k, &s.value, &g),
        (_, _, None) => return (Err("the CSRF token is missing"), rebuilt),
        _ => false,
    };
    if valid {
        (Ok(()), rebuilt)
    } else {
        (
            Err("the CSRF token does not belong to this session"),
            rebuilt,
        )
    }
}

fn csrf_refused(why: &'static str, body: Body) -> Response {
    if body == Body::Form {
        return super::page::refused_page(
            StatusCode::FORBIDDEN,
            "Form refused",
            &format!("{why}: this form did not come from this server's pages, or your session changed. Reload the page and try again."),
        );
    }
    ApiError::new(StatusCode::FORBIDDEN, "csrf token required")
        .detail(Value::from(format!(
            "{why}: a POST made with the session cookie carries the page's CSRF token (form field `csrf` or header `X-CSRF-Token`); API clients send a bearer token or JSON"
        )))
        .into_response()
}

/// A UI page asked for without a session: to the token form, then back.
fn redirect_to_sign_in(uri: &axum::http::Uri) -> Response {
    let back = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/ui");
    let location = format!("/ui/login?next={}", super::forms::encode(back));
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert("location", v);
    }
    r
}

fn refuse(refusal: Refusal, path: &str) -> Response {
    match refusal {
        Refusal::Unauthenticated => {
            let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized")
                .detail(Value::from("missing or invalid bearer token"))
                .into_response();
            r.headers_mut().insert(
                "www-authenticate",
                axum::http::HeaderValue::from_static("Bearer"),
            );
            r
        }
        Refusal::Forbidden { needs } => ApiError::new(StatusCode::FORBIDDEN, "forbidden")
            .detail(Value::from(format!("{path} needs {needs}")))
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(name: &str, token: &str) -> TeamToken {
        TeamToken {
            name: name.into(),
            token: token.into(),
        }
    }

    fn check(
        teams: bool,
        operators: bool,
        protect_metrics: bool,
        class: RouteClass,
        bearer: Option<&str>,
        expected: Result<Principal, Refusal>,
    ) {
        let t = [tok("sre", "team-secret")];
        let o = [tok("alice", "op-secret")];
        let s = [tok("prom", "scrape-secret")];
        let tokens = Tokens {
            teams: if teams { &t } else { &[] },
            operators: if operators { &o } else { &[] },
            scrapers: &s,
            protect_metrics,
        };
        assert_eq!(
            decide(class, &tokens, bearer),
            expected,
            "teams={teams} operators={operators} protect_metrics={protect_metrics} {class:?} {bearer:?}"
        );
    }

    use Principal as P;
    use RouteClass::*;

    const OP: Result<Principal, Refusal> = Err(Refusal::Forbidden {
        needs: "an operator token",
    });

    #[test]
    fn route_classes_with_teams_and_operators() {
        let alice = || Ok(P::Operator("alice".into()));
        check(true, true, false, Open, None, Ok(P::Anonymous));
        check(true, true, false, Open, Some("nope"), Ok(P::Anonymous));
        check(true, true, false, Metrics, None, Ok(P::Anonymous));
        check(
            true,
            true,
            false,
            Trigger,
            None,
            Err(Refusal::Unauthenticated),
        );
        check(
            true,
            true,
            false,
            Trigger,
            Some("nope"),
            Err(Refusal::Unauthenticated),
        );
        check(
            true,
            true,
            false,
            Trigger,
            Some("team-secret"),
            Ok(P::Team("sre".into())),
        );
        check(true, true, false, Trigger, Some("op-secret"), alice());
        check(
            true,
            true,
            false,
            Trigger,
            Some("scrape-secret"),
            Err(Refusal::Forbidden {
                needs: "a team or operator token",
            }),
        );
        check(
            true,
            true,
            false,
            Operator,
            None,
            Err(Refusal::Unauthenticated),
        );
        check(true, true, false, Operator, Some("team-secret"), OP);
        check(true, true, false, Operator, Some("scrape-secret"), OP);
        check(true, true, false, Operator, Some("op-secret"), alice());
        check(true, true, false, ApprovalLink, None, Ok(P::Anonymous));
        check(true, true, false, ApprovalLink, Some("op-secret"), alice());
        check(
            true,
            true,
            false,
            ApprovalLink,
            Some("bad"),
            Ok(P::Anonymous),
        );
    }

    #[test]
    fn teams_alone_still_close_operator_routes() {
        check(
            true,
            false,
            false,
            Operator,
            None,
            Err(Refusal::Unauthenticated),
        );
        check(true, false, false, Operator, Some("team-secret"), OP);
    }

    #[test]
    fn protected_metrics_need_a_scraper_or_operator() {
        let needs = Err(Refusal::Forbidden {
            needs: "a scraper or operator token",
        });
        check(
            true,
            true,
            true,
            Metrics,
            None,
            Err(Refusal::Unauthenticated),
        );
        check(true, true, true, Metrics, Some("team-secret"), needs);
        check(
            true,
            true,
            true,
            Metrics,
            Some("scrape-secret"),
            Ok(P::Scraper("prom".into())),
        );
        check(
            true,
            true,
            true,
            Metrics,
            Some("op-secret"),
            Ok(P::Operator("alice".into())),
        );
        // protect_metrics applies even when the API itself is open.
        check(
            false,
            false,
            true,
            Metrics,
            None,
            Err(Refusal::Unauthenticated),
        );
    }

    #[test]
    fn without_auth_everything_is_open_and_tokens_count_for_what_they_are() {
        for class in [Open, Metrics, Trigger, Operator, ApprovalLink] {
            check(false, false, false, class, None, Ok(P::Anonymous));
        }
        check(
            false,
            false,
            false,
            Operator,
            Some("scrape-secret"),
            Ok(P::Anonymous),
        );
        check(
            false,
            false,
            false,
            Metrics,
            Some("scrape-secret"),
            Ok(P::Scraper("prom".into())),
        );
    }

    #[test]
    fn which_posts_carry_the_csrf_token() {
        use Body::*;
        // (class, post, bearer, cookie, body) -> needed
        let table = [
            (Operator, false, false, true, Other, false), // reads never
            (Operator, true, true, true, Form, false),    // a bearer token stands alone
            (Operator, true, false, true, Json, true),    // the cookie: always
            (Operator, true, false, false, Json, false), // JSON without a cookie: a script, not a page
            (Operator, true, false, false, Form, true),  // a cross-site form with auth off
            (Operator, true, false, false, Other, true),
            (Operator, true, false, false, Bare, false), // `curl -X POST`
            (Operator, true, false, true, Bare, true),
            (Ui, true, false, false, Bare, true),
            (Ui, true, true, false, Form, false),
            (Ui, true, false, false, Json, true),
            (UiLogin, true, true, false, Form, true), // signing in: always
            (UiLogin, false, false, false, Other, false),
            (ApprovalLink, true, false, true, Form, false), // the page's own token
            (ApprovalLink, true, false, true, Json, true),
            (ApprovalLink, true, false, false, Json, false),
            (Trigger, true, false, true, Form, false),
            (Open, true, false, true, Form, false),
        ];
        for (class, post, bearer, cookie, body, needed) in table {
            assert_eq!(
                csrf_needed(class, post, bearer, cookie, body),
                needed,
                "{class:?} post={post} bearer={bearer} cookie={cookie} {body:?}"
            );
        }
    }

    #[test]
    fn ui_pages_are_an_operators_and_the_token_form_anyones() {
        check(true, true, false, Ui, None, Err(Refusal::Unauthenticated));
        check(true, true, false, Ui, Some("team-secret"), OP);
        check(
            true,
            true,
            false,
            Ui,
            Some("op-secret"),
            Ok(P::Operator("alice".into())),
        );
        check(true, true, false, UiLogin, None, Ok(P::Anonymous));
        check(false, false, false, Ui, None, Ok(P::Anonymous));
    }
}
