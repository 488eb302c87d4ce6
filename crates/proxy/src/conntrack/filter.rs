//! What a conntrack entry looks like to weir, and the filters that select entries to delete.

use std::fmt;
use std::net::IpAddr;

use weir_model::{IpFamily, Protocol};

/// IANA protocol numbers, as conntrack reports them.
pub fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// One direction of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
}

/// A conntrack entry: `orig` is the packet as the client sent it, `reply` as the answer comes
/// back — after a DNAT to an endpoint, `reply.src` is the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// IANA protocol number (17 = UDP).
    pub protocol: u8,
    pub orig: FlowTuple,
    pub reply: FlowTuple,
}

impl Flow {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.orig.src)
    }
}

/// Selects conntrack entries the way `conntrack -D` options do: every field that is `Some` must
/// match. Family and protocol always must.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConntrackFilter {
    pub family: IpFamily,
    pub protocol: Protocol,
    /// `--orig-dst`: the address the client sent to (a service IP).
    pub orig_dst: Option<IpAddr>,
    /// `--orig-port-dst`: the port the client sent to (service port or node port).
    pub orig_dst_port: Option<u16>,
    /// `--reply-src`: where the answer comes from (the DNAT target, an endpoint IP).
    pub reply_src: Option<IpAddr>,
    /// `--reply-port-src`: the endpoint's port.
    pub reply_src_port: Option<u16>,
}

impl ConntrackFilter {
    pub fn matches(&self, flow: &Flow) -> bool {
        fn eq<T: PartialEq>(want: Option<T>, have: T) -> bool {
            want.is_none_or(|w| w == have)
        }
        flow.family() == self.family
            && flow.protocol == protocol_number(self.protocol)
            && eq(self.orig_dst, flow.orig.dst)
            && eq(self.orig_dst_port, flow.orig.dst_port)
            && eq(self.reply_src, flow.reply.src)
            && eq(self.reply_src_port, flow.reply.src_port)
    }
}

/// `conntrack -D`-like spelling, for logs.
impl fmt::Display for ConntrackFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fam = match self.family {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        };
        write!(f, "-f {fam} -p {}", self.protocol.as_str())?;
        if let Some(a) = self.orig_dst {
            write!(f, " --orig-dst {a}")?;
        }
        if let Some(p) = self.orig_dst_port {
            write!(f, " --orig-port-dst {p}")?;
        }
        if let Some(a) = self.reply_src {
            write!(f, " --reply-src {a}")?;
        }
        if let Some(p) = self.reply_src_port {
            write!(f, " --reply-port-src {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(dst: &str, dport: u16, reply_src: &str, reply_sport: u16) -> Flow {
        let client: IpAddr = "10.244.0.9".parse().unwrap();
        Flow {
            protocol: 17,
            orig: FlowTuple {
                src: client,
                dst: dst.parse().unwrap(),
                src_port: 40000,
                dst_port: dport,
            },
            reply: FlowTuple {
                src: reply_src.parse().unwrap(),
                dst: client,
                src_port: reply_sport,
                dst_port: 40000,
            },
        }
    }

    fn filter() -> ConntrackFilter {
        ConntrackFilter {
            family: IpFamily::V4,
            protocol: Protocol::Udp,
            orig_dst: Some("10.96.0.10".parse().unwrap()),
            orig_dst_port: Some(53),
            reply_src: Some("10.244.1.5".parse().unwrap()),
            reply_src_port: Some(5353),
        }
    }

    #[test]
    fn every_given_field_must_match() {
        let f = filter();
        assert!(f.matches(&flow("10.96.0.10", 53, "10.244.1.5", 5353)));
        assert!(!f.matches(&flow("10.96.0.11", 53, "10.244.1.5", 5353)));
        assert!(!f.matches(&flow("10.96.0.10", 54, "10.244.1.5", 5353)));
        assert!(!f.matches(&flow("10.96.0.10", 53, "10.244.1.6", 5353)));
        assert!(!f.matches(&flow("10.96.0.10", 53, "10.244.1.5", 53)));
        let mut tcp = flow("10.96.0.10", 53, "10.244.1.5", 5353);
        tcp.protocol = 6;
        assert!(!f.matches(&tcp));
    }

    #[test]
    fn absent_fields_match_anything() {
        let f = ConntrackFilter {
            orig_dst: None,
            reply_src_port: None,
            ..filter()
        };
        assert!(f.matches(&flow("192.168.1.1", 53, "10.244.1.5", 1)));
        assert_eq!(
            f.to_string(),
            "-f ipv4 -p udp --orig-port-dst 53 --reply-src 10.244.1.5"
        );
    }
}
