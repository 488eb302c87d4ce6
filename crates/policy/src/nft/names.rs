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

/// The comment of a pod chain's final drop: the pod, the direction and the policies that
/// isolate it there, by name (they are all in the pod's namespace), as many as fit in 128
/// bytes and a count of the rest: `comment "shop/db-2 ingress: isolated by default-deny,
/// db-deny"`, `… isolated by a, b, +3 more`. Diagnostics read it back ([`RuleComment`]):
/// the chain name may be hashed, the comment is what names the pod and its policies.
pub fn drop_comment(pod: &ObjectKey, direction: &str, isolated_by: &[ObjectKey]) -> String {
    let names: Vec<String> = isolated_by
        .iter()
        .map(|p| {
            if p.namespace == pod.namespace {
                p.name.to_string()
            } else {
                p.to_string()
            }
        })
        .collect();
    if names.is_empty() {
        return comment(&format!("{pod} {direction}"));
    }
    let mut text = format!("{pod} {direction}: isolated by ");
    let mut shown = 0;
    for (i, name) in names.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let rest = names.len() - i - 1;
        let tail = if rest > 0 {
            format!(", +{rest} more")
        } else {
            String::new()
        };
        if text.len() + sep.len() + name.len() + tail.len() > MAX_COMMENT {
            break;
        }
        text.push_str(sep);
        text.push_str(name);
        shown += 1;
    }
    match shown {
        // The first name did not fit with the count behind it: the count alone.
        0 => text = format!("{pod} {direction}: isolated by {} policies", names.len()),
        n if n < names.len() => text.push_str(&format!(", +{} more", names.len() - n)),
        _ => {}
    }
    comment(&text)
}

/// A rule comment of this table read back: what `weir trace` says when a packet meets the
/// rule. The inverse of [`comment`] on the texts [`super::ruleset`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleComment {
    /// `ns/policy`: an allow rule of that policy.
    Allow { policy: String },
    /// `ns/pod itself`: the pod's own addresses ("a pod cannot block access to itself").
    Itself { pod: String },
    /// The final drop of a pod chain: `ns/pod ingress: isolated by a, b, +2 more`.
    Drop {
        pod: String,
        /// `ingress` or `egress`.
        direction: String,
        /// The isolating policies the comment names, as `namespace/name`.
        isolated_by: Vec<String>,
        /// How many more isolate it than the comment could name.
        more: usize,
        /// The comment was cut at 128 bytes (`...`): the list may be incomplete.
        cut: bool,
    },
}

impl RuleComment {
    /// Reads a comment's text (without `comment "…"`). `None`: not one this table writes.
    pub fn parse(text: &str) -> Option<RuleComment> {
        let (text, cut) = match text.strip_suffix("...") {
            Some(t) if text.len() >= MAX_COMMENT => (t, true),
            _ => (text, false),
        };
        let Some((pod, rest)) = text.split_once(' ') else {
            return text.contains('/').then(|| RuleComment::Allow {
                policy: text.into(),
            });
        };
        if !pod.contains('/') {
            return None;
        }
        if rest == "itself" {
            return Some(RuleComment::Itself { pod: pod.into() });
        }
        let (direction, list) = match rest.split_once(':') {
            Some((d, l)) => (d, l.trim_start().strip_prefix("isolated by ")),
            None => (rest, None),
        };
        if direction != "ingress" && direction != "egress" {
            return None;
        }
        let namespace = pod.split('/').next().unwrap_or_default();
        let (mut isolated_by, mut more) = (Vec::new(), 0);
        let list = list.unwrap_or_default();
        for item in list.split(", ").filter(|i| !i.is_empty()) {
            let count = item
                .strip_prefix('+')
                .and_then(|i| i.strip_suffix(" more"))
                .or_else(|| item.strip_suffix(" policies"));
            match count.and_then(|n| n.parse::<usize>().ok()) {
                Some(n) => more += n,
                None if item.contains('/') => isolated_by.push(item.to_string()),
                None => isolated_by.push(format!("{namespace}/{item}")),
            }
        }
        // A name cut in the middle is not a policy's name.
        if cut && !list.is_empty() && !list.ends_with(" more") && !list.ends_with(" policies") {
            isolated_by.pop();
        }
        Some(RuleComment::Drop {
            pod: pod.into(),
            direction: direction.into(),
            isolated_by,
            more,
            cut,
        })
    }
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

    fn comment_text(c: &str) -> &str {
        c.strip_prefix("comment \"")
            .and_then(|c| c.strip_suffix('"'))
            .unwrap()
    }

    #[test]
    fn drop_comments_name_the_isolating_policies_within_128_bytes_and_read_back() {
        let pod = ObjectKey::new("shop", "db-2");
        let keys = |names: &[&str]| -> Vec<ObjectKey> {
            names.iter().map(|n| ObjectKey::new("shop", n)).collect()
        };
        let two = drop_comment(&pod, "ingress", &keys(&["default-deny", "db-deny"]));
        assert_eq!(
            two,
            "comment \"shop/db-2 ingress: isolated by default-deny, db-deny\""
        );
        assert_eq!(
            RuleComment::parse(comment_text(&two)),
            Some(RuleComment::Drop {
                pod: "shop/db-2".into(),
                direction: "ingress".into(),
                isolated_by: vec!["shop/default-deny".into(), "shop/db-deny".into()],
                more: 0,
                cut: false,
            })
        );
        // Twenty long names: as many as fit, then the count of the rest.
        let many: Vec<String> = (0..20).map(|i| format!("allow-from-team-{i:02}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let c = drop_comment(&pod, "egress", &keys(&many));
        let text = comment_text(&c);
        assert!(text.len() <= MAX_COMMENT, "{text}");
        let Some(RuleComment::Drop {
            isolated_by,
            more,
            cut,
            ..
        }) = RuleComment::parse(text)
        else {
            panic!("{text}")
        };
        assert!(!cut && !isolated_by.is_empty(), "{text}");
        assert_eq!(isolated_by.len() + more, 20, "{text}");
        assert_eq!(isolated_by[0], "shop/allow-from-team-00");
        // A name too long for even one: the count alone.
        let long = "p".repeat(120);
        let c = drop_comment(&pod, "ingress", &keys(&[&long]));
        assert_eq!(c, "comment \"shop/db-2 ingress: isolated by 1 policies\"");
        let Some(RuleComment::Drop { more: 1, .. }) = RuleComment::parse(comment_text(&c)) else {
            panic!("{c}")
        };
        // No policy given (hand-made plans): the pod and direction, as before.
        assert_eq!(
            drop_comment(&pod, "ingress", &[]),
            "comment \"shop/db-2 ingress\""
        );
        assert_eq!(
            RuleComment::parse("shop/web-from-lb"),
            Some(RuleComment::Allow {
                policy: "shop/web-from-lb".into()
            })
        );
        assert_eq!(
            RuleComment::parse("shop/web-0 itself"),
            Some(RuleComment::Itself {
                pod: "shop/web-0".into()
            })
        );
        assert_eq!(RuleComment::parse("kube-proxy something"), None);
        assert_eq!(RuleComment::parse("shop/x sideways"), None);
    }

    #[test]
    fn a_drop_comment_cut_at_128_bytes_reads_back_as_cut() {
        // A pod name so long that nft's limit cuts the comment itself.
        let pod = ObjectKey::new("shop", &"w".repeat(110));
        let c = drop_comment(&pod, "ingress", &[ObjectKey::new("shop", "deny-all")]);
        let text = comment_text(&c);
        assert_eq!(text.len(), MAX_COMMENT);
        let Some(RuleComment::Drop {
            cut: true,
            isolated_by,
            direction,
            ..
        }) = RuleComment::parse(text)
        else {
            panic!("{text}")
        };
        assert_eq!(direction, "ingress");
        assert!(isolated_by.is_empty(), "{isolated_by:?}");
    }
}
