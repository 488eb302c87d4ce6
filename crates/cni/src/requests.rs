//! What the runtime asks for one attachment: addresses and a MAC, read from the places the
//! reference plugins read them (host-local's `LoadIPAMConfig`, bridge's `loadNetConf`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

use crate::spec::{CniError, CniResult, ErrorCode};

/// Addresses and a MAC the runtime asks for, as the reference plugins read them: addresses from
/// `CNI_ARGS` `IP=`, `args.cni.ips` and `runtimeConfig.ips` (capability `ips`) together, the MAC from
/// `runtimeConfig.mac` (capability `mac`), else `args.cni.mac`, else `CNI_ARGS` `MAC=`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requested {
    pub ips: Vec<IpAddr>,
    pub mac: Option<[u8; 6]>,
}

impl Requested {
    /// Adds what `CNI_ARGS` asks for (`IP=` a comma-separated list, `MAC=`): addresses come before
    /// those of the configuration (host-local's order), the MAC counts only if the configuration
    /// names none. Malformed values are code 4 (invalid environment).
    pub fn add_cni_args(&mut self, args: &BTreeMap<String, String>) -> CniResult<()> {
        let invalid = |m: String| CniError::new(ErrorCode::InvalidEnvironment, m);
        if let Some(list) = args.get("IP").filter(|v| !v.trim().is_empty()) {
            let mut ips = Vec::new();
            for item in list.split(',') {
                ips.push(
                    parse_requested_ip(item).map_err(|m| invalid(format!("CNI_ARGS IP: {m}")))?,
                );
            }
            ips.append(&mut self.ips);
            self.ips = ips;
        }
        if let Some(mac) = args.get("MAC").filter(|v| !v.trim().is_empty()) {
            let mac = parse_mac(mac).map_err(|m| invalid(format!("CNI_ARGS MAC: {m}")))?;
            self.mac.get_or_insert(mac);
        }
        Ok(())
    }
}

/// The requested addresses and MAC in the configuration: `args.cni.ips`, then `runtimeConfig.ips`;
/// the MAC from `runtimeConfig.mac`, else `args.cni.mac`.
pub(crate) fn requested_in_json(runtime_config: &Value, args: &Value) -> CniResult<Requested> {
    let bad = |m: String| CniError::new(ErrorCode::InvalidConfig, m);
    let cni_args = args.get("cni");
    let mut ips = Vec::new();
    for (field, list) in [
        ("args.cni.ips", cni_args.and_then(|a| a.get("ips"))),
        ("runtimeConfig.ips", runtime_config.get("ips")),
    ] {
        let Some(list) = list.filter(|l| !l.is_null()) else {
            continue;
        };
        let items = list
            .as_array()
            .ok_or_else(|| bad(format!("{field}: must be a list of addresses, got {list}")))?;
        for item in items {
            let text = item
                .as_str()
                .ok_or_else(|| bad(format!("{field}: {item} is not an address string")))?;
            ips.push(parse_requested_ip(text).map_err(|m| bad(format!("{field}: {m}")))?);
        }
    }
    let mut mac = None;
    for (field, value) in [
        ("args.cni.mac", cni_args.and_then(|a| a.get("mac"))),
        ("runtimeConfig.mac", runtime_config.get("mac")),
    ] {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            continue;
        };
        let text = value
            .as_str()
            .ok_or_else(|| bad(format!("{field}: {value} is not a MAC address string")))?;
        if !text.is_empty() {
            mac = Some(parse_mac(text).map_err(|m| bad(format!("{field}: {m}")))?);
        }
    }
    Ok(Requested { ips, mac })
}

/// An address as runtimes write it: plain (`10.1.0.5`) or with a prefix (`10.1.0.5/24`, the prefix
/// ignored, as host-local does).
pub fn parse_requested_ip(text: &str) -> Result<IpAddr, String> {
    let t = text.trim();
    let addr = t.split_once('/').map_or(t, |(a, _)| a);
    addr.parse::<IpAddr>()
        .map_err(|_| format!("{t:?} is not an IP address"))
}

/// `aa:bb:cc:dd:ee:ff` (or with `-`): a unicast, non-zero Ethernet address.
pub fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let t = text.trim();
    let parts: Vec<&str> = t.split([':', '-']).collect();
    let mut mac = [0u8; 6];
    let ok = parts.len() == 6
        && parts
            .iter()
            .zip(mac.iter_mut())
            .all(|(p, b)| p.len() == 2 && u8::from_str_radix(p, 16).map(|v| *b = v).is_ok());
    if !ok {
        return Err(format!(
            "{t:?} is not a MAC address (like 02:42:ac:11:00:02)"
        ));
    }
    if mac[0] & 1 == 1 {
        return Err(format!(
            "{t} is a multicast address; an interface needs a unicast one"
        ));
    }
    if mac == [0; 6] {
        return Err("00:00:00:00:00:00 cannot be an interface's address".into());
    }
    Ok(mac)
}
