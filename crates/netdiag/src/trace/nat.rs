//! Source NAT: MASQUERADE's choice of address.

use std::net::{IpAddr, Ipv4Addr};

use super::{Pkt, Walker};

impl Walker<'_> {
    /// MASQUERADE's source (`inet_select_addr(out, …)`, not the route's `src`): the outgoing
    /// interface's primary IPv4 address, else (an interface with no address) the first global
    /// address of another interface, in interface order.
    pub(super) fn masquerade_source(&mut self, p: &Pkt) -> Ipv4Addr {
        let oif = p.oif.clone().unwrap_or_default();
        let on_oif: Vec<Ipv4Addr> = self
            .st
            .local_addresses()
            .filter(|a| a.ifname == oif && !a.secondary)
            .filter_map(|a| match a.addr {
                IpAddr::V4(v) => Some(v),
                _ => None,
            })
            .collect();
        if let Some(a) = on_oif.first() {
            return *a;
        }
        let fallback = self
            .st
            .links
            .iter()
            .flatten()
            .map(|l| l.name.clone())
            .chain(self.st.local_addresses().map(|a| a.ifname.clone()))
            .find_map(|ifname| {
                self.st.local_addresses().find_map(|a| match a.addr {
                    IpAddr::V4(v)
                        if a.ifname == ifname && a.scope == "global" && !v.is_loopback() =>
                    {
                        Some(v)
                    }
                    _ => None,
                })
            });
        match fallback {
            Some(a) => {
                self.assume(format!("masquerade on {oif}, which has no IPv4 address: the kernel takes another interface's ({a}), as inet_select_addr does"));
                a
            }
            None => {
                self.assume(format!(
                    "no IPv4 address known for masquerade on {oif}: source left unchanged"
                ));
                p.src
            }
        }
    }
}
