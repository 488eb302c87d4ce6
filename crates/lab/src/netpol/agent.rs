//! `weir policy` on every node of a lab with policies: its command line (pure), starting it in
//! the node's namespace, and waiting until `/healthz` says its first table is in the kernel.

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::ns;
use crate::process::{indent, log_tail, spawn_detached};
use crate::proxy::healthz;

/// Where the agent serves `/healthz` (the node's underlay address; the port docs/policy.md's
/// example uses).
pub const HEALTHZ_PORT: u16 = 10258;
/// How long an agent may take from start to its first table in the kernel.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Everything needed to start the policy agent of one node.
#[derive(Debug, Clone)]
pub struct Launch {
    pub weir: PathBuf,
    pub manifests: PathBuf,
    pub node: String,
    pub node_ip: std::net::Ipv4Addr,
    /// The node's namespace name.
    pub netns: String,
    pub log: PathBuf,
}

impl Launch {
    /// `weir policy`'s arguments (docs/policy.md, "The command").
    pub fn args(&self) -> Vec<String> {
        vec![
            "policy".into(),
            "--manifests".into(),
            self.manifests.display().to_string(),
            "--node-name".into(),
            self.node.clone(),
            "--healthz-bind-address".into(),
            self.healthz_addr().to_string(),
            "--manifest-poll-interval".into(),
            crate::routes::MANIFEST_POLL.into(),
        ]
    }

    pub fn healthz_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.node_ip, HEALTHZ_PORT)
    }

    pub fn command_line(&self) -> String {
        format!(
            "ip netns exec {} {} {}",
            self.netns,
            self.weir.display(),
            self.args().join(" ")
        )
    }

    /// Starts the agent, detached, its output appended to the log; returns its pid.
    pub fn spawn(&self) -> anyhow::Result<u32> {
        spawn_detached(&self.weir, &self.args(), &self.netns, &self.log)
    }

    /// Waits until `/healthz` answers 200 (the rules of a complete first view are in the
    /// kernel). Fails early if the agent exits, and after `timeout` with its log's tail.
    pub fn wait_ready(&self, pid: u32, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let last = match healthz(&self.netns, self.healthz_addr()) {
                Ok(200) => return Ok(started.elapsed()),
                Ok(code) => format!("/healthz answered {code}"),
                Err(e) => format!("{e:#}"),
            };
            let why = if !ns::alive(pid) {
                "exited before it was ready".to_string()
            } else if started.elapsed() > timeout {
                format!("not ready after {} s (last: {last})", timeout.as_secs())
            } else {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            bail!(
                "weir policy on node {} (pid {pid}) {why}\n  command: {}\n  log {}:\n{}",
                self.node,
                self.command_line(),
                self.log.display(),
                indent(&log_tail(&self.log, 20))
            );
        }
    }
}

/// Whether `pid` is a `weir policy` reading `manifests` (before it is stopped).
pub fn is_weir_policy(pid: u32, manifests: &std::path::Path) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    args.contains(&b"policy".as_slice()) && args.contains(&manifests.as_os_str().as_encoded_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line() {
        let l = Launch {
            weir: "/usr/bin/weir".into(),
            manifests: "/run/weir-lab/p/manifests".into(),
            node: "a".into(),
            node_ip: [172, 30, 0, 11].into(),
            netns: "wl-p-a".into(),
            log: "/tmp/l".into(),
        };
        assert_eq!(
            l.command_line(),
            "ip netns exec wl-p-a /usr/bin/weir policy --manifests /run/weir-lab/p/manifests \
             --node-name a --healthz-bind-address 172.30.0.11:10258 \
             --manifest-poll-interval 200ms"
        );
    }
}
