//! The network configuration weir-cni reads from stdin.
//!
//! Decoding happens in three steps so that each failure gets the code the spec asks for:
//! JSON syntax (6), cniVersion (1), unknown keys (2, naming key and value), then field values (7).
//!
//! The reference `bridge` plugin's keys are all known: those weir implements work, the others are
//! refused with code 2 and a message saying weir does not implement them ([`unimplemented_keys`]).
//! What the runtime asks for one attachment (addresses, a MAC) is gathered into [`Requested`].

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::ipam::IpamConf;
use crate::requests::requested_in_json;
pub use crate::requests::Requested;
use crate::resolv::parse_resolv_conf;
use crate::spec::{abbreviate, check_version, CniError, CniResult, ErrorCode};

/// Where `weir routes` writes its overlay's pod MTU (weir_routes::MTU_FILE; not a dependency:
/// the plugin stays small and starts fast).
pub const OVERLAY_MTU_FILE: &str = "/run/weir/routes/mtu";

/// An MTU file's content: one decimal number, 68 to 65535.
pub fn parse_mtu(text: &str) -> Option<u32> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|m| (68..=65535).contains(m))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Bridge,
    EniShared,
}

/// One attachment named in GC's `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "default_bridge")]
    pub bridge: String,
    /// None: the overlay's ([`NetConf::resolve_mtu`], on ADD), else 1500. The reference's `0`
    /// ("the kernel's default") reads as None too.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Where `weir routes` writes the pod MTU of its overlay (default [`OVERLAY_MTU_FILE`]),
    /// read on ADD when `mtu` is not set.
    #[serde(default)]
    pub mtu_file: Option<std::path::PathBuf>,
    /// Give the bridge the gateway address of each range set.
    #[serde(default = "yes")]
    pub is_gateway: bool,
    /// Add a default route via the gateway in the pod (in addition to `ipam.routes`).
    #[serde(default)]
    pub is_default_gateway: bool,
    #[serde(default)]
    pub ip_masq: bool,
    /// `ipMasqBackend`: weir always programs nftables; "iptables" is accepted with a warning.
    #[serde(default)]
    pub ip_masq_backend: Option<String>,
    /// Hairpin on the pod's bridge port: `hairpinMode`, default on unless `promiscMode` is set
    /// (the reference refuses both at once).
    #[serde(skip)]
    pub hairpin_mode: bool,
    #[serde(default, rename = "hairpinMode")]
    hairpin_mode_conf: Option<bool>,
    /// Put the bridge in promiscuous mode (the reference's alternative to hairpin).
    #[serde(default)]
    pub promisc_mode: bool,
    /// Replace a different address the bridge holds in a gateway's subnet instead of adding beside it.
    #[serde(default)]
    pub force_address: bool,
    /// Isolate the pods' bridge ports from each other (IFLA_BRPORT_ISOLATED): pods reach the
    /// gateway and beyond, not each other over the bridge.
    #[serde(default)]
    pub port_isolation: bool,
    /// Keep IPv6 duplicate address detection on in the pod (weir turns it off by default so the
    /// address is usable at once).
    #[serde(default, rename = "enabledad")]
    pub enable_dad: bool,
    /// libcni's: the runtime should not run CHECK / GC for this network. weir answers them with
    /// success without looking, for runtimes that call anyway.
    #[serde(default)]
    pub disable_check: bool,
    #[serde(default, rename = "disableGC")]
    pub disable_gc: bool,
    /// Reference keys weir does not implement; accepted only at their "off" value (see
    /// [`unimplemented_keys`]).
    #[serde(default)]
    vlan: Option<Value>,
    #[serde(default)]
    vlan_trunk: Option<Value>,
    #[serde(default, rename = "macspoofchk")]
    mac_spoof_chk: Option<Value>,
    #[serde(default)]
    disable_container_interface: Option<Value>,
    /// Destinations that pod traffic reaches without masquerade. Defaults to the pod subnets.
    #[serde(default, rename = "clusterCIDR", deserialize_with = "one_or_many")]
    pub cluster_cidr: Vec<IpNet>,
    pub ipam: IpamConf,
    #[serde(default)]
    pub dns: Value,
    #[serde(default)]
    pub prev_result: Option<Value>,
    #[serde(default)]
    pub runtime_config: Value,
    #[serde(default)]
    pub args: Value,
    #[serde(default)]
    pub capabilities: Value,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// What the runtime asked for this attachment (filled for ADD by [`NetConf::read_requests`]).
    #[serde(skip)]
    pub requested: Requested,
}

fn default_bridge() -> String {
    "cni0".into()
}

fn yes() -> bool {
    true
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<IpNet>),
    }
    match OneOrMany::deserialize(d)? {
        OneOrMany::Many(v) => Ok(v),
        OneOrMany::One(s) => s
            .split(',')
            .map(|p| p.trim().parse::<IpNet>().map_err(serde::de::Error::custom))
            .collect(),
    }
}

/// Top-level keys we understand. Anything else is "unsupported field" (code 2).
const KNOWN_KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "mode",
    "bridge",
    "mtu",
    "mtuFile",
    "isGateway",
    "isDefaultGateway",
    "ipMasq",
    "ipMasqBackend",
    "hairpinMode",
    "promiscMode",
    "forceAddress",
    "portIsolation",
    "enabledad",
    "disableCheck",
    "disableGC",
    "vlan",
    "vlanTrunk",
    "preserveDefaultVlan", // only matters with VLANs, which weir refuses: accepted and ignored
    "macspoofchk",
    "disableContainerInterface",
    "clusterCIDR",
    "ipam",
    "dns",
    "prevResult",
    "runtimeConfig",
    "args",
    "capabilities",
    "cni.dev/valid-attachments",
];

/// Keys under this prefix are reserved by the spec for runtimes.
const RESERVED_PREFIX: &str = "cni.dev/";

/// The version an input declares, for answering even when the rest is bad.
pub fn declared_version(stdin: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_string)
}

/// Decodes a network configuration in the order the spec's error codes ask for: JSON syntax (6),
/// cniVersion (1), keys outside `known` and the reserved `cni.dev/*` prefix (2, named with their
/// value), then field values (7). `what` names the configuration in messages. Both modes use it.
pub(crate) fn decode_in_steps<T: serde::de::DeserializeOwned>(
    stdin: &[u8],
    known: &[&str],
    what: &str,
) -> CniResult<T> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(ErrorCode::Decode, format!("{what} is not valid JSON")).with_details(e)
    })?;
    let object = value
        .as_object()
        .ok_or_else(|| CniError::new(ErrorCode::Decode, format!("{what} must be a JSON object")))?;
    let version = object
        .get("cniVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            CniError::new(
                ErrorCode::InvalidConfig,
                format!("{what} has no cniVersion string"),
            )
        })?;
    check_version(version)?;
    for (key, val) in object {
        // The spec reserves `cni.dev/*` for runtimes (libcni >= 1.2.3 sends cni.dev/attachments
        // beside cni.dev/valid-attachments in GC): accept them all.
        if !known.contains(&key.as_str()) && !key.starts_with(RESERVED_PREFIX) {
            return Err(CniError::new(
                ErrorCode::UnsupportedField,
                format!(
                    "unsupported field in {what}: {:?} = {}",
                    abbreviate(key, 200),
                    abbreviate(&val.to_string(), 200)
                ),
            ));
        }
    }
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let inner = e.inner().to_string();
        let code = if inner.contains("unknown field") {
            ErrorCode::UnsupportedField
        } else {
            ErrorCode::InvalidConfig
        };
        // The field's path (`ipam.ranges[0][0].subnet`) and the value found there.
        let msg = match (e.path().to_string(), value_at(&value, e.path())) {
            (path, _) if path == "." => format!("invalid {what}: {inner}"),
            (path, Some(v)) => format!(
                "invalid {what}: {path} = {}: {inner}",
                abbreviate(&v.to_string(), 200)
            ),
            (path, None) => format!("invalid {what}: {path}: {inner}"),
        };
        CniError::new(code, msg)
    })
}

/// The JSON value at a decoding error's path, when every step of the path is known.
fn value_at<'a>(mut value: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    use serde_path_to_error::Segment;
    for segment in path.iter() {
        value = match segment {
            Segment::Seq { index } => value.get(*index)?,
            Segment::Map { key } => value.get(key.as_str())?,
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    Some(value)
}

impl NetConf {
    pub fn parse(stdin: &[u8]) -> CniResult<Self> {
        let mut conf: NetConf = decode_in_steps(stdin, KNOWN_KEYS, "network configuration")?;
        if conf.mtu == Some(0) {
            conf.mtu = None;
        }
        conf.hairpin_mode = conf.hairpin_mode_conf.unwrap_or(!conf.promisc_mode);
        conf.validate()?;
        if let Some(backend) = conf.ip_masq_backend.as_deref().filter(|_| conf.ip_masq) {
            if backend == "iptables" {
                eprintln!(
                    "weir-cni: warning: ipMasqBackend \"iptables\": weir-cni always masquerades with nftables (table inet weir-cni)"
                );
            }
        }
        Ok(conf)
    }

    /// The pod MTU when the configuration sets no `mtu` (ADD only, so that a DEL never depends
    /// on the file): the one `weir routes` wrote to `mtuFile` (default [`OVERLAY_MTU_FILE`]) —
    /// the VTEP's MTU, underlay − 50 (IPv4) or − 70 (IPv6) — as flannel's CNI reads
    /// `FLANNEL_MTU` from `/run/flannel/subnet.env`. No file at the default path: no overlay on
    /// this node (host-gw, or no weir routes), so 1500. A configured `mtuFile` that is missing
    /// is an error (the agent has not started yet: the runtime retries, and the pod never gets
    /// an MTU its packets cannot cross the overlay with); so is an unreadable value.
    pub fn resolve_mtu(&mut self) -> CniResult<()> {
        if self.mtu.is_some() {
            return Ok(());
        }
        let (path, configured) = match &self.mtu_file {
            Some(p) => (p.clone(), true),
            None => (std::path::PathBuf::from(OVERLAY_MTU_FILE), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !configured => return Ok(()),
            Err(e) => {
                // Missing: the spec's "try again later" (the agent is starting).
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    ErrorCode::TryAgainLater
                } else {
                    ErrorCode::Io
                };
                return Err(CniError::new(
                    code,
                    format!(
                        "mtuFile {}: {e} (weir routes writes it once its overlay is up; is it running?)",
                        path.display()
                    ),
                ));
            }
        };
        match parse_mtu(&text) {
            Some(mtu) => {
                self.mtu = Some(mtu);
                Ok(())
            }
            None => Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!(
                    "mtuFile {}: {:?} is not an MTU (68 to 65535)",
                    path.display(),
                    abbreviate(text.trim(), 64)
                ),
            )),
        }
    }

    /// Fills [`NetConf::requested`] for an ADD from the configuration (`runtimeConfig`, `args`) and
    /// `CNI_ARGS`. Only ADD reads them, so a malformed one never blocks a DEL.
    pub fn read_requests(&mut self, cni_args: &BTreeMap<String, String>) -> CniResult<()> {
        let mut requested = requested_in_json(&self.runtime_config, &self.args)?;
        requested.add_cni_args(cni_args)?;
        self.requested = requested;
        Ok(())
    }

    /// The result's `dns`: the configuration's own `dns`, else what `ipam.resolvConf` names (as
    /// host-local reads it: nameserver, domain, search, options), else none.
    pub fn result_dns(&self) -> CniResult<Value> {
        let set = match &self.dns {
            Value::Object(o) => o.values().any(|v| !v.is_null()),
            Value::Null => false,
            _ => true,
        };
        if set {
            return Ok(self.dns.clone());
        }
        let Some(path) = &self.ipam.resolv_conf else {
            return Ok(Value::Null);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            CniError::new(
                ErrorCode::Io,
                format!("ipam.resolvConf: cannot read {}: {e}", path.display()),
            )
        })?;
        Ok(parse_resolv_conf(&text))
    }

    fn validate(&self) -> CniResult<()> {
        let bad = |m: String| Err(CniError::new(ErrorCode::InvalidConfig, m));
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            || self.name.starts_with('.')
        {
            return bad(format!(
                "name {:?}: must be letters, digits, '-', '_' or '.'",
                self.name
            ));
        }
        if let Err(m) = crate::spec::validate_ifname(&self.bridge) {
            return bad(format!(
                "bridge: {}",
                m.replace("CNI_IFNAME", "bridge name")
            ));
        }
        if let Some((key, why)) = unimplemented_keys(self).into_iter().next() {
            return Err(CniError::new(
                ErrorCode::UnsupportedField,
                format!("{key}: {why}"),
            ));
        }
        if self.promisc_mode && self.hairpin_mode_conf == Some(true) {
            return bad("hairpinMode and promiscMode cannot both be on (as in the reference bridge plugin): choose one".into());
        }
        if let Some(backend) = &self.ip_masq_backend {
            if !matches!(backend.as_str(), "nftables" | "iptables") {
                return bad(format!(
                    "ipMasqBackend {backend:?}: must be \"nftables\" or \"iptables\" (weir-cni always uses nftables)"
                ));
            }
        }
        if let Some(mtu) = self.mtu {
            if !(68..=65535).contains(&mtu) {
                return bad(format!("mtu {mtu}: must be between 68 and 65535"));
            }
        }
        if !matches!(self.ipam.kind.as_str(), "weir-ipam" | "host-local") {
            return bad(format!(
                "ipam.type {:?}: weir-cni allocates addresses itself; use \"weir-ipam\" (or \"host-local\", same store layout)",
                self.ipam.kind
            ));
        }
        self.ipam
            .validate()
            .map_err(|m| CniError::new(ErrorCode::InvalidConfig, m))?;
        Ok(())
    }

    /// Destinations exempt from masquerade: `clusterCIDR`, or else the pod subnets.
    pub fn masquerade_exempt(&self) -> Vec<IpNet> {
        if !self.cluster_cidr.is_empty() {
            return self.cluster_cidr.clone();
        }
        self.ipam
            .range_sets()
            .iter()
            .flatten()
            .map(|r| r.subnet.trunc())
            .collect()
    }
}

/// Reference keys set to something weir does not implement, each with the reason. Their "off"
/// values (`vlan` 0, an empty `vlanTrunk`, `macspoofchk`/`disableContainerInterface` false, any
/// `preserveDefaultVlan`, which only matters with VLANs) are accepted.
pub fn unimplemented_keys(conf: &NetConf) -> Vec<(String, String)> {
    fn shown(v: &Value) -> String {
        let s = v.to_string();
        if s.len() > 64 {
            format!("{}... ({} bytes)", &s[..s.floor_char_boundary(64)], s.len())
        } else {
            s
        }
    }
    let mut out = Vec::new();
    let mut refuse = |key: &str, v: &Value, what: &str| {
        out.push((
            format!("{key} = {}", shown(v)),
            format!("{what} is not implemented by weir-cni"),
        ));
    };
    if let Some(v) = &conf.vlan {
        if !(v.is_null() || v.as_i64() == Some(0)) {
            refuse("vlan", v, "VLAN tagging of pod ports");
        }
    }
    if let Some(v) = &conf.vlan_trunk {
        if !(v.is_null() || v.as_array().is_some_and(Vec::is_empty)) {
            refuse("vlanTrunk", v, "VLAN trunk ports");
        }
    }
    if let Some(v) = &conf.mac_spoof_chk {
        if !(v.is_null() || v == &Value::Bool(false)) {
            refuse("macspoofchk", v, "MAC spoof checking");
        }
    }
    if let Some(v) = &conf.disable_container_interface {
        if !(v.is_null() || v == &Value::Bool(false)) {
            refuse(
                "disableContainerInterface",
                v,
                "leaving the pod interface down",
            );
        }
    }
    if let Some(ranges) = conf.runtime_config.get("ipRanges") {
        if ranges.as_array().is_some_and(|a| !a.is_empty()) {
            refuse(
                "runtimeConfig.ipRanges",
                ranges,
                "the ipRanges capability (ranges from the runtime)",
            );
        }
    }
    out
}

#[cfg(test)]
mod mtu_tests {
    use super::*;

    fn conf(extra: &str) -> NetConf {
        NetConf::parse(
            format!(
                r#"{{"cniVersion":"1.1.0","name":"n","type":"weir-cni"{extra},
                "ipam":{{"type":"weir-ipam","ranges":[[{{"subnet":"10.244.1.0/24"}}]]}}}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn parse_mtu_takes_one_number_in_range() {
        assert_eq!(parse_mtu("1450\n"), Some(1450));
        assert_eq!(parse_mtu(" 8950 "), Some(8950));
        assert_eq!(parse_mtu("67"), None);
        assert_eq!(parse_mtu("70000"), None);
        assert_eq!(parse_mtu("FLANNEL_MTU=1450"), None);
        assert_eq!(parse_mtu(""), None);
    }

    #[test]
    fn the_overlay_file_gives_the_mtu_unless_the_conf_sets_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mtu");
        std::fs::write(&file, "1450\n").unwrap();
        let with_file = format!(r#","mtuFile":"{}""#, file.display());
        let mut c = conf(&with_file);
        c.resolve_mtu().unwrap();
        assert_eq!(c.mtu, Some(1450));
        // An explicit mtu wins; the file is not even read.
        let mut c = conf(&format!(r#","mtu":9000{with_file}"#));
        std::fs::write(&file, "garbage").unwrap();
        c.resolve_mtu().unwrap();
        assert_eq!(c.mtu, Some(9000));
        // A bad value is a clear error naming the file.
        let mut c = conf(&with_file);
        let e = c.resolve_mtu().unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(
            e.msg.contains("garbage") && e.msg.contains("mtuFile"),
            "{}",
            e.msg
        );
        // A configured file that does not exist (the agent is not up yet) fails the ADD.
        std::fs::remove_file(&file).unwrap();
        let mut c = conf(&with_file);
        let e = c.resolve_mtu().unwrap_err();
        assert!(e.msg.contains("is it running"), "{}", e.msg);
        assert_eq!(e.code, ErrorCode::TryAgainLater);
        assert_eq!(c.mtu, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> String {
        format!(
            r#"{{"cniVersion":"1.1.0","name":"net1","type":"weir-cni"{extra},
               "ipam":{{"type":"weir-ipam","ranges":[[{{"subnet":"10.244.1.0/24"}}]]}}}}"#
        )
    }

    #[test]
    fn gc_as_libcni_sends_it_is_accepted() {
        // libcni >= 1.2.3 sends the live attachments under both names.
        let s = conf(
            r#","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}],
                "cni.dev/attachments":[{"containerID":"c1","ifname":"eth0"}]"#,
        );
        let c = NetConf::parse(s.as_bytes()).expect("GC's configuration parses");
        assert_eq!(c.valid_attachments.map(|v| v.len()), Some(1));
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = NetConf::parse(conf("").as_bytes()).unwrap();
        assert_eq!(c.bridge, "cni0");
        assert_eq!(c.mode, Mode::Bridge);
        assert!(c.is_gateway && c.hairpin_mode && !c.ip_masq);
        assert_eq!(
            c.masquerade_exempt(),
            vec!["10.244.1.0/24".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn cluster_cidr_takes_a_string_or_a_list() {
        let c = NetConf::parse(conf(r#","clusterCIDR":"10.244.0.0/16, fd00::/48""#).as_bytes())
            .unwrap();
        assert_eq!(c.cluster_cidr.len(), 2);
        let c = NetConf::parse(conf(r#","clusterCIDR":["10.244.0.0/16"]"#).as_bytes()).unwrap();
        assert_eq!(
            c.masquerade_exempt(),
            vec!["10.244.0.0/16".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn each_failure_gets_its_code() {
        let code = |s: &str| NetConf::parse(s.as_bytes()).unwrap_err().code;
        assert_eq!(code("{not json"), ErrorCode::Decode);
        assert_eq!(code("[1,2]"), ErrorCode::Decode);
        assert_eq!(
            code(&conf("").replace("1.1.0", "0.1.0")),
            ErrorCode::IncompatibleVersion
        );
        let unknown = NetConf::parse(conf(r#","frobnicate":42"#).as_bytes()).unwrap_err();
        assert_eq!(unknown.code, ErrorCode::UnsupportedField);
        assert!(
            unknown.msg.contains("frobnicate") && unknown.msg.contains("42"),
            "{}",
            unknown.msg
        );
        assert_eq!(code(&conf(r#","mtu":"big""#)), ErrorCode::InvalidConfig);
        assert_eq!(code(&conf(r#","mtu":10"#)), ErrorCode::InvalidConfig);
        assert_eq!(
            code(&conf(r#","bridge":"../etc""#)),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(&conf("").replace("net1", "../x")),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(&conf("").replace("weir-ipam", "dhcp")),
            ErrorCode::InvalidConfig
        );
        assert_eq!(
            code(&conf("").replace("10.244.1.0/24", "10.244.1.0/33")),
            ErrorCode::InvalidConfig
        );
        // A bad value names its field by path, with the value, keeping the code.
        let e = NetConf::parse(conf("").replace("10.244.1.0/24", "10.0.0.0/33").as_bytes())
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert_eq!(
            e.msg,
            "invalid network configuration: ipam.ranges[0][0].subnet = \"10.0.0.0/33\": \
             invalid IP address syntax"
        );
        let e = NetConf::parse(conf(r#","mtu":"big""#).as_bytes()).unwrap_err();
        assert!(e.msg.contains("mtu = \"big\": invalid type"), "{}", e.msg);
        let e = NetConf::parse(
            conf("")
                .replace(
                    r#""type":"weir-ipam""#,
                    r#""type":"weir-ipam","rangeEnd":7"#,
                )
                .as_bytes(),
        )
        .unwrap_err();
        assert!(e.msg.contains(": ipam.rangeEnd = 7: "), "{}", e.msg);
        // An unknown key inside a section is still code 2, named with where it is.
        let e = NetConf::parse(
            conf("")
                .replace(r#""type":"weir-ipam""#, r#""type":"weir-ipam","rangez":[]"#)
                .as_bytes(),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedField);
        assert!(
            e.msg.contains("ipam") && e.msg.contains("rangez"),
            "{}",
            e.msg
        );
        // a huge unknown value is named, not echoed whole
        let huge =
            NetConf::parse(conf(&format!(r#","junk":"{}""#, "x".repeat(10_000_000))).as_bytes())
                .unwrap_err();
        assert_eq!(huge.code, ErrorCode::UnsupportedField);
        assert!(huge.msg.len() < 500 && huge.msg.contains("junk") && huge.msg.contains("bytes)"));
        // keys reserved by the spec for runtimes are accepted
        NetConf::parse(
            conf(r#","cni.dev/valid-attachments":[],"cni.dev/attachments":[],"cni.dev/x":1"#)
                .as_bytes(),
        )
        .unwrap();
        // unknown keys inside ipam are rejected too
        assert_ne!(
            NetConf::parse(
                conf("")
                    .replace(r#""type":"weir-ipam""#, r#""type":"weir-ipam","x":1"#)
                    .as_bytes()
            )
            .unwrap_err()
            .code,
            ErrorCode::Decode
        );
    }

    /// A working bridge + host-local conflist entry, as an operator has it today.
    const MIGRATED: &str = r#"{"cniVersion":"1.0.0","name":"mynet","type":"weir-cni",
        "bridge":"mynet0","isGateway":true,"isDefaultGateway":true,"forceAddress":true,
        "ipMasq":true,"ipMasqBackend":"nftables","mtu":0,"promiscMode":true,"vlan":0,
        "vlanTrunk":[],"preserveDefaultVlan":true,"macspoofchk":false,"enabledad":true,
        "disableContainerInterface":false,"portIsolation":true,"disableCheck":true,"disableGC":false,
        "ipam":{"type":"host-local","subnet":"10.10.0.0/16","rangeStart":"10.10.1.10",
                "rangeEnd":"10.10.1.20","gateway":"10.10.0.254","dataDir":"/run/x",
                "resolvConf":"/etc/resolv.conf","routes":[{"dst":"0.0.0.0/0"}]}}"#;

    #[test]
    fn a_reference_bridge_and_host_local_config_is_understood() {
        let c = NetConf::parse(MIGRATED.as_bytes()).unwrap();
        assert!(c.promisc_mode && c.force_address && c.port_isolation && c.enable_dad);
        assert!(!c.hairpin_mode, "promiscMode turns the hairpin default off");
        assert!(c.disable_check && !c.disable_gc);
        assert_eq!(c.mtu, None, "mtu 0 is the default");
        let sets = c.ipam.range_sets();
        assert_eq!(sets.len(), 1);
        let r = &sets[0][0];
        assert_eq!(r.effective_start().to_string(), "10.10.1.10");
        assert_eq!(r.effective_end().to_string(), "10.10.1.20");
        assert_eq!(r.effective_gateway().to_string(), "10.10.0.254");
        // without promiscMode, weir's hairpin default (on) stays
        let c = NetConf::parse(conf("").as_bytes()).unwrap();
        assert!(c.hairpin_mode && !c.promisc_mode);
    }

    #[test]
    fn unimplemented_reference_features_are_named_not_unknown() {
        for (extra, key) in [
            (r#","vlan":100"#, "vlan = 100"),
            (r#","vlanTrunk":[{"id":5}]"#, "vlanTrunk"),
            (r#","macspoofchk":true"#, "macspoofchk = true"),
            (
                r#","disableContainerInterface":true"#,
                "disableContainerInterface",
            ),
            (
                r#","runtimeConfig":{"ipRanges":[[{"subnet":"10.9.0.0/24"}]]}"#,
                "runtimeConfig.ipRanges",
            ),
        ] {
            let e = NetConf::parse(conf(extra).as_bytes()).unwrap_err();
            assert_eq!(e.code, ErrorCode::UnsupportedField, "{extra}");
            assert!(
                e.msg.starts_with(key) && e.msg.contains("not implemented by weir-cni"),
                "{extra}: {}",
                e.msg
            );
        }
        let huge = format!(
            r#","vlanTrunk":[{}{{"id":5}}]"#,
            r#"{"id":5},"#.repeat(20000)
        );
        let e = NetConf::parse(conf(&huge).as_bytes()).unwrap_err();
        assert!(
            e.msg.len() < 300,
            "the value is shortened: {} bytes",
            e.msg.len()
        );
        // a truly foreign key is still "unsupported field"
        let e = NetConf::parse(conf(r#","vxlanId":7"#).as_bytes()).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedField);
        assert!(e.msg.contains("unsupported field") && e.msg.contains("vxlanId"));
        // values weir cannot take are configuration errors, naming the key
        for (extra, key) in [
            (r#","hairpinMode":true,"promiscMode":true"#, "hairpinMode"),
            (r#","ipMasqBackend":"ebpf""#, "ipMasqBackend"),
        ] {
            let e = NetConf::parse(conf(extra).as_bytes()).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{extra}");
            assert!(e.msg.contains(key), "{}", e.msg);
        }
        assert!(
            NetConf::parse(conf(r#","ipMasq":true,"ipMasqBackend":"iptables""#).as_bytes()).is_ok()
        );
        // the single-range keys need the single-range subnet
        let e = NetConf::parse(
            conf("")
                .replace(
                    r#""type":"weir-ipam""#,
                    r#""type":"weir-ipam","rangeStart":"10.244.1.5""#,
                )
                .as_bytes(),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(
            e.msg.contains("ipam.rangeStart") && e.msg.contains("ipam.subnet"),
            "{}",
            e.msg
        );
    }

    fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn requested_addresses_and_mac_follow_the_reference_precedence() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let mut c = NetConf::parse(
            conf(
                r#","runtimeConfig":{"ips":["10.244.1.7/24"],"mac":"02:00:00:00:00:0a"},
                   "args":{"cni":{"ips":["fd00::7"],"mac":"02:00:00:00:00:0b"}}"#,
            )
            .as_bytes(),
        )
        .unwrap();
        c.read_requests(&args(&[
            ("IP", "10.244.1.8, fd00::8"),
            ("MAC", "02:00:00:00:00:0c"),
        ]))
        .unwrap();
        assert_eq!(
            c.requested.ips,
            vec![
                ip("10.244.1.8"),
                ip("fd00::8"),
                ip("fd00::7"),
                ip("10.244.1.7")
            ],
            "CNI_ARGS, then args.cni.ips, then runtimeConfig.ips"
        );
        assert_eq!(
            c.requested.mac,
            Some([2, 0, 0, 0, 0, 0x0a]),
            "runtimeConfig.mac wins"
        );

        let mut c =
            NetConf::parse(conf(r#","args":{"cni":{"mac":"02-00-00-00-00-0b"}}"#).as_bytes())
                .unwrap();
        c.read_requests(&args(&[("MAC", "02:00:00:00:00:0c")]))
            .unwrap();
        assert_eq!(
            c.requested.mac,
            Some([2, 0, 0, 0, 0, 0x0b]),
            "then args.cni.mac"
        );
        let mut c = NetConf::parse(conf("").as_bytes()).unwrap();
        c.read_requests(&args(&[
            ("MAC", "02:00:00:00:00:0c"),
            ("K8S_POD_NAME", "p"),
        ]))
        .unwrap();
        assert_eq!(
            c.requested.mac,
            Some([2, 0, 0, 0, 0, 0x0c]),
            "then CNI_ARGS"
        );
        assert!(c.requested.ips.is_empty());

        // malformed values: code 7 in the configuration, code 4 in CNI_ARGS, naming the source
        for (extra, field) in [
            (
                r#","runtimeConfig":{"ips":["10.244.1.300"]}"#,
                "runtimeConfig.ips",
            ),
            (
                r#","runtimeConfig":{"ips":"10.244.1.3"}"#,
                "runtimeConfig.ips",
            ),
            (r#","args":{"cni":{"ips":[7]}}"#, "args.cni.ips"),
            (
                r#","runtimeConfig":{"mac":"01:00:5e:00:00:01"}"#,
                "runtimeConfig.mac",
            ),
            (
                r#","args":{"cni":{"mac":"zz:00:00:00:00:01"}}"#,
                "args.cni.mac",
            ),
        ] {
            let mut c = NetConf::parse(conf(extra).as_bytes()).unwrap();
            let e = c.read_requests(&args(&[])).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig, "{extra}");
            assert!(e.msg.starts_with(field), "{}", e.msg);
        }
        for (k, v) in [
            ("IP", "10.244.1.3,bogus"),
            ("MAC", "02:00:00:00:00"),
            ("MAC", "00:00:00:00:00:00"),
        ] {
            let mut c = NetConf::parse(conf("").as_bytes()).unwrap();
            let e = c.read_requests(&args(&[(k, v)])).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidEnvironment, "{k}={v}");
            assert!(e.msg.starts_with(&format!("CNI_ARGS {k}")), "{}", e.msg);
        }
    }

    #[test]
    fn resolv_conf_becomes_the_result_dns_unless_dns_is_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("resolv.conf");
        std::fs::write(
            &file,
            "# generated\nnameserver 10.96.0.10\nnameserver fd00::10\ndomain cluster.local\n\
             search svc.cluster.local cluster.local\noptions ndots:5 edns0\n",
        )
        .unwrap();
        let with = |extra: &str| {
            conf(extra).replace(
                r#""type":"weir-ipam""#,
                &format!(r#""type":"weir-ipam","resolvConf":"{}""#, file.display()),
            )
        };
        let c = NetConf::parse(with("").as_bytes()).unwrap();
        assert_eq!(
            c.result_dns().unwrap(),
            serde_json::json!({"nameservers":["10.96.0.10","fd00::10"],"domain":"cluster.local",
                "search":["svc.cluster.local","cluster.local"],"options":["ndots:5","edns0"]})
        );
        let c = NetConf::parse(with(r#","dns":{"nameservers":["1.1.1.1"]}"#).as_bytes()).unwrap();
        assert_eq!(
            c.result_dns().unwrap(),
            serde_json::json!({"nameservers":["1.1.1.1"]})
        );
        std::fs::remove_file(&file).unwrap();
        let c = NetConf::parse(with("").as_bytes()).unwrap();
        assert_eq!(c.result_dns().unwrap_err().code, ErrorCode::Io);
        assert!(NetConf::parse(conf("").as_bytes())
            .unwrap()
            .result_dns()
            .unwrap()
            .is_null());
    }
}
