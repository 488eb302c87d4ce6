//! Real packets through the iptables mode, inside throwaway network namespaces (root only;
//! skipped otherwise). Each test builds its own lab (tests/common/lab.rs):
//!
//! ```text
//!   p1 10.244.1.5 ──┐                      ┌── client 192.168.77.2 (off-cluster)
//!   p2 10.244.2.5 ──┤ node (IptablesBackend) │
//!      10.244.2.6 ──┘  10.244.1.1 10.244.2.1 └ 192.168.77.1
//! ```
//!
//! The pods run an echo server on port 8080 that greets with "<its address> <the peer it
//! sees>" and then echoes lines; the test thread enters a namespace (weir_kernel::NetNs)
//! to sync the backend (the iptables tools it runs inherit the namespace) or to connect.

use std::io::{BufRead, ErrorKind, Write};
use std::time::{Duration, Instant};

use weir_model::Plan;
use weir_proxy::iptables::{BackendChoice, Flavor, IptablesBackend, IptablesOptions};
use weir_proxy::{Backend, SyncKind};

mod common;
use common::lab::{
    assert_jumps_once, endpoints, load, load_with, Lab, EMPTY, IPTABLES_TOOLS, SOLO, WEB,
};

/// `p` with web's endpoint `from` replaced by `to`.
fn replace_web_endpoint(p: &Plan, from: &str, to: &str) -> Plan {
    let mut p = p.clone();
    let web = p
        .services
        .keys()
        .find(|k| &*k.name == "web")
        .unwrap()
        .clone();
    let eps = &mut std::sync::Arc::make_mut(p.services.get_mut(&web).unwrap()).cluster_endpoints;
    let ep = eps.iter_mut().find(|e| e.ip.to_string() == from).unwrap();
    ep.ip = to.parse().unwrap();
    eps.sort();
    p
}

#[test]
fn cluster_ip_spreads_over_endpoints() {
    let Some(lab) = Lab::new("spread", IPTABLES_TOOLS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    let r = lab.sync(&mut b, &load());
    assert_eq!(r.kind, SyncKind::Full);
    assert_eq!(r.service_ports_touched, 3);

    // Off-cluster client: both endpoints, always masqueraded (the pod sees the node).
    let seen = lab.get("client", WEB, 60);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");
    for (ep, peer) in &seen {
        let node_side = if ep == "10.244.1.5" {
            "10.244.1.1"
        } else {
            "10.244.2.1"
        };
        assert_eq!(
            peer, node_side,
            "off-cluster source not masqueraded: {seen:?}"
        );
    }
    // From pod p2 (in the cluster CIDR): p1 sees p2's own address.
    let seen = lab.get("p2", WEB, 30);
    assert!(
        seen.iter()
            .filter(|(ep, _)| ep == "10.244.1.5")
            .all(|(_, peer)| peer == "10.244.2.5"),
        "{seen:?}"
    );
}

#[test]
fn node_port_forwards() {
    let Some(lab) = Lab::new("nodeport", IPTABLES_TOOLS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    let seen = lab.get("client", "192.168.77.1:30080", 30);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");
    // External traffic (policy Cluster) is masqueraded.
    assert!(
        seen.iter()
            .all(|(_, peer)| peer.starts_with("10.244.") && peer.ends_with(".1")),
        "{seen:?}"
    );
    // The node itself reaches its node port on another of its addresses (nat OUTPUT).
    let seen = lab.get("node", "10.244.1.1:30080", 5);
    assert!(!seen.is_empty());
}

#[test]
fn service_without_endpoints_is_refused_fast() {
    let Some(lab) = Lab::new("reject", IPTABLES_TOOLS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    // Forwarded (client → ClusterIP), local (node → ClusterIP), node port (INPUT).
    for (role, addr) in [
        ("client", EMPTY),
        ("node", EMPTY),
        ("client", "192.168.77.1:30040"),
    ] {
        let start = Instant::now();
        let err = lab.connect(role, addr).err();
        let took = start.elapsed();
        assert_eq!(
            err.as_ref().map(|e| e.kind()),
            Some(ErrorKind::ConnectionRefused),
            "{role} → {addr}: {err:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "{role} → {addr}: refused after {took:?}"
        );
    }
}

#[test]
fn hairpin_is_masqueraded() {
    let Some(lab) = Lab::new("hairpin", IPTABLES_TOOLS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    // p1 reaches itself through `solo`: the reply must come back through the node, so
    // the node masquerades (p1 sees the node's address, not its own).
    let seen = lab.get("p1", SOLO, 3);
    for (ep, peer) in &seen {
        assert_eq!((ep.as_str(), peer.as_str()), ("10.244.1.5", "10.244.1.1"));
    }
}

#[test]
fn incremental_update_replaces_one_endpoint() {
    let Some(lab) = Lab::new("update", IPTABLES_TOOLS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    let v1 = load();
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Full);
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Noop);
    let before = lab.save("iptables-save");

    let v2 = replace_web_endpoint(&v1, "10.244.2.5", "10.244.2.6");
    let r = lab.sync(&mut b, &v2);
    assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Partial, 1));
    let seen = lab.get("client", WEB, 40);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.6"], "{seen:?}");

    // The old endpoint's chain is gone; the other services' chains are untouched.
    let after = lab.save("iptables-save");
    let seps = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with(":KUBE-SEP-"))
            .map(|l| l[1..].split(' ').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(seps(&before).len(), seps(&after).len(), "{after}");
    assert_ne!(seps(&before), seps(&after));
    assert!(
        after.contains("--to-destination 10.244.2.6:8080"),
        "{after}"
    );
    assert!(
        !after.contains("--to-destination 10.244.2.5:8080"),
        "{after}"
    );
    assert_jumps_once(&lab);
}

#[test]
fn restart_is_full_and_keeps_one_set_of_jumps() {
    let Some(lab) = Lab::new("restart", IPTABLES_TOOLS) else {
        return;
    };
    let v1 = load();
    let mut first = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut first, &v1);
    assert_jumps_once(&lab);
    // A connection established before the restart (`solo` has one endpoint: p1).
    let (mut conn, greeting) = lab.connect("client", SOLO).unwrap();
    assert!(greeting.starts_with("10.244.1.5 "), "{greeting}");

    // The restarted process brings a changed plan: 10.244.2.5's chain is stale.
    drop(first);
    let v2 = replace_web_endpoint(&v1, "10.244.2.5", "10.244.2.6");
    let mut second = IptablesBackend::new(IptablesOptions::default());
    let r = lab.sync(&mut second, &v2);
    assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Full, 3));
    assert_jumps_once(&lab);
    let save = lab.save("iptables-save");
    assert!(
        !save.contains("10.244.2.5:8080"),
        "stale endpoint chain left:\n{save}"
    );
    assert_eq!(
        endpoints(&lab.get("client", WEB, 40)),
        ["10.244.1.5", "10.244.2.6"]
    );

    // The established connection kept working through the restart.
    conn.get_mut().write_all(b"ping\n").unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).unwrap();
    assert_eq!(line, "ping\n");

    // Once more, same plan.
    let mut third = IptablesBackend::new(IptablesOptions::default());
    assert_eq!(lab.sync(&mut third, &v2).kind, SyncKind::Full);
    assert_eq!(lab.sync(&mut third, &v2).kind, SyncKind::Noop);
    assert_jumps_once(&lab);
}

#[test]
fn a_failed_sync_is_followed_by_a_full_one() {
    let Some(lab) = Lab::new("failed", IPTABLES_TOOLS) else {
        return;
    };
    let v1 = load();
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &v1);
    // Behind the backend's back, something else jumps to web's endpoint chain for
    // 10.244.2.5: the partial update that replaces that endpoint cannot delete the chain
    // ("too many links"), and iptables-restore rejects the whole update. (Nothing of weir's
    // own rules changed, so the flush detection has nothing to see.)
    let save = lab.save("iptables-save -t nat");
    let sep = save
        .lines()
        .find(|l| l.starts_with("-A KUBE-SEP-") && l.contains("--to-destination 10.244.2.5:"))
        .and_then(|l| l.split(' ').nth(1))
        .unwrap()
        .to_string();
    lab.exec("node", "iptables -t nat -N TEST-REF");
    lab.exec("node", &format!("iptables -t nat -A TEST-REF -j {sep}"));
    let v2 = replace_web_endpoint(&v1, "10.244.2.5", "10.244.2.6");
    let err = {
        let _inside = lab.netns("node").enter().unwrap();
        b.sync(&v2).unwrap_err()
    };
    // Named after the program that refused: iptables-nft-restore here (`auto` picks the
    // implementation by name), iptables-restore where only the system's programs exist.
    let e = err.to_string();
    assert!(
        e.contains("iptables-nft-restore") || e.contains("iptables-restore"),
        "{e}"
    );
    // The failed update changed nothing.
    assert_eq!(
        endpoints(&lab.get("client", WEB, 40)),
        ["10.244.1.5", "10.244.2.5"]
    );
    lab.exec("node", "iptables -t nat -F TEST-REF");
    lab.exec("node", "iptables -t nat -X TEST-REF");
    // Next sync: full, and everything works again.
    assert_eq!(lab.sync(&mut b, &v2).kind, SyncKind::Full);
    assert_eq!(endpoints(&lab.get("client", SOLO, 3)), ["10.244.1.5"]);
    assert_eq!(
        endpoints(&lab.get("client", WEB, 40)),
        ["10.244.1.5", "10.244.2.6"]
    );
}

#[test]
fn flushed_tables_are_detected_and_restored() {
    let Some(lab) = Lab::new("flush", IPTABLES_TOOLS) else {
        return;
    };
    let v1 = load();
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &v1);
    // Someone flushes the nat table (all rules, all user chains, our jumps included).
    lab.exec("node", "iptables -t nat -F");
    lab.exec("node", "iptables -t nat -X");
    assert!(lab.connect("client", SOLO).is_err());
    // The same plan again: the missing canary turns the no-op into a full sync.
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Full);
    assert_jumps_once(&lab);
    assert_eq!(endpoints(&lab.get("client", SOLO, 3)), ["10.244.1.5"]);
}

#[test]
fn cleanup_leaves_no_kube_chain() {
    let Some(lab) = Lab::new("cleanup", IPTABLES_TOOLS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    let cleanup = |b: &mut IptablesBackend| {
        let _inside = lab.netns("node").enter().unwrap();
        b.cleanup().unwrap();
    };
    cleanup(&mut b);
    for tool in ["iptables-save", "ip6tables-save"] {
        let save = lab.save(tool);
        assert!(!save.contains("KUBE-"), "{tool}:\n{save}");
        assert!(
            !save.lines().any(|l| l.starts_with("-A ")),
            "{tool}:\n{save}"
        );
    }
    assert!(lab.connect("client", WEB).is_err());
    // Absence is fine; and a new sync starts from scratch.
    cleanup(&mut b);
    assert_eq!(lab.sync(&mut b, &load()).kind, SyncKind::Full);
    assert_jumps_once(&lab);
    cleanup(&mut IptablesBackend::new(IptablesOptions::default()));
    assert!(!lab.save("iptables-save").contains("KUBE-"));
}

#[test]
fn localhost_node_ports_with_a_loopback_cidr() {
    let Some(lab) = Lab::new("localhost", IPTABLES_TOOLS) else {
        return;
    };
    let plan = load_with(|c| {
        c.nodeport_addresses = vec!["127.0.0.0/8".parse().unwrap()];
        c.localhost_nodeports = true;
        c.local_addresses = vec![
            "127.0.0.1".parse().unwrap(),
            "192.168.77.1".parse().unwrap(),
        ];
    });
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &plan);
    let seen = lab.get("node", "127.0.0.1:30080", 20);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");
    // Only localhost: the node's other addresses do not serve it.
    assert!(lab.connect("client", "192.168.77.1:30080").is_err());
    // kube-proxy's companions of route_localnet: the sysctl, kubelet's localnet rule.
    let sysctl = lab.exec("node", "cat /proc/sys/net/ipv4/conf/all/route_localnet");
    assert_eq!(sysctl.trim(), "1");
    let save = lab.save("iptables-save -t filter");
    assert!(
        save.lines().any(|l| l.starts_with("-A KUBE-FIREWALL ")
            && l.contains("-d 127.0.0.0/8")
            && l.contains("block incoming localnet connections")
            && l.ends_with("-j DROP"))
            && save.contains("-A INPUT -j KUBE-FIREWALL")
            && save.contains("-A OUTPUT -j KUBE-FIREWALL"),
        "{save}"
    );
    // Added once, not on every full sync.
    b.invalidate();
    lab.sync(&mut b, &plan);
    let save = lab.save("iptables-save -t filter");
    assert_eq!(save.matches("-A KUBE-FIREWALL ").count(), 1, "{save}");
    assert_eq!(save.matches("-j KUBE-FIREWALL").count(), 2, "{save}");
}

/// The tools both implementations need by name, besides the system's.
const BOTH_IMPLEMENTATIONS: &[&str] = &[
    "iptables",
    "iptables-nft-save",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "ip6tables-legacy-restore",
    "nft",
];

/// Whether `save` (an `iptables-save` of one implementation) holds a weir nat rule.
fn has_weir_nat(save: &str) -> bool {
    save.lines().any(|l| l.starts_with("-A KUBE-SERVICES "))
}

#[test]
fn auto_backend_follows_kubelet_into_iptables_legacy() {
    let Some(lab) = Lab::new("legacy", BOTH_IMPLEMENTATIONS) else {
        return;
    };
    // What a kubelet on an iptables-legacy node leaves: its hint chain in legacy's mangle.
    lab.exec("node", "iptables-legacy -t mangle -N KUBE-KUBELET-CANARY");
    let mut b = IptablesBackend::new(IptablesOptions::default());
    assert_eq!(lab.sync(&mut b, &load()).kind, SyncKind::Full);
    assert_eq!(b.flavor(), Some(Flavor::Legacy));
    assert!(has_weir_nat(&lab.save("iptables-legacy-save -t nat")));
    assert!(!has_weir_nat(&lab.save("iptables-nft-save -t nat")));
    let seen = lab.get("client", WEB, 40);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");

    // Partial syncs, the check before them and restarts stay in legacy too.
    let v2 = replace_web_endpoint(&load(), "10.244.2.5", "10.244.2.6");
    let r = lab.sync(&mut b, &v2);
    assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Partial, 1));
    let seen = lab.get("client", WEB, 40);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.6"], "{seen:?}");
    let mut restarted = IptablesBackend::new(IptablesOptions::default());
    assert_eq!(lab.sync(&mut restarted, &v2).kind, SyncKind::Full);
    assert_eq!(restarted.flavor(), Some(Flavor::Legacy));
    let legacy = lab.save("iptables-legacy-save");
    assert_eq!(
        common::lab::count_jumps(&legacy, "nat", "PREROUTING", "KUBE-SERVICES"),
        1,
        "{legacy}"
    );
    assert!(!has_weir_nat(&lab.save("iptables-nft-save -t nat")));

    lab.on_node(|| restarted.cleanup().unwrap());
    assert!(!lab.save("iptables-legacy-save").contains("KUBE-SERVICES"));
    assert!(lab.connect("client", WEB).is_err());
}

#[test]
fn auto_backend_is_nft_on_a_fresh_node_and_the_choice_can_be_forced() {
    let Some(lab) = Lab::new("choice", BOTH_IMPLEMENTATIONS) else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    assert_eq!(b.flavor(), Some(Flavor::Nft));
    assert!(has_weir_nat(&lab.save("iptables-nft-save -t nat")));
    assert!(!has_weir_nat(&lab.save("iptables-legacy-save -t nat")));
    lab.on_node(|| b.cleanup().unwrap());

    // Forced legacy on a node whose kubelet hint says nft: the operator's word wins.
    lab.exec("node", "iptables-nft -t mangle -N KUBE-IPTABLES-HINT");
    let mut forced = IptablesBackend::new(IptablesOptions {
        backend: BackendChoice::Legacy,
        ..IptablesOptions::default()
    });
    lab.sync(&mut forced, &load());
    assert_eq!(forced.flavor(), Some(Flavor::Legacy));
    assert!(has_weir_nat(&lab.save("iptables-legacy-save -t nat")));
    assert!(!has_weir_nat(&lab.save("iptables-nft-save -t nat")));
    let seen = lab.get("client", WEB, 40);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");
    lab.on_node(|| forced.cleanup().unwrap());
}
