//! Masquerade of pod traffic that leaves the cluster, in an nftables table weir owns.
//!
//! The table holds two static rules and sets; an ADD or DEL changes only set elements, so the
//! ruleset never grows with the number of pods and removing a pod removes exactly its element:
//!
//! ```text
//! table inet weir-cni {
//!   set pods4 { type ipv4_addr }                  # pods whose traffic may be masqueraded
//!   set direct4 { type ipv4_addr; flags interval } # destinations reached without NAT (cluster CIDR)
//!   chain postrouting { type nat hook postrouting priority srcnat
//!     ip saddr @pods4 ip daddr != @direct4 masquerade }
//! }
//! ```
//! Every change is one `nft -f -` transaction, so it is atomic. Each transaction re-declares the
//! table (declarations are idempotent) and rewrites the two static rules, so a table someone
//! flushed by hand heals on the next ADD.

use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use ipnet::IpNet;

use crate::spec::{CniError, CniResult, ErrorCode};

pub const TABLE: &str = "weir-cni";

/// Always reached directly: multicast.
const ALWAYS_DIRECT: [&str; 2] = ["224.0.0.0/4", "ff00::/8"];

fn declarations() -> String {
    format!(
        "add table inet {TABLE}\n\
         add set inet {TABLE} pods4 {{ type ipv4_addr; }}\n\
         add set inet {TABLE} pods6 {{ type ipv6_addr; }}\n\
         add set inet {TABLE} direct4 {{ type ipv4_addr; flags interval; auto-merge; }}\n\
         add set inet {TABLE} direct6 {{ type ipv6_addr; flags interval; auto-merge; }}\n\
         add chain inet {TABLE} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         flush chain inet {TABLE} postrouting\n\
         add rule inet {TABLE} postrouting ip saddr @pods4 ip daddr != @direct4 masquerade\n\
         add rule inet {TABLE} postrouting ip6 saddr @pods6 ip6 daddr != @direct6 masquerade\n"
    )
}

fn pod_set(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "pods4"
    } else {
        "pods6"
    }
}

/// The script that makes `pods` masqueraded when they leave for anything outside `direct`.
pub fn add_script(pods: &[IpAddr], direct: &[IpNet]) -> String {
    let mut s = declarations();
    for net in direct_nets(direct) {
        let set = if net.contains(':') {
            "direct6"
        } else {
            "direct4"
        };
        s += &format!("add element inet {TABLE} {set} {{ {net} }}\n");
    }
    s + &pod_elements("add", pods)
}

fn direct_nets(direct: &[IpNet]) -> Vec<String> {
    let mut nets: Vec<String> = direct.iter().map(|n| n.trunc().to_string()).collect();
    nets.extend(ALWAYS_DIRECT.iter().map(|s| s.to_string()));
    nets
}

fn pod_elements(verb: &str, pods: &[IpAddr]) -> String {
    pods.iter()
        .map(|ip| format!("{verb} element inet {TABLE} {} {{ {ip} }}\n", pod_set(ip)))
        .collect()
}

/// Makes `pods` masqueraded, cheaply in the common case.
///
/// Declaring the table costs nft about 15 ms (cache fill, chain update, interval-set merge) while
/// adding one element costs 2 ms, so the full script runs only when `stamp` (a file beside the
/// IPAM store) says this network's table was not set up with these destinations, or when the
/// element add fails because the table is gone (flushed ruleset, reboot).
pub fn ensure(pods: &[IpAddr], direct: &[IpNet], stamp: &std::path::Path) -> CniResult<()> {
    let wanted = direct_nets(direct).join(",");
    if std::fs::read_to_string(stamp).is_ok_and(|s| s == wanted)
        && apply(&pod_elements("add", pods)).is_ok()
    {
        return Ok(());
    }
    apply(&add_script(pods, direct))?;
    let tmp = stamp.with_extension("tmp");
    // The stamp only saves time: failing to write it is not an error.
    if std::fs::write(&tmp, &wanted).is_ok() {
        let _ = std::fs::rename(&tmp, stamp);
    }
    Ok(())
}

/// Forgets `pods`; the fast path deletes elements, the slow one first re-declares the table so the
/// delete succeeds even when the table never existed.
pub fn forget(pods: &[IpAddr]) -> CniResult<()> {
    if pods.is_empty() {
        return Ok(());
    }
    let fast = pod_elements("add", pods) + &pod_elements("delete", pods);
    apply(&fast).or_else(|_| apply(&del_script(pods)))
}

/// The script that forgets `pods`. Adding before deleting makes the delete succeed whether or not
/// the element (or the table) existed, in one transaction: DEL must be idempotent, and Debian 12's
/// nft has no `destroy`.
pub fn del_script(pods: &[IpAddr]) -> String {
    declarations() + &pod_elements("add", pods) + &pod_elements("delete", pods)
}

/// Runs one nft transaction.
pub fn apply(script: &str) -> CniResult<()> {
    let fail = |m: String| CniError::new(ErrorCode::Nftables, m);
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run nft (install package nftables): {e}")))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .map_err(|e| fail(format!("writing to nft: {e}")))?;
    let out = child
        .wait_with_output()
        .map_err(|e| fail(format!("waiting for nft: {e}")))?;
    if !out.status.success() {
        return Err(fail("nft rejected the masquerade update".into())
            .with_details(String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// Whether `ip` is in the masquerade set (for CHECK).
pub fn is_masqueraded(ip: &IpAddr) -> bool {
    Command::new("nft")
        .args([
            "get",
            "element",
            "inet",
            TABLE,
            pod_set(ip),
            &format!("{{ {ip} }}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Removes the whole table (used by cleanup tooling; a missing table is success).
pub fn remove_table() -> CniResult<()> {
    apply(&format!(
        "add table inet {TABLE}\ndelete table inet {TABLE}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_script_declares_and_adds() {
        let s = add_script(
            &["10.244.1.5".parse().unwrap()],
            &["10.244.0.0/16".parse().unwrap()],
        );
        assert!(s.contains("add element inet weir-cni pods4 { 10.244.1.5 }"));
        assert!(s.contains("add element inet weir-cni direct4 { 10.244.0.0/16 }"));
        assert!(s.contains("add element inet weir-cni direct4 { 224.0.0.0/4 }"));
        assert_eq!(
            s.matches("masquerade").count(),
            2,
            "the two static rules, once each"
        );
    }

    #[test]
    fn del_script_is_idempotent_by_construction() {
        let s = del_script(&["fd00::5".parse().unwrap()]);
        let add = s
            .find("add element inet weir-cni pods6 { fd00::5 }")
            .unwrap();
        let del = s
            .find("delete element inet weir-cni pods6 { fd00::5 }")
            .unwrap();
        assert!(add < del);
    }
}
