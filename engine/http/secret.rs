//! Secrets compared in constant time: bearer tokens, the UI's session MACs and
//! CSRF tokens, the approval page's form token. The time taken says nothing
//! about where two values first differ, nor, beyond their lengths, anything else.

/// Whether `a` and `b` are the same secret; every byte of the longer is read.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"x"));
        assert!(!same_secret(b"abd", b"abc"));
    }
}
