//! `weir proxy` on every node of a lab: its command line (pure), starting it inside the node's
//! namespace as a detached process, waiting until `/healthz` answers 200, stopping it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ipnet::Ipv4Net;
use weir_kernel::NetNs;

use crate::ns;
use crate::process::{indent, log_tail, spawn_detached};

/// kube-proxy's healthz port; the lab binds it on the node's underlay address.
pub const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's metrics address.
pub const METRICS_ADDR: &str = "127.0.0.1:10249";
/// How long a proxy may take from start to its first applied sync.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Everything needed to start the proxy of one node.
#[derive(Debug, Clone)]
pub struct Launch {
    pub weir: PathBuf,
    /// `nftables` or `iptables`.
    pub mode: String,
    pub manifests: PathBuf,
    pub cluster_cidr: Ipv4Net,
    pub node: String,
    pub node_ip: Ipv4Addr,
    /// The node's namespace name.
    pub netns: String,
    pub log: PathBuf,
    /// `--state-dir`: per node, inside the lab (never the host's /var/lib/weir).
    pub state_dir: PathBuf,
}

impl Launch {
    /// `weir proxy`'s arguments (docs/proxy.md's contract).
    pub fn args(&self) -> Vec<String> {
        vec![
            "proxy".into(),
            "--manifests".into(),
            self.manifests.display().to_string(),
            "--proxy-mode".into(),
            self.mode.clone(),
            "--cluster-cidr".into(),
            self.cluster_cidr.to_string(),
            "--hostname-override".into(),
            self.node.clone(),
            "--healthz-bind-address".into(),
            self.healthz_addr().to_string(),
            "--metrics-bind-address".into(),
            METRICS_ADDR.into(),
            "--state-dir".into(),
            self.state_dir.display().to_string(),
        ]
    }

    pub fn healthz_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.node_ip, HEALTHZ_PORT)
    }

    /// A shell-pasteable command line (for logs and error messages).
    pub fn command_line(&self) -> String {
        format!(
            "ip netns exec {} {} {}",
            self.netns,
            self.weir.display(),
            self.args().join(" ")
        )
    }

    /// Starts the proxy inside the node's namespace, detached (own session), its stdout and
    /// stderr appended to the log. Does not wait for readiness ([`wait_ready`]). Returns its pid.
    pub fn spawn(&self) -> anyhow::Result<u32> {
        spawn_detached(&self.weir, &self.args(), &self.netns, &self.log)
    }
}

/// One `GET /healthz` from inside `netns`: the HTTP status code.
pub fn healthz(netns: &str, addr: SocketAddrV4) -> anyhow::Result<u16> {
    let ns = NetNs::named(netns).with_context(|| format!("open netns {netns}"))?;
    let _guard = ns.enter().with_context(|| format!("enter netns {netns}"))?;
    let mut stream = TcpStream::connect_timeout(&SocketAddr::V4(addr), Duration::from_millis(500))
        .with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    // The status line is all we need.
    while !buf.contains(&b'\n') && buf.len() < 4096 {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    parse_status(&String::from_utf8_lossy(&buf))
}

/// The status code of an HTTP response's first line (`HTTP/1.1 200 OK`).
pub fn parse_status(response: &str) -> anyhow::Result<u16> {
    let line = response.lines().next().unwrap_or_default();
    let mut words = line.split_whitespace();
    match (words.next(), words.next().and_then(|c| c.parse().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => Ok(code),
        _ => bail!("not an HTTP response: {line:?}"),
    }
}

/// Waits until the proxy `pid` answers 200 on `/healthz` (its first sync is applied). Fails
/// early if it exits, and after `timeout` with the log's tail.
pub fn wait_ready(launch: &Launch, pid: u32, timeout: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let addr = launch.healthz_addr();
    loop {
        let last = match healthz(&launch.netns, addr) {
            Ok(200) => return Ok(started.elapsed()),
            Ok(code) => format!("/healthz answered {code}"),
            Err(e) => format!("{e:#}"),
        };
        if !ns::alive(pid) {
            bail!(
                "weir proxy on node {} (pid {pid}) exited before it was ready\n  command: {}\n  \
                 log {}:\n{}",
                launch.node,
                launch.command_line(),
                launch.log.display(),
                indent(&log_tail(&launch.log, 20))
            );
        }
        if started.elapsed() > timeout {
            bail!(
                "weir proxy on node {} (pid {pid}) not ready after {} s (last: {last})\n  \
                 command: {}\n  log {}:\n{}",
                launch.node,
                timeout.as_secs(),
                launch.command_line(),
                launch.log.display(),
                indent(&log_tail(&launch.log, 20))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True when `pid` is a `weir proxy` (so that a recorded pid reused by another process is
/// never killed).
pub fn is_weir_proxy(pid: u32, manifests: &Path) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.get(1).map(String::as_str) == Some("proxy")
        && args.iter().any(|a| Path::new(a) == manifests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_follows_the_contract() {
        let l = Launch {
            weir: "/usr/bin/weir".into(),
            mode: "nftables".into(),
            manifests: "/run/weir-lab/demo/manifests".into(),
            cluster_cidr: "10.244.0.0/16".parse().unwrap(),
            node: "a".into(),
            node_ip: Ipv4Addr::new(172, 30, 0, 11),
            netns: "wl-demo-a".into(),
            log: "/x/proxy-a.log".into(),
            state_dir: "/x/proxy-state/a".into(),
        };
        assert_eq!(
            l.command_line(),
            "ip netns exec wl-demo-a /usr/bin/weir proxy --manifests /run/weir-lab/demo/manifests \
             --proxy-mode nftables --cluster-cidr 10.244.0.0/16 --hostname-override a \
             --healthz-bind-address 172.30.0.11:10256 --metrics-bind-address 127.0.0.1:10249 \
             --state-dir /x/proxy-state/a"
        );
    }

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status("HTTP/1.1 200 OK\r\n\r\n").unwrap(), 200);
        assert_eq!(
            parse_status("HTTP/1.0 503 Service Unavailable\r\n").unwrap(),
            503
        );
        assert!(parse_status("SSH-2.0-OpenSSH").is_err());
        assert!(parse_status("").is_err());
    }
}
