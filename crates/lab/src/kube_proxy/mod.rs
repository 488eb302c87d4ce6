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
//! Rendering is pure ([`iptables::render`], [`nftables::render`], [`ipvs::render`]); [`install`]
//! applies the result inside a node's namespace.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::topology::ProxyKind;

pub mod iptables;
pub mod ipvs;
pub mod nftables;
mod ports;

pub use ports::{Input, IPVS_DUMMY, MASQ_MARK};

/// Which upstream proxier is imitated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    Ipvs,
}

impl Mode {
    /// The upstream kube-proxy mode whose rules the lab writes instead of running a proxy.
    pub fn of(proxy: ProxyKind) -> Option<Mode> {
        match proxy {
            ProxyKind::KubeProxyIptables => Some(Mode::Iptables),
            ProxyKind::KubeProxyNftables => Some(Mode::Nftables),
            ProxyKind::KubeProxyIpvs => Some(Mode::Ipvs),
            _ => None,
        }
    }
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
        Mode::Iptables => run_in(
            netns,
            &["iptables-restore", "--noflush"],
            &iptables::render(input)?,
        ),
        Mode::Nftables => run_in(netns, &["nft", "-f", "-"], &nftables::render(input)?),
        Mode::Ipvs => {
            let r = ipvs::render(input)?;
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
    use crate::state::LabState;
    use crate::topology::Topology;

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
        let e = nftables::render(&input).unwrap_err().to_string();
        assert!(e.contains("service web: sessionAffinity ClientIP"), "{e}");
    }
}
