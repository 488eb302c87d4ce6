use std::collections::VecDeque;
use std::sync::Arc;

use super::*;
use crate::key::ObjectKey;
use crate::model::Protocol;
use crate::plan::{AllowRule, L4Match, PeerMatch, PodProgram, PortMatch, Program};

/// Records every script; fails the applies it is told to; answers listings from a queue
/// (or "no table").
#[derive(Default)]
struct FakeNft {
    scripts: Vec<String>,
    fail: VecDeque<bool>,
    listings: VecDeque<Option<String>>,
}

impl Nft for FakeNft {
    fn apply(&mut self, script: &str) -> Result<(), Error> {
        self.scripts.push(script.to_string());
        if self.fail.pop_front().unwrap_or(false) {
            return Err(Error::Rejected("Error: Could not process rule".into()));
        }
        Ok(())
    }
    fn list_table(&mut self) -> Result<Option<String>, Error> {
        Ok(self.listings.pop_front().flatten())
    }
}

/// A plan for node n1: each pod isolated for ingress, allowing TCP `port` from anywhere.
fn plan(pods: &[(&str, &str, u16)]) -> PolicyPlan {
    let mut plan = PolicyPlan {
        node: "n1".into(),
        ..Default::default()
    };
    for (name, ip, port) in pods {
        let key = ObjectKey::new("shop", name);
        let rule = AllowRule {
            policy: ObjectKey::new("shop", "allow"),
            peers: PeerMatch::Any,
            ports: PortMatch::Only(vec![L4Match {
                protocol: Protocol::Tcp,
                ports: Some((*port, *port)),
            }]),
        };
        let program = PodProgram {
            ips: vec![ip.parse().unwrap()],
            ingress: Some(Program {
                isolated_by: vec![ObjectKey::new("shop", "allow")],
                rules: vec![Arc::new(rule)],
            }),
            egress: None,
        };
        plan.pods.insert(key, Arc::new(program));
    }
    plan
}

/// The table `ruleset` renders to, as `nft -j list table` prints it (the parts read).
fn listing(ruleset: &Ruleset) -> String {
    let state = TableState::expected(ruleset);
    let mut items = vec![serde_json::json!({"metainfo": {"version": "1.0.6"}})];
    items.push(serde_json::json!({"table": {"family": "inet", "name": TABLE}}));
    for (name, elements) in &state.maps {
        let elem: Vec<serde_json::Value> = elements
            .iter()
            .map(|(ip, chain)| serde_json::json!([ip.to_string(), {"jump": {"target": chain}}]))
            .collect();
        let mut map =
            serde_json::json!({"family": "inet", "table": TABLE, "name": name, "map": "verdict"});
        if !elem.is_empty() {
            map["elem"] = elem.into();
        }
        items.push(serde_json::json!({ "map": map }));
    }
    for (name, rules) in &state.chains {
        items.push(serde_json::json!({"chain": {"family": "inet", "table": TABLE, "name": name}}));
        for _ in 0..*rules {
            items.push(serde_json::json!({"rule": {"family": "inet", "table": TABLE, "chain": name, "expr": []}}));
        }
    }
    serde_json::json!({ "nftables": items }).to_string()
}

#[test]
fn the_first_sync_writes_the_table_later_ones_the_diff_and_nothing_when_equal() {
    let mut b = NftBackend::with_nft(FakeNft::default());
    let one = plan(&[("a", "10.0.0.1", 80)]);
    let r = b.sync(&one).unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert_eq!((r.chains, r.chains_written), (1, 1));
    // forward 6 + input 4 + the pod chain (itself, the port, the drop).
    assert_eq!(r.rules, 10 + 3);
    assert_eq!(b.nft().scripts, vec![nft::render(&one)]);
    assert!(b.nft().scripts[0].starts_with(
        "# NetworkPolicy for the pods on node n1.\ntable inet weir-policy\ndelete table inet weir-policy\n"
    ));

    let r = b.sync(&one).unwrap();
    assert_eq!((r.kind, r.script_bytes), (SyncKind::Noop, 0));
    assert_eq!(
        b.nft().scripts.len(),
        1,
        "nothing sent when nothing differs"
    );

    let two = plan(&[("a", "10.0.0.1", 81), ("b", "10.0.0.2", 80)]);
    let r = b.sync(&two).unwrap();
    assert_eq!((r.kind, r.chains_written), (SyncKind::Diff, 2));
    assert_eq!(b.nft().scripts[1], nft::render_diff(&one, &two));
    assert_eq!(b.applied(), Some(&Ruleset::from_plan(&two)));
}

#[test]
fn after_a_rejected_transaction_the_next_sync_writes_the_whole_table() {
    let mut b = NftBackend::with_nft(FakeNft::default());
    let one = plan(&[("a", "10.0.0.1", 80)]);
    let two = plan(&[("a", "10.0.0.1", 81)]);
    b.sync(&one).unwrap();
    b.nft_mut().fail.push_back(true);
    let e = b.sync(&two).unwrap_err();
    assert!(e.to_string().contains("the rules before it stay"), "{e}");
    assert_eq!(b.applied(), None);
    // The same plan again: not a diff against what may or may not be there, the table.
    let r = b.sync(&two).unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert_eq!(b.nft().scripts.last().unwrap(), &nft::render(&two));
    // A failed first sync too.
    let mut b = NftBackend::with_nft(FakeNft::default());
    b.nft_mut().fail.push_back(true);
    assert!(b.sync(&one).is_err());
    assert_eq!(b.sync(&one).unwrap().kind, SyncKind::Full);
}

#[test]
fn intact_compares_chains_rules_and_elements_with_what_was_written() {
    let mut b = NftBackend::with_nft(FakeNft::default());
    assert!(b.intact().unwrap(), "nothing written yet: nothing to check");
    let one = plan(&[("a", "10.0.0.1", 80), ("b", "10.0.0.2", 80)]);
    b.sync(&one).unwrap();
    let rs = Ruleset::from_plan(&one);

    b.nft_mut().listings.push_back(Some(listing(&rs)));
    assert!(b.intact().unwrap());

    // `nft flush ruleset`: no table.
    b.nft_mut().listings.push_back(None);
    assert!(!b.intact().unwrap());

    // A rule deleted from a pod chain.
    let mut fewer = rs.clone();
    let chain = fewer.chains.values_mut().next().unwrap();
    *chain = chain[..chain.len() - 1].into();
    b.nft_mut().listings.push_back(Some(listing(&fewer)));
    assert!(!b.intact().unwrap());

    // A map element deleted.
    let mut gone = rs.clone();
    gone.maps.get_mut(&VerdictMap::Ingress4).unwrap().clear();
    b.nft_mut().listings.push_back(Some(listing(&gone)));
    assert!(!b.intact().unwrap());

    // The base chain flushed (`nft flush table inet weir-policy`).
    let flushed = listing(&rs).replace(r#""chain":"forward","#, r#""chain":"elsewhere","#);
    b.nft_mut().listings.push_back(Some(flushed));
    assert!(!b.intact().unwrap());

    // After invalidate there is nothing to compare with.
    b.invalidate();
    assert!(b.intact().unwrap());
}

#[test]
fn cleanup_deletes_only_its_table_and_the_next_sync_is_full() {
    let mut b = NftBackend::with_nft(FakeNft::default());
    let one = plan(&[("a", "10.0.0.1", 80)]);
    b.sync(&one).unwrap();
    b.cleanup().unwrap();
    assert_eq!(
        b.nft().scripts.last().unwrap(),
        "table inet weir-policy\ndelete table inet weir-policy\n"
    );
    assert_eq!(b.sync(&one).unwrap().kind, SyncKind::Full);
}

/// What nft 1.0.6 printed for a small table (trimmed to one chain of each kind).
const LISTED: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "weir-policy", "handle": 1}}, {"map": {"family": "inet", "name": "ingress4", "table": "weir-policy", "type": "ipv4_addr", "handle": 3, "map": "verdict", "elem": [["10.0.0.1", {"jump": {"target": "ingress_a/b"}}]]}}, {"map": {"family": "inet", "name": "egress4", "table": "weir-policy", "type": "ipv4_addr", "handle": 4, "map": "verdict"}}, {"chain": {"family": "inet", "table": "weir-policy", "name": "forward", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}, {"chain": {"family": "inet", "table": "weir-policy", "name": "ingress_a/b", "handle": 2}}, {"rule": {"family": "inet", "table": "weir-policy", "chain": "forward", "handle": 5, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}}, {"rule": {"family": "inet", "table": "weir-policy", "chain": "forward", "handle": 6, "expr": [{"vmap": {"key": {"payload": {"protocol": "ip", "field": "daddr"}}, "data": "@ingress4"}}]}}, {"rule": {"family": "inet", "table": "weir-policy", "chain": "ingress_a/b", "handle": 9, "comment": "x/y", "expr": [{"accept": null}]}}, {"rule": {"family": "inet", "table": "weir-policy", "chain": "ingress_a/b", "handle": 10, "expr": [{"drop": null}]}}]}"#;

#[test]
fn reads_nfts_json_listing() {
    let state = TableState::from_json(LISTED).unwrap();
    assert_eq!(
        state.chains,
        BTreeMap::from([("forward".to_string(), 2), ("ingress_a/b".to_string(), 2)])
    );
    assert_eq!(
        state.maps["ingress4"],
        BTreeMap::from([("10.0.0.1".parse().unwrap(), "ingress_a/b".to_string())])
    );
    assert!(state.maps["egress4"].is_empty());
    assert!(TableState::from_json("not json").is_err());
}
