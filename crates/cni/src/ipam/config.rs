//! The `ipam` section of a network configuration: host-local's `ranges` (a list of range sets, each a
//! list of ranges), its legacy single `subnet` form, `reserved` addresses, `dataDir` and `routes`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// host-local's default store location; the store of network `n` is `<dataDir>/<n>/`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

// serde reads a missing `Option` field as None, so only the other defaults need saying.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpamConf {
    /// "weir-ipam" or "host-local" (both mean this built-in allocator).
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub ranges: Vec<Vec<RangeConf>>,
    /// host-local's legacy single-range form: one more range set, placed before `ranges`, with its
    /// own `rangeStart`, `rangeEnd` and `gateway` beside `subnet`.
    pub subnet: Option<IpNet>,
    pub range_start: Option<IpAddr>,
    pub range_end: Option<IpAddr>,
    pub gateway: Option<IpAddr>,
    /// host-local's `resolvConf`: a resolv.conf-format file whose nameservers, domain, search list
    /// and options become the result's `dns` (unless the network configuration has its own `dns`).
    pub resolv_conf: Option<PathBuf>,
    /// Addresses never handed out (in addition to each range's gateway).
    #[serde(default)]
    pub reserved: Vec<IpAddr>,
    pub data_dir: Option<PathBuf>,
    #[serde(default)]
    pub routes: Vec<RouteConf>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RangeConf {
    pub subnet: IpNet,
    pub range_start: Option<IpAddr>,
    pub range_end: Option<IpAddr>,
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConf {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
}

pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

pub(crate) fn from_u128(v4: bool, n: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(n))
    }
}

impl RangeConf {
    /// The configured `rangeStart`, or host-local's default: the address after the network address.
    pub fn effective_start(&self) -> IpAddr {
        self.range_start.unwrap_or_else(|| self.first_host())
    }

    /// The configured `rangeEnd`, or host-local's default: the last address of the subnet, except the
    /// broadcast address for IPv4.
    pub fn effective_end(&self) -> IpAddr {
        self.range_end.unwrap_or_else(|| {
            let last = to_u128(self.subnet.broadcast());
            from_u128(
                self.subnet.addr().is_ipv4(),
                if self.subnet.addr().is_ipv4() {
                    last - 1
                } else {
                    last
                },
            )
        })
    }

    /// The configured `gateway`, or host-local's default: the first address of the subnet.
    pub fn effective_gateway(&self) -> IpAddr {
        self.gateway.unwrap_or_else(|| self.first_host())
    }

    fn first_host(&self) -> IpAddr {
        let net = self.subnet.trunc();
        from_u128(net.addr().is_ipv4(), to_u128(net.network()) + 1)
    }

    fn check(&self, field: &str) -> Result<Resolved, String> {
        let subnet = self.subnet.trunc();
        let v4 = subnet.addr().is_ipv4();
        if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
            return Err(format!(
                "{field}.subnet: {} is too small to allocate from",
                self.subnet
            ));
        }
        let inside = |name: &str, ip: Option<IpAddr>| -> Result<(), String> {
            match ip {
                Some(ip) if ip.is_ipv4() != v4 => Err(format!(
                    "{field}.{name}: {ip} is not of the same family as subnet {subnet}"
                )),
                Some(ip) if !subnet.contains(&ip) => {
                    Err(format!("{field}.{name}: {ip} is not in subnet {subnet}"))
                }
                _ => Ok(()),
            }
        };
        inside("rangeStart", self.range_start)?;
        inside("rangeEnd", self.range_end)?;
        inside("gateway", self.gateway)?;
        let (start, end) = (
            to_u128(self.effective_start()),
            to_u128(self.effective_end()),
        );
        if start > end {
            return Err(format!(
                "{field}.rangeEnd: {} is before rangeStart {}",
                self.effective_end(),
                self.effective_start()
            ));
        }
        Ok(Resolved {
            v4,
            start,
            end,
            gateway: self.effective_gateway(),
            prefix_len: subnet.prefix_len(),
        })
    }
}

/// A range with its defaults filled in, as numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Resolved {
    pub v4: bool,
    pub start: u128,
    pub end: u128,
    pub gateway: IpAddr,
    pub prefix_len: u8,
}

impl Resolved {
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.v4 && (self.start..=self.end).contains(&to_u128(ip))
    }
}

/// A range set as its messages name it: `start-end` of each range, comma-separated.
pub(crate) fn describe_range_set(set: &[Resolved]) -> String {
    set.iter()
        .map(|r| format!("{}-{}", from_u128(r.v4, r.start), from_u128(r.v4, r.end)))
        .collect::<Vec<_>>()
        .join(", ")
}

impl IpamConf {
    /// The range sets: the legacy `subnet` form (if any) first, as host-local does, then `ranges`.
    pub fn range_sets(&self) -> Vec<Vec<RangeConf>> {
        let legacy = self.subnet.map(|subnet| {
            vec![RangeConf {
                subnet,
                range_start: self.range_start,
                range_end: self.range_end,
                gateway: self.gateway,
            }]
        });
        legacy
            .into_iter()
            .chain(self.ranges.iter().cloned())
            .collect()
    }

    /// `dataDir`, or host-local's default `/var/lib/cni/networks`.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
    }

    /// Checks the ranges: start/end/gateway inside the subnet, start <= end, one family per range set,
    /// at least one range set, no two ranges overlapping. The message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        self.resolved().map(|_| ())
    }

    /// Name of range set `i`'s `j`th range in the configuration as written.
    fn field(&self, set: usize, range: usize) -> String {
        match (self.subnet.is_some(), set) {
            // the single-range form's keys sit directly in ipam: "ipam.subnet", "ipam.rangeStart"
            (true, 0) => "ipam".to_string(),
            (true, s) => format!("ipam.ranges[{}][{range}]", s - 1),
            (false, s) => format!("ipam.ranges[{s}][{range}]"),
        }
    }

    pub(crate) fn resolved(&self) -> Result<Vec<Vec<Resolved>>, String> {
        if self.subnet.is_none() {
            for (key, set) in [
                ("rangeStart", self.range_start.is_some()),
                ("rangeEnd", self.range_end.is_some()),
                ("gateway", self.gateway.is_some()),
            ] {
                if set {
                    return Err(format!(
                        "ipam.{key} belongs to the single-range form and needs ipam.subnet beside it (or move it into a range of ipam.ranges)"
                    ));
                }
            }
        }
        let sets = self.range_sets();
        if sets.is_empty() {
            return Err("ipam.ranges: at least one range set (or ipam.subnet) is required".into());
        }
        let mut out = Vec::with_capacity(sets.len());
        let mut all: Vec<(String, Resolved)> = Vec::new();
        for (i, set) in sets.iter().enumerate() {
            if set.is_empty() {
                let idx = if self.subnet.is_some() { i - 1 } else { i };
                return Err(format!(
                    "ipam.ranges[{idx}]: a range set needs at least one range"
                ));
            }
            let mut resolved = Vec::with_capacity(set.len());
            for (j, range) in set.iter().enumerate() {
                let field = self.field(i, j);
                let r = range.check(&field)?;
                if let Some(first) = resolved.first().map(|f: &Resolved| f.v4) {
                    if first != r.v4 {
                        return Err(format!(
                            "{field}.subnet: {} is not of the same IP family as the other ranges of its range set",
                            range.subnet
                        ));
                    }
                }
                for (other, o) in &all {
                    if o.v4 == r.v4 && r.start <= o.end && o.start <= r.end {
                        let other = if other == "ipam" {
                            "ipam.subnet"
                        } else {
                            other
                        };
                        return Err(format!(
                            "{field}: range {}-{} overlaps {other} ({}-{})",
                            from_u128(r.v4, r.start),
                            from_u128(r.v4, r.end),
                            from_u128(o.v4, o.start),
                            from_u128(o.v4, o.end)
                        ));
                    }
                }
                all.push((field, r));
                resolved.push(r);
            }
            out.push(resolved);
        }
        Ok(out)
    }
}
