//! The name checks `weir lab check` adds: every name form from every node, by dig and
//! through libc.

use std::time::Instant;

use serde::Serialize;

use super::resolv::resolv_conf;
use super::state::{
    dns_dir, DnsState, EXTERNAL_NAME, EXTERNAL_SERVICE, HEADLESS, NODE_LOCAL_IP, TARGET_SERVICE,
    ZONE,
};
use super::tools::{dig, getent};
use crate::manifests::{NAMESPACE, PORT_NAME};
use crate::state::{LabDir, LabState};

/// How a check asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// `dig @<cluster ip> <name> <type>`.
    Dig { qtype: String },
    /// `getent ahosts <name>`: glibc's getaddrinfo with the namespace's resolv.conf.
    Libc,
    /// `getent ahosts` in a host-network namespace whose resolv.conf is the one given
    /// (ClusterFirstWithHostNet) — bind-mounted for this command only.
    LibcHostNet,
}

/// One name check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NameCheck {
    /// `a/a1` or `a` (host network).
    pub from: String,
    pub netns: String,
    pub what: String,
    pub name: String,
    pub via: Via,
    /// Every one of these must be in the answer (record data or addresses).
    pub expect: Vec<String>,
}

/// The checks: from the first pod of every node, each name form by dig and through libc;
/// from the first node (host network) with the ClusterFirstWithHostNet resolv.conf. Pure.
pub fn plan(state: &LabState, dns: &DnsState) -> Vec<NameCheck> {
    let mut checks = Vec::new();
    let Some(web) = state.services.iter().find(|s| s.name == TARGET_SERVICE) else {
        return checks;
    };
    let ip = web.cluster_ip.to_string();
    let fqdn = format!("{TARGET_SERVICE}.{NAMESPACE}.svc.{ZONE}");
    let backends: Vec<String> = web
        .backends
        .iter()
        .filter_map(|b| state.pods.iter().find(|p| &p.name == b))
        .map(|p| p.ip.to_string())
        .collect();
    let outside = state.outside.to_string();
    let mut seen_nodes = Vec::new();
    for pod in &state.pods {
        if seen_nodes.contains(&pod.node) {
            continue;
        }
        seen_nodes.push(pod.node.clone());
        let from = format!("{}/{}", pod.node, pod.name);
        let mut add = |what: &str, name: &str, via: Via, expect: Vec<String>| {
            checks.push(NameCheck {
                from: from.clone(),
                netns: pod.netns.clone(),
                what: what.into(),
                name: name.into(),
                via,
                expect,
            })
        };
        let a = || Via::Dig { qtype: "A".into() };
        add("service FQDN", &fqdn, a(), vec![ip.clone()]);
        add("service FQDN", &fqdn, Via::Libc, vec![ip.clone()]);
        add("svc", TARGET_SERVICE, Via::Libc, vec![ip.clone()]);
        add(
            "svc.ns",
            &format!("{TARGET_SERVICE}.{NAMESPACE}"),
            Via::Libc,
            vec![ip.clone()],
        );
        let headless = format!("{HEADLESS}.{NAMESPACE}.svc.{ZONE}");
        add("headless", &headless, a(), backends.clone());
        add("headless", HEADLESS, Via::Libc, backends.clone());
        add(
            "named port SRV",
            &format!("_{PORT_NAME}._tcp.{fqdn}"),
            Via::Dig {
                qtype: "SRV".into(),
            },
            vec![format!("0 100 {} {fqdn}.", web.port)],
        );
        let ext = format!("{EXTERNAL_SERVICE}.{NAMESPACE}.svc.{ZONE}");
        add(
            "ExternalName",
            &ext,
            a(),
            vec![format!("{EXTERNAL_NAME}."), outside.clone()],
        );
        add(
            "ExternalName",
            EXTERNAL_SERVICE,
            Via::Libc,
            vec![outside.clone()],
        );
        add(
            "external (forwarded)",
            EXTERNAL_NAME,
            a(),
            vec![outside.clone()],
        );
        add(
            "external (forwarded)",
            EXTERNAL_NAME,
            Via::Libc,
            vec![outside.clone()],
        );
        // Pod records (`--pods insecure`): the pod's own dashed address.
        let pod_name = format!(
            "{}.{NAMESPACE}.pod.{ZONE}",
            pod.ip.to_string().replace('.', "-")
        );
        add("pod name", &pod_name, a(), vec![pod.ip.to_string()]);
    }
    if let Some(node) = state.nodes.iter().find(|n| n.name == dns.node) {
        checks.push(NameCheck {
            from: format!("{} (hostNetwork, ClusterFirstWithHostNet)", node.name),
            netns: node.netns.clone(),
            what: "service FQDN".into(),
            name: fqdn,
            via: Via::LibcHostNet,
            expect: vec![ip],
        });
    }
    checks
}

/// The outcome of one check.
#[derive(Debug, Clone, Serialize)]
pub struct NameResult {
    pub check: NameCheck,
    pub ok: bool,
    /// What came back (record data or addresses), or the error.
    pub got: Vec<String>,
    pub ms: u128,
}

/// Runs one check.
pub fn run_one(c: &NameCheck, dns: &DnsState, lab_dir: &LabDir) -> NameResult {
    let t = Instant::now();
    let got = match &c.via {
        Via::Dig { qtype } => {
            let a = dig(&c.netns, dns.nameserver(), &c.name, qtype);
            if a.status == "NOERROR" {
                Ok(a.answers.into_iter().map(|(_, d)| d).collect())
            } else {
                Err(format!("status {:?}", a.status))
            }
        }
        Via::Libc => getent(&c.netns, &c.name, None),
        Via::LibcHostNet => {
            let conf = dns_dir(lab_dir).join("resolv-hostnet.conf");
            match std::fs::write(&conf, resolv_conf(dns.nameserver(), NAMESPACE)) {
                Ok(()) => getent(&c.netns, &c.name, Some(&conf)),
                Err(e) => Err(format!("write {}: {e}", conf.display())),
            }
        }
    };
    let (ok, got) = match got {
        Ok(got) => (c.expect.iter().all(|e| got.contains(e)), got),
        Err(e) => (false, vec![e]),
    };
    NameResult {
        check: c.clone(),
        ok,
        got,
        ms: t.elapsed().as_millis(),
    }
}

pub fn run(checks: &[NameCheck], dns: &DnsState, lab_dir: &LabDir) -> Vec<NameResult> {
    checks.iter().map(|c| run_one(c, dns, lab_dir)).collect()
}

/// The results as a table.
pub fn render(results: &[NameResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.check.from.clone(),
                r.check.what.clone(),
                match &r.check.via {
                    Via::Dig { qtype } => format!("dig {qtype}"),
                    Via::Libc | Via::LibcHostNet => "getaddrinfo".into(),
                },
                r.check.name.clone(),
                r.got.join(" "),
                if r.ok { "ok".into() } else { "FAIL".into() },
            ]
        })
        .collect();
    crate::table::render_table(&["FROM", "CHECK", "VIA", "NAME", "GOT", "RESULT"], &rows)
}

pub fn summary(results: &[NameResult], dns: &DnsState) -> String {
    let ok = results.iter().filter(|r| r.ok).count();
    let via = if dns.node_local {
        format!(", pods asking the node-local cache on {NODE_LOCAL_IP}")
    } else {
        String::new()
    };
    format!(
        "dns: {ok}/{} name checks ok (weir dns on node {} behind {}{via}, forwarding to NSD)",
        results.len(),
        dns.node,
        dns.cluster_ip
    )
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::addr::dns_cluster_ip;
    use crate::dns::objects::objects;
    use crate::topology::Topology;

    #[test]
    fn plans_every_name_form_from_each_node() {
        let topo = Topology::default_demo();
        let state = LabState::simulated(&topo);
        let dns = DnsState {
            cluster_ip: dns_cluster_ip(topo.service_cidr),
            node: "a".into(),
            server_ip: Ipv4Addr::new(172, 30, 0, 11),
            server_pid: 1,
            nsd_pid: 2,
            node_local: false,
        };
        assert_eq!(dns.cluster_ip, Ipv4Addr::new(10, 96, 0, 10));
        let checks = plan(&state, &dns);
        // 12 per node with pods, and the host-network one.
        assert_eq!(checks.len(), 2 * 12 + 1);
        let pod = checks.iter().find(|c| c.what == "pod name").unwrap();
        assert_eq!(pod.name, "10-244-1-2.default.pod.cluster.local");
        let froms: std::collections::BTreeSet<&str> =
            checks.iter().map(|c| c.from.as_str()).collect();
        assert!(
            froms.contains("a/a1") && froms.contains("b/b1"),
            "{froms:?}"
        );
        let srv = checks.iter().find(|c| c.what == "named port SRV").unwrap();
        assert_eq!(srv.name, "_echo._tcp.web.default.svc.cluster.local");
        assert_eq!(srv.expect, ["0 100 80 web.default.svc.cluster.local."]);
        let headless = checks.iter().find(|c| c.what == "headless").unwrap();
        assert_eq!(headless.expect, ["10.244.1.2", "10.244.2.2"]);
        let objs = objects(dns.cluster_ip, dns.server_ip, &state);
        assert_eq!(objs[0]["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(objs[1]["endpoints"][0]["addresses"][0], "172.30.0.11");
        assert_eq!(objs[3]["endpoints"][1]["hostname"], "b1");
        assert_eq!(objs[4]["spec"]["externalName"], "www.example.test");
    }
}
