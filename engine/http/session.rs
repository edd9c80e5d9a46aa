//! The operator session cookie and the CSRF tokens of the web UI's forms
//! (SPEC 12, 13). Pure: the key and the clock are passed in, so every rule here
//! is table-tested below.
//!
//! The cookie `vs_session` is `KIND.NAME.NONCE.EXPIRES.MAC`:
//! - `KIND` is `o` (an operator signed in with their token) or `a` (a browser
//!   without an operator: the UI when no auth is configured, or the token form).
//!   An anonymous session exists so that even then every form carries a CSRF
//!   token bound to this one browser.
//! - `NAME` is the operator's name in hex (empty for `a`), `NONCE` 16 random
//!   bytes in hex, `EXPIRES` unix seconds.
//! - `MAC` is a keyed BLAKE3 hash of the rest and, for an operator, of a digest of
//!   their current token, under a key derived from the store's page key. Every
//!   replica reads the same key, so any of them verifies any cookie; changing an
//!   operator's token, or removing the operator, ends their sessions.
//!
//! The CSRF token of a form is a keyed hash of the whole cookie value: a page of
//! another site can neither read it nor make one.

use crate::config::TeamToken;

pub const COOKIE: &str = "vs_session";
/// How long a sign-in lasts.
pub const LIFETIME_SECS: i64 = 12 * 3600;

/// Who a verified cookie speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    Operator(String),
    Anonymous,
}

/// A verified session cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub holder: Holder,
    /// The cookie's value, which the CSRF token is bound to.
    pub value: String,
    pub expires: i64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn session_key(page_key: &[u8; 32]) -> [u8; 32] {
    blake3::derive_key("vectorstep 2026 operator session cookie", page_key)
}

fn csrf_key(page_key: &[u8; 32]) -> [u8; 32] {
    blake3::derive_key("vectorstep 2026 ui form csrf", page_key)
}

fn token_digest(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

fn mac(page_key: &[u8; 32], signed: &str, digest: &str) -> String {
    blake3::keyed_hash(
        &session_key(page_key),
        format!("{signed}|{digest}").as_bytes(),
    )
    .to_hex()
    .to_string()
}

/// A new cookie value for `operator` (with their token), or an anonymous one.
pub fn issue(
    page_key: &[u8; 32],
    operator: Option<&TeamToken>,
    nonce: [u8; 16],
    now_secs: i64,
) -> String {
    let (kind, name, digest) = match operator {
        Some(op) => ("o", hex(op.name.as_bytes()), token_digest(&op.token)),
        None => ("a", String::new(), String::new()),
    };
    let signed = format!("{kind}.{name}.{}.{}", hex(&nonce), now_secs + LIFETIME_SECS);
    let mac = mac(page_key, &signed, &digest);
    format!("{signed}.{mac}")
}

/// The session `value` speaks for, if it is one this server issued, has not
/// expired, and (for an operator) the operator still has the token it was
/// issued with.
pub fn verify(
    page_key: &[u8; 32],
    value: &str,
    operators: &[TeamToken],
    now_secs: i64,
) -> Option<Session> {
    let mut parts = value.split('.');
    let (kind, name_hex, nonce, expires, given) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    if parts.next().is_some() || nonce.len() != 32 || unhex(nonce).is_none() {
        return None;
    }
    let expires: i64 = expires.parse().ok()?;
    if expires <= now_secs {
        return None;
    }
    let (holder, digest) = match kind {
        "o" => {
            let name = String::from_utf8(unhex(name_hex)?).ok()?;
            let op = operators.iter().find(|o| o.name == name)?;
            (Holder::Operator(name), token_digest(&op.token))
        }
        "a" if name_hex.is_empty() => (Holder::Anonymous, String::new()),
        _ => return None,
    };
    let signed = format!("{kind}.{name_hex}.{nonce}.{expires}");
    let expected = mac(page_key, &signed, &digest);
    super::policy::same_secret(given.as_bytes(), expected.as_bytes()).then(|| Session {
        holder,
        value: value.to_string(),
        expires,
    })
}

/// The CSRF token every form of a page served with this session carries.
pub fn csrf_token(page_key: &[u8; 32], session_value: &str) -> String {
    blake3::keyed_hash(&csrf_key(page_key), session_value.as_bytes())
        .to_hex()
        .to_string()
}

/// Whether `given` is the CSRF token of this session.
pub fn csrf_valid(page_key: &[u8; 32], session_value: &str, given: &str) -> bool {
    super::policy::same_secret(
        given.as_bytes(),
        csrf_token(page_key, session_value).as_bytes(),
    )
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The `Set-Cookie` header for a session value (`secure` when the request came
/// over HTTPS, as a proxy in front says with `X-Forwarded-Proto`).
pub fn set_cookie(value: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={value}; Path=/; Max-Age={LIFETIME_SECS}; HttpOnly; SameSite=Lax{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` header that ends a session.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax")
}

/// Where to go after signing in: a path of this UI only, never another site
/// (`//evil`, `https://...`, `/\evil` are all refused).
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/ui")
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control) =>
        {
            n.to_string()
        }
        _ => "/ui".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const NOW: i64 = 1_800_000_000;

    fn ops() -> Vec<TeamToken> {
        vec![TeamToken {
            name: "alice".into(),
            token: "op-secret".into(),
        }]
    }

    #[test]
    fn an_operator_cookie_verifies_until_it_expires_or_the_token_changes() {
        let ops = ops();
        let value = issue(&KEY, Some(&ops[0]), [1; 16], NOW);
        let s = verify(&KEY, &value, &ops, NOW + 10).expect("verifies");
        assert_eq!(s.holder, Holder::Operator("alice".into()));
        assert_eq!(s.expires, NOW + LIFETIME_SECS);
        assert_eq!(verify(&KEY, &value, &ops, NOW + LIFETIME_SECS), None);
        let rotated = vec![TeamToken {
            name: "alice".into(),
            token: "new-secret".into(),
        }];
        assert_eq!(verify(&KEY, &value, &rotated, NOW), None, "token rotated");
        assert_eq!(verify(&KEY, &value, &[], NOW), None, "operator removed");
        assert_eq!(verify(&[8; 32], &value, &ops, NOW), None, "another key");
    }

    #[test]
    fn a_forged_or_altered_cookie_is_refused() {
        let ops = ops();
        let anon = issue(&KEY, None, [2; 16], NOW);
        assert_eq!(
            verify(&KEY, &anon, &ops, NOW).map(|s| s.holder),
            Some(Holder::Anonymous)
        );
        // Making the anonymous cookie an operator's, keeping its MAC.
        let parts: Vec<&str> = anon.split('.').collect();
        let forged = format!("o.{}.{}.{}.{}", hex(b"alice"), parts[2], parts[3], parts[4]);
        let longer = format!("a..{}.{}.{}", parts[2], NOW + 10 * LIFETIME_SECS, parts[4]);
        for bad in [
            forged.as_str(),
            longer.as_str(),
            "",
            "a....",
            "x.y.z",
            &format!("{anon}.extra"),
        ] {
            assert_eq!(verify(&KEY, bad, &ops, NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn csrf_tokens_are_bound_to_one_session() {
        let a = issue(&KEY, None, [3; 16], NOW);
        let b = issue(&KEY, None, [4; 16], NOW);
        let token = csrf_token(&KEY, &a);
        assert!(csrf_valid(&KEY, &a, &token));
        assert!(!csrf_valid(&KEY, &b, &token));
        assert!(!csrf_valid(&KEY, &a, ""));
        assert!(!csrf_valid(&[9; 32], &a, &token));
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = "theme=dark; vs_session=a..00.1.ff; other=1";
        assert_eq!(cookie(h, COOKIE), Some("a..00.1.ff"));
        assert_eq!(cookie(h, "missing"), None);
        assert_eq!(cookie("vs_session_x=1", COOKIE), None);
    }

    #[test]
    fn only_local_ui_paths_are_followed_after_sign_in() {
        for (given, expected) in [
            (Some("/ui/runs/abc?x=1"), "/ui/runs/abc?x=1"),
            (Some("/ui"), "/ui"),
            (Some("//evil.example/ui"), "/ui"),
            (Some("https://evil.example/ui"), "/ui"),
            (Some("/ui\\..\\evil"), "/ui"),
            (Some("/runs/abc"), "/ui"),
            (Some("/ui\r\nSet-Cookie: x"), "/ui"),
            (None, "/ui"),
        ] {
            assert_eq!(safe_next(given), expected, "{given:?}");
        }
    }
}
