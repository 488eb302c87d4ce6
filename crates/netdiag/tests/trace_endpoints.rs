//! Every endpoint of a load-balancing choice is walked (issue 22, item 2): an iptables
//! `statistic` cascade, an nft `numgen` map, vmap or rule cascade, IPVS real servers. The
//! verdict is delivered only when every endpoint's is; otherwise it counts them and names the
//! failing ones, with each endpoint's outcome in `endpoint_outcomes` (the text, `--json` and
//! the SVG). Before, the walk followed the first option only and said "delivered" for a
//! service whose other endpoint times out.

mod common;

use std::collections::BTreeMap;

use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::trace::{self, EndpointOutcome, Trace, Verdict};

use common::{data_dir as dir, walk};

/// Pod a1 (10.12.192.18) → the LoadBalancer IP of `api` (10.12.115.101:443), whose endpoints
/// are a2 (10.12.192.19, node a) and b1 (10.12.192.34, node b): a kube-proxy `statistic`
/// cascade on the eni-shared lab node a (a1's veth: `veth`, the fixtures' lab runs named it
/// differently).
fn pod_a1_to_api_lb(st: &NodeState, veth: &str) -> Trace {
    walk(st, "10.12.192.18", "10.12.115.101", 443, veth)
}

fn outcomes(t: &Trace) -> BTreeMap<&str, &EndpointOutcome> {
    t.endpoint_outcomes
        .iter()
        .map(|e| (e.endpoint.as_str(), e))
        .collect()
}

/// With the fix off, the endpoint on this node answers (pod to pod on node a, no ENI) and the
/// one on node b does not: its SYN leaves eth1 masqueraded to eth0's address and strict
/// rp_filter on eth0 drops the SYN-ACK. The first option is the one that works, so the walk
/// used to answer "delivered".
#[test]
fn eni_fix_off_lb_ip_one_endpoint_delivered_the_other_dropped_by_rp_filter() {
    let (st, _) = NodeState::from_dir(&dir("lab-eni-a-fix-off")).unwrap();
    let t = pod_a1_to_api_lb(&st, "eni69381f0634bc");
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert_eq!(
        t.endpoint_outcomes
            .iter()
            .map(|e| e.endpoint.as_str())
            .collect::<Vec<_>>(),
        ["10.12.192.19:8080", "10.12.192.34:8080"]
    );
    let by = outcomes(&t);
    let a2 = by["10.12.192.19:8080"];
    assert_eq!(a2.verdict, Verdict::Delivered, "{:?}", a2.cause);
    assert_eq!(a2.egress.as_ref().unwrap().dst.to_string(), "10.12.192.19");
    let b1 = by["10.12.192.34:8080"];
    assert_eq!(b1.verdict, Verdict::Dropped);
    let cause = b1.cause.as_deref().unwrap();
    assert!(
        cause.starts_with("reply routing: strict reverse-path filter on eth0 drops 10.12.192.34"),
        "{cause}"
    );
    assert!(
        b1.fixes[0].contains("give eth1 an IPv4 address"),
        "{:?}",
        b1.fixes
    );
    assert_eq!(b1.egress.as_ref().unwrap().dst.to_string(), "10.12.192.34");
    assert_eq!(b1.egress.as_ref().unwrap().oif.as_deref(), Some("eth1"));
    // The verdict counts and names the failing endpoint; the path shown is its walk.
    let cause = t.cause.as_deref().unwrap();
    assert!(
        cause.starts_with(
            "1 of 2 endpoints delivered; 10.12.192.34:8080: DROPPED: reply routing: strict reverse-path filter on eth0"
        ),
        "{cause}"
    );
    assert!(t.fixes[0].contains("give eth1 an IPv4 address"));
    assert!(t
        .hops
        .iter()
        .any(|h| h.note.contains("DNAT to 10.12.192.34:8080")));
    assert!(t.choices[0].ends_with(": each walked"), "{:?}", t.choices);
    // Text.
    let text = trace::render(&t);
    assert!(text.contains("endpoints: 1 of 2 delivered\n"), "{text}");
    assert!(
        text.contains("  10.12.192.19:8080      delivered\n"),
        "{text}"
    );
    assert!(
        text.contains("  10.12.192.34:8080      DROPPED: reply routing: strict reverse-path"),
        "{text}"
    );
    assert!(text.contains("(the hops above are the walk to 10.12.192.34:8080)"));
    assert!(text.contains("verdict: DROPPED: 1 of 2 endpoints delivered; 10.12.192.34:8080"));
    // JSON: the existing fields stay, and the per-endpoint list is there.
    let v = serde_json::to_value(&t).unwrap();
    for f in [
        "verdict",
        "cause",
        "fixes",
        "choices",
        "endpoints",
        "egress",
        "hops",
    ] {
        assert!(v.get(f).is_some(), "{f}");
    }
    assert_eq!(v["verdict"], "dropped");
    let list = v["endpoint_outcomes"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["endpoint"], "10.12.192.19:8080");
    assert_eq!(list[0]["verdict"], "delivered");
    assert_eq!(list[1]["endpoint"], "10.12.192.34:8080");
    assert_eq!(list[1]["verdict"], "dropped");
    assert_eq!(list[1]["egress"]["oif"], "eth1");
    assert!(list[1]["hops"].as_array().unwrap().len() > 3);
    // SVG: a line per endpoint, green for the delivered one, red for the dropped one.
    let svg = trace::svg(&t);
    assert!(svg.contains("endpoints: 1 of 2 delivered"));
    assert!(svg.contains("fill=\"#2e7d32\" class=\"endpoint\">10.12.192.19:8080: delivered</text>"));
    assert!(svg
        .contains("fill=\"#c0392b\" class=\"endpoint\">10.12.192.34:8080: DROPPED: reply routing"));
}

/// With weir's fix, both endpoints answer.
#[test]
fn eni_fix_on_lb_ip_both_endpoints_delivered() {
    let (st, _) = NodeState::from_dir(&dir("lab-eni-a-fix-on")).unwrap();
    let t = pod_a1_to_api_lb(&st, "eniccaff4a074a3");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoint_outcomes.len(), 2);
    assert!(t
        .endpoint_outcomes
        .iter()
        .all(|e| e.verdict == Verdict::Delivered && e.cause.is_none()));
    assert!(trace::render(&t).contains("endpoints: 2 of 2 delivered\n"));
}

/// Without the sysctls each endpoint's walk is conditional on its own facts: node a's pod
/// needs forwarding only, node b's also depends on rp_filter on eth0. The overall verdict is
/// conditional, its failing branches counting the endpoints.
#[test]
fn without_sysctls_each_endpoint_is_conditional_on_its_own_facts() {
    let (mut st, _) = NodeState::from_dir(&dir("lab-eni-a-fix-off")).unwrap();
    st.sysctls = None;
    let t = pod_a1_to_api_lb(&st, "eni69381f0634bc");
    assert_eq!(t.verdict, Verdict::Conditional);
    let by = outcomes(&t);
    let a2 = by["10.12.192.19:8080"];
    let b1 = by["10.12.192.34:8080"];
    assert_eq!(a2.verdict, Verdict::Conditional);
    assert_eq!(b1.verdict, Verdict::Conditional);
    let when = |e: &EndpointOutcome, v: Verdict| -> Vec<String> {
        e.branches
            .iter()
            .filter(|b| b.verdict == v)
            .map(|b| b.when_text.clone())
            .collect()
    };
    // a2: delivered exactly when forwarding is on; rp_filter does not enter.
    assert_eq!(
        when(a2, Verdict::Delivered),
        ["net.ipv4.ip_forward is 1"],
        "{:?}",
        a2.branches
    );
    assert!(a2
        .branches
        .iter()
        .all(|b| !b.when_text.contains("rp_filter")));
    // b1: delivered only with rp_filter off or loose on eth0 (and forwarding on).
    let ok = when(b1, Verdict::Delivered).join("; ");
    assert!(
        ok.contains("rp_filter on eth0 is 0 (off) or 2 (loose)"),
        "{ok}"
    );
    assert!(b1.branches.iter().any(|b| b.verdict == Verdict::Dropped
        && b.when_text.contains("rp_filter on eth0 is 1 (strict)")
        && b.cause
            .as_deref()
            .unwrap()
            .contains("strict reverse-path filter on eth0")));
    assert!(!b1.delivered() && !a2.delivered());
    // Overall: delivered only where both are; strict rp_filter fails b1 alone.
    let strict = t
        .branches
        .iter()
        .find(|b| b.when_text.contains("rp_filter on eth0 is 1 (strict)"))
        .unwrap_or_else(|| panic!("{:#?}", t.branches));
    assert_eq!(strict.verdict, Verdict::Dropped);
    assert!(strict
        .cause
        .as_deref()
        .unwrap()
        .starts_with("1 of 2 endpoints delivered; 10.12.192.34:8080: DROPPED: reply routing"));
    assert!(t.branches.iter().any(|b| b.verdict == Verdict::Delivered));
    let text = trace::render(&t);
    assert!(
        text.contains(
            "endpoints: 0 of 2 delivered whatever the dump does not say, 2 conditional\n"
        ),
        "{text}"
    );
}

fn nft_node(rules: &[String], maps: &[&str]) -> NodeState {
    let mut items = vec![
        r#"{"table":{"family":"inet","name":"weir"}}"#.to_string(),
        r#"{"chain":{"family":"inet","table":"weir","name":"nat-prerouting","type":"nat","hook":"prerouting","prio":-100,"policy":"accept"}}"#.into(),
        r#"{"chain":{"family":"inet","table":"weir","name":"aff-chain"}}"#.into(),
        r#"{"chain":{"family":"inet","table":"weir","name":"ep-a"}}"#.into(),
        r#"{"chain":{"family":"inet","table":"weir","name":"ep-b"}}"#.into(),
    ];
    items.extend(maps.iter().map(|m| m.to_string()));
    items.extend(rules.iter().cloned());
    let json = format!(r#"{{"nftables":[{}]}}"#, items.join(","));
    // 10.244.0.0/24 is local; 10.244.9.0/24 is blackholed (a node gone, its routes left).
    let routes = "10.244.0.0/24 dev cni0 proto kernel scope link src 10.244.0.1
blackhole 10.244.9.0/24
192.168.0.0/24 dev eth0 proto kernel scope link src 192.168.0.1
";
    let st = NodeState::from_outputs([
        (Output::NftRuleset, json),
        (Output::IpRoute, routes.to_string()),
        (Output::Sysctl, "net.ipv4.ip_forward = 1\n".to_string()),
    ]);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    st
}

fn rule(chain: &str, expr: &str) -> String {
    format!(r#"{{"rule":{{"family":"inet","table":"weir","chain":"{chain}","expr":[{expr}]}}}}"#)
}

fn dnat(ip: &str) -> String {
    format!(r#"{{"dnat":{{"family":"ip","addr":"{ip}","port":8080}}}}"#)
}

fn daddr_is(ip: &str) -> String {
    format!(
        r#"{{"match":{{"op":"==","left":{{"payload":{{"protocol":"ip","field":"daddr"}}}},"right":"{ip}"}}}}"#
    )
}

fn failing(t: &Trace) -> Vec<(String, Verdict)> {
    t.endpoint_outcomes
        .iter()
        .filter(|e| !e.delivered())
        .map(|e| (e.endpoint.clone(), e.verdict.clone()))
        .collect()
}

/// weir's nft shapes: a `dnat to … numgen … map @m` whose second element is behind a
/// blackhole route, a `numgen random mod 2 == 0` rule cascade (affinity chains) whose
/// fallback is, and a `numgen … vmap` whose second chain is. Each second option is walked
/// and fails; the first options were all the walk saw before.
#[test]
fn nft_numgen_map_cascade_and_vmap_walk_every_option() {
    let map = r#"{"map":{"family":"inet","name":"ep4tcp","table":"weir","type":["ipv4_addr","inet_proto","inet_service","integer"],"map":"ipv4_addr . inet_service","elem":[[{"concat":["10.96.0.10","tcp",80,0]},{"concat":["10.244.0.10",8080]}],[{"concat":["10.96.0.10","tcp",80,1]},{"concat":["10.244.9.11",8080]}]]}}"#;
    let numgen_eq = |k: u32| {
        format!(
            r#"{{"match":{{"op":"==","left":{{"numgen":{{"mode":"random","mod":2,"offset":0}}}},"right":{k}}}}}"#
        )
    };
    let rules = [
        rule(
            "nat-prerouting",
            &format!(
                r#"{},{{"goto":{{"target":"aff-chain"}}}}"#,
                daddr_is("10.96.0.11")
            ),
        ),
        rule(
            "nat-prerouting",
            &format!(
                r#"{},{{"vmap":{{"key":{{"numgen":{{"mode":"random","mod":2,"offset":0}}}},"data":{{"set":[[0,{{"goto":{{"target":"ep-a"}}}}],[1,{{"goto":{{"target":"ep-b"}}}}]]}}}}}}"#,
                daddr_is("10.96.0.12")
            ),
        ),
        rule(
            "nat-prerouting",
            r#"{"dnat":{"family":"ip","addr":{"map":{"key":{"concat":[{"payload":{"protocol":"ip","field":"daddr"}},{"meta":{"key":"l4proto"}},{"payload":{"protocol":"tcp","field":"dport"}},{"numgen":{"mode":"random","mod":2,"offset":0}}]},"data":"@ep4tcp"}}}}"#,
        ),
        rule(
            "aff-chain",
            &format!("{},{}", numgen_eq(0), dnat("10.244.0.21")),
        ),
        rule("aff-chain", &dnat("10.244.9.20")),
        rule("ep-a", &dnat("10.244.0.30")),
        rule("ep-b", &dnat("10.244.9.31")),
    ];
    let st = nft_node(&rules, &[map]);
    for (vip, ok, bad) in [
        ("10.96.0.10", "10.244.0.10:8080", "10.244.9.11:8080"),
        ("10.96.0.11", "10.244.0.21:8080", "10.244.9.20:8080"),
        ("10.96.0.12", "10.244.0.30:8080", "10.244.9.31:8080"),
    ] {
        let t = walk(&st, "192.168.0.99", vip, 80, "eth0");
        assert_eq!(t.verdict, Verdict::Dropped, "{vip}: {:?}", t.cause);
        let names: Vec<&str> = t
            .endpoint_outcomes
            .iter()
            .map(|e| e.endpoint.as_str())
            .collect();
        assert_eq!(names, [ok, bad], "{vip}");
        assert_eq!(failing(&t), [(bad.to_string(), Verdict::Dropped)], "{vip}");
        let cause = t.cause.as_deref().unwrap();
        assert!(
            cause.starts_with(&format!("1 of 2 endpoints delivered; {bad}: DROPPED: ")),
            "{vip}: {cause}"
        );
        assert!(cause.contains("blackhole"), "{vip}: {cause}");
        assert!(t
            .hops
            .iter()
            .any(|h| h.note.contains(&format!("DNAT to {bad}"))));
    }
}

/// A kube-proxy `statistic` cascade of three: the middle option (reached only by skipping
/// the first rule's probability and taking the second's) is the one behind a blackhole.
#[test]
fn iptables_statistic_cascade_walks_the_middle_option_too() {
    let save = "*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-1 - [0:0]
:KUBE-SEP-2 - [0:0]
:KUBE-SEP-3 - [0:0]
-A PREROUTING -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-1
-A KUBE-SVC-A -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-2
-A KUBE-SVC-A -j KUBE-SEP-3
-A KUBE-SEP-1 -p tcp -m tcp -j DNAT --to-destination 10.244.0.21:8080
-A KUBE-SEP-2 -p tcp -m tcp -j DNAT --to-destination 10.244.9.20:8080
-A KUBE-SEP-3 -p tcp -m tcp -j DNAT --to-destination 10.244.0.22:8080
COMMIT
";
    let routes = "10.244.0.0/24 dev cni0 proto kernel scope link src 10.244.0.1
blackhole 10.244.9.0/24
192.168.0.0/24 dev eth0 proto kernel scope link src 192.168.0.1
";
    let st = NodeState::from_outputs([
        (Output::IptablesSave, save.to_string()),
        (Output::IpRoute, routes.to_string()),
        (Output::Sysctl, "net.ipv4.ip_forward = 1\n".to_string()),
    ]);
    let t = walk(&st, "192.168.0.99", "10.96.0.11", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    let names: Vec<&str> = t
        .endpoint_outcomes
        .iter()
        .map(|e| e.endpoint.as_str())
        .collect();
    assert_eq!(
        names,
        ["10.244.0.21:8080", "10.244.9.20:8080", "10.244.0.22:8080"]
    );
    assert_eq!(
        failing(&t),
        [("10.244.9.20:8080".to_string(), Verdict::Dropped)]
    );
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .starts_with("2 of 3 endpoints delivered; 10.244.9.20:8080: DROPPED: "));
    // The third option's walk went through KUBE-SEP-3, not KUBE-SEP-1.
    let third = &t.endpoint_outcomes[2];
    assert!(third
        .hops
        .iter()
        .any(|h| h.rule.as_deref().unwrap_or("").contains("-j KUBE-SEP-3")));
    assert!(!third
        .hops
        .iter()
        .any(|h| h.rule.as_deref().unwrap_or("").contains("KUBE-SEP-1")));
}

/// IPVS: a real server added behind a blackhole route on the collected ipvs node; the
/// scheduler's other two real servers still answer.
#[test]
fn ipvs_real_servers_are_each_walked() {
    let (mut st, _) = NodeState::from_dir(&dir("ipvs-node")).unwrap();
    let t = walk(&st, "10.0.0.2", "10.96.0.10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoint_outcomes.len(), 2);
    let ipvs = st.ipvs.take().unwrap().replacen(
        "TCP  10.96.0.10:80 rr\n",
        "TCP  10.96.0.10:80 rr\n  -> 10.244.9.5:8080              Masq    1      0          0\n",
        1,
    );
    st.ipvs = Some(ipvs);
    let t = walk(&st, "10.0.0.2", "10.96.0.10", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped, "{:?}", t.cause);
    assert_eq!(
        t.endpoint_outcomes
            .iter()
            .map(|e| (e.endpoint.as_str(), e.verdict.clone()))
            .collect::<Vec<_>>(),
        [
            ("10.244.9.5:8080", Verdict::Dropped),
            ("10.244.1.11:8080", Verdict::Delivered),
            ("10.244.2.12:8080", Verdict::Delivered),
        ]
    );
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .starts_with("2 of 3 endpoints delivered; 10.244.9.5:8080: DROPPED: "));
}

/// One endpoint: no list, the verdict as before.
#[test]
fn a_single_endpoint_has_no_per_endpoint_list() {
    let (st, _) = NodeState::from_dir(&dir("lab-eni-a-fix-off")).unwrap();
    let t = walk(
        &st,
        "10.12.192.18",
        "10.12.115.102",
        8443,
        "eni69381f0634bc",
    );
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(t.endpoint_outcomes.is_empty());
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .starts_with("reply routing: strict reverse-path filter on eth0"));
}

fn iptables_node(save: &str) -> NodeState {
    let routes = "10.244.0.0/24 dev cni0 proto kernel scope link src 10.244.0.1
blackhole 10.244.9.0/24
192.168.0.0/24 dev eth0 proto kernel scope link src 192.168.0.1
";
    NodeState::from_outputs([
        (Output::IptablesSave, save.to_string()),
        (Output::IpRoute, routes.to_string()),
        (Output::Sysctl, "net.ipv4.ip_forward = 1\n".to_string()),
    ])
}

/// A choice inside a choice (a cascade whose option jumps to another cascade): every
/// combination is walked, each named by both choices.
#[test]
fn a_choice_after_a_choice_walks_every_combination() {
    let save = "*nat
:PREROUTING ACCEPT [0:0]
:SVC - [0:0]
:INNER - [0:0]
:SEP-1 - [0:0]
:SEP-2 - [0:0]
:SEP-3 - [0:0]
-A PREROUTING -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -j SVC
-A SVC -m statistic --mode random --probability 0.5 -j INNER
-A SVC -j SEP-3
-A INNER -m statistic --mode random --probability 0.5 -j SEP-1
-A INNER -j SEP-2
-A SEP-1 -p tcp -j DNAT --to-destination 10.244.0.21:8080
-A SEP-2 -p tcp -j DNAT --to-destination 10.244.9.22:8080
-A SEP-3 -p tcp -j DNAT --to-destination 10.244.0.23:8080
COMMIT
";
    let t = walk(
        &iptables_node(save),
        "192.168.0.99",
        "10.96.0.11",
        80,
        "eth0",
    );
    let got: Vec<(&str, Verdict)> = t
        .endpoint_outcomes
        .iter()
        .map(|e| (e.endpoint.as_str(), e.verdict.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("INNER then 10.244.0.21:8080", Verdict::Delivered),
            ("INNER then 10.244.9.22:8080", Verdict::Dropped),
            ("10.244.0.23:8080", Verdict::Delivered),
        ]
    );
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .starts_with("2 of 3 endpoints delivered; INNER then 10.244.9.22:8080: DROPPED: "));
}

/// More than 32 endpoints: the first 32 are walked, and that is said.
#[test]
fn more_than_32_endpoints_are_cut_and_said() {
    let mut save = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n");
    for i in 0..40 {
        save.push_str(&format!(":SEP-{i} - [0:0]\n"));
    }
    save.push_str("-A PREROUTING -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -j SVC\n");
    for i in 0..40 {
        let stat = if i < 39 {
            format!(
                "-m statistic --mode random --probability {:.5} ",
                1.0 / (40 - i) as f64
            )
        } else {
            String::new()
        };
        save.push_str(&format!("-A SVC {stat}-j SEP-{i}\n"));
    }
    for i in 0..40 {
        save.push_str(&format!(
            "-A SEP-{i} -p tcp -j DNAT --to-destination 10.244.0.{}:8080\n",
            i + 10
        ));
    }
    save.push_str("COMMIT\n");
    let t = walk(
        &iptables_node(&save),
        "192.168.0.99",
        "10.96.0.11",
        80,
        "eth0",
    );
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.endpoint_outcomes.len(), 32);
    assert_eq!(t.endpoint_outcomes[31].endpoint, "10.244.0.41:8080");
    assert!(t
        .assumptions
        .iter()
        .any(|a| a == "more than 32 endpoints to choose from: only the first 32 walked"));
    assert_eq!(t.endpoints.len(), 40);
}
