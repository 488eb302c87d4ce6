//! trace over weir's NetworkPolicy table, without a kernel: node n1 of weir-policy's golden
//! (`crates/policy/tests/golden/before.nft`) as `weir trace collect` saved it
//! (`tests/data/policy-node`, recaptured by its `capture.sh`). Each walk must name the
//! policy that allowed the packet, or the pod whose isolation dropped it and the policies
//! isolating it; replies of allowed connections pass. A root test checks that the fixture is
//! still what the golden loads to.

mod common;

use common::{data_dir, walk};
use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::trace::{self, Packet, PolicyDecision, PolicyVerdict, Proto, Verdict};

fn node() -> NodeState {
    NodeState::from_dir(&data_dir("policy-node")).unwrap().0
}

/// (direction, pod, verdict, allowing policy) of each decision, in the walk's order.
fn decisions(t: &trace::Trace) -> Vec<(String, String, PolicyVerdict, String)> {
    t.policy
        .iter()
        .map(|d: &PolicyDecision| {
            (
                d.direction.clone(),
                d.pod.clone().unwrap_or_default(),
                d.verdict,
                d.allowed_by.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn d(
    direction: &str,
    pod: &str,
    verdict: PolicyVerdict,
    by: &str,
) -> (String, String, PolicyVerdict, String) {
    (direction.into(), pod.into(), verdict, by.into())
}

#[test]
fn ingress_allowed_by_the_policy_whose_rule_matched() {
    // lb-0 (on n2) → web-0's named port http (8080): web-from-lb's rule.
    let t = walk(&node(), "10.0.1.1", "10.0.0.1", 8080, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(
        decisions(&t),
        [
            d("egress", "", PolicyVerdict::NotIsolated, ""),
            d(
                "ingress",
                "shop/web-0",
                PolicyVerdict::Allowed,
                "shop/web-from-lb"
            ),
        ]
    );
    assert_eq!(
        t.policy[1].isolated_by,
        ["shop/default-deny", "shop/web-from-lb"]
    );
    assert!(common::has_hop(
        &t,
        "FORWARD",
        "ip saddr 10.0.1.1 tcp dport 8080 accept comment \"shop/web-from-lb\"",
        "ingress to shop/web-0 allowed by shop/web-from-lb"
    ));
    // The reply is part of the connection: the table's first rule passes it.
    assert!(t.hops.iter().any(|h| h.stage.starts_with("reply")
        && h.rule.as_deref() == Some("ct state established,related accept")
        && h.note.contains("already allowed")));
    let text = trace::render(&t);
    assert!(
        text.contains("policy: ingress to shop/web-0 allowed by shop/web-from-lb"),
        "{text}"
    );
}

#[test]
fn ingress_dropped_names_the_pod_and_every_isolating_policy() {
    // db-1 (on n2) → db-0: only db-0 itself may reach it.
    let t = walk(&node(), "10.0.1.3", "10.0.0.3", 5432, "eth0");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert_eq!(
        t.cause.as_deref(),
        Some("FORWARD: NetworkPolicy: no policy allows ingress to shop/db-0 (isolated by shop/db-deny, shop/default-deny)")
    );
    assert!(common::has_hop(
        &t,
        "FORWARD",
        "drop comment \"shop/db-0 ingress: isolated by db-deny, default-deny\"",
        "DROPPED by NetworkPolicy: no policy allows ingress to shop/db-0 (isolated by shop/db-deny, shop/default-deny)"
    ));
    assert!(
        t.fixes[0].contains("ingress rule `from: [{ipBlock: {cidr: 10.0.1.3/32}}]`"),
        "{:?}",
        t.fixes
    );
    assert!(t.fixes[0].contains("port: 5432"), "{:?}", t.fixes);
    assert_eq!(
        t.fixes[1],
        "read what isolates it: kubectl -n shop get networkpolicy db-deny default-deny -o yaml"
    );
    let dropped = t.policy.last().unwrap();
    assert_eq!(dropped.verdict, PolicyVerdict::Dropped);
    assert_eq!(dropped.isolated_by, ["shop/db-deny", "shop/default-deny"]);
    assert_eq!(dropped.address.to_string(), "10.0.0.3");

    // free-0 (open itself) → web-1 on a port web-from-lb allows only to lb and probe.
    let t = walk(&node(), "10.0.0.4", "10.0.0.2", 9050, "vfree0");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .ends_with("ingress to shop/web-1 (isolated by shop/default-deny, shop/web-from-lb)"));
}

#[test]
fn egress_is_judged_at_the_source_pod_first() {
    let st = node();
    // web-0 → db-1 (on n2) on http: web-out allows it; db-1 is n2's to police.
    let t = walk(&st, "10.0.0.1", "10.0.1.3", 8080, "vweb0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(
        decisions(&t),
        [
            d(
                "egress",
                "shop/web-0",
                PolicyVerdict::Allowed,
                "shop/web-out"
            ),
            d("ingress", "", PolicyVerdict::NotIsolated, ""),
        ]
    );
    // web-0 → probe-0: nothing in web-out allows it; ingress is never reached.
    let t = walk(&st, "10.0.0.1", "10.0.1.2", 8080, "vweb0");
    assert_eq!(t.verdict, Verdict::Dropped);
    assert_eq!(
        t.cause.as_deref(),
        Some("FORWARD: NetworkPolicy: no policy allows egress from shop/web-0 (isolated by shop/web-out)")
    );
    assert!(
        t.fixes[0].contains("egress rule `to: [{ipBlock: {cidr: 10.0.1.2/32}}]`"),
        "{:?}",
        t.fixes
    );
    assert_eq!(t.policy.len(), 1);
    // DNS over UDP to anywhere: web-out's `udp dport { 53 }`.
    let t = trace::trace(
        &st,
        &Packet {
            src: "10.0.0.2".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            proto: Proto::Udp,
            sport: 40000,
            dport: 53,
            iif: "vweb1".into(),
        },
    );
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(t.policy[0].allowed_by.as_deref(), Some("shop/web-out"));
    assert_eq!(t.policy[0].pod.as_deref(), Some("shop/web-1"));
}

#[test]
fn a_pod_reaching_itself_and_pods_no_policy_selects_pass() {
    let st = node();
    // web-0 → web-0 (a Service hairpin reaches forward): "a pod cannot block itself".
    let t = walk(&st, "10.0.0.1", "10.0.0.1", 9999, "vweb0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(
        decisions(&t),
        [
            d("egress", "shop/web-0", PolicyVerdict::Itself, ""),
            d("ingress", "shop/web-0", PolicyVerdict::Itself, ""),
        ]
    );
    // lb-0 → free-0: no policy selects free-0 (default-deny leaves app=free out).
    let t = walk(&st, "10.0.1.1", "10.0.0.4", 80, "eth0");
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert_eq!(
        decisions(&t),
        [
            d("egress", "", PolicyVerdict::NotIsolated, ""),
            d("ingress", "", PolicyVerdict::NotIsolated, ""),
        ]
    );
    assert!(t.policy[1].describe().contains("10.0.0.4: not isolated"));
}

#[test]
fn json_carries_each_decision() {
    let t = walk(&node(), "10.0.1.3", "10.0.0.3", 5432, "eth0");
    let v = serde_json::to_value(&t).unwrap();
    let last = &v["policy"][1];
    assert_eq!(last["direction"], "ingress");
    assert_eq!(last["pod"], "shop/db-0");
    assert_eq!(last["verdict"], "dropped");
    assert_eq!(last["isolated_by"][1], "shop/default-deny");
    assert_eq!(v["policy"][0]["verdict"], "not_isolated");
}

/// A drop comment cut to 128 bytes, or naming a count of the rest, still names what it can.
#[test]
fn a_comment_with_more_policies_than_fit_is_said_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(data_dir("policy-node")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let file = dir.path().join(Output::NftRuleset.file_name());
    let json = std::fs::read_to_string(&file).unwrap().replace(
        "shop/db-0 ingress: isolated by db-deny, default-deny",
        "shop/db-0 ingress: isolated by db-deny, default-deny, +3 more",
    );
    std::fs::write(&file, json).unwrap();
    let st = NodeState::from_dir(dir.path()).unwrap().0;
    let t = walk(&st, "10.0.1.3", "10.0.0.3", 5432, "eth0");
    assert!(t
        .cause
        .as_deref()
        .unwrap()
        .ends_with("(isolated by shop/db-deny, shop/default-deny and 3 more)"));
    assert_eq!(t.policy.last().unwrap().isolated_by_more, 3);
}

/// The objects saved beside the node are the ones the golden was rendered from.
#[test]
fn the_saved_objects_render_to_the_golden() {
    let st = node();
    let objects = st.objects.as_ref().expect("objects.yaml read by content");
    assert_eq!(objects.files, ["objects.yaml"]);
    assert!(
        objects.errors.is_empty() && objects.warnings.is_empty(),
        "{objects:?}"
    );
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/tests/golden/before.nft");
    assert_eq!(
        weir_policy::nft::render(&weir_policy::plan(&objects.cluster, "n1")),
        std::fs::read_to_string(golden).unwrap()
    );
}

/// The fixture is what the golden table loads to today (root: loaded into a scratch network
/// namespace with `unshare -n`, listed with `nft -j`): a changed renderer fails here until
/// `capture.sh` is run again.
#[test]
fn the_fixture_is_the_golden_table_as_the_kernel_lists_it() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["nft", "unshare"])) {
        return;
    }
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/tests/golden/before.nft");
    let script = std::fs::read_to_string(&golden).unwrap();
    let [json]: [String; 1] = common::scratch::listings("", &script, &["nft -j list ruleset"])
        .try_into()
        .unwrap();
    let live = weir_netdiag::nft::parse(&json).value;
    let saved = node().nft.unwrap();
    let rules = |rs: &weir_netdiag::nft::Ruleset| -> Vec<(String, String)> {
        rs.rules
            .iter()
            .filter(|r| r.table == "weir-policy")
            .map(|r| (r.chain.clone(), r.text.clone()))
            .collect()
    };
    assert_eq!(
        rules(&live),
        rules(&saved),
        "rerun tests/data/policy-node/capture.sh"
    );
    let elements = |rs: &weir_netdiag::nft::Ruleset| -> Vec<String> {
        rs.sets
            .iter()
            .map(|s| format!("{} {:?}", s.name, s.elements))
            .collect()
    };
    assert_eq!(
        elements(&live),
        elements(&saved),
        "rerun tests/data/policy-node/capture.sh"
    );
}
