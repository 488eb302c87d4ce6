//! The CNI protocol as the spec (1.1) defines it: versions, the environment, results and errors.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The version this plugin speaks natively.
pub const CURRENT_VERSION: &str = "1.1.0";
/// Every version whose configuration and result format we understand, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Well-known error codes (spec section "Error").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    IncompatibleVersion = 1,
    UnsupportedField = 2,
    UnknownContainer = 3,
    InvalidEnvironment = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADDs.
    NotAvailable = 50,
    /// STATUS: cannot serve ADDs, and existing containers may be affected.
    NotAvailableExistingAffected = 51,
    // Plugin-specific codes start at 100.
    /// The address range has no free address.
    RangeExhausted = 100,
    /// The kernel refused a network change.
    Netlink = 101,
    /// nftables could not be programmed.
    Nftables = 102,
    /// CHECK found the attachment different from what ADD made.
    CheckFailed = 103,
    /// A requested address (runtimeConfig.ips, args.cni.ips, CNI_ARGS IP=) is held by another
    /// attachment.
    AddressInUse = 104,
    /// ADD found the attachment (or an interface of that name in the pod) already in place; the
    /// spec says ADD must fail then, and names no code for it.
    AlreadyExists = 105,
}

/// Longest `msg` an error prints; beyond it the text is cut (see [`abbreviate`]).
const MAX_MSG: usize = 1024;
/// Longest `details` an error prints.
const MAX_DETAILS: usize = 4096;

/// `text` if it fits in `max` bytes, else its first `max` bytes (on a character boundary) and
/// "… (N bytes)": an error must name a bad value without echoing megabytes of it.
pub fn abbreviate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// An error as the spec's JSON (`code`, `msg`, `details`), printed on stdout with a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: ErrorCode,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }
    pub fn with_details(mut self, details: impl fmt::Display) -> Self {
        self.details = details.to_string();
        self
    }
    pub fn to_json(&self, cni_version: &str) -> String {
        let mut v = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code as u32,
            "msg": abbreviate(&self.msg, MAX_MSG),
        });
        if !self.details.is_empty() {
            v["details"] = abbreviate(&self.details, MAX_DETAILS).into();
        }
        serde_json::to_string_pretty(&v).expect("error JSON serializes")
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code as u32)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

pub type CniResult<T> = Result<T, CniError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

/// The CNI_* environment, validated so that nothing in it can escape a directory or exceed a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: BTreeMap<String, String>,
    pub path: Vec<PathBuf>,
}

/// Longest container ID we accept: generous for runtimes (64 hex) yet bounded for file names.
pub const MAX_CONTAINER_ID: usize = 255;
/// IFNAMSIZ - 1.
pub const MAX_IFNAME: usize = 15;

/// Reads `CNI_COMMAND` alone: VERSION needs nothing else, and runtimes (podman) probe it with
/// dummy values in the other variables, which must not be judged.
pub fn parse_command(get: impl Fn(&str) -> Option<String>) -> CniResult<Command> {
    let invalid = |m: String| CniError::new(ErrorCode::InvalidEnvironment, m);
    Ok(match get("CNI_COMMAND").as_deref() {
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some("GC") => Command::Gc,
        Some("STATUS") => Command::Status,
        Some("VERSION") => Command::Version,
        Some(other) => {
            return Err(invalid(format!(
                "CNI_COMMAND: unknown command {:?}",
                abbreviate(other, 64)
            )))
        }
        None => return Err(invalid("CNI_COMMAND is not set".into())),
    })
}

impl Env {
    /// Reads and validates the environment. `get` abstracts `std::env::var` for tests.
    /// Only what the command uses is validated (VERSION, GC and STATUS ignore the attachment's
    /// variables, which runtimes may fill with placeholders).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> CniResult<Self> {
        let invalid = |m: String| CniError::new(ErrorCode::InvalidEnvironment, m);
        let command = parse_command(&get)?;
        if command == Command::Version {
            return Ok(Self {
                command,
                container_id: String::new(),
                netns: None,
                ifname: String::new(),
                args: BTreeMap::new(),
                path: Vec::new(),
            });
        }
        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let container_id = get("CNI_CONTAINERID").unwrap_or_default();
        let ifname = get("CNI_IFNAME").unwrap_or_default();
        let netns = get("CNI_NETNS")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        if needs_attachment {
            validate_container_id(&container_id).map_err(invalid)?;
            validate_ifname(&ifname).map_err(invalid)?;
            if command != Command::Del && netns.is_none() {
                return Err(invalid("CNI_NETNS is required for ADD and CHECK".into()));
            }
            if let Some(ns) = &netns {
                if !ns.is_absolute() {
                    return Err(invalid(format!(
                        "CNI_NETNS must be an absolute path, got {:?}",
                        abbreviate(&ns.to_string_lossy(), 200)
                    )));
                }
            }
        }
        let args = parse_args(get("CNI_ARGS").as_deref().unwrap_or("")).map_err(invalid)?;
        let path = get("CNI_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

/// The spec: alphanumeric first, then alphanumerics, `_`, `.` or `-`.
pub fn validate_container_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("CNI_CONTAINERID is empty or not set".into());
    }
    if id.len() > MAX_CONTAINER_ID {
        return Err(format!(
            "CNI_CONTAINERID is longer than {MAX_CONTAINER_ID} characters"
        ));
    }
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Err(format!(
            "CNI_CONTAINERID {id:?} must start with a letter or digit and contain only letters, digits, '_', '.', '-'"
        ));
    }
    Ok(())
}

/// The spec: at most IFNAMSIZ-1 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("CNI_IFNAME is empty or not set".into());
    }
    if name.len() > MAX_IFNAME {
        return Err(format!(
            "CNI_IFNAME {name:?} is longer than {MAX_IFNAME} bytes"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("CNI_IFNAME {name:?} is not a valid interface name"));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "CNI_IFNAME {name:?} contains '/', ':' or whitespace"
        ));
    }
    Ok(())
}

/// `CNI_ARGS`: `K1=V1;K2=V2`.
fn parse_args(raw: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in raw.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("CNI_ARGS: {pair:?} is not KEY=VALUE"))?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Checks a configuration's `cniVersion` against what we support.
pub fn check_version(version: &str) -> CniResult<()> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "cniVersion {version:?} is not supported; supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        ))
    }
}

/// `what` (a verb) needs cniVersion `min`; the configuration declares `have`.
pub fn require_version(have: &str, min: &str, what: &str) -> CniResult<()> {
    if version_at_least(have, min) {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!("{what} needs cniVersion {min} or later, the configuration says {have}"),
        ))
    }
}

/// True when `version` is at least `min` (both from SUPPORTED_VERSIONS or well-formed x.y.z).
pub fn version_at_least(version: &str, min: &str) -> bool {
    fn parts(v: &str) -> (u32, u32, u32) {
        let mut it = v.split('.').map(|p| p.parse().unwrap_or(0));
        (
            it.next().unwrap_or(0),
            it.next().unwrap_or(0),
            it.next().unwrap_or(0),
        )
    }
    parts(version) >= parts(min)
}

// ---- results ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// A result in the 1.x shape; [`Outcome::to_json`] renders older shapes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub dns: serde_json::Value,
}

impl Outcome {
    /// Parses a prevResult of any supported version (0.3/0.4 `ips[].version` is accepted and dropped).
    pub fn from_value(v: &serde_json::Value) -> CniResult<Self> {
        let mut v = v.clone();
        if let Some(ips) = v.get_mut("ips").and_then(|i| i.as_array_mut()) {
            for ip in ips {
                if let Some(o) = ip.as_object_mut() {
                    o.remove("version");
                }
            }
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("cniVersion");
        }
        serde_json::from_value(v).map_err(|e| {
            CniError::new(ErrorCode::Decode, "prevResult is not a valid CNI result").with_details(e)
        })
    }

    /// The result as the requested version's JSON.
    pub fn to_json(&self, cni_version: &str) -> String {
        let mut v = serde_json::to_value(self).expect("result serializes");
        v["cniVersion"] = cni_version.into();
        if !version_at_least(cni_version, "1.1.0") {
            if let Some(ifs) = v["interfaces"].as_array_mut() {
                for i in ifs {
                    i.as_object_mut().map(|o| o.remove("mtu"));
                }
            }
        }
        if !version_at_least(cni_version, "1.0.0") {
            if let Some(ips) = v["ips"].as_array_mut() {
                for ip in ips {
                    let family = if ip["address"].as_str().is_some_and(|a| a.contains(':')) {
                        "6"
                    } else {
                        "4"
                    };
                    ip["version"] = family.into();
                }
            }
        }
        serde_json::to_string_pretty(&v).expect("result serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> CniResult<Env> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::parse(|k| map.get(k).cloned())
    }

    const GOOD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ("CNI_ARGS", "K8S_POD_NAME=p;K8S_POD_NAMESPACE=default"),
    ];

    fn with(key: &str, value: &str) -> Vec<(&'static str, String)> {
        GOOD.iter()
            .map(|(k, v)| {
                (
                    *k,
                    if *k == key {
                        value.to_string()
                    } else {
                        v.to_string()
                    },
                )
            })
            .collect()
    }

    fn env_owned(pairs: Vec<(&str, String)>) -> CniResult<Env> {
        let map: BTreeMap<String, String> =
            pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Env::parse(|k| map.get(k).cloned())
    }

    #[test]
    fn good_environment_parses() {
        let e = env(GOOD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.args["K8S_POD_NAME"], "p");
        assert_eq!(e.path.len(), 2);
    }

    #[test]
    fn hostile_container_ids_are_rejected() {
        for bad in [
            "../../etc",
            "a/b",
            "",
            ".hidden",
            "-x",
            "a b",
            &"x".repeat(256),
        ] {
            let err = env_owned(with("CNI_CONTAINERID", bad)).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidEnvironment, "{bad:?}");
        }
    }

    #[test]
    fn hostile_ifnames_are_rejected() {
        for bad in ["", ".", "..", "eth/0", "eth:0", "eth 0", "abcdefghijklmnop"] {
            let err = env_owned(with("CNI_IFNAME", bad)).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidEnvironment, "{bad:?}");
        }
        assert!(
            env_owned(with("CNI_IFNAME", "abcdefghijklmno")).is_ok(),
            "15 bytes is the limit"
        );
    }

    #[test]
    fn version_ignores_the_placeholders_runtimes_probe_with() {
        // podman 4.3 validates a conflist by running each plugin with these.
        let probe = env(&[
            ("CNI_COMMAND", "VERSION"),
            ("CNI_NETNS", "dummy"),
            ("CNI_CONTAINERID", "dummy"),
            ("CNI_IFNAME", "dummy"),
            ("CNI_ARGS", "not-a-pair"),
        ]);
        assert_eq!(
            probe.expect("VERSION is answered").command,
            Command::Version
        );
    }

    #[test]
    fn netns_must_be_absolute_and_is_optional_for_del() {
        assert!(env_owned(with("CNI_NETNS", "relative/ns")).is_err());
        let mut del = with("CNI_COMMAND", "DEL");
        del.retain(|(k, _)| *k != "CNI_NETNS");
        assert!(env_owned(del).is_ok());
        let mut add = with("CNI_COMMAND", "ADD");
        add.retain(|(k, _)| *k != "CNI_NETNS");
        assert!(env_owned(add).is_err());
    }

    #[test]
    fn version_needs_only_the_command() {
        // podman's probe: placeholders everywhere else
        let e = env(&[
            ("CNI_COMMAND", "VERSION"),
            ("CNI_CONTAINERID", "dummy/../x"),
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy dummy dummy"),
            ("CNI_ARGS", "not-a-pair"),
        ])
        .unwrap();
        assert_eq!(e.command, Command::Version);
        // GC and STATUS do not use the netns either
        assert!(env(&[("CNI_COMMAND", "GC"), ("CNI_NETNS", "dummy")]).is_ok());
    }

    #[test]
    fn abbreviate_cuts_on_a_character_boundary_and_says_how_long() {
        assert_eq!(abbreviate("short", 10), "short");
        let long = "é".repeat(1000);
        let cut = abbreviate(&long, 201);
        assert!(cut.starts_with(&"é".repeat(100)), "{cut}");
        assert!(cut.ends_with("… (2000 bytes)"), "{cut}");
        let e = CniError::new(ErrorCode::UnsupportedField, "x".repeat(10_000_000));
        assert!(e.to_json("1.1.0").len() < 2000);
    }

    #[test]
    fn status_and_version_need_no_attachment() {
        assert!(env(&[("CNI_COMMAND", "STATUS")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "GC")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "FROB")]).is_err());
    }

    #[test]
    fn versions_compare() {
        assert!(version_at_least("1.1.0", "1.0.0"));
        assert!(!version_at_least("0.4.0", "1.0.0"));
        assert!(check_version("0.2.0").is_err());
        assert!(check_version("1.1.0").is_ok());
    }

    #[test]
    fn results_render_per_version() {
        let r = Outcome {
            interfaces: vec![Interface {
                name: "eth0".into(),
                mtu: Some(1500),
                ..Default::default()
            }],
            ips: vec![IpConfig {
                address: "10.1.0.5/24".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            }],
            ..Default::default()
        };
        let v11: serde_json::Value = serde_json::from_str(&r.to_json("1.1.0")).unwrap();
        assert_eq!(v11["interfaces"][0]["mtu"], 1500);
        assert!(v11["ips"][0].get("version").is_none());
        let v04: serde_json::Value = serde_json::from_str(&r.to_json("0.4.0")).unwrap();
        assert_eq!(v04["ips"][0]["version"], "4");
        assert!(v04["interfaces"][0].get("mtu").is_none());
        // and the old shape reads back
        assert_eq!(Outcome::from_value(&v04).unwrap().ips, r.ips);
    }

    #[test]
    fn error_json_has_code_and_msg() {
        let e = CniError::new(ErrorCode::InvalidConfig, "bad").with_details("field x");
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.1.0")).unwrap();
        assert_eq!(v["code"], 7);
        assert_eq!(v["msg"], "bad");
        assert_eq!(v["details"], "field x");
    }
}
