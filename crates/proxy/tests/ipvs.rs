//! ipvs mode, pure parts: the rendered virtual servers, ipsets and iptables rules against
//! kube-proxy's ipvs layout for the same services (golden files), and the update scripts.

use weir_model::{IpFamily, Plan};
use weir_proxy::ipvs::render::{
    ipset_full, ipset_update, ipvsadm_save, render, Desired, IpvsOptions, LOOP_BACK,
};

mod common;
use common::{golden, load, load_with};

const NODE: &str = "192.0.2.10";

fn rendered(plan: &Plan, family: IpFamily, opts: &IpvsOptions) -> Desired {
    let node_ips = match family {
        IpFamily::V4 => vec![NODE.parse().unwrap()],
        IpFamily::V6 => vec!["2001:db8::10".parse().unwrap()],
    };
    render(plan, family, &node_ips, opts)
}

/// Everything one family holds, as the tools would print or load it.
fn dump(d: &Desired, family: IpFamily) -> String {
    let addrs: Vec<String> = d.addresses.iter().map(|a| a.to_string()).collect();
    format!(
        "# kube-ipvs0\n{}\n# ipvsadm -Sn\n{}# ipset restore\n{}{}",
        addrs.join("\n"),
        ipvsadm_save(&d.services),
        ipset_full(&d.ipsets, family)
            .replace(&format!("weir-{}-", std::process::id()), "weir-tmp-"),
        d.iptables
    )
}

#[test]
fn v1_fixture_renders_kube_proxys_ipvs_layout() {
    let plan = load_with("v1", vec!["0.0.0.0/0".parse().unwrap()]);
    let d = rendered(&plan, IpFamily::V4, &IpvsOptions::default());
    golden("ipvs-v1.txt", &dump(&d, IpFamily::V4));
    let ipt = &d.iptables;
    // Lines kube-proxy's ipvs proxier writes for the same kinds of services.
    for want in [
        "-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
        "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
        "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
    ] {
        assert!(ipt.lines().any(|l| l == want), "missing {want}\n{ipt}");
    }
    // Every ClusterIP is on the dummy and has a virtual server; NodePorts are on the node.
    for vs in d.services.keys() {
        assert!(
            d.addresses.contains(&vs.addr) || vs.addr.to_string() == NODE,
            "{vs}"
        );
    }
    // KUBE-LOOP-BACK holds node-a's endpoints (10.244.0.x) and, as kube-proxy's, no other
    // node's: it held every real server, and overflowed its 65,536 entries at ~6,600
    // services of ten endpoints, failing every full sync.
    let loop_back = &d.ipsets[LOOP_BACK].entries;
    assert!(!loop_back.is_empty());
    assert!(
        loop_back.iter().all(|e| e.starts_with("10.244.0.")),
        "{loop_back:?}"
    );
}

#[test]
fn traffic_policies_and_affinity_follow_kube_proxy() {
    let plan = load_with("iptables-policies", vec!["0.0.0.0/0".parse().unwrap()]);
    let opts = IpvsOptions {
        scheduler: "sh".into(),
        ..Default::default()
    };
    let d = rendered(&plan, IpFamily::V4, &opts);
    golden("ipvs-policies.txt", &dump(&d, IpFamily::V4));
    let save = ipvsadm_save(&d.services);
    // externalTrafficPolicy Local with no endpoint on this node: as kube-proxy's
    // syncEndpoint (kubernetes#97081), the NodePort and externalIP virtual servers hold the
    // cluster endpoints, so pods and the node reach the service ...
    for vip in [format!("{NODE}:30081"), "198.51.100.8:80".into()] {
        assert!(
            save.contains(&format!(
                "-A -t {vip} -s sh\n-a -t {vip} -r 10.244.1.11:8080 -m -w 1\n"
            )),
            "{vip}: {save}"
        );
    }
    assert!(
        save.contains("-a -t 10.96.2.2:80 -r 10.244.1.11:8080 -m -w 1"),
        "{save}"
    );
    // ... while new connections from outside the cluster CIDR and the node are dropped before
    // IPVS sees them (filter INPUT), as the other modes drop them.
    let ipt = &d.iptables;
    for vip in [
        format!("{NODE}/32 -p tcp -m tcp --dport 30081"),
        "198.51.100.8/32 -p tcp -m tcp --dport 80".into(),
    ] {
        let want = format!(
            "-A KUBE-PROXY-FIREWALL ! -s 10.244.0.0/16 -d {vip} -m addrtype ! --src-type LOCAL -m conntrack --ctstate NEW -m comment --comment \"default/etp-remote/tcp/v4 has no local endpoints\" -j DROP"
        );
        assert!(ipt.lines().any(|l| l == want), "missing {want}\n{ipt}");
    }
    assert_eq!(ipt.matches("has no local endpoints").count(), 2, "{ipt}");
    let np_local = &d.ipsets["KUBE-NODE-PORT-LOCAL-TCP"].entries;
    assert!(np_local.contains("30081"), "{np_local:?}");
    let ext_local = &d.ipsets["KUBE-EXTERNAL-IP-LOCAL"].entries;
    assert!(ext_local.contains("198.51.100.8,tcp:80"), "{ext_local:?}");
}

#[test]
fn ipv6_sets_take_kube_proxys_names() {
    let plan = load("v1");
    let d = rendered(&plan, IpFamily::V6, &IpvsOptions::default());
    assert!(d.ipsets.contains_key("KUBE-6-CLUSTER-IP"));
    // 31 characters at most: "KUBE-6-LOAD-BALANCER-SOURCE-CIDR" is cut.
    assert!(d.ipsets.contains_key("KUBE-6-LOAD-BALANCER-SOURCE-CID"));
    assert!(d.ipsets.keys().all(|n| n.len() <= 31));
    assert!(d.services.keys().all(|k| k.addr.is_ipv6()));
}

#[test]
fn an_endpoint_change_updates_only_its_entries() {
    let v1 = rendered(&load("v1"), IpFamily::V4, &IpvsOptions::default());
    let v2 = rendered(&load("v2"), IpFamily::V4, &IpvsOptions::default());
    let script: String = ipset_update(&v1.ipsets, &v2.ipsets)
        .iter()
        .map(|c| format!("{c}\n"))
        .collect();
    golden("ipvs-v1-to-v2-ipset.txt", &script);
    assert!(script
        .lines()
        .all(|l| l.starts_with("add ") || l.starts_with("del ")));
    assert!(ipset_update(&v2.ipsets, &v2.ipsets).is_empty());
}
