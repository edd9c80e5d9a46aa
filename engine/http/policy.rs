//! Who may call which route. Every route the router serves is declared in
//! [`super::routes`] together with its [`RouteClass`], so a route cannot exist
//! without one; [`authorize`] is the one middleware that enforces it.
//!
//! The decision itself, [`decide`], is pure: given the class, the configured
//! tokens and the presented one, it answers allowed (as whom) or 401/403. It is
//! table-tested below; the HTTP tests drive the same table through the binary.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

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
    /// a bearer token, when sent, is still checked and identifies an operator.
    ApprovalLink,
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
                if constant_time_eq(given.as_bytes(), t.token.as_bytes()) {
                    found = Some(make(t.name.clone()));
                }
            }
        }
        found
    }
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
        RouteClass::Open | RouteClass::ApprovalLink => false,
        RouteClass::Metrics => tokens.protect_metrics,
        RouteClass::Trigger | RouteClass::Operator => tokens.api_protected(),
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
        RouteClass::Open | RouteClass::ApprovalLink => true,
        RouteClass::Metrics => matches!(who, Principal::Scraper(_) | Principal::Operator(_)),
        RouteClass::Trigger => matches!(who, Principal::Team(_) | Principal::Operator(_)),
        RouteClass::Operator => matches!(who, Principal::Operator(_)),
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

/// Compares two secrets in constant time (for the page's CSRF token too).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    constant_time_eq(a, b)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

/// The middleware: refuses the request or hands the handler its [`Principal`]
/// as a request extension.
pub async fn authorize(
    State((state, class)): State<(Arc<AppState>, RouteClass)>,
    mut req: Request,
    next: Next,
) -> Response {
    let tokens = Tokens::of(&state.engine.config);
    match decide(class, &tokens, bearer(req.headers())) {
        Ok(who) => {
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        Err(refusal) => {
            let path = req.uri().path().to_string();
            if class == RouteClass::Trigger {
                crate::telemetry::webhook(
                    &super::intake::source_label(req.uri(), req.headers()),
                    if refusal == Refusal::Unauthenticated {
                        "401"
                    } else {
                        "403"
                    },
                );
            }
            refuse(refusal, &path)
        }
    }
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
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(!constant_time_eq(b"abd", b"abc"));
    }
}
