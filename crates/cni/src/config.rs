//! The network configuration weir-cni reads from stdin.
//!
//! Decoding happens in three steps so that each failure gets the code the spec asks for:
//! JSON syntax (6), cniVersion (1), unknown keys (2, naming key and value), then field values (7).

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use crate::ipam::IpamConf;
use crate::spec::{abbreviate, check_version, CniError, CniResult, ErrorCode};

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
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Give the bridge the gateway address of each range set.
    #[serde(default = "yes")]
    pub is_gateway: bool,
    /// Add a default route via the gateway in the pod (in addition to `ipam.routes`).
    #[serde(default)]
    pub is_default_gateway: bool,
    #[serde(default)]
    pub ip_masq: bool,
    #[serde(default = "yes")]
    pub hairpin_mode: bool,
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
    "isGateway",
    "isDefaultGateway",
    "ipMasq",
    "hairpinMode",
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

impl NetConf {
    pub fn parse(stdin: &[u8]) -> CniResult<Self> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(ErrorCode::Decode, "network configuration is not valid JSON")
                .with_details(e)
        })?;
        let object = value.as_object().ok_or_else(|| {
            CniError::new(
                ErrorCode::Decode,
                "network configuration must be a JSON object",
            )
        })?;
        let version = object
            .get("cniVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidConfig,
                    "network configuration has no cniVersion string",
                )
            })?;
        check_version(version)?;
        for (key, val) in object {
            // The spec reserves `cni.dev/*` for runtimes (libcni >= 1.2.3 sends cni.dev/attachments
            // beside cni.dev/valid-attachments in GC): accept them all.
            if !KNOWN_KEYS.contains(&key.as_str()) && !key.starts_with(RESERVED_PREFIX) {
                return Err(CniError::new(
                    ErrorCode::UnsupportedField,
                    format!(
                        "unsupported field in network configuration: {:?} = {}",
                        abbreviate(key, 200),
                        abbreviate(&val.to_string(), 200)
                    ),
                ));
            }
        }
        let conf: NetConf = serde_json::from_value(value).map_err(|e| {
            let code = if e.to_string().contains("unknown field") {
                ErrorCode::UnsupportedField
            } else {
                ErrorCode::InvalidConfig
            };
            CniError::new(code, format!("invalid network configuration: {e}"))
        })?;
        conf.validate()?;
        Ok(conf)
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
}
