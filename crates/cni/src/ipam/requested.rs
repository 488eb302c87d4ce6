//! Requested addresses (`runtimeConfig.ips`, `args.cni.ips`, `CNI_ARGS` `IP=`): which range set each
//! one is for. Pure, so every refusal is decided before the store is touched.

use std::net::IpAddr;

use super::config::{describe_range_set, Resolved};
use super::IpamError;

/// For each range set, the requested address that falls in it (host-local's rule: at most one per
/// range set, every requested address must land in one). Errors name the address and the reason:
/// outside every range, two in one range set, a gateway, or a `reserved` address.
pub(crate) fn assign_requested(
    sets: &[Vec<Resolved>],
    reserved: &[IpAddr],
    requested: &[IpAddr],
) -> Result<Vec<Option<IpAddr>>, IpamError> {
    let mut wanted: Vec<Option<IpAddr>> = vec![None; sets.len()];
    for &ip in requested {
        let place = sets
            .iter()
            .enumerate()
            .find_map(|(i, set)| set.iter().find(|r| r.contains(ip)).map(|r| (i, r)));
        let Some((i, range)) = place else {
            let ranges: Vec<String> = sets.iter().map(|s| describe_range_set(s)).collect();
            return Err(IpamError::Requested(format!(
                "requested address {ip} is outside every range of this network ({})",
                ranges.join("; ")
            )));
        };
        match wanted[i] {
            Some(prev) if prev == ip => continue, // asked for twice (e.g. CNI_ARGS and runtimeConfig)
            Some(prev) => {
                return Err(IpamError::Requested(format!(
                    "requested addresses {prev} and {ip} are both in range set {i} ({}); one address per range set",
                    describe_range_set(&sets[i])
                )))
            }
            None => {}
        }
        if ip == range.gateway {
            return Err(IpamError::Requested(format!(
                "requested address {ip} is the gateway of its range"
            )));
        }
        if reserved.contains(&ip) {
            return Err(IpamError::Requested(format!(
                "requested address {ip} is listed in ipam.reserved"
            )));
        }
        wanted[i] = Some(ip);
    }
    Ok(wanted)
}
