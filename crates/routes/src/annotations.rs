//! The Node annotations of the overlay, in flannel's shape.
//!
//! flannel (kube subnet manager) publishes, under its `--kube-annotation-prefix` (default
//! `flannel.alpha.coreos.com`): `backend-type` (`vxlan`, `host-gw`), `backend-data`
//! (`{"VNI":1,"VtepMAC":"aa:bb:…"}`), `public-ip` / `public-ipv6` (the underlay address) and
//! `backend-v6-data` for its separate IPv6 VTEP. weir uses the same keys and values under its
//! own default prefix `weir.dev`: the same shape, so tooling written for flannel's annotations
//! reads weir's by changing the prefix, while a flanneld on the same cluster never mistakes
//! weir's VTEPs for its own (or the other way round). The prefix is configurable like flannel's.
//! weir runs one VTEP per node for both families (the overlay carries Ethernet frames, so IPv6
//! pods ride an IPv4 underlay), hence no `backend-v6-data`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{format_mac, parse_mac, Mac};

/// weir's default annotation prefix.
pub const DEFAULT_PREFIX: &str = "weir.dev";

/// The annotation keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotations {
    prefix: String,
}

impl Annotations {
    pub fn new(prefix: &str) -> Self {
        Annotations {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }
    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.prefix)
    }
    pub fn backend_type(&self) -> String {
        self.key("backend-type")
    }
    pub fn backend_data(&self) -> String {
        self.key("backend-data")
    }
    pub fn public_ip(&self) -> String {
        self.key("public-ip")
    }
    pub fn public_ipv6(&self) -> String {
        self.key("public-ipv6")
    }

    /// What this node publishes so the others can reach it: the backend, the VTEP (vxlan) and
    /// the underlay address.
    pub fn publish(
        &self,
        backend_type: &str,
        vtep: Option<&VtepData>,
        underlay: Option<IpAddr>,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        out.insert(self.backend_type(), backend_type.to_string());
        if let Some(v) = vtep {
            out.insert(self.backend_data(), v.render());
        }
        match underlay {
            Some(ip @ IpAddr::V4(_)) => {
                out.insert(self.public_ip(), ip.to_string());
            }
            Some(ip @ IpAddr::V6(_)) => {
                out.insert(self.public_ipv6(), ip.to_string());
            }
            None => {}
        }
        out
    }
}

/// `backend-data` of the vxlan backend: `{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VtepData {
    /// flannel omits the VNI when it is the default (1) in older releases.
    pub vni: Option<u32>,
    pub mac: Mac,
}

#[derive(Serialize, Deserialize)]
struct VtepJson {
    #[serde(rename = "VNI", default, skip_serializing_if = "Option::is_none")]
    vni: Option<u32>,
    #[serde(rename = "VtepMAC")]
    vtep_mac: String,
}

impl VtepData {
    pub fn parse(text: &str) -> Result<Self, String> {
        let json: VtepJson =
            serde_json::from_str(text).map_err(|e| format!("not backend data: {e}"))?;
        let mac = parse_mac(&json.vtep_mac)
            .ok_or_else(|| format!("VtepMAC {:?} is not a MAC address", json.vtep_mac))?;
        if mac == [0; 6] || mac[0] & 1 == 1 {
            return Err(format!(
                "VtepMAC {} is not a unicast address",
                json.vtep_mac
            ));
        }
        Ok(VtepData { vni: json.vni, mac })
    }

    pub fn render(&self) -> String {
        serde_json::to_string(&VtepJson {
            vni: self.vni,
            vtep_mac: format_mac(&self.mac),
        })
        .expect("plain struct serializes")
    }
}
