//! Outside interference with weir's rules, in both modes (root only; skipped otherwise):
//! a firewall reload or an admin flushing tables, chains or jump rules. Each kind must be
//! seen by `Backend::intact` (what the agent calls on its timer, with no object change)
//! and repaired by the next sync — asserted with real TCP connections through a ClusterIP
//! in the lab of tests/common/lab.rs. And weir must leave kubelet's chain alone.

use std::io::ErrorKind;

use weir_model::Plan;
use weir_proxy::iptables::{IptablesBackend, IptablesOptions, KUBE_FIREWALL};
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::{Backend, SyncKind};

mod common;
use common::lab::{assert_jumps_once, endpoints, load, Lab, EMPTY, IPTABLES_TOOLS, SOLO, WEB};

/// Asserts that `solo` (one endpoint, p1) answers from the client.
fn assert_served(lab: &Lab, what: &str) {
    match lab.connect("client", SOLO) {
        Ok((_, greeting)) => assert!(greeting.starts_with("10.244.1.5 "), "{what}: {greeting}"),
        Err(e) => panic!("{what}: client → {SOLO}: {e}"),
    }
}

/// How a flush must be noticed.
#[derive(Clone, Copy, PartialEq)]
enum Seen {
    /// By every sync's own check: the next sync of the same plan is full.
    BySync,
    /// Only by the periodic `intact` check (the agent then calls `invalidate`).
    ByTimer,
}

/// Applies `flush` (run in the node namespace), checks that it broke the datapath if
/// `breaks`, that the backend notices, and that the next sync of the same plan repairs it.
fn flush_and_repair(
    lab: &Lab,
    b: &mut dyn Backend,
    plan: &Plan,
    (flush, breaks, seen): (&str, bool, Seen),
) {
    assert_served(lab, &format!("before `{flush}`"));
    lab.exec("node", flush);
    if breaks {
        assert!(
            lab.connect("client", SOLO).is_err(),
            "`{flush}` did not break {SOLO}: the test proves nothing"
        );
    }
    // The timer-driven check (no object changed) sees it.
    assert!(
        !lab.on_node(|| b.intact().unwrap()),
        "`{flush}` went unnoticed"
    );
    if seen == Seen::ByTimer {
        b.invalidate();
    }
    let r = lab.sync(b, plan);
    assert_eq!(r.kind, SyncKind::Full, "after `{flush}`");
    assert!(
        lab.on_node(|| b.intact().unwrap()),
        "after repairing `{flush}`"
    );
    assert_served(lab, &format!("after repairing `{flush}`"));
    assert_eq!(
        endpoints(&lab.get("client", WEB, 30)),
        ["10.244.1.5", "10.244.2.5"],
        "after repairing `{flush}`"
    );
    // And the repaired rules are stable: nothing to do next time.
    assert_eq!(lab.sync(b, plan).kind, SyncKind::Noop, "after `{flush}`");
}

#[test]
fn iptables_outside_flushes_are_repaired() {
    let Some(lab) = Lab::new("oc-ipt", IPTABLES_TOOLS) else {
        return;
    };
    let plan = load();
    let mut b = IptablesBackend::new(IptablesOptions::default());
    assert_eq!(lab.sync(&mut b, &plan).kind, SyncKind::Full);
    assert!(lab.on_node(|| b.intact().unwrap()));
    assert_eq!(lab.sync(&mut b, &plan).kind, SyncKind::Noop);
    // Every kind of flush from the issue: whole nat table (rules only: the chains, and
    // kube-proxy's canaries, stay), the dispatch chain only, the built-in chains' jumps,
    // the filter table, and the chains themselves.
    for case in [
        ("iptables -t nat -F", true, Seen::BySync),
        // A sync that changes something rewrites KUBE-SERVICES anyway; a no-op sync does
        // not, so only the periodic check looks at it (it is the expensive chain to read).
        ("iptables -t nat -F KUBE-SERVICES", true, Seen::ByTimer),
        (
            "sh -c 'iptables -t nat -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES \
             && iptables -t nat -D OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES'",
            true,
            Seen::BySync,
        ),
        ("iptables -t filter -F", false, Seen::BySync),
        ("sh -c 'iptables -t nat -F && iptables -t nat -X'", true, Seen::BySync),
    ] {
        flush_and_repair(&lab, &mut b, &plan, case);
        assert_jumps_once(&lab);
    }
    // The filter flush removed the REJECT of the service without endpoints; it is back.
    let err = lab.connect("client", EMPTY).err().map(|e| e.kind());
    assert_eq!(err, Some(ErrorKind::ConnectionRefused));
}

#[test]
fn nftables_outside_flushes_are_repaired() {
    let Some(lab) = Lab::new("oc-nft", &["nft"]) else {
        return;
    };
    let plan = load();
    let mut b = NftBackend::new(NftOptions::default());
    assert_eq!(lab.sync(&mut b, &plan).kind, SyncKind::Full);
    assert!(lab.on_node(|| b.intact().unwrap()));
    assert_eq!(lab.sync(&mut b, &plan).kind, SyncKind::Noop);
    for (flush, breaks) in [
        // Every chain left empty, table, chains and maps still there.
        ("nft flush table inet weir", true),
        ("nft flush chain inet weir services", true),
        ("nft flush chain inet weir nat-postrouting", false),
        ("nft delete table inet weir", true),
        ("nft flush ruleset", true),
    ] {
        flush_and_repair(&lab, &mut b, &plan, (flush, breaks, Seen::BySync));
    }
}

#[test]
fn nftables_partial_sync_deletes_a_balancing_chain_with_its_last_user() {
    let Some(lab) = Lab::new("oc-cls", &["nft"]) else {
        return;
    };
    let v1 = load();
    let mut b = NftBackend::new(NftOptions::default());
    lab.sync(&mut b, &v1);
    let chains = || lab.exec("node", "nft list chains inet");
    // `solo` is the only service with one endpoint: the one user of the n1 chain.
    let n1 = "chain ep4tcp-n1-";
    assert!(chains().contains(n1), "{}", chains());
    let mut v2 = v1.clone();
    let solo = v2
        .services
        .keys()
        .find(|k| &*k.name == "solo")
        .unwrap()
        .clone();
    let sp = std::sync::Arc::make_mut(v2.services.get_mut(&solo).unwrap());
    sp.cluster_endpoints.push(weir_model::Endpoint {
        ip: "10.244.2.6".parse().unwrap(),
        ..sp.cluster_endpoints[0].clone()
    });
    sp.cluster_endpoints.sort();
    assert_eq!(lab.sync(&mut b, &v2).kind, SyncKind::Partial);
    assert!(!chains().contains(n1), "unused chain left:\n{}", chains());
    assert!(lab.on_node(|| b.intact().unwrap()));
    let seen = lab.get("client", SOLO, 30);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.6"], "{seen:?}");
    // Back: the chain is created again by a partial sync, and used.
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Partial);
    assert!(chains().contains(n1), "{}", chains());
    assert!(lab.on_node(|| b.intact().unwrap()));
    assert_served(&lab, "n1 chain recreated");
}

/// kubelet's `KUBE-FIREWALL` as kubelet (≥ 1.28) writes it: the CVE-2020-8558 rule, jumped
/// to from INPUT and OUTPUT.
const KUBELET_FIREWALL: &str = "sh -c 'iptables -N KUBE-FIREWALL \
    && iptables -A KUBE-FIREWALL -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP \
    && iptables -I INPUT -j KUBE-FIREWALL && iptables -I OUTPUT -j KUBE-FIREWALL'";

fn kubelet_firewall_intact(lab: &Lab, what: &str) {
    let save = lab.save("iptables-save -t filter");
    assert!(
        save.contains(&format!(":{KUBE_FIREWALL} ")),
        "{what}: chain gone\n{save}"
    );
    let rule = save
        .lines()
        .filter(|l| l.starts_with(&format!("-A {KUBE_FIREWALL} ")))
        .collect::<Vec<_>>();
    assert_eq!(rule.len(), 1, "{what}:\n{save}");
    assert!(
        rule[0].contains("block incoming localnet connections"),
        "{what}: {rule:?}"
    );
    for chain in ["INPUT", "OUTPUT"] {
        assert!(
            save.contains(&format!("-A {chain} -j {KUBE_FIREWALL}")),
            "{what}: {chain} jump gone\n{save}"
        );
    }
}

#[test]
fn iptables_mode_leaves_kubelets_firewall_chain_alone() {
    let Some(lab) = Lab::new("oc-kfw", IPTABLES_TOOLS) else {
        return;
    };
    lab.exec("node", KUBELET_FIREWALL);
    kubelet_firewall_intact(&lab, "set up");
    let plan = load();
    let mut b = IptablesBackend::new(IptablesOptions::default());
    assert_eq!(lab.sync(&mut b, &plan).kind, SyncKind::Full);
    kubelet_firewall_intact(&lab, "after a full sync");
    b.invalidate();
    assert_eq!(lab.sync(&mut b, &plan).kind, SyncKind::Full);
    kubelet_firewall_intact(&lab, "after a second full sync");
    assert_served(&lab, "with kubelet's chain");
    lab.on_node(|| b.cleanup().unwrap());
    kubelet_firewall_intact(&lab, "after cleanup");
    let save = lab.save("iptables-save");
    let others: Vec<&str> = save
        .lines()
        .filter(|l| l.contains("KUBE-") && !l.contains(KUBE_FIREWALL))
        .collect();
    assert!(others.is_empty(), "cleanup left {others:?}");
}
