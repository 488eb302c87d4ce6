//! The checks on the captured eni-node outputs (fix off, FORWARD DROP, a VXLAN at 1450 next to a
//! bridge at 1500), then on the same outputs edited the way each fix would change them: every
//! check must fail on the broken state and pass on the fixed one, without root.

use std::path::PathBuf;

use weir_netdiag::doctor::{self, Check, PodDns, Status};
use weir_netdiag::state::{NodeState, Output};

fn data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/eni-node")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The node's outputs, with `edit` applied to each text.
fn node(edit: impl Fn(Output, String) -> String) -> NodeState {
    let files = [
        (Output::IptablesSave, "iptables-save.txt"),
        (Output::NftRuleset, "nft-ruleset.json"),
        (Output::IpRule, "ip-rule.json"),
        (Output::IpRoute, "ip-route.json"),
        (Output::IpLink, "ip-link.json"),
        (Output::IpAddr, "ip-addr.txt"),
        (Output::IpNeigh, "ip-neigh.json"),
        (Output::Sysctl, "sysctl.txt"),
    ];
    NodeState::from_outputs(files.map(|(o, f)| (o, edit(o, data(f)))))
}

fn check(st: &NodeState, f: fn(&NodeState) -> Check) -> Check {
    let c = f(st);
    eprintln!("{}", doctor::render_table(std::slice::from_ref(&c)));
    c
}

fn set_sysctl(text: String, key: &str, value: &str) -> String {
    let mut found = false;
    let mut out: String = text
        .lines()
        .map(|l| {
            if l.split_once('=').is_some_and(|(k, _)| k.trim() == key) {
                found = true;
                format!("{key} = {value}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    if !found {
        out.push_str(&format!("{key} = {value}\n"));
    }
    out
}

#[test]
fn forwarding_fails_at_zero_and_passes_at_one() {
    let broken = node(|_, t| t);
    let c = check(&broken, doctor::forwarding);
    assert_eq!(c.status, Status::Fail);
    assert!(c
        .evidence
        .iter()
        .any(|e| e.contains("net.ipv4.ip_forward = 0")));
    let fixed = node(|o, t| match o {
        Output::Sysctl => {
            let t = set_sysctl(t, "net.ipv4.ip_forward", "1");
            let t = set_sysctl(t, "net.ipv4.conf.all.forwarding", "1");
            set_sysctl(t, "net.ipv6.conf.all.forwarding", "1")
        }
        _ => t,
    });
    assert_eq!(check(&fixed, doctor::forwarding).status, Status::Ok);
}

#[test]
fn br_netfilter_off_or_unloaded() {
    assert_eq!(
        check(&node(|_, t| t), doctor::br_netfilter).status,
        Status::Ok
    );
    let off = node(|o, t| match o {
        Output::Sysctl => set_sysctl(t, "net.bridge.bridge-nf-call-iptables", "0"),
        _ => t,
    });
    assert_eq!(check(&off, doctor::br_netfilter).status, Status::Fail);
    let unloaded = node(|o, t| match o {
        Output::Sysctl => t
            .lines()
            .filter(|l| !l.starts_with("net.bridge."))
            .map(|l| format!("{l}\n"))
            .collect(),
        _ => t,
    });
    let c = check(&unloaded, doctor::br_netfilter);
    assert_eq!(c.status, Status::Fail, "cni0 is a bridge");
    assert!(c.evidence.iter().any(|e| e.contains("cni0")));
}

#[test]
fn forward_drop_needs_marked_and_established_accepts() {
    // iptables' FORWARD (DROP) has KUBE-FORWARD; the nft kube-proxy table's forward chain
    // (policy drop) has no accept for marked traffic.
    let c = check(&node(|_, t| t), doctor::forward_policy);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("kube-proxy filter-forward") && e.contains("masquerade-marked")),
        "{:?}",
        c.evidence
    );
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("iptables filter FORWARD: marked")),
        "{:?}",
        c.evidence
    );

    // Without KUBE-FORWARD's rules the iptables side fails too.
    let no_kube_forward = node(|o, t| match o {
        Output::IptablesSave => t
            .lines()
            .filter(|l| !l.starts_with("-A KUBE-FORWARD"))
            .map(|l| format!("{l}\n"))
            .collect(),
        Output::NftRuleset => "{\"nftables\": []}".into(),
        _ => t,
    });
    let c = check(&no_kube_forward, doctor::forward_policy);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.starts_with("iptables filter FORWARD has policy drop")),
        "{:?}",
        c.evidence
    );

    // With the nft table gone, iptables' accept rules are enough.
    let iptables_only = node(|o, t| match o {
        Output::NftRuleset => "{\"nftables\": []}".into(),
        _ => t,
    });
    assert_eq!(
        check(&iptables_only, doctor::forward_policy).status,
        Status::Ok
    );
}

#[test]
fn dnat_to_an_address_nobody_answers_for() {
    let c = check(&node(|_, t| t), doctor::stale_dnat);
    assert_eq!(c.status, Status::Ok);
    assert!(
        c.evidence[0].contains("5 DNAT target(s)"),
        "{:?}",
        c.evidence
    );
    // 10.12.97.77 is on eth0's subnet and its neighbour entry is FAILED (captured).
    let stale = node(|o, t| match o {
        Output::IptablesSave => t.replace(
            "--to-destination 10.12.200.6:8443",
            "--to-destination 10.12.97.77:8443",
        ),
        _ => t,
    });
    let c = check(&stale, doctor::stale_dnat);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("10.12.97.77") && e.contains("FAILED")),
        "{:?}",
        c.evidence
    );
    // A target in table main's blackhole is dead too; one whose route's device is gone as well.
    let gone = node(|o, t| match o {
        Output::IptablesSave => t.replace(
            "--to-destination 10.12.200.6:8443",
            "--to-destination 10.12.192.44:8443",
        ),
        Output::IpLink => {
            let mut v: serde_json::Value = serde_json::from_str(&t).unwrap();
            v.as_array_mut()
                .unwrap()
                .retain(|l| l["ifname"] != "eni1a2b3c4d5e6f");
            v.to_string()
        }
        _ => t,
    });
    let c = check(&gone, doctor::stale_dnat);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("eni1a2b3c4d5e6f, which does not exist")),
        "{:?}",
        c.evidence
    );
}

#[test]
fn vxlan_smaller_than_the_pod_side() {
    let c = check(&node(|_, t| t), doctor::mtu);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("vethab12 mtu 1500") && e.contains("cni0 mtu 1500")),
        "{:?}",
        c.evidence
    );
    let fixed = node(|o, t| match o {
        Output::IpLink => t.replace("\"mtu\":1500", "\"mtu\":1450"),
        _ => t,
    });
    // eth0 (the underlay) is now 1450 too: 1450 + 50 does not fit.
    let c = check(&fixed, doctor::mtu);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.evidence
            .iter()
            .any(|e| e.contains("underlay eth0 mtu 1450")),
        "{:?}",
        c.evidence
    );
    let fixed = node(|o, t| match o {
        Output::IpLink => {
            let mut v: serde_json::Value = serde_json::from_str(&t).unwrap();
            for l in v.as_array_mut().unwrap() {
                if l["ifname"] == "cni0" || l["ifname"] == "vethab12" {
                    l["mtu"] = 1450.into();
                }
            }
            v.to_string()
        }
        _ => t,
    });
    assert_eq!(check(&fixed, doctor::mtu).status, Status::Ok);
}

#[test]
fn conntrack_pressure() {
    assert_eq!(check(&node(|_, t| t), doctor::conntrack).status, Status::Ok);
    let full = node(|o, t| match o {
        Output::Sysctl => set_sysctl(t, "net.netfilter.nf_conntrack_count", "250000"),
        _ => t,
    });
    assert_eq!(check(&full, doctor::conntrack).status, Status::Fail);
    let busy = node(|o, t| match o {
        Output::Sysctl => set_sysctl(t, "net.netfilter.nf_conntrack_count", "200000"),
        _ => t,
    });
    assert_eq!(check(&busy, doctor::conntrack).status, Status::Warn);
    let mut drops = node(|_, t| t);
    drops.conntrack_stats = Some("cpu=0 found=0 invalid=3 insert=0 insert_failed=0 drop=0 early_drop=7 error=0 search_restart=0\ncpu=1 found=0 invalid=0 insert=0 insert_failed=0 drop=2 early_drop=0 error=0\n".into());
    let c = check(&drops, doctor::conntrack);
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.evidence.iter().any(|e| e.contains("drop=2 early_drop=7")),
        "{:?}",
        c.evidence
    );
}

#[test]
fn eni_shared_fix_off_is_explained_and_the_fix_passes() {
    let c = check(&node(|_, t| t), doctor::eni_asymmetric);
    assert_eq!(c.status, Status::Fail);
    let ev = c.evidence.join("\n");
    assert!(ev.contains("2000:\tfrom 10.12.192.44 lookup 1003"), "{ev}");
    assert!(
        ev.contains("eth1 has no IPv4 address") && ev.contains("takes 10.12.97.49 from eth0"),
        "{ev}"
    );
    assert!(ev.contains("strict (1)"), "{ev}");
    assert!(ev.contains("src_valid_mark is off"), "{ev}");

    // Loose rp_filter on eth0: the reply passes, the SYN still carries eth0's address.
    let loose = node(|o, t| match o {
        Output::Sysctl => set_sysctl(t, "net.ipv4.conf.eth0.rp_filter", "2"),
        _ => t,
    });
    assert_eq!(check(&loose, doctor::eni_asymmetric).status, Status::Warn);

    // weir-cni's fix: an address on the ENI and src_valid_mark with the fwmark rule.
    let fixed = node(|o, t| {
        match o {
        Output::IpAddr => t.replace(
            "5: eth1@eth1p: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP group default qlen 1000\n",
            "5: eth1@eth1p: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP group default qlen 1000\n    inet 10.12.192.10/32 scope global noprefixroute eth1\n",
        ),
        Output::Sysctl => set_sysctl(t, "net.ipv4.conf.all.src_valid_mark", "1"),
        _ => t,
    }
    });
    assert!(
        fixed.ipv4_on("eth1").len() == 1,
        "the edit must add the address"
    );
    let c = check(&fixed, doctor::eni_asymmetric);
    assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);

    // The address alone leaves the NodePort direction broken.
    let address_only = node(|o, t| {
        match o {
        Output::IpAddr => t.replace(
            "5: eth1@eth1p: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP group default qlen 1000\n",
            "5: eth1@eth1p: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP group default qlen 1000\n    inet 10.12.192.10/32 scope global noprefixroute eth1\n",
        ),
        _ => t,
    }
    });
    assert_eq!(
        check(&address_only, doctor::eni_asymmetric).status,
        Status::Fail
    );
}

#[test]
fn pod_dns_host_only_dead_and_live() {
    assert_eq!(doctor::pod_dns(None).status, Status::Skip);
    let host_only = PodDns {
        source: "resolv.conf".into(),
        resolv_conf: "nameserver 127.0.0.53\noptions edns0\n".into(),
        probes: vec![],
    };
    assert_eq!(doctor::pod_dns(Some(&host_only)).status, Status::Fail);
    let dead = PodDns {
        source: "resolv.conf".into(),
        resolv_conf: "nameserver 192.168.1.1\n".into(),
        probes: vec![(
            "192.168.1.1".parse().unwrap(),
            Err("no answer within 1s".into()),
        )],
    };
    assert_eq!(doctor::pod_dns(Some(&dead)).status, Status::Fail);
    let live = PodDns {
        probes: vec![("192.168.1.1".parse().unwrap(), Ok(()))],
        ..dead
    };
    assert_eq!(doctor::pod_dns(Some(&live)).status, Status::Ok);
    let empty = PodDns::default();
    assert_eq!(doctor::pod_dns(Some(&empty)).status, Status::Fail);
}

#[test]
fn missing_outputs_skip_and_say_so() {
    let st = NodeState::default();
    for c in doctor::run_all(&st, None) {
        assert_eq!(c.status, Status::Skip, "{}", c.id);
        assert!(!c.evidence.is_empty(), "{} must say why it skipped", c.id);
    }
    assert!(!doctor::any_failed(&doctor::run_all(&st, None)));
}
