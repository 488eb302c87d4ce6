//! Running a CNI plugin exactly as a container runtime does: environment + config on stdin, result
//! on stdout, inside the node's network namespace.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use ipnet::Ipv4Net;
use serde_json::{json, Value};
use weir_kernel::NetNs;

use crate::topology::{CniKind, Network, Node, Topology};

/// Where Debian's reference plugins live.
pub const REFERENCE_CNI_DIR: &str = "/usr/lib/cni";

/// The network configuration fed to the plugin on stdin for pods of `node`.
pub fn net_conf(topo: &Topology, node: &Node, ipam_dir: &Path) -> Value {
    if topo.network == Network::Eni {
        return eni_conf(topo, node, ipam_dir);
    }
    let ranges = json!([[{ "subnet": node.pod_cidr.to_string() }]]);
    let routes = json!([{ "dst": "0.0.0.0/0" }]);
    match topo.cni {
        CniKind::Weir => json!({
            "cniVersion": "1.1.0",
            "name": "weir-lab",
            "type": "weir-cni",
            "mode": "bridge",
            "bridge": "cni0",
            "mtu": 1500,
            "isGateway": true,
            "ipMasq": true,
            "hairpinMode": true,
            "clusterCIDR": topo.cluster_cidr.to_string(),
            "ipam": {
                "type": "weir-ipam",
                "ranges": ranges,
                "dataDir": ipam_dir,
                "routes": routes,
            },
        }),
        CniKind::Reference => json!({
            "cniVersion": "1.0.0",
            "name": "weir-lab",
            "type": "bridge",
            "bridge": "cni0",
            "mtu": 1500,
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
    let v: Value = serde_json::from_str(stdout).context("CNI result is not JSON")?;
    let ips = v["ips"]
        .as_array()
        .ok_or_else(|| anyhow!("CNI result has no ips: {stdout}"))?;
    for ip in ips {
        if let Some(addr) = ip["address"].as_str() {
            if let Ok(net) = addr.parse::<Ipv4Net>() {
                return Ok(net);
            }
        }
    }
    bail!("CNI result has no IPv4 address: {stdout}")
}

/// The gateway the pods of `node` use (first host of the pod CIDR, set on cni0 by the plugin). In
/// an eni network the same address is the ENI's own, the source masquerade picks out of the ENI.
pub fn gateway(node: &Node) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(node.pod_cidr.network()) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weir_config_matches_the_contract() {
        let t = Topology::default_demo();
        let c = net_conf(&t, &t.nodes[0], Path::new("/s/nodes/a/cni/ipam"));
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
    fn reference_config_drops_weir_keys() {
        let mut t = Topology::default_demo();
        t.cni = CniKind::Reference;
        let c = net_conf(&t, &t.nodes[1], Path::new("/x"));
        assert_eq!(c["type"], "bridge");
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["ipam"]["type"], "host-local");
        assert_eq!(c["ipam"]["ranges"][0][0]["subnet"], "10.244.2.0/24");
        assert!(c.get("mode").is_none() && c.get("clusterCIDR").is_none());
    }

    #[test]
    fn parses_results() {
        let r = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"fd00::2/64"},{"address":"10.244.1.2/24","gateway":"10.244.1.1","interface":0}]}"#;
        assert_eq!(result_ipv4(r).unwrap().to_string(), "10.244.1.2/24");
        assert!(result_ipv4(r#"{"ips":[]}"#).is_err());
        assert!(result_ipv4("nope").is_err());
    }
}
