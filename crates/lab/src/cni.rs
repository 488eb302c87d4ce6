//! Running a CNI plugin exactly as a container runtime does: environment + config on stdin, result
//! on stdout, inside the node's network namespace.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::{json, Value};
use weir_kernel::NetNs;

use crate::state::LabDir;
use crate::topology::{CniKind, Network, Node, Overlay, Topology};

/// Where Debian's reference plugins live.
pub const REFERENCE_CNI_DIR: &str = "/usr/lib/cni";

/// The network configuration fed to the plugin on stdin for pods of `node`.
///
/// The pod MTU: on a vxlan overlay weir-cni is given no `mtu` but the node's `weir routes`
/// MTU file (`mtuFile`, the VTEP's MTU, docs/cni.md); the reference plugin cannot read it, so it
/// gets the VTEP's MTU (underlay 1500 − 50) in its `mtu`; host-gw pods keep the underlay's 1500.
pub fn net_conf(topo: &Topology, node: &Node, dir: &LabDir) -> Value {
    let ipam_dir = dir.ipam(&node.name);
    if topo.network == Network::Eni {
        return eni_conf(topo, node, &ipam_dir);
    }
    let vxlan = topo.overlay == Overlay::Vxlan;
    let mut ranges = json!([[{ "subnet": node.pod_cidr.to_string() }]]);
    let mut routes = json!([{ "dst": "0.0.0.0/0" }]);
    let mut cluster_cidr = json!(topo.cluster_cidr.to_string());
    // Dual-stack: one range set per family, a default route and a clusterCIDR for each.
    if let (Some(v6), Some(cidr6)) = (&topo.ipv6, topo.pod_cidr6(node)) {
        ranges =
            json!([[{ "subnet": node.pod_cidr.to_string() }], [{ "subnet": cidr6.to_string() }]]);
        routes = json!([{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]);
        cluster_cidr = json!([topo.cluster_cidr.to_string(), v6.cluster_cidr.to_string()]);
    }
    match topo.cni {
        CniKind::Weir => {
            let mut conf = json!({
                "cniVersion": "1.1.0",
                "name": "weir-lab",
                "type": "weir-cni",
                "mode": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "clusterCIDR": cluster_cidr,
                "ipam": {
                    "type": "weir-ipam",
                    "ranges": ranges,
                    "dataDir": ipam_dir,
                    "routes": routes,
                },
            });
            if vxlan {
                conf["mtuFile"] = json!(dir.routes_mtu(&node.name));
            } else {
                conf["mtu"] = json!(UNDERLAY_MTU);
            }
            conf
        }
        CniKind::Reference => json!({
            "cniVersion": "1.0.0",
            "name": "weir-lab",
            "type": "bridge",
            "bridge": "cni0",
            "mtu": if vxlan { UNDERLAY_MTU - VXLAN_OVERHEAD_V4 } else { UNDERLAY_MTU },
            "isGateway": true,
            "ipMasq": true,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": ranges,
                "dataDir": ipam_dir,
                "routes": routes,
            },
        }),
    }
}

/// The MTU of the lab's underlay links (veth's default).
pub const UNDERLAY_MTU: u32 = 1500;
/// VXLAN's overhead on an IPv4 underlay (outer IPv4 20 + UDP 8 + VXLAN 8 + Ethernet 14).
pub const VXLAN_OVERHEAD_V4: u32 = 50;

/// The ENI every lab node has (eni network), and its route table.
pub const ENI_NAME: &str = "eth1";
pub const ENI_TABLE: u32 = 1003;

/// weir-cni in eni-shared mode on the node's `eth1`, with the addresses the VPC assigned to it.
fn eni_conf(topo: &Topology, node: &Node, ipam_dir: &Path) -> Value {
    let addresses: Vec<String> = Topology::eni_addresses(node)
        .iter()
        .map(|a| a.to_string())
        .collect();
    json!({
        "cniVersion": "1.1.0",
        "name": "weir-lab",
        "type": "weir-cni",
        "mode": "eni-shared",
        "eniName": ENI_NAME,
        "eniGateway": topo.eni_gateway().to_string(),
        "routeTable": ENI_TABLE,
        "eniAddresses": addresses,
        "mtu": 1500,
        "dataDir": ipam_dir,
    })
}

/// A plugin to exec and the directory given as CNI_PATH.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub binary: PathBuf,
    pub cni_path: PathBuf,
}

impl Plugin {
    pub fn for_kind(kind: CniKind, weir_cni: &Path) -> Self {
        match kind {
            CniKind::Weir => Plugin {
                binary: weir_cni.to_path_buf(),
                cni_path: weir_cni.parent().map(Path::to_path_buf).unwrap_or_default(),
            },
            CniKind::Reference => Plugin {
                binary: Path::new(REFERENCE_CNI_DIR).join("bridge"),
                cni_path: REFERENCE_CNI_DIR.into(),
            },
        }
    }
}

/// One plugin invocation.
pub struct Invocation<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns: &'a Path,
    pub ifname: &'a str,
    pub config: &'a Value,
    /// The namespace the plugin process runs in (the node's).
    pub node_ns: &'a NetNs,
}

#[derive(Debug)]
pub struct Outcome {
    pub stdout: String,
    pub elapsed: Duration,
}

/// Execs the plugin; a non-zero exit becomes an error carrying the CNI error's code and message.
pub fn invoke(plugin: &Plugin, inv: &Invocation) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut cmd = Command::new(&plugin.binary);
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        )
        .env("CNI_COMMAND", inv.command)
        .env("CNI_CONTAINERID", inv.container_id)
        .env("CNI_NETNS", inv.netns)
        .env("CNI_IFNAME", inv.ifname)
        .env("CNI_PATH", &plugin.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    inv.node_ns.spawn_inside(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run CNI plugin {}", plugin.binary.display()))?;
    let input = serde_json::to_vec(inv.config)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin may exit before reading everything (an early error): ignore EPIPE here.
        let _ = stdin.write_all(&input);
    }
    let out = child.wait_with_output()?;
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let detail = match serde_json::from_str::<Value>(&stdout) {
            Ok(v) => format!(
                "CNI error {}: {}{}",
                v["code"],
                v["msg"].as_str().unwrap_or("(no msg)"),
                v["details"]
                    .as_str()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            ),
            Err(_) => format!("stdout {:?}", stdout.trim()),
        };
        bail!(
            "{} {} for {} failed ({}): {detail}{}",
            plugin.binary.display(),
            inv.command,
            inv.container_id,
            out.status,
            if stderr.trim().is_empty() {
                String::new()
            } else {
                format!("; stderr: {}", stderr.trim())
            }
        );
    }
    Ok(Outcome { stdout, elapsed })
}

/// The first IPv4 address of a CNI result (`ips[].address`, e.g. "10.244.1.2/24").
pub fn result_ipv4(stdout: &str) -> anyhow::Result<Ipv4Net> {
    result_ip(stdout, "IPv4")
}

/// The first IPv6 address of a CNI result (dual-stack pods).
pub fn result_ipv6(stdout: &str) -> anyhow::Result<Ipv6Net> {
    result_ip(stdout, "IPv6")
}

fn result_ip<N: std::str::FromStr>(stdout: &str, family: &str) -> anyhow::Result<N> {
    let v: Value = serde_json::from_str(stdout).context("CNI result is not JSON")?;
    let ips = v["ips"]
        .as_array()
        .ok_or_else(|| anyhow!("CNI result has no ips: {stdout}"))?;
    for ip in ips {
        if let Some(addr) = ip["address"].as_str() {
            if let Ok(net) = addr.parse::<N>() {
                return Ok(net);
            }
        }
    }
    bail!("CNI result has no {family} address: {stdout}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weir_config_matches_the_contract() {
        let t = Topology::default_demo();
        let dir = LabDir { dir: "/s".into() };
        let c = net_conf(&t, &t.nodes[0], &dir);
        assert_eq!(
            c,
            serde_json::from_str::<Value>(
                r#"{"cniVersion":"1.1.0","name":"weir-lab","type":"weir-cni","mode":"bridge","bridge":"cni0","mtu":1500,
 "isGateway":true,"ipMasq":true,"hairpinMode":true,"clusterCIDR":"10.244.0.0/16",
 "ipam":{"type":"weir-ipam","ranges":[[{"subnet":"10.244.1.0/24"}]],"dataDir":"/s/nodes/a/cni/ipam","routes":[{"dst":"0.0.0.0/0"}]}}"#
            )
            .unwrap()
        );
    }

    #[test]
    fn dual_stack_pods_get_a_range_set_route_and_cluster_cidr_per_family() {
        let t = Topology::dual_stack_demo();
        let c = net_conf(&t, &t.nodes[1], &LabDir { dir: "/s".into() });
        assert_eq!(
            c["ipam"]["ranges"],
            json!([[{"subnet": "10.244.2.0/24"}], [{"subnet": "fd00:10:244:2::/64"}]])
        );
        assert_eq!(
            c["ipam"]["routes"],
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
        assert_eq!(
            c["clusterCIDR"],
            json!(["10.244.0.0/16", "fd00:10:244::/48"])
        );
    }

    #[test]
    fn reference_config_drops_weir_keys() {
        let mut t = Topology::default_demo();
        t.cni = CniKind::Reference;
        let c = net_conf(&t, &t.nodes[1], &LabDir { dir: "/x".into() });
        assert_eq!(c["type"], "bridge");
        assert_eq!(c["mtu"], 1500);
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["ipam"]["type"], "host-local");
        assert_eq!(c["ipam"]["ranges"][0][0]["subnet"], "10.244.2.0/24");
        assert!(c.get("mode").is_none() && c.get("clusterCIDR").is_none());
    }

    #[test]
    fn vxlan_pods_take_the_overlay_mtu() {
        let mut t = Topology::vxlan_demo();
        let dir = LabDir { dir: "/s".into() };
        let c = net_conf(&t, &t.nodes[1], &dir);
        assert!(c.get("mtu").is_none(), "{c}");
        assert_eq!(c["mtuFile"], "/s/routes/b/mtu");
        t.cni = CniKind::Reference;
        assert_eq!(net_conf(&t, &t.nodes[1], &dir)["mtu"], 1450);
    }

    #[test]
    fn parses_results() {
        let r = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"fd00::2/64"},{"address":"10.244.1.2/24","gateway":"10.244.1.1","interface":0}]}"#;
        assert_eq!(result_ipv4(r).unwrap().to_string(), "10.244.1.2/24");
        assert_eq!(result_ipv6(r).unwrap().to_string(), "fd00::2/64");
        assert!(result_ipv6(r#"{"ips":[{"address":"10.244.1.2/24"}]}"#).is_err());
        assert!(result_ipv4(r#"{"ips":[]}"#).is_err());
        assert!(result_ipv4("nope").is_err());
    }
}
