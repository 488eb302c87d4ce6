//! The `nft list ruleset` text reader against the real nft (root, `nft`, `unshare`): each
//! ruleset is loaded into a fresh network namespace (`unshare --net`: gone when the command
//! ends, nothing outside it touched) and listed three ways, `nft list ruleset`, `nft -a list
//! ruleset` and `nft -j list ruleset`. The text read by `nft_text::parse` must be the very model
//! `nft::parse` reads from the JSON (handles compared where `-a` prints them), and neither
//! reader may skip a line.
//!
//! The rulesets: kube-proxy's nftables mode (its verdict maps with element comments, `numgen`
//! vmaps, affinity sets, `fib`, reject), weir's own `inet weir` and `inet weir-policy` as their
//! renderers write them (the proxy's and the policy's goldens), a plain filter table (`ct
//! state`, anonymous sets, intervals, counters, `policy drop`, NAT of both families, log,
//! limit), and the other families (ip6, bridge, netdev).

mod common;

use serde_json::Value;
use weir_netdiag::nft::{self, Ruleset};
use weir_netdiag::nft_text;

/// A ruleset as nft lists it.
struct Listed {
    text: String,
    with_handles: String,
    json: String,
}

/// `script` loaded into a fresh network namespace and listed three ways; `setup` runs there
/// first (`iptables-nft` commands).
fn listed(script: &str, setup: &str) -> Listed {
    let mut parts = common::scratch::listings(
        setup,
        script,
        &[
            "nft list ruleset",
            "nft -a list ruleset",
            "nft -j list ruleset",
        ],
    )
    .into_iter();
    let mut next = || parts.next().unwrap();
    Listed {
        text: next(),
        with_handles: next(),
        json: next(),
    }
}

fn can_run() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["nft", "unshare"]))
}

/// Both readers' models of `l`, the version (only the JSON has it) left out; without handles
/// unless `handles`.
fn models(l: &Listed, handles: bool) -> (Value, Value) {
    let from_json = nft::parse(&l.json);
    assert!(from_json.skipped.is_empty(), "{:#?}", from_json.skipped);
    let text = if handles { &l.with_handles } else { &l.text };
    let from_text = nft_text::parse(text);
    assert!(
        from_text.skipped.is_empty(),
        "{:#?}\n{text}",
        from_text.skipped
    );
    let norm = |mut rs: Ruleset| {
        rs.version = None;
        if !handles {
            rs.rules.iter_mut().for_each(|r| r.handle = None);
        }
        rs
    };
    (
        serde_json::to_value(norm(from_text.value)).unwrap(),
        serde_json::to_value(norm(from_json.value)).unwrap(),
    )
}

/// The first difference between the two models, said plainly (a rule's text and both
/// expressions), or the whole models.
fn difference(text: &Value, json: &Value) -> String {
    for key in ["tables", "chains", "sets", "rules"] {
        let (a, b) = (&text[key], &json[key]);
        let (Some(a), Some(b)) = (a.as_array(), b.as_array()) else {
            continue;
        };
        if a.len() != b.len() {
            return format!(
                "{key}: {} from the text, {} from the JSON",
                a.len(),
                b.len()
            );
        }
        if let Some((x, y)) = a.iter().zip(b).find(|(x, y)| x != y) {
            return format!("{key} differ:\ntext: {x}\njson: {y}");
        }
    }
    format!("text: {text}\njson: {json}")
}

fn assert_same_model(name: &str, script: &str) {
    let l = listed(script, "");
    for handles in [false, true] {
        let (text, json) = models(&l, handles);
        assert!(
            text == json,
            "{name} (handles: {handles}): {}",
            difference(&text, &json)
        );
    }
    // Not an empty agreement: the ruleset has rules and the text reader read them.
    let rs = nft_text::parse(&l.text).value;
    assert!(!rs.rules.is_empty() && !rs.chains.is_empty(), "{name}");
}

#[test]
fn kube_proxy_nftables_mode_and_a_plain_filter_table_read_as_their_json() {
    if !can_run() {
        return;
    }
    assert_same_model(
        "kube-proxy + inet filter",
        include_str!("data/nft-text/kube-proxy-and-filter.nft"),
    );
}

#[test]
fn weirs_own_tables_read_as_their_json() {
    if !can_run() {
        return;
    }
    // What weir's renderers write, as their golden files hold it.
    assert_same_model(
        "inet weir v1",
        include_str!("../../proxy/tests/golden/v1.nft"),
    );
    assert_same_model(
        "inet weir v2",
        include_str!("../../proxy/tests/golden/v2.nft"),
    );
    assert_same_model(
        "inet weir-policy",
        include_str!("../../policy/tests/golden/after.nft"),
    );
}

#[test]
fn every_family_and_statement_form_reads_as_its_json() {
    if !can_run() {
        return;
    }
    assert_same_model("families", include_str!("data/nft-text/families.nft"));
}

/// iptables-nft's rules: nft prints its xtables matches translated in the text and opaque in
/// the JSON. Every rule the JSON reads natively is read the same from the text; the others
/// are read as the translation says (what the walk then evaluates), and what nft cannot
/// translate stays an `xt` expression in both.
#[test]
fn iptables_nft_rules_read_as_their_translation() {
    if !can_run() {
        return;
    }
    let setup = "iptables-nft -P FORWARD DROP
iptables-nft -N KUBE-FORWARD
iptables-nft -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
iptables-nft -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
iptables-nft -A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
iptables-nft -A FORWARD -s 10.0.0.0/8 -i eth0 -o cni0 -j ACCEPT
iptables-nft -A FORWARD -m physdev --physdev-is-bridged -j ACCEPT";
    let l = listed("", setup);
    let text = nft_text::parse(&l.text);
    assert!(text.skipped.is_empty(), "{:#?}", text.skipped);
    let json = nft::parse(&l.json).value;
    assert_eq!(text.value.rules.len(), json.rules.len());
    let mut translated = 0;
    for (t, j) in text.value.rules.iter().zip(&json.rules) {
        if j.uses_xt && !t.uses_xt {
            translated += 1;
        } else {
            assert_eq!(t.expr, j.expr, "{}", t.text);
        }
    }
    // The comment and conntrack matches are translated; physdev is not (xt in both).
    assert_eq!(translated, 2, "{}", l.text);
    assert!(text
        .value
        .rules
        .iter()
        .any(|r| r.text == "ct state related,established counter accept"));
    assert!(text.value.rules.iter().any(|r| r.uses_xt));
}
