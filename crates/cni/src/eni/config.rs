//! The network configuration of `mode: "eni-shared"`, parsed from the raw JSON when the mode says so
//! (bridge mode's [`crate::config::NetConf`] never sees these keys).
//!
//! Same decoding steps and error codes as bridge mode: JSON syntax (6), cniVersion (1), unknown
//! keys (2, naming key and value), field values (7, naming the field).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use crate::config::{decode_in_steps, Attachment};
use crate::spec::{CniError, CniResult, ErrorCode};

/// How the node's secondary ENI is found: NICs are not always eth0/eth1, a MAC is stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EniSelector {
    Name(String),
    Mac([u8; 6]),
}

/// Where the ENI's cloud-assigned addresses come from (see [`super::addresses`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressConf {
    List(Vec<Ipv4Addr>),
    /// One address per line, written by a node agent.
    File(PathBuf),
}

/// Policy-rule priorities. `to_pod < fwmark < from_pod`, all before the main table's 32766:
/// traffic to a pod always uses main (its host route), connections that entered the node by a
/// non-ENI interface answer through main, and everything else a pod sends uses the ENI's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RulePriorities {
    #[serde(default = "default_to_pod")]
    pub to_pod: u32,
    #[serde(default = "default_fwmark")]
    pub fwmark: u32,
    #[serde(default = "default_from_pod")]
    pub from_pod: u32,
}

// AWS VPC CNI's values, so `ip rule` reads the same on nodes migrated from it.
fn default_to_pod() -> u32 {
    512
}
fn default_fwmark() -> u32 {
    1024
}
fn default_from_pod() -> u32 {
    1536
}

impl Default for RulePriorities {
    fn default() -> Self {
        RulePriorities {
            to_pod: default_to_pod(),
            fwmark: default_fwmark(),
            from_pod: default_from_pod(),
        }
    }
}

/// The connection mark weir sets on connections that enter the node by a non-pod, non-ENI
/// interface. Default 0x80 (AWS VPC CNI's bit): clear of kube-proxy's 0x4000 (masquerade) and
/// 0x8000 (drop) and of Calico's 0xffff0000.
pub const DEFAULT_MARK: u32 = 0x80;
/// Bits no eni-shared mark may use: kube-proxy's (and weir proxy's) masquerade and drop marks.
pub const KUBE_PROXY_BITS: u32 = 0x4000 | 0x8000;

pub const DEFAULT_VETH_PREFIX: &str = "eni";

#[derive(Debug, Clone, PartialEq)]
pub struct EniConf {
    pub cni_version: String,
    pub name: String,
    pub eni: EniSelector,
    pub gateway: Ipv4Addr,
    pub route_table: u32,
    pub addresses: AddressConf,
    /// The ENI's own address (never a pod's); default: the first address of the source.
    pub eni_address: Option<Ipv4Addr>,
    pub veth_prefix: String,
    pub priorities: RulePriorities,
    pub mark: u32,
    pub mark_mask: u32,
    pub mtu: Option<u32>,
    pub data_dir: PathBuf,
    pub dns: Value,
    pub prev_result: Option<Value>,
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// The wire form, before validation.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    cni_version: String,
    name: String,
    #[serde(rename = "type")]
    _kind: String,
    #[serde(rename = "mode")]
    _mode: String,
    #[serde(default)]
    eni_name: Option<String>,
    #[serde(default, rename = "eniMAC")]
    eni_mac: Option<String>,
    eni_gateway: Ipv4Addr,
    route_table: u32,
    #[serde(default)]
    eni_addresses: Option<Vec<Ipv4Addr>>,
    #[serde(default)]
    eni_address_file: Option<PathBuf>,
    #[serde(default)]
    eni_address: Option<Ipv4Addr>,
    #[serde(default)]
    veth_prefix: Option<String>,
    #[serde(default)]
    rule_priorities: RulePriorities,
    #[serde(default)]
    mark: Option<Number>,
    #[serde(default)]
    mark_mask: Option<Number>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    dns: Value,
    #[serde(default)]
    prev_result: Option<Value>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

/// A mark as a JSON number or a string (`"0x80"`, `"128"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Int(u32),
    Text(String),
}

impl Number {
    fn value(&self, field: &str) -> CniResult<u32> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(s) => {
                let t = s.trim();
                let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(hex) => u32::from_str_radix(hex, 16),
                    None => t.parse(),
                };
                parsed.map_err(|_| invalid(format!("{field} {s:?}: not a 32-bit number")))
            }
        }
    }
}

const KNOWN_KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "mode",
    "eniName",
    "eniMAC",
    "eniGateway",
    "routeTable",
    "eniAddresses",
    "eniAddressFile",
    "eniAddress",
    "vethPrefix",
    "rulePriorities",
    "mark",
    "markMask",
    "mtu",
    "dataDir",
    "dns",
    "prevResult",
    "runtimeConfig",
    "args",
    "capabilities",
    "cni.dev/valid-attachments",
];

/// The store of an eni-shared network lives where host-local's would: `<dataDir>/<name>/`.
pub const DEFAULT_DATA_DIR: &str = crate::ipam::DEFAULT_DATA_DIR;

fn invalid(m: String) -> CniError {
    CniError::new(ErrorCode::InvalidConfig, m)
}

/// Whether a configuration asks for eni-shared mode (the plugin's dispatch hook).
pub fn is_eni_shared(stdin: &[u8]) -> bool {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("mode")
                .and_then(Value::as_str)
                .map(|m| m == "eni-shared")
        })
        .unwrap_or(false)
}

/// `aa:bb:cc:dd:ee:ff` (either case, `-` accepted too).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

impl EniConf {
    pub fn parse(stdin: &[u8]) -> CniResult<Self> {
        let raw: Raw = decode_in_steps(stdin, KNOWN_KEYS, "eni-shared network configuration")?;
        Self::from_raw(raw)
    }

    /// Each value checked in the order of the fields, the first wrong one named.
    fn from_raw(raw: Raw) -> CniResult<Self> {
        check_name(&raw.name)?;
        let eni = eni_selector(raw.eni_name, raw.eni_mac)?;
        // 0 is unspec, 253-255 are default/main/local.
        if raw.route_table == 0 || (253..=255).contains(&raw.route_table) {
            return Err(invalid(format!(
                "routeTable {}: must be a table of its own (not 0, 253 default, 254 main or 255 local)",
                raw.route_table
            )));
        }
        let addresses = address_conf(raw.eni_addresses, raw.eni_address_file)?;
        if let (Some(own), AddressConf::List(list)) = (raw.eni_address, &addresses) {
            if !list.contains(&own) {
                return Err(invalid(format!(
                    "eniAddress {own}: not one of eniAddresses"
                )));
            }
        }
        let veth_prefix = veth_prefix(raw.veth_prefix, &eni)?;
        let p = raw.rule_priorities;
        if !(p.to_pod > 0 && p.to_pod < p.fwmark && p.fwmark < p.from_pod && p.from_pod < 32766) {
            return Err(invalid(format!(
                "rulePriorities {{toPod {}, fwmark {}, fromPod {}}}: need 0 < toPod < fwmark < fromPod < 32766 (the main table's rule)",
                p.to_pod, p.fwmark, p.from_pod
            )));
        }
        let (mark, mark_mask) = marks(raw.mark.as_ref(), raw.mark_mask.as_ref())?;
        if let Some(mtu) = raw.mtu {
            if !(68..=65535).contains(&mtu) {
                return Err(invalid(format!("mtu {mtu}: must be between 68 and 65535")));
            }
        }
        Ok(EniConf {
            cni_version: raw.cni_version,
            name: raw.name,
            eni,
            gateway: raw.eni_gateway,
            route_table: raw.route_table,
            addresses,
            eni_address: raw.eni_address,
            veth_prefix,
            priorities: p,
            mark,
            mark_mask,
            mtu: raw.mtu,
            data_dir: raw
                .data_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            dns: raw.dns,
            prev_result: raw.prev_result,
            valid_attachments: raw.valid_attachments,
        })
    }
}

fn check_name(name: &str) -> CniResult<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "name {name:?}: must be letters, digits, '-', '_' or '.'"
        )))
    }
}

/// `eniName` or `eniMAC`, exactly one.
fn eni_selector(name: Option<String>, mac: Option<String>) -> CniResult<EniSelector> {
    match (name, mac) {
        (Some(_), Some(_)) => Err(invalid("give eniName or eniMAC, not both".into())),
        (None, None) => Err(invalid(
            "eni-shared needs the ENI: eniName (e.g. \"eth1\") or eniMAC".into(),
        )),
        (Some(name), None) => {
            crate::spec::validate_ifname(&name)
                .map_err(|m| invalid(format!("eniName: {}", m.replace("CNI_IFNAME", "eniName"))))?;
            Ok(EniSelector::Name(name))
        }
        (None, Some(mac)) => Ok(EniSelector::Mac(parse_mac(&mac).ok_or_else(|| {
            invalid(format!(
                "eniMAC {mac:?}: not a MAC address like 02:00:0a:0c:c0:01"
            ))
        })?)),
    }
}

/// `eniAddresses` or `eniAddressFile`, exactly one.
fn address_conf(list: Option<Vec<Ipv4Addr>>, file: Option<PathBuf>) -> CniResult<AddressConf> {
    match (list, file) {
        (Some(_), Some(_)) => Err(invalid(
            "give eniAddresses or eniAddressFile, not both".into(),
        )),
        (None, None) => Err(invalid(
            "eni-shared needs the ENI's addresses: eniAddresses [...] or eniAddressFile".into(),
        )),
        (Some(list), None) => {
            check_address_list(&list).map_err(|m| invalid(format!("eniAddresses: {m}")))?;
            Ok(AddressConf::List(list))
        }
        (None, Some(path)) if !path.is_absolute() => Err(invalid(format!(
            "eniAddressFile {}: must be an absolute path",
            path.display()
        ))),
        (None, Some(path)) => Ok(AddressConf::File(path)),
    }
}

/// The pod interfaces' name prefix: short, plain, and not the ENI's own.
fn veth_prefix(prefix: Option<String>, eni: &EniSelector) -> CniResult<String> {
    let prefix = prefix.unwrap_or_else(|| DEFAULT_VETH_PREFIX.to_string());
    if !(1..=8).contains(&prefix.len())
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(invalid(format!(
            "vethPrefix {prefix:?}: must be 1 to 8 characters from [a-z0-9] (the rest of the 15-byte name is a hash)"
        )));
    }
    if let EniSelector::Name(n) = eni {
        if n.starts_with(&prefix) {
            return Err(invalid(format!(
                "vethPrefix {prefix:?}: the ENI {n} starts with it, so it would be taken for a pod interface"
            )));
        }
    }
    Ok(prefix)
}

/// `mark` and `markMask` (the mark by default): non-zero, inside the mask, clear of
/// kube-proxy's bits.
fn marks(mark: Option<&Number>, mask: Option<&Number>) -> CniResult<(u32, u32)> {
    let mark = match mark {
        Some(n) => n.value("mark")?,
        None => DEFAULT_MARK,
    };
    let mask = match mask {
        Some(n) => n.value("markMask")?,
        None => mark,
    };
    if mark == 0 || mark & !mask != 0 {
        return Err(invalid(format!(
            "mark {mark:#x}/{mask:#x}: the mark must be non-zero and inside markMask"
        )));
    }
    if mask & KUBE_PROXY_BITS != 0 {
        return Err(invalid(format!(
            "markMask {mask:#x}: overlaps kube-proxy's masquerade/drop bits 0x4000/0x8000, which would clear or misread weir's mark"
        )));
    }
    Ok((mark, mask))
}

/// A usable list: at least two addresses (the ENI's own and one for a pod), no duplicates, none
/// of them unspecified, loopback, multicast or broadcast.
pub fn check_address_list(list: &[Ipv4Addr]) -> Result<(), String> {
    if list.len() < 2 {
        return Err(format!(
            "{} address(es): need the ENI's own address and at least one for pods",
            list.len()
        ));
    }
    for (i, ip) in list.iter().enumerate() {
        if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast() {
            return Err(format!("{ip} cannot be a pod or ENI address"));
        }
        if list[..i].contains(ip) {
            return Err(format!("{ip} is listed twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> String {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"eni1","type":"weir-cni","mode":"eni-shared",
                "eniName":"eth1","eniGateway":"10.12.192.1","routeTable":1003,
                "eniAddresses":["10.12.192.10","10.12.192.44","10.12.192.45"]{extra}}}"#
        )
    }

    fn code(s: &str) -> ErrorCode {
        EniConf::parse(s.as_bytes()).unwrap_err().code
    }

    #[test]
    fn gc_as_libcni_sends_it_is_accepted() {
        // libcni >= 1.2.3 sends the live attachments under both names.
        let s = conf(
            r#","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}],
                "cni.dev/attachments":[{"containerID":"c1","ifname":"eth0"}]"#,
        );
        let c = EniConf::parse(s.as_bytes()).expect("GC's configuration parses");
        assert_eq!(c.valid_attachments.map(|v| v.len()), Some(1));
    }

    #[test]
    fn minimal_config_gets_the_documented_defaults() {
        let c = EniConf::parse(conf("").as_bytes()).unwrap();
        assert_eq!(c.eni, EniSelector::Name("eth1".into()));
        assert_eq!(c.veth_prefix, "eni");
        assert_eq!(
            c.priorities,
            RulePriorities {
                to_pod: 512,
                fwmark: 1024,
                from_pod: 1536
            }
        );
        assert_eq!((c.mark, c.mark_mask), (0x80, 0x80));
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks"));
        assert!(is_eni_shared(conf("").as_bytes()));
    }

    #[test]
    fn mac_marks_priorities_and_file_are_read() {
        let s = conf(r#","mark":"0x100","markMask":"0x300","rulePriorities":{"toPod":100,"fwmark":200,"fromPod":300}"#)
            .replace(r#""eniName":"eth1""#, r#""eniMAC":"02:AB:00:00:00:01""#)
            .replace(
                r#""eniAddresses":["10.12.192.10","10.12.192.44","10.12.192.45"]"#,
                r#""eniAddressFile":"/run/weir/eni1.addresses""#,
            );
        let c = EniConf::parse(s.as_bytes()).unwrap();
        assert_eq!(c.eni, EniSelector::Mac([2, 0xab, 0, 0, 0, 1]));
        assert_eq!((c.mark, c.mark_mask), (0x100, 0x300));
        assert_eq!(c.priorities.from_pod, 300);
        assert_eq!(
            c.addresses,
            AddressConf::File("/run/weir/eni1.addresses".into())
        );
    }

    #[test]
    fn each_bad_value_is_named_with_its_code() {
        assert_eq!(code("{"), ErrorCode::Decode);
        assert_eq!(code(&conf(r#","frob":1"#)), ErrorCode::UnsupportedField);
        // keys reserved for runtimes (libcni >= 1.2.3's GC sends cni.dev/attachments) are accepted
        EniConf::parse(
            conf(r#","cni.dev/valid-attachments":[],"cni.dev/attachments":[]"#).as_bytes(),
        )
        .unwrap();
        // bridge-mode keys are not silently accepted either
        assert_eq!(
            code(&conf(r#","bridge":"cni0""#)),
            ErrorCode::UnsupportedField
        );
        for (extra, needle) in [
            (r#","eniMAC":"02:00:00:00:00:01""#, "not both"),
            (r#","routeTable":254"#, "routeTable 254"),
            (r#","eniAddress":"10.1.1.1""#, "eniAddress 10.1.1.1"),
            (r#","vethPrefix":"eth""#, "vethPrefix \"eth\""),
            (r#","vethPrefix":"toolongprefix""#, "vethPrefix"),
            (r#","mark":"0x4000""#, "markMask 0x4000"),
            (r#","mark":0"#, "non-zero"),
            (r#","mark":"0x180","markMask":"0x80""#, "inside markMask"),
            (r#","mark":"zz""#, "mark \"zz\""),
            (r#","rulePriorities":{"toPod":2000}"#, "toPod < fwmark"),
            (r#","mtu":10"#, "mtu 10"),
        ] {
            // later duplicate keys override earlier ones in serde_json: put overrides last
            let e = EniConf::parse(conf(extra).as_bytes()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{extra}: {}", e.msg);
            assert!(e.msg.contains(needle), "{extra}: {}", e.msg);
        }
        let dup = conf("").replace("10.12.192.45", "10.12.192.44");
        assert!(EniConf::parse(dup.as_bytes())
            .unwrap_err()
            .msg
            .contains("listed twice"));
        let none = conf("").replace(r#""eniName":"eth1","#, "");
        assert!(EniConf::parse(none.as_bytes())
            .unwrap_err()
            .msg
            .contains("eniName"));
        let rel = conf("").replace(
            r#""eniAddresses":["10.12.192.10","10.12.192.44","10.12.192.45"]"#,
            r#""eniAddressFile":"eni.txt""#,
        );
        assert!(EniConf::parse(rel.as_bytes())
            .unwrap_err()
            .msg
            .contains("absolute"));
    }
}
