//! `weir dns --node-local`: a cache on a link-local address on every node (NodeLocal
//! DNSCache's shape), whose traffic conntrack never sees. The lab's node-local mode sets up
//! the same table.

use std::net::Ipv4Addr;

/// The table's name (family `ip`).
pub const TABLE: &str = "weir-nodelocal-dns";

/// An nft script removing the table whether or not it exists (`add` first makes the
/// `delete` valid; one transaction). The setup prefixes it to the table, replacing it whole.
pub const REMOVE_TABLE: &str =
    "add table ip weir-nodelocal-dns\ndelete table ip weir-nodelocal-dns\n";

/// The nft table exempting the node-local cache's traffic from conntrack: in the raw-priority
/// hooks, before conntrack sees a packet, so a lookup makes no conntrack entry (and cannot
/// race on inserting one). Its own table: the proxies' tables are not touched.
pub fn notrack_table(ip: Ipv4Addr) -> String {
    // Both hooks match both directions: a pod's query arrives in prerouting and the answer
    // leaves through output; a host-network client's query and answer pass output and then
    // (over lo) prerouting.
    let rules = format!(
        "ip daddr {ip} udp dport 53 notrack; ip daddr {ip} tcp dport 53 notrack; \
         ip saddr {ip} udp sport 53 notrack; ip saddr {ip} tcp sport 53 notrack;"
    );
    format!(
        "table ip weir-nodelocal-dns {{\n\
         \tchain pre {{ type filter hook prerouting priority raw; {rules} }}\n\
         \tchain out {{ type filter hook output priority raw; {rules} }}\n}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notrack_table_exempts_both_directions() {
        let t = notrack_table(Ipv4Addr::new(169, 254, 20, 10));
        for hook in ["prerouting", "output"] {
            let chain = t
                .lines()
                .find(|l| l.contains(&format!("hook {hook} priority raw;")))
                .unwrap();
            for rule in [
                "ip daddr 169.254.20.10 udp dport 53 notrack;",
                "ip daddr 169.254.20.10 tcp dport 53 notrack;",
                "ip saddr 169.254.20.10 udp sport 53 notrack;",
                "ip saddr 169.254.20.10 tcp sport 53 notrack;",
            ] {
                assert!(chain.contains(rule), "{hook}: {rule}: {t}");
            }
        }
    }
}
