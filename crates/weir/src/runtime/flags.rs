//! One way to name the object source and the node on the command line: the same flags, value
//! grammar and defaults in `weir routes`, `weir policy` and `weir dns` (`weir proxy` and
//! `weir agent` take kube-proxy's spelling of the same: `--kubeconfig`, `--master`,
//! `--hostname-override`, which `--node-name` aliases there too).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::source::Origin;
use crate::proxy_cmd::parse_duration;

/// Where the objects come from.
#[derive(Debug, Clone, Args)]
pub struct SourceFlags {
    /// Directory of Kubernetes YAML manifests, watched.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "master"])]
    pub manifests: Option<PathBuf>,
    /// Objects from the Kubernetes API of this kubeconfig.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The Kubernetes API at URL (overrides the kubeconfig's server). With neither flag nor
    /// --manifests, in a pod (KUBERNETES_SERVICE_HOST set): the in-cluster service account.
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// How often the manifest directory is checked for changes (a Go duration: 500ms, 1s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "500ms")]
    pub manifest_poll_interval: Duration,
}

impl SourceFlags {
    /// The source these flags name ([`Origin::choose`]).
    pub fn origin(&self) -> anyhow::Result<Origin> {
        Origin::choose(
            self.manifests.as_ref(),
            self.kubeconfig.as_ref(),
            self.master.as_ref(),
            self.manifest_poll_interval,
        )
    }
}

/// This node's name.
#[derive(Debug, Clone, Args)]
pub struct NodeFlag {
    /// This node's name (default: the host name).
    #[arg(
        long = "node-name",
        visible_alias = "hostname-override",
        value_name = "NAME"
    )]
    pub node_name: Option<String>,
}

impl NodeFlag {
    /// The name given, else the host name.
    pub fn resolve(&self) -> anyhow::Result<String> {
        match &self.node_name {
            Some(n) => Ok(n.clone()),
            None => Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("host name")?
                .trim()
                .to_string()),
        }
    }
}

/// The address of a listener (`--metrics-bind-address`, `--healthz-bind-address`): IP:port,
/// or `""` or `0` for none (kube-proxy's "set empty to disable").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

pub fn parse_listen(s: &str) -> Result<Listen, String> {
    match s.trim() {
        "" | "0" => Ok(Listen(None)),
        a => a
            .parse()
            .map(|a| Listen(Some(a)))
            .map_err(|_| format!("{s:?} is not IP:port (\"\" or 0: off)")),
    }
}

/// Each command's default `/metrics` address (the proxy's, kube-proxy's 127.0.0.1:10249, is
/// in its settings with the rest of kube-proxy's defaults): loopback (scraped on the node, or moved with
/// the flag), on a port of its own, so every weir command can run on one node at once, in one
/// network namespace. The proxy's and DNS's are the ports of the tools they replace
/// (kube-proxy, CoreDNS, NodeLocal DNSCache); routes and policy take two that Kubernetes'
/// components leave free (10250–10259 are the kubelet's, the control plane's and kube-proxy's;
/// 10261–10262 OpenYurt's).
pub mod metrics_default {
    pub const ROUTES: &str = "127.0.0.1:10263";
    pub const POLICY: &str = "127.0.0.1:10264";
    pub const DNS: &str = "127.0.0.1:9153";
    pub const NODE_LOCAL_DNS: &str = "127.0.0.1:9253";
}

#[cfg(test)]
mod tests {
    use crate::{Cli, Command};
    use clap::Parser;
    use std::net::SocketAddr;

    fn metrics(args: &[&str]) -> Option<SocketAddr> {
        let argv = std::iter::once("weir").chain(args.iter().copied());
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Proxy(a) => crate::proxy_cmd::metrics_address(&a),
            Command::Routes(a) => crate::routes_cmd::metrics_address(&a),
            Command::Policy(a) => crate::policy_cmd::metrics_address(&a),
            Command::Dns(a) => crate::dns_cmd::metrics_address(&a),
            _ => unreachable!("{args:?}"),
        }
    }

    /// Every long-running command serves `/metrics` by default, on loopback and on a port of
    /// its own, so the proxy, routes, policy, the cluster DNS and a node-local cache run on one
    /// node (one network namespace) at once; `""` or `0` turns each off.
    #[test]
    fn every_command_serves_metrics_by_default_on_a_port_of_its_own() {
        let commands: &[&[&str]] = &[
            &["proxy", "--hostname-override=n1"],
            &["routes"],
            &["policy"],
            &["dns"],
            &["dns", "--node-local", "--listen=169.254.20.10:53"],
        ];
        let mut ports = std::collections::BTreeMap::new();
        for args in commands {
            let addr = metrics(args).unwrap_or_else(|| panic!("{args:?}: off by default"));
            assert!(addr.ip().is_loopback(), "{args:?}: {addr}");
            if let Some(other) = ports.insert(addr.port(), *args) {
                panic!(
                    "{args:?} and {other:?} both default to port {}",
                    addr.port()
                );
            }
            for off in ["--metrics-bind-address=", "--metrics-bind-address=0"] {
                let with_off: Vec<&str> = args.iter().copied().chain([off]).collect();
                assert_eq!(metrics(&with_off), None, "{with_off:?}");
            }
        }
        let ports: Vec<u16> = ports.into_keys().collect();
        assert_eq!(ports, [9153, 9253, 10249, 10263, 10264]);
    }
}
