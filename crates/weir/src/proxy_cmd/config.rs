//! `weir proxy` settings: command-line flags over a KubeProxyConfiguration file over defaults.
//! What weir does with each of kube-proxy's flags and fields is [`super::kube_proxy::ROWS`];
//! the ones it applies are typed here.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use ipnet::IpNet;
use serde::Deserialize;
use weir_model::NodePortDefault;
use weir_proxy::iptables::BackendChoice;
use weir_source::yaml::excerpt;

use super::kube_proxy::{self, Findings, KubeProxyOnlyFlags};
use super::problems::{self, Invalid, Problem};
use crate::LogFormat;

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

/// An address flag as kube-proxy takes it: `IP:port`, or an IP alone (the port then comes
/// from `--healthz-port` / `--metrics-port`, else the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddr {
    pub ip: IpAddr,
    pub port: Option<u16>,
}

/// `--healthz-bind-address` / `--metrics-bind-address` as given: an address, or `""` or `0`
/// for none (kube-proxy: "set empty to disable").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindFlag {
    Off,
    At(BindAddr),
}

fn parse_bind_flag(s: &str) -> Result<BindFlag, String> {
    match s.trim() {
        "" | "0" => Ok(BindFlag::Off),
        _ => parse_bind_addr(s).map(BindFlag::At),
    }
}

pub fn parse_bind_addr(s: &str) -> Result<BindAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(BindAddr {
            ip: a.ip(),
            port: Some(a.port()),
        });
    }
    let ip = s.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<IpAddr>()
        .map(|ip| BindAddr { ip, port: None })
        .map_err(|_| format!("{:?} is not IP:port or IP", excerpt(s, 60)))
}

fn go_bool(s: &str) -> Result<bool, String> {
    kube_proxy::parse_go_bool(s)
}

/// The heading of the kube-proxy flags weir applies that have no other place in its help.
const KP: &str = "kube-proxy's flags (its meaning unless said)";

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
    /// How services are programmed: nftables (the default; kube-proxy's is iptables),
    /// iptables, ipvs, or userspace (connections relayed through this process). Unset: the
    /// --config file's `mode`.
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
    /// This node's name (default: the host name). `--node-name`, as in the other commands.
    #[arg(long, visible_alias = "node-name", value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// CIDRs whose local addresses serve NodePorts, or the keywords `primary` (the node's own
    /// IPs), `localhost`, `all`. Unset: every local address in iptables, ipvs and userspace
    /// modes, `primary` in nftables mode (as kube-proxy). A loopback CIDR enables localhost
    /// NodePorts (iptables mode only).
    #[arg(long, value_name = "CIDR[,CIDR]|primary", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,
    /// Masquerade all traffic sent to service IPs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = go_bool)]
    pub masquerade_all: Option<bool>,
    /// How often the rules are checked against the kernel and resynced if changed (a Go
    /// duration). Unset: --iptables-sync-period's (--ipvs-sync-period's in ipvs mode), then
    /// the --config file's, then 30s. In `weir agent`, every part's period.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub sync_period: Option<Duration>,
    /// Interval of the periodic full resync, which rewrites every rule even when nothing
    /// seems to have changed (kube-proxy: one hour, fixed).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub full_sync_period: Option<Duration>,
    /// Minimum interval between syncs; changes arriving faster are batched.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub min_sync_period: Option<Duration>,
    /// KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1). Flags given beside it
    /// win over its fields (kube-proxy ignores most flags then).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of /healthz and /livez: IP:port, or an IP (port: --healthz-port, else 10256);
    /// "" or 0: off. Default 0.0.0.0:10256.
    #[arg(long, value_name = "ADDR", value_parser = parse_bind_flag)]
    pub healthz_bind_address: Option<BindFlag>,
    /// Address of /metrics: IP:port, or an IP (port: --metrics-port, else 10249); "" or 0:
    /// off. Default 127.0.0.1:10249 (kube-proxy's).
    #[arg(long, value_name = "ADDR", value_parser = parse_bind_flag)]
    pub metrics_bind_address: Option<BindFlag>,
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

    /// --sync-period outside ipvs mode.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub iptables_sync_period: Option<Duration>,
    /// --min-sync-period outside ipvs mode.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub iptables_min_sync_period: Option<Duration>,
    /// --sync-period in ipvs mode.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub ipvs_sync_period: Option<Duration>,
    /// --min-sync-period in ipvs mode.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub ipvs_min_sync_period: Option<Duration>,
    /// The fwmark bit (0-31, default 14) that marks packets to masquerade, in iptables and ipvs
    /// modes (nftables mode: the config file's nftables.masqueradeBit).
    #[arg(long, value_name = "BIT", value_parser = clap::value_parser!(u32).range(0..=31),
          help_heading = KP)]
    pub iptables_masquerade_bit: Option<u32>,
    /// ipvs mode: idle timeout of IPVS TCP connections (0 leaves the kernel's).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub ipvs_tcp_timeout: Option<Duration>,
    /// ipvs mode: timeout of IPVS TCP connections after a FIN (0 leaves the kernel's).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub ipvs_tcpfin_timeout: Option<Duration>,
    /// ipvs mode: timeout of IPVS UDP flows (0 leaves the kernel's).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub ipvs_udp_timeout: Option<Duration>,
    /// ipvs mode: virtual servers on these addresses are never deleted as stale.
    #[arg(long, value_name = "CIDR[,CIDR]", value_delimiter = ',', help_heading = KP)]
    pub ipvs_exclude_cidrs: Vec<IpNet>,
    /// ipvs mode: set arp_ignore=1 and arp_announce=2 for every interface.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = go_bool, help_heading = KP)]
    pub ipvs_strict_arp: Option<bool>,
    /// This node's primary IP of its family (the other family's comes from the Node object);
    /// 0.0.0.0 and :: leave both to the Node object.
    #[arg(long, value_name = "IP", help_heading = KP)]
    pub bind_address: Option<IpAddr>,
    /// The port for an --healthz-bind-address without one; 0 turns /healthz and /livez off.
    #[arg(long, value_name = "PORT", help_heading = KP)]
    pub healthz_port: Option<u16>,
    /// The port for an --metrics-bind-address without one; 0 turns /metrics off.
    #[arg(long, value_name = "PORT", help_heading = KP)]
    pub metrics_port: Option<u16>,
    /// Written to /proc/self/oom_score_adj (-1000..1000); unset, left as it is (kube-proxy
    /// writes -999).
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1000..=1000), help_heading = KP)]
    pub oom_score_adj: Option<i32>,
    /// Raise nf_conntrack_max to this many entries per CPU (0 leaves it); unset, weir leaves
    /// conntrack's size alone (kube-proxy: 32768).
    #[arg(long, value_name = "N", help_heading = KP)]
    pub conntrack_max_per_core: Option<u32>,
    /// nf_conntrack_max at least this (with --conntrack-max-per-core).
    #[arg(long, value_name = "N", help_heading = KP)]
    pub conntrack_min: Option<u32>,
    /// nf_conntrack_tcp_timeout_established (0 leaves it; unset too, where kube-proxy sets 24h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub conntrack_tcp_timeout_established: Option<Duration>,
    /// nf_conntrack_tcp_timeout_close_wait (0 leaves it; unset too, where kube-proxy sets 1h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub conntrack_tcp_timeout_close_wait: Option<Duration>,
    /// Set nf_conntrack_tcp_be_liberal=1.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = go_bool, help_heading = KP)]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// nf_conntrack_udp_timeout (0 leaves it).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub conntrack_udp_timeout: Option<Duration>,
    /// nf_conntrack_udp_timeout_stream (0 leaves it).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = KP)]
    pub conntrack_udp_timeout_stream: Option<Duration>,
    /// Feature gates, Name=true,Name=false: those weir always follows pass, those asking for
    /// what weir lacks are refused by name, unknown ones noticed (see docs/proxy.md).
    #[arg(long, value_name = "NAME=BOOL,...", help_heading = KP)]
    pub feature_gates: Vec<String>,
    /// The log format: text or json (weir's --log-format).
    #[arg(long, value_enum, help_heading = KP)]
    pub logging_format: Option<LogFormat>,
    /// klog's verbosity as weir's log level: 0-1 info; 2-3 debug and 4-5 trace for weir's
    /// crates; 6+ its libraries' debug too. RUST_LOG, when set, wins.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", help_heading = KP)]
    pub v: Option<u32>,
    /// Print weir's version line and exit (`--version` or `--version=raw`).
    #[arg(long = "version", id = "kube_proxy_version", value_name = "raw",
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          help_heading = KP)]
    pub version: Option<String>,
    /// kube-proxy's flags weir has no flag of its own for: noticed or refused by name.
    #[command(flatten)]
    pub kube_proxy: KubeProxyOnlyFlags,
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
    /// This node's primary IPs given (`--bind-address`); a family without one takes the
    /// Node object's.
    pub node_ips: Vec<IpAddr>,
    /// Empty: `nodeport_default`.
    pub nodeport_addresses: Vec<IpNet>,
    pub nodeport_default: NodePortDefault,
    /// Loopback addresses may serve NodePorts (iptables mode, with `route_localnet`).
    pub localhost_nodeports: bool,
    pub masquerade_all: bool,
    /// The fwmark that marks packets to masquerade (`1 << masqueradeBit`).
    pub masquerade_mark: u32,
    /// How often the proxy re-checks its rules (and resyncs if they were changed).
    pub sync_period: Duration,
    /// How often every rule is rewritten regardless.
    pub full_sync_period: Duration,
    pub min_sync_period: Duration,
    /// `None`: not served (`--healthz-port=0`).
    pub healthz_bind_address: Option<SocketAddr>,
    /// `None`: not served (`--metrics-port=0`).
    pub metrics_bind_address: Option<SocketAddr>,
    /// The Kubernetes API source; `None`: the manifest directory.
    pub api: Option<ApiSettings>,
    pub ipvs: IpvsSettings,
    /// iptables mode's implementation (`--iptables-backend`).
    pub iptables_backend: BackendChoice,
    /// Written to /proc/self/oom_score_adj at start.
    pub oom_score_adj: Option<i32>,
    pub conntrack: ConntrackSettings,
    pub log: LogSettings,
}

/// ipvs mode's settings (`--ipvs-scheduler`, the configuration file's `ipvs:` section).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpvsSettings {
    pub scheduler: String,
    /// IPVS connection timeouts; zero leaves the kernel's.
    pub tcp_timeout: Duration,
    pub tcp_fin_timeout: Duration,
    pub udp_timeout: Duration,
    pub strict_arp: bool,
    pub exclude_cidrs: Vec<IpNet>,
}

/// kube-proxy's conntrack settings, each applied only when given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConntrackSettings {
    pub max_per_core: Option<u32>,
    pub min: Option<u32>,
    pub tcp_established_timeout: Option<Duration>,
    pub tcp_close_wait_timeout: Option<Duration>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<Duration>,
    pub udp_stream_timeout: Option<Duration>,
}

/// Logging as kube-proxy's flags and `logging:` ask for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogSettings {
    /// `--logging-format` / `logging.format`; `None`: weir's `--log-format`.
    pub format: Option<LogFormat>,
    /// klog's `-v` / `logging.verbosity`.
    pub verbosity: Option<u32>,
}

impl LogSettings {
    /// The tracing filter for a klog verbosity: 0–1 info; 2–3 debug and 4–5 trace for weir's
    /// own crates (targets `weir*`); 6 and more the libraries' debug too (as klog's 6+ shows
    /// API requests). `None`: weir's default, info.
    pub fn filter(&self) -> Option<String> {
        let v = self.verbosity?;
        Some(
            match v {
                0 | 1 => "info",
                2 | 3 => "info,weir=debug",
                4 | 5 => "info,weir=trace",
                _ => "debug,weir=trace",
            }
            .to_string(),
        )
    }
}

/// The KubeProxyConfiguration fields weir applies (the others are checked against
/// [`kube_proxy::ROWS`] by [`kube_proxy::check_config`]).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeProxyConfiguration {
    mode: Option<String>,
    cluster_c_i_d_r: Option<String>,
    hostname_override: Option<String>,
    node_port_addresses: Option<Vec<String>>,
    bind_address: Option<String>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    /// Not kube-proxy 1.37's (noticed as such), applied over the mode's section.
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    iptables: Option<ModeSection>,
    nftables: Option<ModeSection>,
    ipvs: Option<ModeSection>,
    client_connection: Option<ClientConnection>,
    oom_score_adj: Option<i32>,
    conntrack: Option<ConntrackSection>,
    logging: Option<LoggingSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModeSection {
    masquerade_all: Option<bool>,
    masquerade_bit: Option<i64>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    // ipvs: only.
    scheduler: Option<String>,
    tcp_timeout: Option<String>,
    tcp_fin_timeout: Option<String>,
    udp_timeout: Option<String>,
    #[serde(rename = "strictARP")]
    strict_arp: Option<bool>,
    #[serde(rename = "excludeCIDRs")]
    exclude_cidrs: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConntrackSection {
    max_per_core: Option<i64>,
    min: Option<i64>,
    tcp_established_timeout: Option<String>,
    tcp_close_wait_timeout: Option<String>,
    tcp_be_liberal: Option<bool>,
    udp_timeout: Option<String>,
    udp_stream_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoggingSection {
    format: Option<String>,
    verbosity: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientConnection {
    kubeconfig: Option<String>,
}

/// A duration field of the file (`None`: unset).
fn file_duration(v: Option<&String>, name: &str) -> anyhow::Result<Option<Duration>> {
    v.map(|s| parse_duration(s).map_err(|e| anyhow::anyhow!("config {name}: {e}")))
        .transpose()
}

fn ipvs_settings(
    flags: &ProxyFlags,
    section: Option<&ModeSection>,
) -> anyhow::Result<IpvsSettings> {
    let scheduler = flags
        .ipvs_scheduler
        .as_deref()
        .or(section.and_then(|s| s.scheduler.as_deref()))
        .filter(|s| !s.is_empty())
        .unwrap_or("rr")
        .to_string();
    weir_proxy::ipvs::check_scheduler(&scheduler)
        .map_err(|e| anyhow::anyhow!("--ipvs-scheduler: {e}"))?;
    let timeout = |flag: Option<Duration>, v: Option<&Option<String>>, name: &str| match flag {
        Some(d) => Ok(d),
        None => file_duration(v.and_then(|o| o.as_ref()), &format!("ipvs.{name}"))
            .map(Option::unwrap_or_default),
    };
    let exclude_cidrs = if !flags.ipvs_exclude_cidrs.is_empty() {
        flags.ipvs_exclude_cidrs.clone()
    } else {
        let items = section
            .and_then(|s| s.exclude_cidrs.clone())
            .unwrap_or_default();
        parse_cidrs(&items, "config ipvs.excludeCIDRs")?
    };
    Ok(IpvsSettings {
        scheduler,
        tcp_timeout: timeout(
            flags.ipvs_tcp_timeout,
            section.map(|s| &s.tcp_timeout),
            "tcpTimeout",
        )?,
        tcp_fin_timeout: timeout(
            flags.ipvs_tcpfin_timeout,
            section.map(|s| &s.tcp_fin_timeout),
            "tcpFinTimeout",
        )?,
        udp_timeout: timeout(
            flags.ipvs_udp_timeout,
            section.map(|s| &s.udp_timeout),
            "udpTimeout",
        )?,
        strict_arp: flags
            .ipvs_strict_arp
            .or(section.and_then(|s| s.strict_arp))
            .unwrap_or(false),
        exclude_cidrs,
    })
}

fn conntrack_settings(
    flags: &ProxyFlags,
    file: Option<&ConntrackSection>,
) -> anyhow::Result<ConntrackSettings> {
    let count = |flag: Option<u32>, v: Option<i64>, name: &str| -> anyhow::Result<Option<u32>> {
        match (flag, v) {
            (Some(n), _) => Ok(Some(n)),
            (None, Some(n)) => u32::try_from(n)
                .map(Some)
                .map_err(|_| anyhow::anyhow!("config conntrack.{name}: {n} is not 0 or more")),
            (None, None) => Ok(None),
        }
    };
    let duration = |flag: Option<Duration>, v: Option<&String>, name: &str| match flag {
        Some(d) => Ok(Some(d)),
        None => file_duration(v, &format!("conntrack.{name}")),
    };
    Ok(ConntrackSettings {
        max_per_core: count(
            flags.conntrack_max_per_core,
            file.and_then(|c| c.max_per_core),
            "maxPerCore",
        )?,
        min: count(flags.conntrack_min, file.and_then(|c| c.min), "min")?,
        tcp_established_timeout: duration(
            flags.conntrack_tcp_timeout_established,
            file.and_then(|c| c.tcp_established_timeout.as_ref()),
            "tcpEstablishedTimeout",
        )?,
        tcp_close_wait_timeout: duration(
            flags.conntrack_tcp_timeout_close_wait,
            file.and_then(|c| c.tcp_close_wait_timeout.as_ref()),
            "tcpCloseWaitTimeout",
        )?,
        tcp_be_liberal: flags
            .conntrack_tcp_be_liberal
            .or(file.and_then(|c| c.tcp_be_liberal)),
        udp_timeout: duration(
            flags.conntrack_udp_timeout,
            file.and_then(|c| c.udp_timeout.as_ref()),
            "udpTimeout",
        )?,
        udp_stream_timeout: duration(
            flags.conntrack_udp_timeout_stream,
            file.and_then(|c| c.udp_stream_timeout.as_ref()),
            "udpStreamTimeout",
        )?,
    })
}

/// A --config file that does not decode, as one problem: the file, where (line, and the
/// field when inside one), what is wrong; never the file's content beyond a line's start.
fn decode_config<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    text: &str,
) -> Result<T, Problem> {
    weir_source::yaml::decode(text).map_err(|e| match (&e.field, e.not_a_mapping) {
        // A syntax error: serde_path_to_error names no field (`?`).
        (Some(f), None) if f == "?" => Problem::in_file(
            path,
            e.line.map(|(n, _)| n),
            None,
            format!("not YAML: {}", e.message),
        ),
        (None, what) => {
            let what = what.map(|w| format!("the file reads as {w}"));
            let at = e
                .line
                .as_ref()
                .map(|(n, start)| format!("; line {n} ({start:?})"));
            let message = format!(
                "not a KubeProxyConfiguration (a YAML mapping of fields): {}{}",
                what.unwrap_or(e.message),
                at.unwrap_or_default()
            );
            Problem::in_file(path, None, None, message)
        }
        (Some(field), _) => {
            Problem::in_file(path, e.line.map(|(n, _)| n), Some(field.clone()), e.message)
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
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .with_context(|| format!("{what}: {:?} is not a CIDR", excerpt(s, 60)))
        })
        .collect()
}

/// `--nodeport-addresses`: CIDRs with kube-proxy's keywords `localhost` (127.0.0.0/8, ::1/128)
/// and `all` (0.0.0.0/0, ::/0) expanded; `primary` is left out (the caller's default).
fn parse_nodeport_addresses(items: &[String], what: &str) -> anyhow::Result<Vec<IpNet>> {
    let mut out = Vec::new();
    for s in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match s {
            "primary" => {}
            "localhost" => {
                out.extend(["127.0.0.0/8", "::1/128"].map(|c| c.parse::<IpNet>().unwrap()))
            }
            "all" => out.extend(["0.0.0.0/0", "::/0"].map(|c| c.parse::<IpNet>().unwrap())),
            _ => out.extend(parse_cidrs(&[s.to_string()], what)?),
        }
    }
    Ok(out)
}

/// Running in a pod: the kubelet sets KUBERNETES_SERVICE_HOST in every container.
fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty())
}

/// A loaded --config file: the fields weir applies, the rows' findings, its feature gates,
/// the document (for the checks that need the mode) and its problems.
#[derive(Default)]
struct LoadedConfig {
    cfg: KubeProxyConfiguration,
    findings: Findings,
    gates: BTreeMap<String, bool>,
    doc: serde_json::Value,
    problems: Vec<Problem>,
}

/// Reads and checks the --config file; what is wrong is in `problems`, each on its own.
fn load_config(path: &std::path::Path) -> LoadedConfig {
    let mut loaded = LoadedConfig::default();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            let p = Problem::in_file(path, None, None, format!("cannot read it: {e}"));
            loaded.problems.push(p);
            return loaded;
        }
    };
    // Blank or comments only: no document at all.
    let blank = text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
    let doc = match blank {
        true => serde_json::Value::Null,
        false => match decode_config::<serde_json::Value>(path, &text) {
            Ok(doc) => doc,
            Err(p) => {
                loaded.problems.push(p);
                return loaded;
            }
        },
    };
    loaded
        .problems
        .extend(problems::check_document(path, &text, &doc));
    if doc.is_null() {
        return loaded;
    }
    match decode_config::<KubeProxyConfiguration>(path, &text) {
        Ok(cfg) => loaded.cfg = cfg,
        Err(p) => loaded.problems.push(p),
    }
    let mut found = Findings::default();
    loaded.gates = kube_proxy::check_config(&doc, &mut found);
    let unknown = found.unknown.iter();
    (loaded.problems).extend(unknown.map(|f| problems::unknown_field(path, &text, f)));
    let at = |m: String| format!("{}: {m}", path.display());
    loaded.findings = Findings {
        notices: found.notices.into_iter().map(at).collect(),
        refused: found.refused.into_iter().map(at).collect(),
        unknown: Vec::new(),
    };
    loaded.doc = doc;
    loaded
}

/// `--version[=raw]`: print weir's version (`Ok(true)`); `=false`: nothing; another value
/// (kube-proxy's "report this version") is refused.
pub fn version_request(v: &str) -> Result<bool, String> {
    match v {
        "raw" => Ok(true),
        _ => kube_proxy::parse_go_bool(v).map_err(|_| {
            format!(
                "--version={v}: refused: weir reports its own version (`--version` or \
                 `--version=raw` prints it)"
            )
        }),
    }
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

    /// The logging the flags alone ask for (`--cleanup` reads no file).
    pub fn log_flags(&self) -> LogSettings {
        LogSettings {
            format: self.logging_format,
            verbosity: self.v,
        }
    }

    /// Merges flags over the configuration file (if any) over defaults. `notice` receives one
    /// line per flag or field that weir takes differently from kube-proxy, or not at all.
    /// Anything wrong (a value that does not parse, an unknown field, a refused flag, field or
    /// gate, settings that contradict one another) is an error holding [`Invalid`]: every
    /// problem, each on its own.
    pub fn settings(&self, notice: &mut dyn FnMut(String)) -> anyhow::Result<Settings> {
        let mut findings = Findings::default();
        let mut problems = Vec::new();
        self.kube_proxy.check(&mut findings);
        let loaded = self.config.as_deref().map(load_config).unwrap_or_default();
        findings.notices.extend(loaded.findings.notices);
        findings.refused.extend(loaded.findings.refused);
        problems.extend(loaded.problems);
        let (file, doc) = (loaded.cfg, loaded.doc);
        let gates = self.feature_gates(loaded.gates, &mut findings);
        let mut keep = Keep(&mut problems);
        let mode = keep.ok(self.mode(&file, &gates, &mut findings));
        let mode = mode.unwrap_or(ProxyMode::Nftables);
        if let Some(path) = &self.config {
            let unread = problems::unread_mode_fields(&doc, mode.as_str()).into_iter();
            (findings.notices).extend(unread.map(|n| format!("{}: {n}", path.display())));
        }
        findings.notices.extend(self.unread_mode_flags(mode));
        let settings = self.merge(mode, &file, &mut findings, &mut keep);
        problems.extend(findings.refused.into_iter().map(Problem::msg));
        findings.notices.into_iter().for_each(notice);
        match settings {
            Some(s) if problems.is_empty() => Ok(s),
            _ => Err(Invalid(problems).into()),
        }
    }

    /// The settings of `mode` from the flags over `file` over the defaults; `None` when a
    /// value is wrong (each in `keep`).
    fn merge(
        &self,
        mode: ProxyMode,
        file: &KubeProxyConfiguration,
        findings: &mut Findings,
        keep: &mut Keep<'_>,
    ) -> Option<Settings> {
        let periods = keep.ok(self.periods(mode, file));
        let masq_section = masquerade_section(mode, file);
        let masquerade_bit = keep.ok(self.masquerade_bit(mode, masq_section));
        let cluster_cidrs = keep.ok(self.cluster_cidrs(file));
        let nodeports = keep.ok(self.nodeports(mode, file, findings));
        let api = keep.ok(self.api_settings(file, in_cluster()));
        let node_name = keep.ok(self.node_name(file));
        let bind_ip = keep.ok(self.bind_ip(file)).flatten();
        let ipvs = keep.ok(ipvs_settings(self, file.ipvs.as_ref()));
        let conntrack = keep.ok(conntrack_settings(self, file.conntrack.as_ref()));
        let log = keep.ok(self.log_settings(file.logging.as_ref()));
        let oom_score_adj = keep.ok(self.oom_score_adj(file)).flatten();
        let v6 = bind_ip.is_some_and(|ip| ip.is_ipv6());
        let healthz_bind_address = keep.ok(bind_addr(
            self.healthz_bind_address,
            self.healthz_port,
            &file.healthz_bind_address,
            (if v6 { "::" } else { "0.0.0.0" }, 10256),
            "healthzBindAddress",
        ));
        let metrics_bind_address = keep.ok(bind_addr(
            self.metrics_bind_address,
            self.metrics_port,
            &file.metrics_bind_address,
            (if v6 { "::1" } else { "127.0.0.1" }, 10249),
            "metricsBindAddress",
        ));
        let (periods, nodeports) = (periods?, nodeports?);
        Some(Settings {
            api: api?,
            ipvs: ipvs?,
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
            cluster_cidrs: cluster_cidrs?,
            node_name: node_name?,
            node_ips: bind_ip
                .filter(|ip| !ip.is_unspecified())
                .into_iter()
                .collect(),
            nodeport_addresses: nodeports.addresses,
            nodeport_default: nodeports.default,
            localhost_nodeports: nodeports.localhost,
            masquerade_all: self
                .masquerade_all
                .or(masq_section.and_then(|s| s.masquerade_all))
                .unwrap_or(false),
            masquerade_mark: 1 << masquerade_bit?,
            sync_period: periods.sync,
            full_sync_period: periods.full_sync,
            min_sync_period: periods.min_sync,
            healthz_bind_address: healthz_bind_address?,
            metrics_bind_address: metrics_bind_address?,
            oom_score_adj,
            conntrack: conntrack?,
            log: log?,
        })
    }

    /// `--oom-score-adj` over the file's, within -1000..1000.
    fn oom_score_adj(&self, file: &KubeProxyConfiguration) -> anyhow::Result<Option<i32>> {
        let adj = self.oom_score_adj.or(file.oom_score_adj);
        if let Some(adj) = adj.filter(|a| !(-1000..=1000).contains(a)) {
            bail!("config oomScoreAdj {adj}: must be within -1000..1000");
        }
        Ok(adj)
    }

    /// A notice for each flag of another mode than `mode` (kube-proxy ignores them too).
    fn unread_mode_flags(&self, mode: ProxyMode) -> Vec<String> {
        let mut out = Vec::new();
        let ipvs_flags = [
            ("--ipvs-scheduler", self.ipvs_scheduler.is_some()),
            ("--ipvs-tcp-timeout", self.ipvs_tcp_timeout.is_some()),
            ("--ipvs-tcpfin-timeout", self.ipvs_tcpfin_timeout.is_some()),
            ("--ipvs-udp-timeout", self.ipvs_udp_timeout.is_some()),
            ("--ipvs-strict-arp", self.ipvs_strict_arp == Some(true)),
            ("--ipvs-exclude-cidrs", !self.ipvs_exclude_cidrs.is_empty()),
        ];
        if mode != ProxyMode::Ipvs {
            for (flag, _) in ipvs_flags.iter().filter(|(_, given)| *given) {
                out.push(format!(
                    "{flag}: ignored: ipvs mode only, and the mode is {}",
                    mode.as_str()
                ));
            }
        }
        if mode == ProxyMode::Nftables && self.iptables_masquerade_bit.is_some() {
            out.push(
                "--iptables-masquerade-bit: ignored in nftables mode (as by kube-proxy); \
                 nftables mode takes the config file's nftables.masqueradeBit"
                    .into(),
            );
        }
        if mode != ProxyMode::Iptables && self.iptables_backend.is_some() {
            out.push(format!(
                "--iptables-backend: ignored: iptables mode only, and the mode is {}",
                mode.as_str()
            ));
        }
        out
    }

    /// Feature gates: the file's, then the flag's over them; each with where it was set.
    fn feature_gates(
        &self,
        file_gates: BTreeMap<String, bool>,
        findings: &mut Findings,
    ) -> BTreeMap<String, (bool, String)> {
        let mut gates: BTreeMap<String, (bool, String)> = file_gates
            .into_iter()
            .map(|(k, v)| (k, (v, "featureGates".to_string())))
            .collect();
        for list in &self.feature_gates {
            match kube_proxy::parse_gates(list) {
                Ok(parsed) => gates.extend(
                    parsed
                        .into_iter()
                        .map(|(k, v)| (k, (v, "--feature-gates".to_string()))),
                ),
                Err(e) => findings.refused.push(format!("--feature-gates: {e}")),
            }
        }
        kube_proxy::check_gates(&gates, findings);
        gates
    }

    /// `--proxy-mode` over the file's `mode` over nftables; ipvs is refused with its gate off.
    fn mode(
        &self,
        file: &KubeProxyConfiguration,
        gates: &BTreeMap<String, (bool, String)>,
        findings: &mut Findings,
    ) -> anyhow::Result<ProxyMode> {
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
        if mode == ProxyMode::Ipvs && gates.get("KubeProxyIPVS").is_some_and(|(on, _)| !on) {
            findings.refused.push(
                "ipvs mode: refused: the feature gate KubeProxyIPVS is false (kube-proxy 1.37 \
                 refuses ipvs mode then too)"
                    .into(),
            );
        }
        Ok(mode)
    }

    /// The sync periods: the generic flag over the mode's flag over the file's top-level
    /// field over the mode's section (ipvs mode reads `ipvs:`, nftables `nftables:`, every
    /// other mode `iptables:`, as kube-proxy converts v1alpha1) over the defaults.
    fn periods(&self, mode: ProxyMode, file: &KubeProxyConfiguration) -> anyhow::Result<Periods> {
        let (section, section_name) = match mode {
            ProxyMode::Nftables => (file.nftables.as_ref(), "nftables"),
            ProxyMode::Ipvs => (file.ipvs.as_ref(), "ipvs"),
            _ => (file.iptables.as_ref(), "iptables"),
        };
        let (mode_sync, mode_min_sync) = match mode {
            ProxyMode::Ipvs => (self.ipvs_sync_period, self.ipvs_min_sync_period),
            _ => (self.iptables_sync_period, self.iptables_min_sync_period),
        };
        let period = |flag: Option<Duration>,
                      mode_flag: Option<Duration>,
                      top: &Option<String>,
                      sect: Option<&Option<String>>,
                      name: &str|
         -> anyhow::Result<Option<Duration>> {
            match (flag.or(mode_flag), top) {
                (Some(d), _) => Ok(Some(d)),
                (None, Some(top)) => file_duration(Some(top), name),
                (None, None) => file_duration(
                    sect.and_then(|s| s.as_ref()),
                    &format!("{section_name}.{name}"),
                ),
            }
        };
        let sync = period(
            self.sync_period,
            mode_sync,
            &file.sync_period,
            section.map(|s| &s.sync_period),
            "syncPeriod",
        )?
        .unwrap_or(Duration::from_secs(30));
        let full_sync = self.full_sync_period.unwrap_or(Duration::from_secs(3600));
        if full_sync.is_zero() || sync.is_zero() {
            bail!("--sync-period and --full-sync-period must be greater than 0");
        }
        let min_sync = period(
            self.min_sync_period,
            mode_min_sync,
            &file.min_sync_period,
            section.map(|s| &s.min_sync_period),
            "minSyncPeriod",
        )?
        .unwrap_or(Duration::from_secs(1));
        if min_sync > sync {
            bail!(
                "min-sync-period: {} is longer than the sync period {}: changes would wait longer \
                 than the periodic check (kube-proxy refuses this too: minSyncPeriod must be less \
                 than or equal to syncPeriod)",
                problems::go_duration(min_sync),
                problems::go_duration(sync)
            );
        }
        Ok(Periods {
            sync,
            full_sync,
            min_sync,
        })
    }

    /// `--iptables-masquerade-bit` (not in nftables mode) over the mode's section over 14.
    fn masquerade_bit(
        &self,
        mode: ProxyMode,
        masq_section: Option<&ModeSection>,
    ) -> anyhow::Result<i64> {
        let masquerade_bit = match mode {
            ProxyMode::Nftables => None,
            _ => self.iptables_masquerade_bit.map(i64::from),
        }
        .or(masq_section.and_then(|s| s.masquerade_bit))
        .unwrap_or(14);
        if !(0..=31).contains(&masquerade_bit) {
            bail!("config masqueradeBit {masquerade_bit}: must be within 0..31");
        }
        Ok(masquerade_bit)
    }

    fn cluster_cidrs(&self, file: &KubeProxyConfiguration) -> anyhow::Result<Vec<IpNet>> {
        if !self.cluster_cidr.is_empty() {
            return Ok(self.cluster_cidr.clone());
        }
        let items: Vec<String> = file
            .cluster_c_i_d_r
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::to_string)
            .collect();
        parse_cidrs(&items, "config clusterCIDR")
    }

    /// The NodePort addresses (flag over file) and kube-proxy's per-mode defaults; loopback
    /// addresses are noticed where the mode ignores them.
    fn nodeports(
        &self,
        mode: ProxyMode,
        file: &KubeProxyConfiguration,
        findings: &mut Findings,
    ) -> anyhow::Result<NodePorts> {
        let file_np = file.node_port_addresses.clone().unwrap_or_default();
        let (np_items, np_what) = if !self.nodeport_addresses.is_empty() {
            (&self.nodeport_addresses, "--nodeport-addresses")
        } else {
            (&file_np, "config nodePortAddresses")
        };
        let addresses = parse_nodeport_addresses(np_items, np_what)?;
        let explicit_primary = np_items.iter().any(|s| s.trim() == "primary");
        if explicit_primary && !addresses.is_empty() {
            findings.refused.push(format!(
                "{np_what}: refused: \"primary\" cannot be combined with CIDRs or other keywords \
                 in weir (kube-proxy serves their union)"
            ));
        }
        // kube-proxy's per-mode defaults: iptables accepts NodePorts on every local address,
        // nftables on the node's primary IPs.
        let default = match (mode, explicit_primary) {
            // kube-proxy's ipvs and userspace modes listened on every address, too.
            (ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Userspace, false) => {
                NodePortDefault::AllLocal
            }
            _ => NodePortDefault::Primary,
        };
        for n in addresses.iter().filter(|n| n.network().is_loopback()) {
            match (mode, n) {
                (ProxyMode::Nftables | ProxyMode::Ipvs | ProxyMode::Userspace, _) => {
                    findings.notices.push(format!(
                        "{np_what}: {n}: localhost NodePorts are not supported in {} mode \
                         (as in kube-proxy); loopback addresses are ignored",
                        mode.as_str()
                    ))
                }
                (ProxyMode::Iptables, IpNet::V6(_)) => findings.notices.push(format!(
                    "{np_what}: {n}: IPv6 localhost NodePorts cannot work; ignored"
                )),
                (ProxyMode::Iptables, IpNet::V4(_)) => {}
            }
        }
        Ok(NodePorts {
            addresses,
            default,
            localhost: mode == ProxyMode::Iptables,
        })
    }

    /// `--hostname-override` over the file's over the kernel's host name, lower-cased.
    fn node_name(&self, file: &KubeProxyConfiguration) -> anyhow::Result<String> {
        let given = self
            .hostname_override
            .as_ref()
            .or(file.hostname_override.as_ref());
        Ok(match given {
            Some(n) if !n.trim().is_empty() => n.trim().to_lowercase(),
            _ => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("read the host name")?
                .trim()
                .to_lowercase(),
        })
    }

    fn bind_ip(&self, file: &KubeProxyConfiguration) -> anyhow::Result<Option<IpAddr>> {
        Ok(match (self.bind_address, file.bind_address.as_deref()) {
            (Some(ip), _) => Some(ip),
            (None, Some(s)) if !s.trim().is_empty() => {
                Some(s.trim().parse::<IpAddr>().map_err(|_| {
                    anyhow::anyhow!("config bindAddress: {:?} is not an IP", excerpt(s, 60))
                })?)
            }
            _ => None,
        })
    }

    fn log_settings(&self, file_log: Option<&LoggingSection>) -> anyhow::Result<LogSettings> {
        Ok(LogSettings {
            format: match (
                self.logging_format,
                file_log.and_then(|l| l.format.as_deref()),
            ) {
                (Some(f), _) => Some(f),
                (None, None | Some("")) => None,
                (None, Some("text")) => Some(LogFormat::Text),
                (None, Some("json")) => Some(LogFormat::Json),
                (None, Some(other)) => bail!(
                    "config logging.format {:?}: weir writes text or json",
                    excerpt(other, 40)
                ),
            },
            verbosity: self.v.or(file_log.and_then(|l| l.verbosity)),
        })
    }
}

/// Collects the problem of each failed step so that one run names them all.
struct Keep<'a>(&'a mut Vec<Problem>);

impl Keep<'_> {
    fn ok<T>(&mut self, r: anyhow::Result<T>) -> Option<T> {
        r.map_err(|e| self.0.extend(problems::problems_of(&e))).ok()
    }
}

/// The mode's section for masquerading, as kube-proxy converts v1alpha1: nftables mode reads
/// `nftables:`, every other mode `iptables:`.
fn masquerade_section(mode: ProxyMode, file: &KubeProxyConfiguration) -> Option<&ModeSection> {
    match mode {
        ProxyMode::Nftables => file.nftables.as_ref(),
        _ => file.iptables.as_ref(),
    }
}

struct Periods {
    sync: Duration,
    full_sync: Duration,
    min_sync: Duration,
}

/// Where NodePorts are served: the given addresses, else the mode's default; and whether
/// localhost NodePorts are (iptables mode only).
struct NodePorts {
    addresses: Vec<IpNet>,
    default: NodePortDefault,
    localhost: bool,
}

/// A bind address: port flag 0 disables it; else the address flag (its port over the port
/// flag) over the file's field over the default.
fn bind_addr(
    flag: Option<BindFlag>,
    port_flag: Option<u16>,
    file: &Option<String>,
    (default_ip, default_port): (&str, u16),
    name: &str,
) -> anyhow::Result<Option<SocketAddr>> {
    if port_flag == Some(0) || flag == Some(BindFlag::Off) {
        return Ok(None);
    }
    let given = match (flag, file.as_deref()) {
        (Some(BindFlag::At(a)), _) => a,
        (None, Some(s)) if !s.is_empty() => {
            parse_bind_addr(s).map_err(|e| anyhow::anyhow!("config {name}: {e}"))?
        }
        _ => BindAddr {
            ip: default_ip.parse().expect("valid default"),
            port: None,
        },
    };
    let port = given.port.or(port_flag).unwrap_or(default_port);
    Ok(Some(SocketAddr::new(given.ip, port)))
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
        // An empty text: no file (an empty file is an error of its own).
        let flags = ProxyFlags {
            config: (!yaml.is_empty()).then_some(path),
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
        // Every field of it is applied: nothing to say.
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(s.conntrack.max_per_core, Some(0));

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
        assert_eq!(s.healthz_bind_address.unwrap().port(), 10256);
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
        assert!(
            e.contains("kp.yaml: line 3: iptables.masqueradeAll: invalid boolean"),
            "{e}"
        );
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

    /// `weir proxy ARGS` through the real command line, as `main` parses it.
    fn flags_of(args: &[&str]) -> ProxyFlags {
        use clap::Parser;
        let argv: Vec<std::ffi::OsString> = ["weir", "proxy"]
            .iter()
            .chain(args)
            .map(Into::into)
            .collect();
        let cli = crate::Cli::try_parse_from(super::super::kube_proxy_spelling(argv))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.command {
            crate::Command::Proxy(a) => a.flags,
            #[allow(unreachable_patterns)]
            _ => unreachable!(),
        }
    }

    fn refused(r: anyhow::Result<(Settings, Vec<String>)>) -> Vec<String> {
        match r {
            Ok((s, _)) => panic!("accepted: {s:?}"),
            Err(e) => e
                .downcast_ref::<Invalid>()
                .unwrap_or_else(|| panic!("not a refusal: {e:#}"))
                .0
                .iter()
                .map(Problem::to_string)
                .collect(),
        }
    }

    #[test]
    fn kube_proxy_flags_map_onto_weirs_settings() {
        let secs = Duration::from_secs;
        // The iptables periods outside ipvs mode, the ipvs ones in it; --sync-period wins.
        let f = flags_of(&[
            "--iptables_sync_period=10s",
            "--iptables-min-sync-period",
            "2s",
            "--ipvs-sync-period=20s",
        ]);
        let (s, w) = settings_from(f, "mode: nftables\n").unwrap();
        assert_eq!((s.sync_period, s.min_sync_period), (secs(10), secs(2)));
        assert!(w.is_empty(), "{w:?}");
        let f = flags_of(&[
            "--iptables-sync-period=10s",
            "--ipvs-sync-period=20s",
            "--ipvs-min-sync-period=3s",
            "--proxy-mode=ipvs",
        ]);
        let (s, _) = settings_from(f, "").unwrap();
        assert_eq!((s.sync_period, s.min_sync_period), (secs(20), secs(3)));
        let f = flags_of(&["--iptables-sync-period=10s", "--sync-period=5s"]);
        assert_eq!(settings_from(f, "").unwrap().0.sync_period, secs(5));
        // nftables mode reads its own section, masquerade bit included.
        let (s, _) = settings_from(
            ProxyFlags::default(),
            "mode: nftables\nnftables:\n  syncPeriod: 7s\n  minSyncPeriod: 0s\n  \
             masqueradeBit: 12\n  masqueradeAll: true\niptables:\n  masqueradeBit: 3\n",
        )
        .unwrap();
        assert_eq!(
            (s.sync_period, s.min_sync_period),
            (secs(7), Duration::ZERO)
        );
        assert_eq!(s.masquerade_mark, 1 << 12);
        assert!(s.masquerade_all);
        // The masquerade bit flag: iptables and ipvs modes (nftables mode ignores it, as
        // kube-proxy); ipvs mode reads the iptables section, masqueradeAll too.
        let f = flags_of(&["--iptables-masquerade-bit=13", "--proxy-mode=iptables"]);
        assert_eq!(settings_from(f, "").unwrap().0.masquerade_mark, 0x2000);
        let f = flags_of(&["--iptables-masquerade-bit=13", "--proxy-mode=nftables"]);
        assert_eq!(settings_from(f, "").unwrap().0.masquerade_mark, 0x4000);
        let ipvs_file = "mode: ipvs\niptables:\n  masqueradeBit: 5\n  masqueradeAll: true\n";
        let (s, _) = settings_from(ProxyFlags::default(), ipvs_file).unwrap();
        assert_eq!((s.masquerade_mark, s.masquerade_all), (1 << 5, true));
        let (s, _) = settings_from(flags_of(&["--masquerade-all=false"]), ipvs_file).unwrap();
        assert!(!s.masquerade_all);
        // ipvs mode's flags and fields.
        let f = flags_of(&[
            "--proxy-mode=ipvs",
            "--ipvs-tcp-timeout=15m",
            "--ipvs-tcpfin-timeout=30s",
            "--ipvs-udp-timeout=1m",
            "--ipvs-strict-arp",
            "--ipvs-exclude-cidrs=10.0.0.0/8,fd00::/64",
        ]);
        let (s, _) = settings_from(f, "").unwrap();
        assert_eq!(
            (
                s.ipvs.tcp_timeout,
                s.ipvs.tcp_fin_timeout,
                s.ipvs.udp_timeout
            ),
            (secs(900), secs(30), secs(60))
        );
        assert!(s.ipvs.strict_arp);
        assert_eq!(s.ipvs.exclude_cidrs.len(), 2);
        let (s, _) = settings_from(
            ProxyFlags::default(),
            "mode: ipvs\nipvs:\n  strictARP: true\n  excludeCIDRs: [192.168.0.0/16]\n",
        )
        .unwrap();
        assert!(s.ipvs.strict_arp);
        assert_eq!(
            s.ipvs.exclude_cidrs,
            ["192.168.0.0/16".parse::<IpNet>().unwrap()]
        );
        // --bind-address: this family's primary IP; IPv6 moves the servers' defaults.
        let (s, _) = settings_from(flags_of(&["--bind-address=fd00::5"]), "").unwrap();
        assert_eq!(s.node_ips, ["fd00::5".parse::<IpAddr>().unwrap()]);
        assert_eq!(s.healthz_bind_address, Some("[::]:10256".parse().unwrap()));
        assert_eq!(s.metrics_bind_address, Some("[::1]:10249".parse().unwrap()));
        let (s, _) = settings_from(ProxyFlags::default(), "bindAddress: 0.0.0.0\n").unwrap();
        assert!(s.node_ips.is_empty());
        assert_eq!(
            s.healthz_bind_address,
            Some("0.0.0.0:10256".parse().unwrap())
        );
        // Bind addresses without a port take --healthz-port / --metrics-port; 0 is off.
        let f = flags_of(&[
            "--healthz-bind-address=127.0.0.2",
            "--healthz-port=11000",
            "--metrics-port=0",
        ]);
        let (s, _) = settings_from(f, "").unwrap();
        assert_eq!(
            s.healthz_bind_address,
            Some("127.0.0.2:11000".parse().unwrap())
        );
        assert_eq!(s.metrics_bind_address, None);
        let f = flags_of(&[
            "--healthz-bind-address=127.0.0.2:12000",
            "--healthz-port=11000",
        ]);
        let (s, _) = settings_from(f, "").unwrap();
        assert_eq!(s.healthz_bind_address.unwrap().port(), 12000);
        // "" or 0 turns a server off, as kube-proxy's "set empty to disable".
        let f = flags_of(&["--metrics-bind-address=", "--healthz-bind-address", "0"]);
        let (s, _) = settings_from(f, "metricsBindAddress: 127.0.0.1:9999\n").unwrap();
        assert_eq!(
            (s.healthz_bind_address, s.metrics_bind_address),
            (None, None)
        );
        let (s, _) =
            settings_from(ProxyFlags::default(), "healthzBindAddress: 10.0.0.1\n").unwrap();
        assert_eq!(
            s.healthz_bind_address,
            Some("10.0.0.1:10256".parse().unwrap())
        );
        // The node's name, lowercased.
        let (s, _) = settings_from(flags_of(&["--hostname-override=Node-X"]), "").unwrap();
        assert_eq!(s.node_name, "node-x");
        // Logging: the flags over the file's.
        let (s, _) = settings_from(flags_of(&["--logging-format=json", "-v=4"]), "").unwrap();
        assert_eq!(
            s.log,
            LogSettings {
                format: Some(LogFormat::Json),
                verbosity: Some(4)
            }
        );
        let log_file = "logging:\n  format: json\n  verbosity: 2\n  flushFrequency: 5s\n";
        let (s, w) = settings_from(ProxyFlags::default(), log_file).unwrap();
        assert_eq!(
            s.log,
            LogSettings {
                format: Some(LogFormat::Json),
                verbosity: Some(2)
            }
        );
        assert!(w.is_empty(), "{w:?}");
        let (s, _) = settings_from(flags_of(&["--v", "0"]), log_file).unwrap();
        assert_eq!(s.log.verbosity, Some(0));
        // oom_score_adj and conntrack: from the flags, else the file.
        let f = flags_of(&[
            "--oom-score-adj",
            "-999",
            "--conntrack-min=1000",
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout=30s",
        ]);
        let ct_file = "oomScoreAdj: 5\nconntrack:\n  maxPerCore: 10\n  min: 20\n  \
                       tcpEstablishedTimeout: 24h\n";
        let (s, w) = settings_from(f, ct_file).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(s.oom_score_adj, Some(-999));
        assert_eq!(
            s.conntrack,
            ConntrackSettings {
                max_per_core: Some(10),
                min: Some(1000),
                tcp_established_timeout: Some(secs(86400)),
                tcp_be_liberal: Some(true),
                udp_timeout: Some(secs(30)),
                ..Default::default()
            }
        );
        // --version: weir's line; another version is refused.
        assert_eq!(version_request("true"), Ok(true));
        assert_eq!(version_request("raw"), Ok(true));
        assert_eq!(version_request("false"), Ok(false));
        assert!(version_request("v1.37.2")
            .unwrap_err()
            .starts_with("--version=v1.37.2: refused: weir reports its own version"));
        // pflag's repeats: the last value wins, lists append.
        let f = flags_of(&[
            "--proxy-mode=iptables",
            "--proxy-mode=ipvs",
            "--nodeport-addresses=10.0.0.0/8",
            "--nodeport-addresses=192.168.0.0/16",
        ]);
        assert_eq!(f.proxy_mode, Some(ProxyMode::Ipvs));
        assert_eq!(f.nodeport_addresses.len(), 2);
        // --cleanup as pflag writes it.
        for (arg, want) in [("--cleanup", Some(true)), ("--cleanup=false", Some(false))] {
            use clap::Parser;
            let cli = crate::Cli::try_parse_from(["weir", "proxy", arg]).unwrap();
            match cli.command {
                crate::Command::Proxy(a) => assert_eq!(a.cleanup, want, "{arg}"),
                #[allow(unreachable_patterns)]
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn nodeport_keywords_and_refusals_name_the_value() {
        let f = flags_of(&["--nodeport-addresses=all", "--proxy-mode=nftables"]);
        let (s, _) = settings_from(f, "").unwrap();
        assert_eq!(
            s.nodeport_addresses,
            [
                "0.0.0.0/0".parse::<IpNet>().unwrap(),
                "::/0".parse().unwrap()
            ]
        );
        let f = flags_of(&["--nodeport-addresses=localhost", "--proxy-mode=iptables"]);
        let (s, w) = settings_from(f, "").unwrap();
        assert_eq!(s.nodeport_addresses.len(), 2);
        assert!(w.len() == 1 && w[0].contains("::1/128"), "{w:?}");
        let r = refused(settings_from(
            flags_of(&["--nodeport-addresses=primary,localhost"]),
            "",
        ));
        assert!(
            r[0].starts_with("--nodeport-addresses: refused: \"primary\""),
            "{r:?}"
        );
        // Each refused flag, by name, all at once.
        let r = refused(settings_from(
            flags_of(&[
                "--detect-local-mode=NodeCIDR",
                "--init-only",
                "--write-config-to=/x",
            ]),
            "",
        ));
        assert_eq!(r.len(), 3, "{r:?}");
        assert!(r[0].starts_with("--detect-local-mode=NodeCIDR: refused:"));
        assert!(r[1].starts_with("--init-only=true: refused:"));
        assert!(r[2].starts_with("--write-config-to=/x: refused:"));
        // Harmless values pass without a word.
        let f = flags_of(&[
            "--detect-local-mode=ClusterCIDR",
            "--profiling=false",
            "--init-only=false",
        ]);
        let (_, w) = settings_from(f, "").unwrap();
        assert!(w.is_empty(), "{w:?}");
        // Gates: the file's and the flag's; KubeProxyIPVS=false refuses ipvs mode.
        let r = refused(settings_from(
            flags_of(&["--feature-gates=KubeProxyIPVS=false", "--proxy-mode=ipvs"]),
            "",
        ));
        assert!(r[0].contains("KubeProxyIPVS"), "{r:?}");
        assert!(settings_from(flags_of(&["--feature-gates=KubeProxyIPVS=false"]), "").is_ok());
        let r = refused(settings_from(
            ProxyFlags::default(),
            "featureGates:\n  AllowServiceExternalIPs: false\n",
        ));
        assert!(
            r[0].contains("featureGates AllowServiceExternalIPs=false: refused"),
            "{r:?}"
        );
        // The flag's value wins over the file's.
        let f = flags_of(&["--feature-gates", "AllowServiceExternalIPs=true"]);
        assert!(settings_from(f, "featureGates:\n  AllowServiceExternalIPs: false\n").is_ok());
        // A refused field names the file and the field.
        let r = refused(settings_from(ProxyFlags::default(), "ipvs:\n  strictARP: true\ninitOnly: 1\nconntrack: {}\nwinkernel: {enableDSR: true}\ndetectLocalMode: BridgeInterface\n"));
        // initOnly is a flag, not a field: unknown.
        assert!(
            r.len() == 2
                && r[0].ends_with("kp.yaml: line 3: unknown field initOnly")
                && r[1].contains("kp.yaml: detectLocalMode=BridgeInterface: refused"),
            "{r:?}"
        );
    }

    #[test]
    fn verbosity_maps_onto_log_levels() {
        let f = |v| {
            LogSettings {
                format: None,
                verbosity: v,
            }
            .filter()
        };
        assert_eq!(f(None), None);
        assert_eq!(f(Some(0)).as_deref(), Some("info"));
        assert_eq!(f(Some(1)).as_deref(), Some("info"));
        assert_eq!(f(Some(2)).as_deref(), Some("info,weir=debug"));
        assert_eq!(f(Some(4)).as_deref(), Some("info,weir=trace"));
        assert_eq!(f(Some(6)).as_deref(), Some("debug,weir=trace"));
        // `weir=` covers every weir crate's target (weir_proxy, weir_source, …).
        let filter = tracing_subscriber::EnvFilter::new(f(Some(2)).unwrap());
        assert!(filter.to_string().contains("weir=debug"));
    }
}
