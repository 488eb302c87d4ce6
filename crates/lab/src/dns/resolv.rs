//! The pods' resolv.conf: what the kubelet writes, and where `ip netns exec` finds it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::state::ZONE;

/// The resolv.conf the kubelet writes for dnsPolicy ClusterFirst in namespace `ns` (and for
/// ClusterFirstWithHostNet in a hostNetwork pod).
pub fn resolv_conf(nameserver: Ipv4Addr, ns: &str) -> String {
    format!(
        "# written by weir lab (kubelet, dnsPolicy ClusterFirst)\nnameserver {nameserver}\n\
         search {ns}.svc.{ZONE} svc.{ZONE} {ZONE}\noptions ndots:5\n"
    )
}

/// `/etc/netns/<netns>`: where `ip netns exec <netns>` finds files to mount over `/etc`.
pub fn netns_etc(netns: &str) -> PathBuf {
    Path::new("/etc/netns").join(netns)
}

/// Removes the resolv.conf the lab wrote for each of `namespaces` (and the directory when it
/// is left empty). Best effort: returns what could not be removed.
pub fn remove_netns_etc(namespaces: &[String]) -> Vec<String> {
    let mut failed = Vec::new();
    for n in namespaces {
        let dir = netns_etc(n);
        let file = dir.join("resolv.conf");
        if file.exists() {
            if let Err(e) = std::fs::remove_file(&file) {
                failed.push(format!("{}: {e}", file.display()));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_is_the_kubelets() {
        assert_eq!(
            resolv_conf(Ipv4Addr::new(10, 96, 0, 10), "default")
                .lines()
                .skip(1)
                .collect::<Vec<_>>(),
            [
                "nameserver 10.96.0.10",
                "search default.svc.cluster.local svc.cluster.local cluster.local",
                "options ndots:5"
            ]
        );
    }
}
