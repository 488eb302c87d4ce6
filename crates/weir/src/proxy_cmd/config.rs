//! `weir proxy` settings: command-line flags over a KubeProxyConfiguration file over defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use ipnet::IpNet;
use serde::Deserialize;
use weir_model::NodePortDefault;
use weir_proxy::iptables::BackendChoice;
use weir_source::yaml::excerpt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    Nftables,
    Iptables,
    Ipvs,
    Userspace,
}

impl ProxyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Userspace => "userspace",
        }
    }
}

/// `--iptables-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IptablesBackendFlag {
    Auto,
    Nft,
    Legacy,
}

/// Flags of `weir proxy` (kube-proxy's names). Unset flags fall back to `--config`, then to
/// kube-proxy's defaults.
#[derive(Debug, Clone, Default, Args)]
pub struct ProxyFlags {
    /// Directory of Kubernetes YAML manifests (Services, EndpointSlices, Nodes), watched.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// How often the manifest directory is checked for changes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub manifest_poll_interval: Option<Duration>,
    /// Largest manifest file read, in bytes (larger files are reported and keep their objects).
    #[arg(long, value_name = "BYTES")]
    pub manifest_max_file_size: Option<u64>,
    /// Where last-known-good copies of the manifests' objects are kept across restarts.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// How services are programmed: nftables (the default), iptables, ipvs, or userspace
    /// (connections relayed through this process). Unset: the --config file's `mode`.
    #[arg(long, value_enum)]
    pub proxy_mode: Option<ProxyMode>,
    /// IPVS scheduler in ipvs mode: rr (default), wrr, lc, wlc, lblc, lblcr, sh, dh, sed,
    /// nq, mh.
    #[arg(long, value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,
    /// iptables mode: the iptables implementation to drive. `auto` (default): the one that
    /// already holds kubelet's hint chains, else more KUBE-/WEIR- chains, else nft.
    #[arg(long, value_enum)]
    pub iptables_backend: Option<IptablesBackendFlag>,
    /// Pod CIDRs of the cluster, comma-separated.
    #[arg(long, value_name = "CIDR[,CIDR]", value_delimiter = ',')]
    pub cluster_cidr: Vec<IpNet>,
    /// This node's name (default: the host name).
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// CIDRs whose local addresses serve NodePorts, or `primary` (the node's own IPs).
    /// Unset: every local address in iptables, ipvs and userspace modes, `primary` in
    /// nftables mode (as kube-proxy). A loopback CIDR enables localhost NodePorts (iptables
    /// mode only).
    #[arg(long, value_name = "CIDR[,CIDR]|primary", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,
    /// Masquerade all traffic sent to service IPs.
    #[arg(long)]
    pub masquerade_all: bool,
    /// Periodic resync interval (Go duration, e.g. 30s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub sync_period: Option<Duration>,
    /// Interval of the periodic full resync, which rewrites every rule even when nothing
    /// seems to have changed (kube-proxy: one hour, fixed).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub full_sync_period: Option<Duration>,
    /// Minimum interval between syncs; changes arriving faster are batched.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub min_sync_period: Option<Duration>,
    /// KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of /healthz and /livez.
    #[arg(long, value_name = "ADDR")]
    pub healthz_bind_address: Option<SocketAddr>,
    /// Address of /metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind_address: Option<SocketAddr>,
    /// kubeconfig file of the Kubernetes API to watch (instead of --manifests).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the Kubernetes API server (overrides the kubeconfig's), e.g.
    /// https://10.0.0.1:6443.
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// Server-side timeout of each API watch request; a silent watch is abandoned after it
    /// (plus 5 s), a hung response after it plus 10 s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, hide = true)]
    pub api_watch_timeout: Option<Duration>,
}

/// Where the Kubernetes API is (the source when set).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiSettings {
    /// None with `master` None: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub watch_timeout: Duration,
}

/// The settings the agent runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub manifests: PathBuf,
    pub manifest_poll_interval: Duration,
    pub manifest_max_file_size: u64,
    pub state_dir: PathBuf,
    pub mode: ProxyMode,
    pub cluster_cidrs: Vec<IpNet>,
    pub node_name: String,
    /// Empty: `nodeport_default`.
    pub nodeport_addresses: Vec<IpNet>,
    pub nodeport_default: NodePortDefault,
    /// Loopback addresses may serve NodePorts (iptables mode, with `route_localnet`).
    pub localhost_nodeports: bool,
    pub masquerade_all: bool,
    /// How often the proxy re-checks its rules (and resyncs if they were changed).
    pub sync_period: Duration,
    /// How often every rule is rewritten regardless.
    pub full_sync_period: Duration,
    pub min_sync_period: Duration,
    pub healthz_bind_address: SocketAddr,
    pub metrics_bind_address: SocketAddr,
    /// The Kubernetes API source; `None`: the manifest directory.
    pub api: Option<ApiSettings>,
    pub ipvs: IpvsSettings,
    /// iptables mode's implementation (`--iptables-backend`).
    pub iptables_backend: BackendChoice,
}

/// ipvs mode's settings (`--ipvs-scheduler`, the configuration file's `ipvs:` section).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpvsSettings {
    pub scheduler: String,
    /// IPVS connection timeouts; zero leaves the kernel's.
    pub tcp_timeout: Duration,
    pub tcp_fin_timeout: Duration,
    pub udp_timeout: Duration,
}

/// The KubeProxyConfiguration fields weir applies. Other fields of the kind are accepted and
/// reported as ignored (real configuration files carry many that do not apply here).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeProxyConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    mode: Option<String>,
    cluster_c_i_d_r: Option<String>,
    hostname_override: Option<String>,
    #[serde(default)]
    node_port_addresses: Vec<String>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    iptables: Option<ModeSection>,
    nftables: Option<ModeSection>,
    client_connection: Option<ClientConnection>,
    ipvs: Option<ModeSection>,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModeSection {
    masquerade_all: Option<bool>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    // ipvs: only.
    scheduler: Option<String>,
    tcp_timeout: Option<String>,
    tcp_fin_timeout: Option<String>,
    udp_timeout: Option<String>,
}

fn ipvs_settings(
    flag: Option<&str>,
    section: Option<&ModeSection>,
) -> anyhow::Result<IpvsSettings> {
    let scheduler = flag
        .or(section.and_then(|s| s.scheduler.as_deref()))
        .filter(|s| !s.is_empty())
        .unwrap_or("rr")
        .to_string();
    weir_proxy::ipvs::check_scheduler(&scheduler)
        .map_err(|e| anyhow::anyhow!("--ipvs-scheduler: {e}"))?;
    let timeout = |v: Option<&Option<String>>, name: &str| -> anyhow::Result<Duration> {
        match v.and_then(|o| o.as_deref()) {
            Some(t) => parse_duration(t).map_err(|e| anyhow::anyhow!("config ipvs.{name}: {e}")),
            None => Ok(Duration::ZERO),
        }
    };
    Ok(IpvsSettings {
        scheduler,
        tcp_timeout: timeout(section.map(|s| &s.tcp_timeout), "tcpTimeout")?,
        tcp_fin_timeout: timeout(section.map(|s| &s.tcp_fin_timeout), "tcpFinTimeout")?,
        udp_timeout: timeout(section.map(|s| &s.udp_timeout), "udpTimeout")?,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientConnection {
    kubeconfig: Option<String>,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde_json::Value>,
}

/// A --config file that does not decode, said in one line: the file, where (line, and the
/// field when inside one), what is wrong, and that line's start; never the file's content.
fn decode_config(path: &std::path::Path, text: &str) -> anyhow::Result<KubeProxyConfiguration> {
    weir_source::yaml::decode(text).map_err(|e| {
        let at = e
            .line
            .as_ref()
            .map(|(n, start)| format!("line {n} ({start:?})"));
        match (&e.field, e.not_a_mapping) {
            (None, what) => {
                let what = what.map(|w| format!("the file reads as {w}"));
                let at = at.map(|at| format!("; {at}")).unwrap_or_default();
                anyhow::anyhow!(
                    "{}: not a KubeProxyConfiguration (a YAML mapping of fields): {}{at}",
                    path.display(),
                    what.unwrap_or(e.message)
                )
            }
            (Some(field), _) => {
                let at = at.map(|at| format!("{at}: ")).unwrap_or_default();
                anyhow::anyhow!("{}: {at}{field}: {}", path.display(), e.message)
            }
        }
    })
}

/// Parses a Go duration (`300ms`, `30s`, `1m30s`, `1h`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {:?} (expected e.g. 250ms, 30s, 1m30s)",
            excerpt(s, 40)
        )
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total += Duration::from_secs_f64(value * scale);
    }
    Ok(total)
}

fn parse_cidrs(items: &[String], what: &str) -> anyhow::Result<Vec<IpNet>> {
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty() && *s != "primary")
        .map(|s| {
            s.parse::<IpNet>()
                .with_context(|| format!("{what}: {:?} is not a CIDR", excerpt(s, 60)))
        })
        .collect()
}

/// Running in a pod: the kubelet sets KUBERNETES_SERVICE_HOST in every container.
fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

impl ProxyFlags {
    /// The API source, as kube-proxy finds its API server: `--kubeconfig` (or the config
    /// file's `clientConnection.kubeconfig`) and/or `--master`; with neither, in a pod (and
    /// without `--manifests`), the in-cluster service account. Outside a cluster with none of
    /// them, `None`: the manifest directory.
    fn api_settings(
        &self,
        file: &KubeProxyConfiguration,
        in_cluster: bool,
    ) -> anyhow::Result<Option<ApiSettings>> {
        let kubeconfig = self.kubeconfig.clone().or_else(|| {
            file.client_connection
                .as_ref()
                .and_then(|c| c.kubeconfig.as_deref())
                .filter(|k| !k.trim().is_empty())
                .map(PathBuf::from)
        });
        let master = self.master.clone().filter(|m| !m.trim().is_empty());
        let explicit = kubeconfig.is_some() || master.is_some();
        if explicit && self.manifests.is_some() {
            bail!(
                "--manifests and the Kubernetes API (--kubeconfig, --master or \
                 clientConnection.kubeconfig) are two sources: choose one"
            );
        }
        let in_pod_by_default = in_cluster && self.manifests.is_none();
        if !(explicit || in_pod_by_default) {
            return Ok(None);
        }
        let watch_timeout = self.api_watch_timeout.unwrap_or(Duration::from_secs(290));
        if watch_timeout < Duration::from_secs(1) {
            bail!("--api-watch-timeout must be at least 1s");
        }
        Ok(Some(ApiSettings {
            kubeconfig,
            master,
            watch_timeout,
        }))
    }

    /// Merges flags over the configuration file (if any) over defaults. `warn` receives one
    /// line per configuration field that is valid but not applied by weir.
    pub fn settings(&self, warn: &mut dyn FnMut(String)) -> anyhow::Result<Settings> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("read {}", path.display()))?;
                let cfg = decode_config(path, &text)?;
                if cfg
                    .kind
                    .as_deref()
                    .is_some_and(|k| k != "KubeProxyConfiguration")
                {
                    bail!(
                        "{}: kind {:?} is not KubeProxyConfiguration",
                        path.display(),
                        cfg.kind.as_deref().unwrap_or_default()
                    );
                }
                if let Some(v) = &cfg.api_version {
                    if !v.starts_with("kubeproxy.config.k8s.io/") {
                        bail!(
                            "{}: apiVersion {v:?} is not kubeproxy.config.k8s.io/*",
                            path.display()
                        );
                    }
                }
                for k in cfg.other.keys() {
                    warn(format!(
                        "{}: field {k:?} is not applied by weir",
                        path.display()
                    ));
                }
                for k in cfg.client_connection.iter().flat_map(|c| c.other.keys()) {
                    warn(format!(
                        "{}: field \"clientConnection.{k}\" is not applied by weir",
                        path.display()
                    ));
                }
                cfg
            }
            None => KubeProxyConfiguration::default(),
        };
        let mode = match (self.proxy_mode, file.mode.as_deref()) {
            (Some(m), _) => m,
            (None, None | Some("")) => ProxyMode::Nftables,
            (None, Some("nftables")) => ProxyMode::Nftables,
            (None, Some("iptables")) => ProxyMode::Iptables,
            (None, Some("ipvs")) => ProxyMode::Ipvs,
            (None, Some("userspace")) => ProxyMode::Userspace,
            (None, Some(other)) => {
                bail!(
                    "config mode {:?}: weir supports nftables, iptables, ipvs and userspace",
                    excerpt(other, 40)
                )
            }
        };
        let section = match mode {
            ProxyMode::Nftables => file.nftables.as_ref(),
            ProxyMode::Iptables => file.iptables.as_ref(),
            ProxyMode::Ipvs => file.ipvs.as_ref(),
            ProxyMode::Userspace => None,
        };
        let file_duration = |top: &Option<String>, sect: Option<&Option<String>>, name: &str| {
            top.as_ref()
                .or(sect.and_then(|s| s.as_ref()))
                .map(|s| parse_duration(s).map_err(|e| anyhow::anyhow!("config {name}: {e}")))
                .transpose()
        };
        let sync_period = match self.sync_period {
            Some(d) => d,
            None => file_duration(
                &file.sync_period,
                section.map(|s| &s.sync_period),
                "syncPeriod",
            )?
            .unwrap_or(Duration::from_secs(30)),
        };
        let full_sync_period = self.full_sync_period.unwrap_or(Duration::from_secs(3600));
        if full_sync_period.is_zero() || sync_period.is_zero() {
            bail!("--sync-period and --full-sync-period must be greater than 0");
        }
        let min_sync_period = match self.min_sync_period {
            Some(d) => d,
            None => file_duration(
                &file.min_sync_period,
                section.map(|s| &s.min_sync_period),
                "minSyncPeriod",
            )?
            .unwrap_or(Duration::from_secs(1)),
        };
        let cluster_cidrs = if !self.cluster_cidr.is_empty() {
            self.cluster_cidr.clone()
        } else {
            let items: Vec<String> = file
                .cluster_c_i_d_r
                .as_deref()
                .unwrap_or_default()
                .split(',')
                .map(str::to_string)
                .collect();
            parse_cidrs(&items, "config clusterCIDR")?
        };
        let (np_items, np_what) = if !self.nodeport_addresses.is_empty() {
            (&self.nodeport_addresses, "--nodeport-addresses")
        } else {
            (&file.node_port_addresses, "config nodePortAddresses")
        };
        let nodeport_addresses = parse_cidrs(np_items, np_what)?;
        let explicit_primary = np_items.iter().any(|s| s.trim() == "primary");
        if explicit_primary && !nodeport_addresses.is_empty() {
            bail!("{np_what}: \"primary\" cannot be combined with CIDRs");
        }
        // kube-proxy's per-mode defaults: iptables accepts NodePorts on every local address,
        // nftables on the node's primary IPs.
        let nodeport_default = match (mode, explicit_primary) {
            // kube-proxy's ipvs and userspace modes listened on every address, too.
            (ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Userspace, false) => {
                NodePortDefault::AllLocal
            }
            _ => NodePortDefault::Primary,
        };
        let localhost_nodeports = mode == ProxyMode::Iptables;
        let loopback: Vec<&IpNet> = nodeport_addresses
            .iter()
            .filter(|n| n.network().is_loopback())
            .collect();
        for n in &loopback {
            match (mode, n) {
                (ProxyMode::Nftables | ProxyMode::Ipvs | ProxyMode::Userspace, _) => warn(format!(
                    "{np_what}: {n}: localhost NodePorts are not supported in {} mode \
                     (as in kube-proxy); loopback addresses are ignored",
                    mode.as_str()
                )),
                (ProxyMode::Iptables, IpNet::V6(_)) => warn(format!(
                    "{np_what}: {n}: IPv6 localhost NodePorts cannot work; ignored"
                )),
                (ProxyMode::Iptables, IpNet::V4(_)) => {}
            }
        }
        let api = self.api_settings(&file, in_cluster())?;
        let node_name = match self.hostname_override.clone().or(file.hostname_override) {
            Some(n) if !n.trim().is_empty() => n.trim().to_lowercase(),
            _ => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("read the host name")?
                .trim()
                .to_lowercase(),
        };
        let addr =
            |flag: Option<SocketAddr>, file: &Option<String>, default: &str, name: &str| match (
                flag,
                file.as_deref(),
            ) {
                (Some(a), _) => Ok(a),
                (None, Some(s)) if !s.is_empty() => s
                    .parse::<SocketAddr>()
                    .with_context(|| format!("config {name}: {:?} is not ip:port", excerpt(s, 60))),
                _ => Ok(default.parse().expect("valid default")),
            };
        let ipvs = ipvs_settings(self.ipvs_scheduler.as_deref(), file.ipvs.as_ref())?;
        Ok(Settings {
            api,
            ipvs,
            iptables_backend: match self.iptables_backend {
                None | Some(IptablesBackendFlag::Auto) => BackendChoice::Auto,
                Some(IptablesBackendFlag::Nft) => BackendChoice::Nft,
                Some(IptablesBackendFlag::Legacy) => BackendChoice::Legacy,
            },
            manifests: self
                .manifests
                .clone()
                .unwrap_or_else(|| PathBuf::from("/etc/weir/manifests")),
            manifest_poll_interval: self
                .manifest_poll_interval
                .unwrap_or(Duration::from_millis(500)),
            manifest_max_file_size: self.manifest_max_file_size.unwrap_or(4 << 20),
            state_dir: self
                .state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("/var/lib/weir/proxy")),
            mode,
            cluster_cidrs,
            node_name,
            nodeport_addresses,
            nodeport_default,
            localhost_nodeports,
            masquerade_all: self.masquerade_all
                || section.and_then(|s| s.masquerade_all).unwrap_or(false),
            sync_period,
            full_sync_period,
            min_sync_period,
            healthz_bind_address: addr(
                self.healthz_bind_address,
                &file.healthz_bind_address,
                "0.0.0.0:10256",
                "healthzBindAddress",
            )?,
            metrics_bind_address: addr(
                self.metrics_bind_address,
                &file.metrics_bind_address,
                "127.0.0.1:10249",
                "metricsBindAddress",
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("3x").is_err());
    }

    fn settings_from(flags: ProxyFlags, yaml: &str) -> anyhow::Result<(Settings, Vec<String>)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kp.yaml");
        std::fs::write(&path, yaml).unwrap();
        let flags = ProxyFlags {
            config: Some(path),
            hostname_override: flags.hostname_override.or(Some("n1".into())),
            ..flags
        };
        let mut warnings = Vec::new();
        let s = flags.settings(&mut |w| warnings.push(w))?;
        Ok((s, warnings))
    }

    #[test]
    fn config_file_applies_and_flags_win() {
        let yaml = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
            mode: iptables\nclusterCIDR: 10.244.0.0/16,fd00::/48\nnodePortAddresses: [primary]\n\
            iptables:\n  masqueradeAll: true\n  syncPeriod: 1m\n  minSyncPeriod: 2s\n\
            conntrack:\n  maxPerCore: 0\n";
        let (s, warnings) = settings_from(ProxyFlags::default(), yaml).unwrap();
        assert_eq!(s.mode, ProxyMode::Iptables);
        assert_eq!(s.cluster_cidrs.len(), 2);
        assert!(s.nodeport_addresses.is_empty());
        assert!(s.masquerade_all);
        assert_eq!(s.sync_period, Duration::from_secs(60));
        assert_eq!(s.min_sync_period, Duration::from_secs(2));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("conntrack"));

        let flags = ProxyFlags {
            proxy_mode: Some(ProxyMode::Nftables),
            sync_period: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let (s, _) = settings_from(flags, yaml).unwrap();
        assert_eq!(s.mode, ProxyMode::Nftables);
        assert_eq!(s.sync_period, Duration::from_secs(5));
        // The iptables section does not apply to nftables mode.
        assert!(!s.masquerade_all);
        assert_eq!(s.healthz_bind_address.port(), 10256);
    }

    #[test]
    fn ipvs_mode_takes_its_section_and_scheduler_flag() {
        let file = "mode: ipvs\nipvs:\n  scheduler: sh\n  tcpTimeout: 15m\n  udpTimeout: 30s\n  syncPeriod: 20s\n";
        let (s, _) = settings_from(ProxyFlags::default(), file).unwrap();
        assert_eq!(s.mode, ProxyMode::Ipvs);
        assert_eq!(s.ipvs.scheduler, "sh");
        assert_eq!(s.ipvs.tcp_timeout, Duration::from_secs(900));
        assert_eq!(s.ipvs.udp_timeout, Duration::from_secs(30));
        assert_eq!(s.sync_period, Duration::from_secs(20));
        assert_eq!(s.nodeport_default, NodePortDefault::AllLocal);
        let flags = ProxyFlags {
            ipvs_scheduler: Some("mh".into()),
            ..Default::default()
        };
        let (s, _) = settings_from(flags, file).unwrap();
        assert_eq!(s.ipvs.scheduler, "mh");
        let (s, _) = settings_from(ProxyFlags::default(), "mode: ipvs\n").unwrap();
        assert_eq!(s.ipvs.scheduler, "rr");
        let bad = ProxyFlags {
            ipvs_scheduler: Some("fastest".into()),
            ..Default::default()
        };
        let e = settings_from(bad, "mode: ipvs\n").unwrap_err();
        assert!(e.to_string().contains("fastest"), "{e}");
    }

    #[test]
    fn config_errors_name_the_field() {
        let e = settings_from(
            ProxyFlags::default(),
            "kind: KubeProxyConfiguration\nmode: kernelspace\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("kernelspace"), "{e}");
        let e = settings_from(ProxyFlags::default(), "clusterCIDR: banana\n").unwrap_err();
        assert!(e.to_string().contains("clusterCIDR"), "{e}");
        let e = settings_from(
            ProxyFlags::default(),
            "mode: iptables\niptables:\n  syncPeriod: soon\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("syncPeriod"), "{e}");
        let e = settings_from(ProxyFlags::default(), "kind: Pod\n").unwrap_err();
        assert!(e.to_string().contains("Pod"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_a_config_is_named_not_echoed() {
        // /etc/passwd: YAML reads it as one multi-line string.
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
            daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
            .repeat(50);
        let e = settings_from(ProxyFlags::default(), &passwd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kp.yaml: not a KubeProxyConfiguration"), "{e}");
        assert!(e.contains("the file reads as a YAML string"), "{e}");
        assert!(
            e.contains("line 1 (\"root:x:0:0:root:/root:/bin/bash\")"),
            "{e}"
        );
        assert!(!e.contains("daemon"), "{e}");
        assert!(e.len() < 300, "{} bytes: {e}", e.len());

        // A field's value: the field once, its line, the value cut.
        let long = "on and ".repeat(100);
        let yaml = format!("mode: iptables\niptables:\n  masqueradeAll: \"{long}\"\n");
        let e = settings_from(ProxyFlags::default(), &yaml)
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches("iptables.masqueradeAll").count(), 1, "{e}");
        assert!(e.contains("kp.yaml: line 3 (\"  masqueradeAll:"), "{e}");
        assert!(e.contains("invalid boolean"), "{e}");
        assert!(e.len() < 300, "{} bytes: {e}", e.len());

        let e = settings_from(ProxyFlags::default(), &format!("mode: {long}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config mode") && e.len() < 200, "{e}");
    }

    #[test]
    fn nodeport_defaults_follow_kube_proxy_per_mode() {
        let flags = |mode, np: &[&str]| ProxyFlags {
            proxy_mode: Some(mode),
            nodeport_addresses: np.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let (s, w) = settings_from(flags(ProxyMode::Iptables, &[]), "").unwrap();
        assert_eq!(s.nodeport_default, NodePortDefault::AllLocal);
        assert!(s.localhost_nodeports && w.is_empty(), "{w:?}");
        let (s, _) = settings_from(flags(ProxyMode::Iptables, &["primary"]), "").unwrap();
        assert_eq!(s.nodeport_default, NodePortDefault::Primary);
        let (s, _) = settings_from(flags(ProxyMode::Nftables, &[]), "").unwrap();
        assert_eq!(s.nodeport_default, NodePortDefault::Primary);
        assert!(!s.localhost_nodeports);
        // Localhost NodePorts: iptables mode takes them; nftables says it cannot.
        let (s, w) = settings_from(flags(ProxyMode::Iptables, &["127.0.0.0/8"]), "").unwrap();
        assert_eq!(s.nodeport_addresses.len(), 1);
        assert!(w.is_empty(), "{w:?}");
        let (_, w) = settings_from(flags(ProxyMode::Nftables, &["127.0.0.0/8"]), "").unwrap();
        assert!(
            w.len() == 1 && w[0].contains("127.0.0.0/8") && w[0].contains("nftables"),
            "{w:?}"
        );
        let e =
            settings_from(flags(ProxyMode::Nftables, &["primary", "10.0.0.0/8"]), "").unwrap_err();
        assert!(e.to_string().contains("primary"), "{e}");
    }

    #[test]
    fn the_api_source_is_chosen_as_kube_proxy_finds_its_server() {
        let none = KubeProxyConfiguration::default();
        let flags = ProxyFlags::default();
        assert_eq!(flags.api_settings(&none, false).unwrap(), None);
        // In a pod without any flag: the in-cluster service account.
        let api = flags.api_settings(&none, true).unwrap().unwrap();
        assert_eq!((api.kubeconfig, api.master), (None, None));
        assert_eq!(api.watch_timeout, Duration::from_secs(290));
        // ... unless a manifest directory is asked for.
        let manifests = ProxyFlags {
            manifests: Some("/m".into()),
            ..Default::default()
        };
        assert_eq!(manifests.api_settings(&none, true).unwrap(), None);
        let master = ProxyFlags {
            master: Some("http://127.0.0.1:6443".into()),
            ..Default::default()
        };
        let api = master.api_settings(&none, false).unwrap().unwrap();
        assert_eq!(api.master.as_deref(), Some("http://127.0.0.1:6443"));
        let both = ProxyFlags {
            manifests: Some("/m".into()),
            ..master
        };
        let e = both.api_settings(&none, false).unwrap_err();
        assert!(e.to_string().contains("choose one"), "{e}");
    }

    #[test]
    fn client_connection_kubeconfig_comes_from_the_config_file_and_the_flag_wins() {
        let yaml = "kind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n  qps: 5\n";
        let (s, w) = settings_from(ProxyFlags::default(), yaml).unwrap();
        let api = s.api.unwrap();
        assert_eq!(
            api.kubeconfig.as_deref(),
            Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
        );
        assert!(
            w.len() == 1 && w[0].contains("clientConnection.qps"),
            "{w:?}"
        );
        let flags = ProxyFlags {
            kubeconfig: Some("/k".into()),
            ..Default::default()
        };
        let (s, _) = settings_from(flags, yaml).unwrap();
        assert_eq!(s.api.unwrap().kubeconfig.as_deref(), Some(Path::new("/k")));
    }

    #[test]
    fn full_sync_period_defaults_to_an_hour() {
        let (s, _) = settings_from(ProxyFlags::default(), "").unwrap();
        assert_eq!(s.full_sync_period, Duration::from_secs(3600));
        assert_eq!(s.sync_period, Duration::from_secs(30));
        let flags = ProxyFlags {
            full_sync_period: Some(Duration::from_secs(600)),
            ..Default::default()
        };
        assert_eq!(
            settings_from(flags, "").unwrap().0.full_sync_period,
            Duration::from_secs(600)
        );
        let flags = ProxyFlags {
            full_sync_period: Some(Duration::ZERO),
            ..Default::default()
        };
        assert!(settings_from(flags, "").is_err());
    }
}
