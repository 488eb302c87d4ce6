//! Static host entries (CoreDNS's `hosts` plugin with `fallthrough`): A/AAAA for the names
//! given, PTR for their addresses' reverse names; every other name goes on to the forwarder.
//! Pure: built once at start, looked up per query.

use std::collections::HashMap;
use std::net::IpAddr;

use hickory_proto::rr::rdata::{A, AAAA, PTR};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// CoreDNS's `hosts` TTL when none is given.
pub const DEFAULT_TTL: u32 = 3600;

#[derive(Debug, Default, Clone)]
pub struct Hosts {
    /// Lowercased name → its addresses, in entry order.
    addrs: HashMap<Name, Vec<IpAddr>>,
    /// Lowercased reverse name → the names of that address.
    names: HashMap<Name, Vec<Name>>,
    ttl: u32,
}

impl Hosts {
    /// From `(address, names)` entries (names fully qualified); a name under several
    /// entries gets every address.
    pub fn new(entries: &[(IpAddr, Vec<Name>)], ttl: u32) -> Self {
        let mut hosts = Hosts {
            ttl,
            ..Hosts::default()
        };
        for (ip, names) in entries {
            for name in names {
                let list = hosts.addrs.entry(name.to_lowercase()).or_default();
                if !list.contains(ip) {
                    list.push(*ip);
                }
                let reverse = Name::from(*ip).to_lowercase();
                let list = hosts.names.entry(reverse).or_default();
                if !list.contains(name) {
                    list.push(name.clone());
                }
            }
        }
        hosts
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The records for `name`/`qtype` when `name` is a host entry or one of their reverse
    /// names (empty: the name exists without that type, NODATA); `None` for every other name.
    /// Records are owned by `name` as asked (the question's spelling).
    pub fn lookup(&self, name: &Name, qtype: RecordType) -> Option<Vec<Record>> {
        let key = name.to_lowercase();
        if let Some(addrs) = self.addrs.get(&key) {
            let records = addrs
                .iter()
                .filter_map(|ip| match (ip, qtype) {
                    (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => Some(RData::A(A(*v4))),
                    (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => {
                        Some(RData::AAAA(AAAA(*v6)))
                    }
                    _ => None,
                })
                .map(|rdata| Record::from_rdata(name.clone(), self.ttl, rdata))
                .collect();
            return Some(records);
        }
        let targets = self.names.get(&key)?;
        let wanted = matches!(qtype, RecordType::PTR | RecordType::ANY);
        Some(
            targets
                .iter()
                .filter(|_| wanted)
                .map(|t| Record::from_rdata(name.clone(), self.ttl, RData::PTR(PTR(t.clone()))))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn data(records: &[Record]) -> Vec<String> {
        records.iter().map(|r| r.data.to_string()).collect()
    }

    #[test]
    fn names_addresses_and_reverse_names() {
        let hosts = Hosts::new(
            &[
                (
                    "10.1.2.3".parse().unwrap(),
                    vec![n("db.corp."), n("pg.corp.")],
                ),
                ("fd00::3".parse().unwrap(), vec![n("db.corp.")]),
            ],
            60,
        );
        let a = hosts.lookup(&n("DB.Corp."), RecordType::A).unwrap();
        assert_eq!(data(&a), ["10.1.2.3"]);
        assert_eq!(a[0].name.to_string(), "DB.Corp.", "the question's spelling");
        assert_eq!(a[0].ttl, 60);
        let aaaa = hosts.lookup(&n("db.corp."), RecordType::AAAA).unwrap();
        assert_eq!(data(&aaaa), ["fd00::3"]);
        assert_eq!(hosts.lookup(&n("pg.corp."), RecordType::AAAA), Some(vec![]));
        assert_eq!(hosts.lookup(&n("pg.corp."), RecordType::MX), Some(vec![]));
        let ptr = hosts
            .lookup(&n("3.2.1.10.in-addr.arpa."), RecordType::PTR)
            .unwrap();
        assert_eq!(data(&ptr), ["db.corp.", "pg.corp."]);
        assert_eq!(hosts.lookup(&n("other.corp."), RecordType::A), None);
        assert_eq!(
            hosts.lookup(&n("4.2.1.10.in-addr.arpa."), RecordType::PTR),
            None
        );
    }
}
