//! Address arithmetic the lab's layout is made of: host numbers of a subnet, and the fixed
//! hosts the lab gives a role (the DNS Service's ClusterIP, a node's pod gateway).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// The next host address of `net` from host number `*next` on that is not in `used` (and
/// marks it used).
pub fn take_ip(net: Ipv4Net, next: &mut u32, used: &mut BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    loop {
        let ip = nth_host(net, *next)?;
        *next += 1;
        if used.insert(ip) {
            return Some(ip);
        }
    }
}

/// Host number `n` of `net` (network address + n), if it is a usable host address.
pub fn nth_host(net: Ipv4Net, n: u32) -> Option<Ipv4Addr> {
    let base = u32::from(net.network());
    let addr = Ipv4Addr::from(base.checked_add(n)?);
    (net.contains(&addr) && addr != net.broadcast() && n != 0).then_some(addr)
}

/// The DNS Service's ClusterIP: host 10 of serviceCIDR.
pub fn dns_cluster_ip(service_cidr: Ipv4Net) -> Ipv4Addr {
    (u32::from(service_cidr.network()) + 10).into()
}

/// The gateway the pods of a node with pod CIDR `pod_cidr` use (first host of the pod CIDR, set
/// on cni0 by the plugin). In an eni network the same address is the ENI's own, the source
/// masquerade picks out of the ENI.
pub fn pod_gateway(pod_cidr: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(pod_cidr.network()) + 1)
}
