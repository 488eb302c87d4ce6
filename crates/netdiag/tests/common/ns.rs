//! A network namespace for one kernel-agreement test: commands, a listener, a TCP connect, and
//! `trace` on its live state.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use weir_kernel::NetNs;
use weir_netdiag::live::Target;
use weir_netdiag::state::NodeState;
use weir_netdiag::trace;

/// Deleted on drop (also when the test panics).
pub struct Ns(pub String);

impl Ns {
    /// `<prefix>-<tag>-<pid>`: the prefix keeps test binaries running at once apart.
    pub fn new(prefix: &str, tag: &str) -> Ns {
        let name = format!("{prefix}-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        assert!(Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success());
        let ns = Ns(name);
        ns.sh("ip link set lo up");
        ns
    }

    pub fn sh(&self, cmd: &str) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", cmd])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn handle(&self) -> NetNs {
        NetNs::named(&self.0).unwrap()
    }

    /// A TCP listener on `ip:port` inside the namespace (kept open while the value lives).
    pub fn listen(&self, ip: &str, port: u16) -> TcpListener {
        self.handle()
            .run(|| TcpListener::bind((ip, port)).unwrap())
            .unwrap()
    }

    /// Whether a TCP connection from inside the namespace completes within `limit`.
    pub fn connects(&self, to: &str, limit: Duration) -> bool {
        let addr: SocketAddr = to.parse().unwrap();
        self.handle()
            .run(|| TcpStream::connect_timeout(&addr, limit).is_ok())
            .unwrap()
    }

    /// Whether one ping (ICMP echo request) from inside the namespace is answered within a
    /// second.
    pub fn pings(&self, to: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.0, "ping", "-n", "-c1", "-W1", to])
            .output()
            .unwrap()
            .status
            .success()
    }

    /// The namespace's live state, as `weir trace --netns` reads it.
    pub fn state(&self) -> NodeState {
        let target = Target {
            netns: Some(self.0.clone()),
        };
        NodeState::from_outputs(
            target
                .collect()
                .into_iter()
                .filter_map(|r| r.result.ok().map(|t| (r.output, t))),
        )
    }

    /// `trace` of one TCP packet on the namespace's live state.
    pub fn trace(&self, src: &str, dst: &str, dport: u16, iif: &str) -> trace::Trace {
        super::walk(&self.state(), src, dst, dport, iif)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}
