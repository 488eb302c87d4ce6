//! iptables mode, pure parts: kube-proxy's chain names, golden restore scripts, what an
//! incremental update names; and `iptables-restore --test` of the scripts in a throwaway
//! network namespace (root only; skipped otherwise).

use std::collections::BTreeSet;

use weir_model::{Endpoint, IpFamily, Plan, Protocol, ServicePortKey};
use weir_proxy::iptables::names::{
    endpoint_chain, port_proto_hash, service_port_name, ServiceChains,
};
use weir_proxy::iptables::{
    chains_in_save, probability, render_full, render_full_replacing, render_update,
    service_chain_names, IptablesOptions,
};

mod common;
use common::{golden, in_netns, load, load_with};

/// The policies fixture, node ports on every local address.
fn policies() -> Plan {
    load_with(
        "iptables-policies",
        vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
    )
}

fn key(ns: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortKey {
    ServicePortKey {
        namespace: ns.into(),
        name: name.into(),
        port_name: port.into(),
        protocol,
        family: IpFamily::V4,
    }
}

fn endpoint(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        port,
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
    }
}

/// Chain names as kube-proxy computes them (values from kube-proxy's own tests and from
/// `iptables-save` of real clusters).
#[test]
fn chain_names_match_kube_proxy() {
    let kubernetes = key("default", "kubernetes", "https", Protocol::Tcp);
    assert_eq!(service_port_name(&kubernetes), "default/kubernetes:https");
    assert_eq!(
        ServiceChains::of(&kubernetes).svc,
        "KUBE-SVC-NPX46M4PTMTKRN6Y"
    );
    let dns = key("kube-system", "kube-dns", "dns", Protocol::Udp);
    assert_eq!(ServiceChains::of(&dns).svc, "KUBE-SVC-TCOU7JCQXEZGVUNU");
    let dns_tcp = key("kube-system", "kube-dns", "dns-tcp", Protocol::Tcp);
    assert_eq!(port_proto_hash(&dns_tcp), "ERIFXISQEP7F7OF4");
    let metrics = key("kube-system", "kube-dns", "metrics", Protocol::Tcp);
    assert_eq!(port_proto_hash(&metrics), "JD5MR3NA4I4DYORP");

    let svc1 = key("ns1", "svc1", "p80", Protocol::Tcp);
    let ch = ServiceChains::of(&svc1);
    assert_eq!(ch.svc, "KUBE-SVC-XPGD46QRK7WJZT7O");
    assert_eq!(ch.svl, "KUBE-SVL-XPGD46QRK7WJZT7O");
    assert_eq!(ch.ext, "KUBE-EXT-XPGD46QRK7WJZT7O");
    assert_eq!(ch.fw, "KUBE-FW-XPGD46QRK7WJZT7O");
    assert_eq!(
        endpoint_chain(&svc1, &endpoint("10.180.0.1", 80)),
        "KUBE-SEP-SXIVWICOYRO3J4NJ"
    );
    let svc3 = key("ns3", "svc3", "p80", Protocol::Tcp);
    assert_eq!(ServiceChains::of(&svc3).svc, "KUBE-SVC-X27LE4BHSL4DOUIK");
    assert_eq!(
        endpoint_chain(&svc3, &endpoint("10.180.0.3", 80)),
        "KUBE-SEP-OYPFS5VJICHGATKP"
    );
    // The family is not part of the name (v4 and v6 rules live in different tables).
    let mut v6 = svc1.clone();
    v6.family = IpFamily::V6;
    assert_eq!(ServiceChains::of(&v6), ch);
    // Every name fits iptables' 28-character limit.
    assert!(ch.svc.len() <= 28 && ch.fw.len() <= 28);
}

#[test]
fn probabilities_use_kube_proxys_formatting() {
    assert_eq!(probability(2), "0.5000000000");
    assert_eq!(probability(3), "0.3333333333");
    assert_eq!(probability(6), "0.1666666667");
    // Exact ties round half to even, like Go's %0.10f.
    assert_eq!(probability(2048), "0.0004882812");
}

#[test]
fn golden_full_and_update() {
    let o = IptablesOptions::default();
    let v1 = load("v1");
    let v2 = load("v2");
    golden("iptables-v1.txt", &render_full(&v1, IpFamily::V4, &o));
    golden("iptables-v1-ipv6.txt", &render_full(&v1, IpFamily::V6, &o));
    golden("iptables-v2.txt", &render_full(&v2, IpFamily::V4, &o));
    golden(
        "iptables-v1-to-v2.txt",
        &render_update(&v1, &v2, IpFamily::V4, &o),
    );
    let p = policies();
    golden("iptables-policies.txt", &render_full(&p, IpFamily::V4, &o));
    golden(
        "iptables-policies-ipv6.txt",
        &render_full(&p, IpFamily::V6, &o),
    );
    // Nothing changed: only the header.
    assert_eq!(render_update(&v2, &v2, IpFamily::V4, &o).lines().count(), 1);
    // v1 → v2 changes nothing of the IPv6 web service's v6 family... except its endpoints?
    // (the fixture only touches IPv4 endpoints): the IPv6 update is empty.
    assert_eq!(render_update(&v1, &v2, IpFamily::V6, &o).lines().count(), 1);
}

/// Chains declared (`:NAME`) and deleted (`-X NAME`) by a script, per table.
fn declared_and_deleted(script: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut declared = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    let mut table = String::new();
    for l in script.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(c) = l.strip_prefix(':') {
            declared.insert(format!("{table}/{}", c.split_whitespace().next().unwrap()));
        } else if let Some(c) = l.strip_prefix("-X ") {
            deleted.insert(format!("{table}/{c}"));
        }
    }
    (declared, deleted)
}

#[test]
fn update_names_only_listing_and_touched_chains() {
    let o = IptablesOptions::default();
    let v1 = load("v1");
    let v2 = load("v2");
    let u = render_update(&v1, &v2, IpFamily::V4, &o);
    assert!(u.starts_with("# weir iptables update"), "{u}");
    let (declared, deleted) = declared_and_deleted(&u);

    let diff = v1.diff(&v2);
    let touched: Vec<&ServicePortKey> = diff
        .touched()
        .into_iter()
        .filter(|k| k.family == IpFamily::V4)
        .collect();
    let chains_of = |p: &Plan, keys: &[&ServicePortKey]| -> BTreeSet<String> {
        let sub = Plan {
            services: p
                .services
                .iter()
                .filter(|(k, _)| keys.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..p.clone()
        };
        service_chain_names(&sub, IpFamily::V4, &o)
    };
    let new_touched = chains_of(&v2, &touched);
    let old_touched = chains_of(&v1, &touched);
    let mut expected: BTreeSet<String> = [
        "filter/KUBE-SERVICES",
        "filter/KUBE-EXTERNAL-SERVICES",
        "filter/KUBE-NODEPORTS",
        "filter/KUBE-PROXY-FIREWALL",
        "nat/KUBE-SERVICES",
        "nat/KUBE-NODEPORTS",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    expected.extend(new_touched.iter().map(|c| format!("nat/{c}")));
    let gone: BTreeSet<String> = old_touched
        .difference(&new_touched)
        .map(|c| format!("nat/{c}"))
        .collect();
    expected.extend(gone.iter().cloned());
    assert_eq!(declared, expected, "{u}");
    assert_eq!(deleted, gone, "{u}");
    // The removed service `empty` had no chains (no endpoints); the web service's old
    // endpoint 10.244.1.5 had one, which is deleted.
    let web = key("default", "web", "http", Protocol::Tcp);
    assert!(deleted.contains(&format!(
        "nat/{}",
        endpoint_chain(&web, &endpoint("10.244.1.5", 8080))
    )));
    // Unchanged services (`lb`) keep their chains: KUBE-SERVICES jumps to them, but they
    // are not redeclared.
    let lb = ServiceChains::of(&key("default", "lb", "", Protocol::Tcp));
    assert!(u.contains(&format!("-j {}", lb.svc)), "{u}");
    assert!(!declared.contains(&format!("nat/{}", lb.svc)), "{u}");
}

#[test]
fn full_render_deletes_stale_service_chains_only() {
    let o = IptablesOptions::default();
    let v2 = load("v2");
    let existing: BTreeSet<String> = [
        "KUBE-SVC-AAAAAAAAAAAAAAAA",
        "KUBE-SEP-BBBBBBBBBBBBBBBB",
        "KUBE-SERVICES",
        "DOCKER",
        "KUBE-KUBELET-CANARY",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let s = render_full_replacing(&v2, IpFamily::V4, &o, &existing);
    let (_, deleted) = declared_and_deleted(&s);
    assert_eq!(
        deleted,
        [
            "nat/KUBE-SEP-BBBBBBBBBBBBBBBB",
            "nat/KUBE-SVC-AAAAAAAAAAAAAAAA"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
}

#[test]
fn several_cluster_cidrs_use_the_offcluster_chain() {
    let o = IptablesOptions::default();
    let mut p = load("v1");
    p.cluster_cidrs.push("10.245.0.0/16".parse().unwrap());
    let s = render_full(&p, IpFamily::V4, &o);
    assert!(
        s.contains("-A KUBE-MARK-MASQ-OFFCLUSTER -s 10.244.0.0/16 -j RETURN"),
        "{s}"
    );
    assert!(
        s.contains("-A KUBE-MARK-MASQ-OFFCLUSTER -s 10.245.0.0/16 -j RETURN"),
        "{s}"
    );
    assert!(s.contains("--dport 80 -j KUBE-MARK-MASQ-OFFCLUSTER"), "{s}");
    // Going back to one CIDR is a globals change: a full render that deletes the chain.
    let back = load("v1");
    let u = render_update(&p, &back, IpFamily::V4, &o);
    assert!(u.starts_with("# weir iptables full"), "{u}");
    assert!(u.contains("-X KUBE-MARK-MASQ-OFFCLUSTER"), "{u}");
}

#[test]
fn save_output_parses_into_chains() {
    let save = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n*filter\n:INPUT ACCEPT [1:2]\nCOMMIT\n";
    let c = chains_in_save(save);
    assert_eq!(c["nat"].len(), 2);
    assert!(c["nat"].contains("KUBE-SERVICES"));
    assert!(c["filter"].contains("INPUT"));
}

/// Root and `iptables-restore`, `ip6tables-restore`, `unshare`, or the test is skipped (a failure under CI=true, naming what is missing).
fn can_run_iptables() -> bool {
    weir_testkit::can_run(weir_testkit::missing(
        true,
        &["iptables-restore", "ip6tables-restore", "unshare"],
    ))
}

#[test]
fn scripts_pass_restore_test_and_apply_in_a_netns() {
    if !can_run_iptables() {
        return;
    }
    let o = IptablesOptions::default();
    let v1 = load("v1");
    let v2 = load("v2");
    let tmp = std::env::temp_dir().join(format!("weir-iptables-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let write = |name: &str, text: String| {
        let p = tmp.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let f1 = write("v1", render_full(&v1, IpFamily::V4, &o));
    let f2 = write("v2", render_full(&v2, IpFamily::V4, &o));
    let u12 = write("u12", render_update(&v1, &v2, IpFamily::V4, &o));
    let u21 = write("u21", render_update(&v2, &v1, IpFamily::V4, &o));
    let f1v6 = write("v1v6", render_full(&v1, IpFamily::V6, &o));
    let f2v6 = write("v2v6", render_full(&v2, IpFamily::V6, &o));
    // Stale chains of v1 deleted by a full v2 render (what a restart does).
    let stale = service_chain_names(&v1, IpFamily::V4, &o);
    let f2r = write("v2r", render_full_replacing(&v2, IpFamily::V4, &o, &stale));
    let pol = write("pol", render_full(&policies(), IpFamily::V4, &o));
    let pol6 = write("pol6", render_full(&policies(), IpFamily::V6, &o));
    // --test on the full scripts; then load v1, --test and apply the update to v2 and
    // back, reload full v2 over it (replace), and check nothing of v1 is left.
    let r = "iptables-restore -w --noflush";
    let r6 = "ip6tables-restore -w --noflush";
    let (ok, log) = in_netns(&format!(
        "{r} --test < {f1}; {r} --test < {f2}; {r6} --test < {f1v6}; {r6} --test < {f2v6}
         {r} --test < {pol}; {r6} --test < {pol6}
         {r} < {f1}; {r} --test < {u12}; {r} < {u12}; {r} --test < {u21}; {r} < {u21}
         {r} < {u12}; {r} < {f2r}; {r} < {f1}; {r} < {f2r}
         {r6} < {f1v6}; {r6} < {f2v6}
         iptables-save > {dir}/saved",
        dir = tmp.display()
    ));
    let saved = std::fs::read_to_string(tmp.join("saved")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(ok, "{log}");
    // The kernel now holds exactly v2's service chains.
    let nat = chains_in_save(&saved).remove("nat").unwrap_or_default();
    let held: BTreeSet<String> = nat
        .into_iter()
        .filter(|c| weir_proxy::iptables::names::is_service_chain(c))
        .collect();
    assert_eq!(held, service_chain_names(&v2, IpFamily::V4, &o), "{saved}");
}

/// The nat commits of a script: (chains declared, rules) per `*nat … COMMIT` section.
fn nat_commits(script: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut cur: Option<(Vec<String>, Vec<String>)> = None;
    for l in script.lines() {
        if l == "*nat" {
            cur = Some((Vec::new(), Vec::new()));
        } else if l == "COMMIT" {
            out.extend(cur.take());
        } else if let Some((chains, rules)) = cur.as_mut() {
            if let Some(c) = l.strip_prefix(':') {
                chains.push(c.split_whitespace().next().unwrap().to_string());
            } else {
                rules.push(l.to_string());
            }
        }
    }
    out
}

/// What a batched script does to the nat table, whatever the batches: the final rules per
/// chain (a `:CHAIN` empties it) and the chains deleted.
fn nat_effect(script: &str) -> (Vec<String>, BTreeSet<String>) {
    let mut rules: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut deleted = BTreeSet::new();
    for (chains, lines) in nat_commits(script) {
        for c in chains {
            rules.insert(c.clone(), Vec::new());
            deleted.remove(&c);
        }
        for l in lines {
            if let Some(c) = l.strip_prefix("-X ") {
                rules.remove(c);
                deleted.insert(c.to_string());
            } else if let Some(rest) = l.strip_prefix("-A ") {
                let chain = rest.split_whitespace().next().unwrap().to_string();
                rules.entry(chain).or_default().push(l.to_string());
            }
        }
    }
    (rules.into_values().flatten().collect(), deleted)
}

/// Batched (iptables-nft), every nat commit jumps only to chains that exist by then, the
/// listing chains come after the chains they list, stale chains go after the last jump to
/// them, and the result equals the one-commit script's.
#[test]
fn batched_scripts_commit_in_a_working_order_with_the_same_result() {
    let one = IptablesOptions::default();
    let batched = IptablesOptions {
        chains_per_commit: Some(3),
        ..IptablesOptions::default()
    };
    let (v1, v2) = (load("v1"), load("v2"));
    let stale = service_chain_names(&v1, IpFamily::V4, &one);
    let scripts = [
        (
            render_full(&v2, IpFamily::V4, &one),
            render_full(&v2, IpFamily::V4, &batched),
        ),
        (
            render_full_replacing(&v2, IpFamily::V4, &one, &stale),
            render_full_replacing(&v2, IpFamily::V4, &batched, &stale),
        ),
        (
            render_update(&v1, &v2, IpFamily::V4, &one),
            render_update(&v1, &v2, IpFamily::V4, &batched),
        ),
    ];
    for (n, (single, split)) in scripts.iter().enumerate() {
        assert_eq!(nat_effect(single), nat_effect(split), "{split}");
        let commits = nat_commits(split);
        assert!(commits.len() > 2, "not batched:\n{split}");
        // Chains that exist before the script: the fixed ones, and v1's before the update.
        let mut exist: BTreeSet<String> = ["KUBE-MARK-MASQ", "KUBE-POSTROUTING"]
            .map(String::from)
            .into();
        if n == 2 {
            exist.extend(stale.iter().cloned());
        }
        let mut listed_at = None;
        for (i, (chains, rules)) in commits.iter().enumerate() {
            exist.extend(chains.iter().cloned());
            for r in rules {
                if let Some(t) = r.split(" -j ").nth(1) {
                    let t = t.split_whitespace().next().unwrap();
                    if t.starts_with("KUBE-") {
                        assert!(exist.contains(t), "commit {i} jumps to {t} first:\n{split}");
                    }
                }
                if let Some(c) = r.strip_prefix("-X ") {
                    // Nothing later may still jump to it.
                    for (later, _) in commits[i + 1..]
                        .iter()
                        .flat_map(|(_, r)| r.iter())
                        .map(|r| (r, ()))
                    {
                        assert!(
                            !later.ends_with(&format!("-j {c}")),
                            "{c} deleted too early:\n{split}"
                        );
                    }
                }
            }
            if chains.iter().any(|c| c == "KUBE-SERVICES") {
                listed_at = Some(i);
            }
        }
        let listed_at = listed_at.expect("KUBE-SERVICES declared");
        for (chains, _) in &commits[..listed_at] {
            assert!(
                !chains.iter().any(|c| c.starts_with("KUBE-SERVICES")),
                "listing before the end:\n{split}"
            );
        }
        for (chains, _) in &commits[listed_at + 1..] {
            assert!(chains
                .iter()
                .all(|c| weir_proxy::iptables::names::is_service_chain(c)));
        }
    }
}

/// The defect: one commit naming every chain of a big table, which iptables-nft's restore
/// handles in time quadratic in the chains (2,000 services × 10 endpoints: 22,000 chains).
/// Batched, no nat commit names more than the batch plus one service port's chains.
#[test]
fn big_tables_are_committed_in_bounded_batches() {
    use std::net::{IpAddr, Ipv4Addr};
    use weir_model::{
        EndpointSet, Frontend, FrontendKind, Masquerade, NodePortAddresses, ServicePortPlan,
        TopologyMode, Verdict,
    };
    let services = (0..2000u32)
        .map(|i| {
            let k = key("bench", &format!("svc-{i:05}"), "", Protocol::Tcp);
            let eps = (0..10)
                .map(|j| endpoint(&Ipv4Addr::from(0x0a80_0000 + i * 10 + j).to_string(), 8080))
                .collect();
            let fe = Frontend {
                kind: FrontendKind::ClusterIp,
                addr: Some(IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i))),
                port: 80,
                endpoints: EndpointSet::Cluster,
                verdict: Verdict::Forward,
                masquerade: Masquerade::OffCluster,
                short_circuit: false,
                source_ranges: None,
            };
            let sp = ServicePortPlan {
                port: 80,
                frontends: vec![fe],
                cluster_endpoints: eps,
                local_endpoints: vec![],
                affinity_timeout: None,
                internal_policy_local: false,
                external_policy_local: false,
                health_check_node_port: None,
                topology: TopologyMode::None,
                has_any_endpoints: true,
            };
            (k, sp.into())
        })
        .collect();
    let plan = Plan {
        services,
        node_port_addresses_v4: NodePortAddresses::None,
        node_port_addresses_v6: NodePortAddresses::None,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        masquerade_all: false,
        warnings: vec![],
    };
    let o = IptablesOptions {
        chains_per_commit: Some(weir_proxy::iptables::NFT_CHAINS_PER_COMMIT),
        ..IptablesOptions::default()
    };
    let script = render_full(&plan, IpFamily::V4, &o);
    let commits = nat_commits(&script);
    let biggest = commits.iter().map(|(c, _)| c.len()).max().unwrap();
    assert!(
        biggest <= weir_proxy::iptables::NFT_CHAINS_PER_COMMIT + 11,
        "{biggest}"
    );
    let total: usize = commits.iter().map(|(c, _)| c.len()).sum();
    assert!(total >= 22_000, "{total}");
}

/// The batched scripts in the kernel: load v1, update to v2 and back, replace over stale
/// chains; every commit is accepted and the kernel ends holding exactly v2's chains.
#[test]
fn batched_scripts_apply_in_a_netns() {
    if !can_run_iptables() {
        return;
    }
    let o = IptablesOptions {
        chains_per_commit: Some(4),
        ..IptablesOptions::default()
    };
    let (v1, v2) = (load("v1"), load("v2"));
    let tmp = std::env::temp_dir().join(format!("weir-iptables-batch-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let write = |name: &str, text: String| {
        let p = tmp.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let stale = service_chain_names(&v1, IpFamily::V4, &o);
    let f1 = write("v1", render_full(&v1, IpFamily::V4, &o));
    let u12 = write("u12", render_update(&v1, &v2, IpFamily::V4, &o));
    let u21 = write("u21", render_update(&v2, &v1, IpFamily::V4, &o));
    let f2r = write("v2r", render_full_replacing(&v2, IpFamily::V4, &o, &stale));
    let r = "iptables-restore -w --noflush";
    let (ok, log) = in_netns(&format!(
        "{r} < {f1}; {r} < {u12}; {r} < {u21}; {r} < {f2r}; iptables-save > {dir}/saved",
        dir = tmp.display()
    ));
    let saved = std::fs::read_to_string(tmp.join("saved")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(ok, "{log}");
    let held: BTreeSet<String> = chains_in_save(&saved)
        .remove("nat")
        .unwrap_or_default()
        .into_iter()
        .filter(|c| weir_proxy::iptables::names::is_service_chain(c))
        .collect();
    assert_eq!(held, service_chain_names(&v2, IpFamily::V4, &o), "{saved}");
}

/// `p` with web's endpoint `from` replaced by `to` (the planner keeps endpoints sorted).
fn replace_web_endpoint(p: &Plan, from: &str, to: &str) -> Plan {
    let mut p = p.clone();
    let web = key("default", "web", "http", Protocol::Tcp);
    let sp = std::sync::Arc::make_mut(p.services.get_mut(&web).unwrap());
    let ep = sp
        .cluster_endpoints
        .iter_mut()
        .find(|e| e.ip.to_string() == from)
        .unwrap();
    ep.ip = to.parse().unwrap();
    sp.cluster_endpoints.sort();
    p
}

/// An endpoint change names only its service port's chains, as kube-proxy's partial sync
/// does for the chains it writes, and unlike its rewrite of the listing chains: those name
/// every service port of the cluster (as jump targets), which made a one-endpoint sync cost
/// as much as the cluster is big. The update still applies over the full ruleset.
#[test]
fn an_endpoint_change_names_only_its_own_chains() {
    let o = IptablesOptions::default();
    let v1 = load("v1");
    let v2 = replace_web_endpoint(&v1, "10.244.1.5", "10.244.1.9");
    let u = render_update(&v1, &v2, IpFamily::V4, &o);
    let (declared, deleted) = declared_and_deleted(&u);
    let web = key("default", "web", "http", Protocol::Tcp);
    let old_sep = endpoint_chain(&web, &endpoint("10.244.1.5", 8080));
    let only_web = Plan {
        services: v2
            .services
            .iter()
            .filter(|(k, _)| **k == web)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..v2.clone()
    };
    let mut expected: BTreeSet<String> = service_chain_names(&only_web, IpFamily::V4, &o)
        .into_iter()
        .map(|c| format!("nat/{c}"))
        .collect();
    expected.insert(format!("nat/{old_sep}"));
    assert_eq!(declared, expected, "{u}");
    assert_eq!(deleted, BTreeSet::from([format!("nat/{old_sep}")]), "{u}");
    assert!(!u.contains("*filter"), "{u}");
    assert!(!u.contains("KUBE-SERVICES"), "{u}");

    if !can_run_iptables() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("weir-iptables-ep-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let write = |name: &str, text: &str| {
        let p = tmp.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let f1 = write("v1", &render_full(&v1, IpFamily::V4, &o));
    let f2 = write("v2", &render_full(&v2, IpFamily::V4, &o));
    let u12 = write("u12", &u);
    let r = "iptables-restore -w --noflush";
    let dir = tmp.display();
    let (ok1, log1) = in_netns(&format!(
        "{r} < {f1}; {r} < {u12}; iptables-save -t nat > {dir}/updated"
    ));
    let (ok2, log2) = in_netns(&format!("{r} < {f2}; iptables-save -t nat > {dir}/direct"));
    let read = |name: &str| std::fs::read_to_string(tmp.join(name)).unwrap_or_default();
    let (updated, direct) = (read("updated"), read("direct"));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(ok1 && ok2, "{log1}{log2}");
    // The updated kernel holds what loading v2 from scratch gives (chains and rules; the
    // order of chain declarations in a save is the kernel's, so compare as sets).
    let body = |s: &str| -> BTreeSet<String> {
        s.lines()
            .filter(|l| l.starts_with("-A ") || l.starts_with(':'))
            .map(String::from)
            .collect()
    };
    assert_eq!(body(&updated), body(&direct), "{updated}");
    assert!(updated.contains("10.244.1.9:8080"), "{updated}");
}
