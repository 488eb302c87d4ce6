//! Upstream kube-proxy's rule shapes, rendered from a lab's services as static rules: a test
//! fixture standing in for another product, so the lab can show that a datapath (eni-shared mode)
//! holds for kube-proxy itself and not only for `weir proxy`.
//!
//! Each renderer follows one upstream proxier (kubernetes `pkg/proxy/<mode>/proxier.go`, v1.31)
//! in the parts that decide a packet's path: where the DNAT happens, which traffic gets the
//! masquerade mark 0x4000 and where it is turned into MASQUERADE. It is a subset, written out
//! once when the lab comes up: no sync loop, no ClientIP affinity, no firewall (source ranges),
//! no healthz server, no metrics. Chain names use upstream's hashing
//! (`base32(sha256(servicePortName + protocol))[:16]`).
//!
//! Rendering is pure ([`iptables`], [`nftables`], [`ipvs`]); [`install`] applies the result
//! inside a node's namespace.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use crate::echo::ECHO_PORT;
use crate::manifests::{NAMESPACE, PORT_NAME};
use crate::state::{LabState, NodeState, ServiceState};
use crate::topology::ServiceType;

/// kube-proxy's `--iptables-masquerade-bit` 14: the mark that asks for SNAT.
pub const MASQ_MARK: &str = "0x4000";
/// The dummy link kube-proxy's ipvs mode binds every service IP to.
pub const IPVS_DUMMY: &str = "kube-ipvs0";

/// Which upstream proxier is imitated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    Ipvs,
}

/// What every renderer needs: the lab's services and pods, the node rendered for, and the
/// `--cluster-cidr` (pod traffic is not masqueraded to ClusterIPs; everything else is).
pub struct Input<'a> {
    pub state: &'a LabState,
    pub node: &'a NodeState,
    pub cluster_cidr: Ipv4Net,
    pub service_cidr: Ipv4Net,
}

/// One service port as the proxiers see it.
struct Port<'a> {
    svc: &'a ServiceState,
    /// `default/web:echo`, upstream's ServicePortName.
    name: String,
    proto: &'static str,
    endpoints: Vec<Ipv4Addr>,
    /// The endpoints on the node rendered for (externalTrafficPolicy Local).
    local: Vec<Ipv4Addr>,
}

impl Port<'_> {
    /// upstream `portProtoHash`.
    fn hash(&self) -> String {
        let digest = Sha256::digest(format!("{}{}", self.name, self.proto));
        data_encoding::BASE32.encode(&digest)[..16].to_string()
    }
    /// The addresses reached from outside: the LoadBalancer IP.
    fn external_ips(&self) -> Vec<Ipv4Addr> {
        self.svc.load_balancer_ip.into_iter().collect()
    }
    fn has_external(&self) -> bool {
        self.svc.node_port.is_some() || self.svc.load_balancer_ip.is_some()
    }
    /// The endpoints external traffic may reach.
    fn external_endpoints(&self) -> &[Ipv4Addr] {
        if self.svc.local_policy() {
            &self.local
        } else {
            &self.endpoints
        }
    }
}

fn ports<'a>(input: &Input<'a>) -> anyhow::Result<Vec<Port<'a>>> {
    input
        .state
        .services
        .iter()
        .map(|svc| {
            if svc.sticky() {
                bail!(
                    "service {}: sessionAffinity ClientIP is outside the kube-proxy-shaped subset",
                    svc.name
                );
            }
            let pods: Vec<_> = svc
                .backends
                .iter()
                .filter_map(|b| input.state.pods.iter().find(|p| &p.name == b))
                .collect();
            Ok(Port {
                svc,
                name: format!("{NAMESPACE}/{}:{PORT_NAME}", svc.name),
                proto: svc.protocol.as_str(),
                endpoints: pods.iter().map(|p| p.ip).collect(),
                local: pods
                    .iter()
                    .filter(|p| p.node == input.node.name)
                    .map(|p| p.ip)
                    .collect(),
            })
        })
        .collect()
}

/// `iptables-restore --noflush` input following `pkg/proxy/iptables/proxier.go`: nat
/// KUBE-SERVICES → KUBE-SVC (ClusterIP: masquerade what does not come from a pod) / KUBE-EXT
/// (NodePort, LB IP: masquerade, or with policy Local keep the source and use KUBE-SVL) →
/// KUBE-SEP (hairpin: masquerade; DNAT); KUBE-MARK-MASQ sets 0x4000 and KUBE-POSTROUTING turns
/// it into MASQUERADE; filter KUBE-SERVICES / KUBE-EXTERNAL-SERVICES reject what has no
/// endpoints.
pub fn iptables(input: &Input) -> anyhow::Result<String> {
    let ports = ports(input)?;
    let cc = input.cluster_cidr;
    let (mut filter, mut chains, mut rules) = (String::new(), String::new(), String::new());
    let mut nodeports = String::new();
    let _ = writeln!(
        filter,
        "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    );
    for p in &ports {
        let (svc, proto, h) = (p.svc, p.proto, p.hash());
        let m = format!("-m {proto} -p {proto}");
        if p.endpoints.is_empty() {
            let c = format!("-m comment --comment \"{} has no endpoints\"", p.name);
            let _ = writeln!(
                filter,
                "-A KUBE-SERVICES {c} {m} -d {}/32 --dport {} -j REJECT",
                svc.cluster_ip, svc.port
            );
            if let Some(np) = svc.node_port {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES {c} -m addrtype --dst-type LOCAL {m} --dport {np} -j REJECT"
                );
            }
            for ip in p.external_ips() {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES {c} {m} -d {ip}/32 --dport {} -j REJECT",
                    svc.port
                );
            }
            continue;
        }
        if p.has_external() && p.external_endpoints().is_empty() {
            // upstream: "has no local endpoints" → DROP (not REJECT) for external traffic.
            let c = format!("-m comment --comment \"{} has no local endpoints\"", p.name);
            if let Some(np) = svc.node_port {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES {c} -m addrtype --dst-type LOCAL {m} --dport {np} -j DROP"
                );
            }
            for ip in p.external_ips() {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES {c} {m} -d {ip}/32 --dport {} -j DROP",
                    svc.port
                );
            }
        }
        let svc_chain = format!("KUBE-SVC-{h}");
        let _ = writeln!(chains, ":{svc_chain} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" {m} -d {}/32 --dport {} -j {svc_chain}",
            p.name, svc.cluster_ip, svc.port
        );
        let _ = writeln!(
            rules,
            "-A {svc_chain} -m comment --comment \"{} cluster IP\" {m} -d {}/32 --dport {} ! -s {cc} -j KUBE-MARK-MASQ",
            p.name, svc.cluster_ip, svc.port
        );
        let sep = |ip: &Ipv4Addr| {
            let digest = Sha256::digest(format!("{}{}{ip}:{ECHO_PORT}", p.name, proto));
            format!("KUBE-SEP-{}", &data_encoding::BASE32.encode(&digest)[..16])
        };
        let spread = |rules: &mut String, chain: &str, eps: &[Ipv4Addr]| {
            for (i, ip) in eps.iter().enumerate() {
                let left = eps.len() - i;
                let stat = if left > 1 {
                    format!(
                        " -m statistic --mode random --probability {:.10}",
                        1.0 / left as f64
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    rules,
                    "-A {chain} -m comment --comment \"{} -> {ip}:{ECHO_PORT}\"{stat} -j {}",
                    p.name,
                    sep(ip)
                );
            }
        };
        spread(&mut rules, &svc_chain, &p.endpoints);
        for ip in &p.endpoints {
            let s = sep(ip);
            let _ = writeln!(chains, ":{s} - [0:0]");
            let _ = writeln!(
                rules,
                "-A {s} -m comment --comment {} -s {ip}/32 -j KUBE-MARK-MASQ\n\
                 -A {s} -m comment --comment {} {m} -j DNAT --to-destination {ip}:{ECHO_PORT}",
                p.name, p.name
            );
        }
        if !p.has_external() {
            continue;
        }
        let ext = format!("KUBE-EXT-{h}");
        let _ = writeln!(chains, ":{ext} - [0:0]");
        if let Some(np) = svc.node_port {
            let _ = writeln!(
                nodeports,
                "-A KUBE-NODEPORTS -m comment --comment {} {m} --dport {np} -j {ext}",
                p.name
            );
        }
        for ip in p.external_ips() {
            let _ = writeln!(
                rules,
                "-A KUBE-SERVICES -m comment --comment \"{} loadbalancer IP\" {m} -d {ip}/32 --dport {} -j {ext}",
                p.name, svc.port
            );
        }
        if svc.local_policy() {
            let svl = format!("KUBE-SVL-{h}");
            let _ = writeln!(chains, ":{svl} - [0:0]");
            let _ = writeln!(
                rules,
                "-A {ext} -m comment --comment \"pod traffic for {n} external destinations\" -s {cc} -j {svc_chain}\n\
                 -A {ext} -m comment --comment \"masquerade LOCAL traffic for {n} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ\n\
                 -A {ext} -m comment --comment \"route LOCAL traffic for {n} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}\n\
                 -A {ext} -j {svl}",
                n = p.name
            );
            spread(&mut rules, &svl, &p.local);
        } else {
            let _ = writeln!(
                rules,
                "-A {ext} -m comment --comment \"masquerade traffic for {} external destinations\" -j KUBE-MARK-MASQ\n\
                 -A {ext} -j {svc_chain}",
                p.name
            );
        }
    }
    filter += "COMMIT\n";
    let mut nat = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    nat += &chains;
    nat += &nat_base_jumps();
    nat += &postrouting_and_mark("");
    nat += &rules;
    nat += &nodeports;
    nat += "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS\nCOMMIT\n";
    Ok(filter + &nat)
}

/// The built-in chains' jumps into kube-proxy's nat chains (iptables and ipvs modes).
fn nat_base_jumps() -> String {
    "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
     -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
     -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n"
        .to_string()
}

/// KUBE-POSTROUTING (after `first`, ipvs mode's hairpin rule) and KUBE-MARK-MASQ, identical in
/// upstream's iptables and ipvs modes.
fn postrouting_and_mark(first: &str) -> String {
    format!(
        "{first}-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}\n"
    )
}

/// `nft -f` input following `pkg/proxy/nftables/proxier.go`: table `ip kube-proxy`, the
/// `services` chain dispatching through the `service-ips` and `service-nodeports` verdict maps
/// (NodePorts on `nodeport-ips`, the node's primary address: upstream's default
/// `--nodeport-addresses primary`), per-service `service-…` / `external-…` / `endpoint-…`
/// chains, `mark-for-masquerade` (0x4000) and `masquerading` in nat postrouting, and the
/// `no-endpoint-*` maps checked in filter chains at priority -110.
pub fn nftables(input: &Input) -> anyhow::Result<String> {
    let ports = ports(input)?;
    let cc = input.cluster_cidr;
    let node_ip = input.node.underlay_ip;
    let mut t = String::new();
    let (mut svc_ips, mut svc_nps, mut noep_ips, mut noep_nps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut chains = String::new();
    let cluster_ips: Vec<String> = ports.iter().map(|p| p.svc.cluster_ip.to_string()).collect();
    for p in &ports {
        let (svc, proto) = (p.svc, p.proto);
        let id = format!(
            "{}-{NAMESPACE}/{}/{proto}/{PORT_NAME}",
            &p.hash()[..8],
            svc.name
        );
        let (svc_chain, ext_chain) = (format!("service-{id}"), format!("external-{id}"));
        let ip_key = |ip: Ipv4Addr| format!("{ip} . {proto} . {}", svc.port);
        if p.endpoints.is_empty() {
            noep_ips.push(format!("{} : goto reject-chain", ip_key(svc.cluster_ip)));
            for ip in p.external_ips() {
                noep_ips.push(format!("{} : goto reject-chain", ip_key(ip)));
            }
            if let Some(np) = svc.node_port {
                noep_nps.push(format!("{proto} . {np} : goto reject-chain"));
            }
            continue;
        }
        if p.has_external() && p.external_endpoints().is_empty() {
            for ip in p.external_ips() {
                noep_ips.push(format!("{} : drop", ip_key(ip)));
            }
            if let Some(np) = svc.node_port {
                noep_nps.push(format!("{proto} . {np} : drop"));
            }
        }
        let ep_chain = |ip: &Ipv4Addr| format!("endpoint-{id}__{ip}/{ECHO_PORT}");
        let vmap = |eps: &[Ipv4Addr]| {
            let arms: Vec<String> = eps
                .iter()
                .enumerate()
                .map(|(i, ip)| format!("{i} : goto {}", ep_chain(ip)))
                .collect();
            format!(
                "numgen random mod {} vmap {{ {} }}",
                eps.len(),
                arms.join(", ")
            )
        };
        svc_ips.push(format!("{} : goto {svc_chain}", ip_key(svc.cluster_ip)));
        let _ = writeln!(
            chains,
            "  chain {svc_chain} {{\n    ip daddr {} {proto} dport {} ip saddr != {cc} jump mark-for-masquerade\n    {}\n  }}",
            svc.cluster_ip,
            svc.port,
            vmap(&p.endpoints)
        );
        for ip in &p.endpoints {
            let _ = writeln!(
                chains,
                "  chain {} {{\n    ip saddr {ip} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {ip}:{ECHO_PORT}\n  }}",
                ep_chain(ip)
            );
        }
        if !p.has_external() {
            continue;
        }
        for ip in p.external_ips() {
            svc_ips.push(format!("{} : goto {ext_chain}", ip_key(ip)));
        }
        if let Some(np) = svc.node_port {
            svc_nps.push(format!("{proto} . {np} : goto {ext_chain}"));
        }
        let body = if svc.local_policy() {
            let last = if p.local.is_empty() {
                "drop".to_string()
            } else {
                vmap(&p.local)
            };
            format!(
                "    ip saddr {cc} goto {svc_chain} comment \"short-circuit pod traffic\"\n    \
                 fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n    \
                 fib saddr type local goto {svc_chain} comment \"short-circuit local traffic\"\n    {last}"
            )
        } else {
            format!("    jump mark-for-masquerade\n    goto {svc_chain}")
        };
        let _ = writeln!(chains, "  chain {ext_chain} {{\n{body}\n  }}");
    }
    let elements = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", v.join(", "))
        }
    };
    let _ = writeln!(
        t,
        "table ip kube-proxy {{\n  comment \"rules for kube-proxy\"\n\
         \x20 set cluster-ips {{ type ipv4_addr; comment \"Active ClusterIPs\";{} }}\n\
         \x20 set nodeport-ips {{ type ipv4_addr; comment \"IPs that accept NodePort traffic\"; elements = {{ {node_ip} }}; }}\n\
         \x20 map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\";{} }}\n\
         \x20 map service-nodeports {{ type inet_proto . inet_service : verdict; comment \"NodePort traffic\";{} }}\n\
         \x20 map no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict; comment \"vmap to drop or reject packets to services with no endpoints\";{} }}\n\
         \x20 map no-endpoint-nodeports {{ type inet_proto . inet_service : verdict; comment \"vmap to drop or reject packets to service nodeports with no endpoints\";{} }}",
        elements(&cluster_ips),
        elements(&svc_ips),
        elements(&svc_nps),
        elements(&noep_ips),
        elements(&noep_nps),
    );
    let hooks = [
        ("filter-input", "filter", "input", "-110", "ct state new jump nodeport-endpoints-check\n    ct state new jump service-endpoints-check"),
        ("filter-forward", "filter", "forward", "-110", "ct state new jump service-endpoints-check\n    ct state new jump cluster-ips-check"),
        ("filter-output", "filter", "output", "-110", "ct state new jump service-endpoints-check"),
        ("filter-output-post-dnat", "filter", "output", "-90", "ct state new jump cluster-ips-check"),
        ("nat-prerouting", "nat", "prerouting", "-100", "jump services"),
        ("nat-output", "nat", "output", "-100", "jump services"),
        ("nat-postrouting", "nat", "postrouting", "100", "jump masquerading"),
    ];
    for (name, kind, hook, prio, body) in hooks {
        let _ = writeln!(
            t,
            "  chain {name} {{\n    type {kind} hook {hook} priority {prio}; policy accept;\n    {body}\n  }}"
        );
    }
    let _ = writeln!(
        t,
        "  chain mark-for-masquerade {{\n    meta mark set meta mark | {MASQ_MARK}\n  }}\n\
         \x20 chain masquerading {{\n    meta mark & {MASQ_MARK} == 0 return\n    meta mark set meta mark ^ {MASQ_MARK}\n    masquerade fully-random\n  }}\n\
         \x20 chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n    ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n  }}\n\
         \x20 chain service-endpoints-check {{\n    ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n  }}\n\
         \x20 chain nodeport-endpoints-check {{\n    ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports\n  }}\n\
         \x20 chain cluster-ips-check {{\n    ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n    ip daddr {} drop comment \"Drop traffic to unallocated ClusterIPs\"\n  }}\n\
         \x20 chain reject-chain {{\n    comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"\n    reject\n  }}",
        input.service_cidr
    );
    t += &chains;
    t += "}\n";
    Ok(t)
}

/// What kube-proxy's ipvs mode (`pkg/proxy/ipvs/proxier.go`) puts in a node, as the inputs of
/// the tools that load it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipvs {
    /// Bound (/32) to the `kube-ipvs0` dummy, which upstream leaves down: every ClusterIP and
    /// LoadBalancer IP, so IPVS sees them in LOCAL_IN.
    pub addresses: Vec<Ipv4Addr>,
    /// `ipset restore` input: KUBE-CLUSTER-IP, KUBE-LOAD-BALANCER, KUBE-LOOP-BACK,
    /// KUBE-NODE-PORT-TCP/UDP (+ -LOCAL- for policy Local).
    pub ipset: String,
    /// `ipvsadm -R` input: a virtual server per ClusterIP, LB IP and node IP:NodePort, real
    /// servers masqueraded (`-m`, NAT forwarding), scheduler rr.
    pub ipvsadm: String,
    /// `iptables-restore --noflush` input: the nat rules of ipvs mode.
    pub iptables: String,
    /// The sysctls upstream sets; `vs.conntrack=1` is what lets iptables MASQUERADE see IPVS's
    /// connections.
    pub sysctls: Vec<(&'static str, &'static str)>,
}

pub fn ipvs(input: &Input) -> anyhow::Result<Ipvs> {
    let ports = ports(input)?;
    let node_ip = input.node.underlay_ip;
    let mut addresses = Vec::new();
    let (mut cluster, mut lb, mut loopback) = (Vec::new(), Vec::new(), Vec::new());
    let mut nodeport: [Vec<u16>; 2] = Default::default();
    let mut nodeport_local: [Vec<u16>; 2] = Default::default();
    let mut adm = String::new();
    let mut virtual_server = |flag: &str, vip: String, eps: &[Ipv4Addr]| {
        let _ = writeln!(adm, "-A {flag} {vip} -s rr");
        for ep in eps {
            let _ = writeln!(adm, "-a {flag} {vip} -r {ep}:{ECHO_PORT} -m -w 1");
        }
    };
    for p in &ports {
        let svc = p.svc;
        let (flag, pi) = match p.proto {
            "udp" => ("-u", 1),
            _ => ("-t", 0),
        };
        addresses.push(svc.cluster_ip);
        cluster.push(format!("{},{}:{}", svc.cluster_ip, p.proto, svc.port));
        virtual_server(
            flag,
            format!("{}:{}", svc.cluster_ip, svc.port),
            &p.endpoints,
        );
        for ep in &p.endpoints {
            loopback.push(format!("{ep},{}:{ECHO_PORT},{ep}", p.proto));
        }
        for ip in p.external_ips() {
            addresses.push(ip);
            lb.push(format!("{ip},{}:{}", p.proto, svc.port));
            virtual_server(flag, format!("{ip}:{}", svc.port), p.external_endpoints());
        }
        if let Some(np) = svc.node_port {
            nodeport[pi].push(np);
            if svc.local_policy() {
                nodeport_local[pi].push(np);
            }
            virtual_server(flag, format!("{node_ip}:{np}"), p.external_endpoints());
        }
        if svc.kind == ServiceType::LoadBalancer && svc.local_policy() {
            bail!(
                "service {}: LoadBalancer with policy Local is outside the ipvs subset",
                svc.name
            );
        }
    }
    let mut ipset = String::new();
    let mut set = |name: &str, kind: &str, entries: &[String]| {
        let _ = writeln!(ipset, "create {name} {kind} -exist");
        for e in entries {
            let _ = writeln!(ipset, "add {name} {e} -exist");
        }
    };
    let hash = "family inet hashsize 1024 maxelem 65536";
    set("KUBE-CLUSTER-IP", &format!("hash:ip,port {hash}"), &cluster);
    set("KUBE-LOAD-BALANCER", &format!("hash:ip,port {hash}"), &lb);
    set(
        "KUBE-LOOP-BACK",
        &format!("hash:ip,port,ip {hash}"),
        &loopback,
    );
    let ports_of = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>();
    for (i, proto) in ["TCP", "UDP"].iter().enumerate() {
        let bitmap = "bitmap:port range 0-65535";
        set(
            &format!("KUBE-NODE-PORT-{proto}"),
            bitmap,
            &ports_of(&nodeport[i]),
        );
        set(
            &format!("KUBE-NODE-PORT-LOCAL-{proto}"),
            bitmap,
            &ports_of(&nodeport_local[i]),
        );
    }
    let cc = input.cluster_cidr;
    let mut nat = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODE-PORT - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n",
    );
    nat += &nat_base_jumps();
    nat += &postrouting_and_mark(
        "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE\n",
    );
    let _ = write!(
        nat,
        "-A KUBE-SERVICES ! -s {cc} -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n\
         -A KUBE-SERVICES -m comment --comment \"Kubernetes service lb portal\" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER\n\
         -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n\
         -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n\
         -A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT\n\
         -A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n"
    );
    for proto in ["TCP", "UDP"] {
        let p = proto.to_lowercase();
        let _ = write!(
            nat,
            "-A KUBE-NODE-PORT -p {p} -m comment --comment \"Kubernetes nodeport {proto} port with externalTrafficPolicy=local\" -m set --match-set KUBE-NODE-PORT-LOCAL-{proto} dst -j RETURN\n\
             -A KUBE-NODE-PORT -p {p} -m comment --comment \"Kubernetes nodeport {proto} port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-{proto} dst -j KUBE-MARK-MASQ\n"
        );
    }
    nat += "COMMIT\n";
    Ok(Ipvs {
        addresses,
        ipset,
        ipvsadm: adm,
        iptables: nat,
        sysctls: vec![
            ("net.ipv4.vs.conntrack", "1"),
            ("net.ipv4.vs.conn_reuse_mode", "0"),
            ("net.ipv4.vs.expire_nodest_conn", "1"),
            ("net.ipv4.vs.expire_quiescent_template", "1"),
        ],
    })
}

/// Runs `args` inside `netns` with `stdin`, failing with its stderr.
fn run_in(netns: &str, args: &[&str], stdin: &str) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", args[0]))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} in {netns}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Renders `mode`'s rules for `input.node` and loads them into its namespace.
pub fn install(mode: Mode, input: &Input) -> anyhow::Result<()> {
    let netns = input.node.netns.as_str();
    match mode {
        Mode::Iptables => run_in(netns, &["iptables-restore", "--noflush"], &iptables(input)?),
        Mode::Nftables => run_in(netns, &["nft", "-f", "-"], &nftables(input)?),
        Mode::Ipvs => {
            let r = ipvs(input)?;
            let mut links = format!("link add {IPVS_DUMMY} type dummy\n");
            for a in &r.addresses {
                let _ = writeln!(links, "address add {a}/32 dev {IPVS_DUMMY}");
            }
            run_in(netns, &["ip", "-b", "-"], &links)?;
            run_in(netns, &["ipset", "restore"], &r.ipset)?;
            run_in(netns, &["ipvsadm", "-R"], &r.ipvsadm)?;
            // one process for all of them: every exec counts in the test VM
            let mut args = vec!["sysctl".to_string(), "-qw".to_string()];
            args.extend(r.sysctls.iter().map(|(k, v)| format!("{k}={v}")));
            run_in(
                netns,
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
                "",
            )?;
            run_in(netns, &["iptables-restore", "--noflush"], &r.iptables)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    fn eni_input<T>(f: impl FnOnce(&Input) -> T) -> T {
        let topo = Topology::eni_demo();
        let state = LabState::simulated(&topo);
        let input = Input {
            state: &state,
            node: &state.nodes[0],
            cluster_cidr: topo.cluster_cidr,
            service_cidr: topo.service_cidr,
        };
        f(&input)
    }

    #[test]
    fn chain_names_use_upstreams_hash() {
        // pkg/proxy/iptables/proxier_test.go: servicePortChainName("ns1/svc1:p80", "tcp")
        let svc = ServiceState {
            name: "svc1".into(),
            kind: ServiceType::ClusterIP,
            protocol: crate::topology::Protocol::Tcp,
            port: 80,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            node_port: None,
            health_check_node_port: None,
            load_balancer_ip: None,
            load_balancer_node: None,
            external_traffic_policy: Default::default(),
            session_affinity: Default::default(),
            backends: vec![],
        };
        let p = Port {
            svc: &svc,
            name: "ns1/svc1:p80".into(),
            proto: "tcp",
            endpoints: vec![],
            local: vec![],
        };
        assert_eq!(p.hash(), "XPGD46QRK7WJZT7O");
    }

    #[test]
    fn iptables_shape_marks_and_masquerades_like_upstream() {
        let text = eni_input(|i| iptables(i).unwrap());
        for line in [
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        // edge: LoadBalancer, policy Cluster → KUBE-EXT masquerades, then KUBE-SVC
        assert!(text.contains("\"default/edge:echo loadbalancer IP\" -m tcp -p tcp -d 10.12.115.102/32 --dport 8443 -j KUBE-EXT-"), "{text}");
        assert!(text.contains(
            "\"masquerade traffic for default/edge:echo external destinations\" -j KUBE-MARK-MASQ"
        ));
        // shop (NodePort, Local) on node a: its local endpoint a1 (10.12.192.18) in KUBE-SVL
        assert!(text.contains("-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"));
        assert!(text.contains("\"default/shop:echo -> 10.12.192.18:8080\" -j KUBE-SEP-"));
        // gone: no endpoints → REJECT in filter, for the ClusterIP and the NodePort
        assert!(text.contains("\"default/gone:echo has no endpoints\" -m tcp -p tcp -d"));
        assert!(text.contains("-m addrtype --dst-type LOCAL -m tcp -p tcp --dport"));
        assert!(text.ends_with("-j KUBE-NODEPORTS\nCOMMIT\n"), "{text}");
    }

    #[test]
    fn nftables_shape_dispatches_through_verdict_maps() {
        let text = eni_input(|i| nftables(i).unwrap());
        assert!(text.starts_with("table ip kube-proxy {"));
        assert!(
            text.contains("10.12.115.102 . tcp . 8443 : goto external-"),
            "{text}"
        );
        assert!(text.contains("chain masquerading {\n    meta mark & 0x4000 == 0 return\n    meta mark set meta mark ^ 0x4000\n    masquerade fully-random"));
        assert!(
            text.contains("ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")
        );
        assert!(text.contains("set nodeport-ips { type ipv4_addr; comment \"IPs that accept NodePort traffic\"; elements = { 10.12.97.11 }; }"), "{text}");
        // gone has no endpoints: rejected; shop's NodePort has a local endpoint on node a
        assert!(text.contains(": goto reject-chain"));
        assert!(!text.contains(": drop"), "{text}");
    }

    #[test]
    fn nftables_drops_external_traffic_without_local_endpoints() {
        let topo = Topology::eni_demo();
        let state = LabState::simulated(&topo);
        let input = Input {
            state: &state,
            node: &state.nodes[1],
            cluster_cidr: topo.cluster_cidr,
            service_cidr: topo.service_cidr,
        };
        let text = nftables(&input).unwrap();
        assert!(text.contains("tcp . 30080 : drop"), "{text}");
        assert!(iptables(&input)
            .unwrap()
            .contains("\"default/shop:echo has no local endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP"));
    }

    #[test]
    fn ipvs_shape_binds_every_service_ip_and_masquerades_real_servers() {
        let r = eni_input(|i| ipvs(i).unwrap());
        assert!(r.addresses.contains(&Ipv4Addr::new(10, 12, 115, 102)));
        assert!(
            r.ipset
                .contains("add KUBE-LOAD-BALANCER 10.12.115.102,tcp:8443 -exist"),
            "{}",
            r.ipset
        );
        assert!(
            r.ipset
                .contains("add KUBE-NODE-PORT-LOCAL-TCP 30080 -exist"),
            "{}",
            r.ipset
        );
        // edge's only backend b2 (10.12.192.35): NAT forwarding
        assert!(r.ipvsadm.contains("-A -t 10.12.115.102:8443 -s rr\n-a -t 10.12.115.102:8443 -r 10.12.192.35:8080 -m -w 1\n"), "{}", r.ipvsadm);
        assert!(r.ipvsadm.contains("-A -u "), "dns is UDP: {}", r.ipvsadm);
        assert!(r
            .iptables
            .contains("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ"));
        assert!(r
            .iptables
            .contains("-m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE"));
        assert!(r.sysctls.contains(&("net.ipv4.vs.conntrack", "1")));
    }

    #[test]
    fn client_ip_affinity_is_refused_clearly() {
        let mut topo = Topology::default_demo();
        topo.services[0].session_affinity = crate::topology::SessionAffinity::ClientIP;
        let state = LabState::simulated(&topo);
        let input = Input {
            state: &state,
            node: &state.nodes[0],
            cluster_cidr: topo.cluster_cidr,
            service_cidr: topo.service_cidr,
        };
        let e = nftables(&input).unwrap_err().to_string();
        assert!(e.contains("service web: sessionAffinity ClientIP"), "{e}");
    }
}
