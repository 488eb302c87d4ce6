//! Chain names and rule comments from Kubernetes names, within nftables' limits.

use crate::key::ObjectKey;

/// Longest chain name we write; the kernel allows 255 bytes (`NFT_CHAIN_MAXNAMELEN`).
const MAX_CHAIN_NAME: usize = 200;
/// nftables rejects comments over 128 bytes.
const MAX_COMMENT: usize = 128;

/// The chain for one pod and direction: `ingress_<ns>/<pod>` or `egress_<ns>/<pod>`, stable
/// across restarts. Kubernetes names (DNS-1123) are valid unquoted nft identifiers after a
/// letter; a name that is not (from a hand-written manifest) or too long is cut and given a
/// hash of the full name behind `_h`, which no DNS-1123 name contains, so it cannot collide
/// with a plain one.
pub fn chain_name(direction: &str, pod: &ObjectKey) -> String {
    let plain = format!("{direction}_{}/{}", pod.namespace, pod.name);
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/' | '_');
    let body_clean = pod
        .namespace
        .chars()
        .chain(pod.name.chars())
        .all(|c| allowed(c) && c != '_');
    if body_clean && plain.len() <= MAX_CHAIN_NAME {
        return plain;
    }
    let mut cut: String = plain
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .collect();
    cut.truncate(MAX_CHAIN_NAME - 18);
    while !cut.is_char_boundary(cut.len()) {
        cut.pop();
    }
    format!("{cut}_h{:016x}", fnv1a(plain.as_bytes()))
}

/// `text` as an nft comment: no quotes or control characters, at most 128 bytes.
pub fn comment(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if out.len() > MAX_COMMENT {
        out.truncate(MAX_COMMENT - 3);
        out.push_str("...");
    }
    format!("comment \"{out}\"")
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_stay_readable_and_odd_or_long_ones_are_hashed() {
        let web = ObjectKey::new("shop", "web-0");
        assert_eq!(chain_name("ingress", &web), "ingress_shop/web-0");
        let long = ObjectKey::new("shop", &"a".repeat(253));
        let name = chain_name("egress", &long);
        assert!(
            name.len() <= MAX_CHAIN_NAME && name.contains("_h"),
            "{name}"
        );
        assert_ne!(
            name,
            chain_name("egress", &ObjectKey::new("shop", &"a".repeat(252)))
        );
        let odd = chain_name("ingress", &ObjectKey::new("shop", "we\"b"));
        assert!(odd.starts_with("ingress_shop/we-b_h"), "{odd}");
        assert_eq!(comment("a\"b"), "comment \"a?b\"");
        assert_eq!(comment(&"x".repeat(300)).len(), "comment \"\"".len() + 128);
    }
}
