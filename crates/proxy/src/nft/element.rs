//! Set and map elements as values: printed in `nft` syntax for scripts and encoded as the
//! bytes the kernel stores, for netlink batches. Both come from one value so that the two
//! paths cannot disagree.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use weir_model::Protocol;

/// One component of a (possibly concatenated) key or value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Val {
    Addr(IpAddr),
    /// An interval; only in interval sets, which always go through `nft`.
    Net(IpNet),
    Proto(Protocol),
    Port(u16),
    /// `numgen random mod N` result.
    Slot(u32),
}

/// What a map element maps to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Data {
    Goto(String),
    Drop,
    Values(Vec<Val>),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub key: Vec<Val>,
    pub data: Option<Data>,
}

impl Element {
    pub fn set(key: Vec<Val>) -> Self {
        Element { key, data: None }
    }
    pub fn map(key: Vec<Val>, data: Data) -> Self {
        Element {
            key,
            data: Some(data),
        }
    }
    /// Elements of interval sets cannot be written by the netlink fast path.
    pub fn is_interval(&self) -> bool {
        self.key.iter().any(|v| matches!(v, Val::Net(_)))
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Addr(a) => write!(f, "{a}"),
            Val::Net(n) => write!(f, "{n}"),
            Val::Proto(p) => f.write_str(p.as_str()),
            Val::Port(p) => write!(f, "{p}"),
            Val::Slot(s) => write!(f, "{s}"),
        }
    }
}

fn join(f: &mut fmt::Formatter<'_>, vals: &[Val]) -> fmt::Result {
    for (i, v) in vals.iter().enumerate() {
        if i > 0 {
            f.write_str(" . ")?;
        }
        write!(f, "{v}")?;
    }
    Ok(())
}

/// The key alone, as `delete element` wants it.
pub struct KeyText<'a>(pub &'a Element);

impl fmt::Display for KeyText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        join(f, &self.0.key)
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        join(f, &self.key)?;
        match &self.data {
            None => Ok(()),
            Some(Data::Goto(c)) => write!(f, " : goto {c}"),
            Some(Data::Drop) => f.write_str(" : drop"),
            Some(Data::Values(v)) => {
                f.write_str(" : ")?;
                join(f, v)
            }
        }
    }
}

/// Kernel encoding of a concatenation: each component is padded to a 32-bit register
/// boundary, addresses and ports in network order, `numgen` results in host order (the
/// expression writes a native u32 into the register).
pub fn encode(vals: &[Val]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * 8);
    encode_into(&mut out, vals);
    out
}

/// [`encode`], appended to `out`.
pub fn encode_into(out: &mut Vec<u8>, vals: &[Val]) {
    for v in vals {
        match v {
            Val::Addr(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            Val::Addr(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            Val::Net(n) => match n.network() {
                IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
                IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
            },
            Val::Proto(p) => out.extend_from_slice(&[proto_number(*p), 0, 0, 0]),
            Val::Port(p) => {
                out.extend_from_slice(&p.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            Val::Slot(s) => out.extend_from_slice(&s.to_ne_bytes()),
        }
    }
}

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_bytes() {
        let e = Element::map(
            vec![
                Val::Addr("10.96.0.1".parse().unwrap()),
                Val::Proto(Protocol::Udp),
                Val::Port(53),
                Val::Slot(2),
            ],
            Data::Values(vec![
                Val::Addr("10.244.1.2".parse().unwrap()),
                Val::Port(5353),
            ]),
        );
        assert_eq!(
            e.to_string(),
            "10.96.0.1 . udp . 53 . 2 : 10.244.1.2 . 5353"
        );
        assert_eq!(KeyText(&e).to_string(), "10.96.0.1 . udp . 53 . 2");
        let mut want = vec![10, 96, 0, 1, 17, 0, 0, 0, 0, 53, 0, 0];
        want.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(encode(&e.key), want);
        assert!(!e.is_interval());
        let goto = Element::map(
            vec![Val::Proto(Protocol::Tcp), Val::Port(30080)],
            Data::Goto("x".into()),
        );
        assert_eq!(goto.to_string(), "tcp . 30080 : goto x");
    }
}
