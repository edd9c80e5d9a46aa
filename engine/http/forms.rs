//! HTML form bodies (`application/x-www-form-urlencoded`) and URL query parts:
//! decoding what a form sent, encoding what goes into a link.

/// The pairs of a form body or query string, decoded, in order.
pub fn pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// The first value of field `name` in a form body.
pub fn field(body: &[u8], name: &str) -> Option<String> {
    pairs(&String::from_utf8_lossy(body))
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// `%XX` and `+` decoded; invalid escapes are kept as they are.
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Percent-encodes everything but unreserved characters, for a query value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_and_values_round_trip() {
        assert_eq!(
            pairs("a=1&b=x+y&c=%3Cb%3E&bad&d=%zz"),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "<b>".into()),
                ("d".into(), "%zz".into()),
            ]
        );
        assert_eq!(field(b"csrf=abc&x=1", "csrf").as_deref(), Some("abc"));
        assert_eq!(field(b"x=1", "csrf"), None);
        for s in ["/ui/runs/a?b=c&d=e", "<script>", "é ü", "100%"] {
            assert_eq!(decode(&encode(s)), s);
        }
        assert_eq!(encode("/ui?x=1&y"), "/ui%3Fx%3D1%26y");
    }
}
