//! Where an ENI's addresses come from. There is no cloud API on this side of weir: the addresses
//! are a list in the configuration or a file a node agent writes, behind [`AddressSource`] so a
//! cloud IPAM (EC2 `AssignPrivateIpAddresses`, an Alibaba/ECS equivalent) can be plugged in later.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::config::{check_address_list, AddressConf};

/// The addresses the cloud has assigned to one ENI.
///
/// Contract:
/// - `addresses()` returns every address assigned to the ENI, in a stable order, each once; the
///   ENI's own address (its primary private IP, which weir puts on the interface and never gives
///   to a pod) is among them.
/// - An address may be handed to a pod only while it is listed. A source that removes an address
///   must first make sure no pod holds it (weir keeps existing allocations of unlisted addresses
///   and never hands them out again).
/// - Errors are for the runtime to see (ADD fails with "I/O error", nothing is allocated): never
///   return a partial list.
pub trait AddressSource {
    fn addresses(&self) -> Result<Vec<Ipv4Addr>, String>;
}

/// `eniAddresses` in the configuration.
pub struct StaticList(pub Vec<Ipv4Addr>);

impl AddressSource for StaticList {
    fn addresses(&self) -> Result<Vec<Ipv4Addr>, String> {
        Ok(self.0.clone())
    }
}

/// `eniAddressFile`: one IPv4 address per line; blank lines and `#` comments are ignored. The
/// writer should replace the file atomically (write a temporary file, rename it over).
pub struct AddressFile(pub PathBuf);

impl AddressSource for AddressFile {
    fn addresses(&self) -> Result<Vec<Ipv4Addr>, String> {
        let text = std::fs::read_to_string(&self.0)
            .map_err(|e| format!("eniAddressFile {}: {e}", self.0.display()))?;
        let list = parse_address_lines(&text)
            .map_err(|m| format!("eniAddressFile {}: {m}", self.0.display()))?;
        check_address_list(&list)
            .map_err(|m| format!("eniAddressFile {}: {m}", self.0.display()))?;
        Ok(list)
    }
}

/// Parses the file format of [`AddressFile`]; the error names the line.
pub fn parse_address_lines(text: &str) -> Result<Vec<Ipv4Addr>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        out.push(
            line.parse()
                .map_err(|_| format!("line {}: {line:?} is not an IPv4 address", n + 1))?,
        );
    }
    Ok(out)
}

pub fn source_for(conf: &AddressConf) -> Box<dyn AddressSource> {
    match conf {
        AddressConf::List(list) => Box::new(StaticList(list.clone())),
        AddressConf::File(path) => Box::new(AddressFile(path.clone())),
    }
}

/// The ENI's own address and the addresses pods may get, from one read of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPlan {
    pub eni_address: Ipv4Addr,
    pub pod_pool: Vec<Ipv4Addr>,
}

/// Splits `listed` into the ENI's address (`configured`, or the first listed) and the pod pool.
pub fn plan_addresses(
    listed: &[Ipv4Addr],
    configured: Option<Ipv4Addr>,
) -> Result<AddressPlan, String> {
    let eni_address = match configured {
        Some(ip) if !listed.contains(&ip) => {
            return Err(format!("eniAddress {ip} is not one of the ENI's addresses"))
        }
        Some(ip) => ip,
        None => *listed.first().ok_or("the ENI has no addresses")?,
    };
    Ok(AddressPlan {
        eni_address,
        pod_pool: listed
            .iter()
            .copied()
            .filter(|ip| *ip != eni_address)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_format_allows_comments_and_names_bad_lines() {
        let list =
            parse_address_lines("# eth1, written by weir\n10.0.0.5\n\n 10.0.0.6 # pod\n").unwrap();
        assert_eq!(
            list,
            vec![Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(10, 0, 0, 6)]
        );
        let e = parse_address_lines("10.0.0.5\n10.0.0.x\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn eni_address_is_never_in_the_pod_pool() {
        let listed = [
            Ipv4Addr::new(10, 0, 0, 5),
            Ipv4Addr::new(10, 0, 0, 6),
            Ipv4Addr::new(10, 0, 0, 7),
        ];
        let p = plan_addresses(&listed, None).unwrap();
        assert_eq!(p.eni_address, listed[0]);
        assert_eq!(p.pod_pool, listed[1..]);
        let p = plan_addresses(&listed, Some(listed[1])).unwrap();
        assert_eq!(p.pod_pool, vec![listed[0], listed[2]]);
        assert!(plan_addresses(&listed, Some(Ipv4Addr::new(1, 1, 1, 1))).is_err());
    }

    #[test]
    fn missing_file_is_an_error_not_an_empty_list() {
        let src = AddressFile("/nonexistent/weir-eni-test".into());
        assert!(src
            .addresses()
            .unwrap_err()
            .contains("/nonexistent/weir-eni-test"));
    }
}
