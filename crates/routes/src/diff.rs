//! Desired vs observed → the operations that close the gap (pure).
//!
//! Every entry is keyed (routes by destination, neighbours by address, FDB entries by MAC), so
//! a node that joins, leaves or changes yields operations on its own keys only, and a state
//! that is already right yields none.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::plan::{Desired, Entries, RouteEntry, VtepSpec};
use crate::Mac;

/// The VTEP device as found in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedVtep {
    pub index: u32,
    /// `vxlan` for a usable device; anything else is somebody else's device with our name.
    pub kind: Option<String>,
    pub vxlan: weir_kernel::VxlanInfo,
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub up: bool,
    pub addresses: Vec<IpNet>,
}

/// What the kernel holds of weir's: routes with weir's protocol, and the permanent neighbour
/// and FDB entries on weir's VTEP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub vtep: Option<ObservedVtep>,
    pub entries: Entries,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Removes weir's VTEP (and with it every neighbour, FDB entry and route through it).
    DeleteVtep,
    CreateVtep(VtepSpec),
    SetVtepMtu(u32),
    SetVtepUp,
    AddVtepAddress(IpNet),
    DelVtepAddress(IpNet),
    DelRoute(IpNet, RouteEntry),
    AddRoute(IpNet, RouteEntry),
    DelNeighbour(IpAddr, Mac),
    SetNeighbour(IpAddr, Mac),
    DelFdb(Mac, IpAddr),
    SetFdb(Mac, IpAddr),
}

/// The device with weir's VTEP name exists but is not a vxlan device: weir will not remove
/// a device it did not create.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {name} exists and is not a vxlan device (kind {kind:?}): not weir's, left alone")]
pub struct ForeignDevice {
    pub name: String,
    pub kind: Option<String>,
}

/// Whether an existing VTEP matches the spec in everything that needs re-creation to change.
fn vtep_matches(found: &ObservedVtep, want: &VtepSpec) -> bool {
    let v = &found.vxlan;
    v.vni == Some(want.vni)
        && v.port == Some(want.port)
        && v.local == Some(want.local)
        && v.underlay == Some(want.underlay_index)
        && v.learning != Some(true)
        && found.mac == want.mac
}

/// Operations in a safe order: the VTEP first, then removals (routes before the neighbour and
/// FDB entries they use), then additions (FDB and neighbours before the routes that need them).
pub fn diff(desired: &Desired, observed: &Observed) -> Result<Vec<Op>, ForeignDevice> {
    let mut ops = Vec::new();
    if desired.blocked.is_some() {
        return Ok(ops);
    }
    let mut have = observed.entries.clone();
    if let Some(found) = &observed.vtep {
        if found.kind.as_deref() != Some("vxlan") {
            let name = desired
                .vtep
                .as_ref()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            return Err(ForeignDevice {
                name,
                kind: found.kind.clone(),
            });
        }
    }
    match (&desired.vtep, &observed.vtep) {
        (None, Some(_)) => {
            ops.push(Op::DeleteVtep);
            forget_vtep_entries(&mut have);
        }
        (Some(want), None) => {
            ops.push(Op::CreateVtep(want.clone()));
            forget_vtep_entries(&mut have);
            ops.extend(want.addresses.iter().map(|a| Op::AddVtepAddress(*a)));
        }
        (Some(want), Some(found)) if !vtep_matches(found, want) => {
            ops.push(Op::DeleteVtep);
            ops.push(Op::CreateVtep(want.clone()));
            forget_vtep_entries(&mut have);
            ops.extend(want.addresses.iter().map(|a| Op::AddVtepAddress(*a)));
        }
        (Some(want), Some(found)) => {
            if found.mtu != want.mtu {
                ops.push(Op::SetVtepMtu(want.mtu));
            }
            if !found.up {
                ops.push(Op::SetVtepUp);
            }
            for a in &want.addresses {
                if !found.addresses.contains(a) {
                    ops.push(Op::AddVtepAddress(*a));
                }
            }
            for a in &found.addresses {
                // IPv6 link-local addresses are the kernel's own.
                let link_local =
                    matches!(a, IpNet::V6(n) if n.addr().segments()[0] & 0xffc0 == 0xfe80);
                if !want.addresses.contains(a) && !link_local {
                    ops.push(Op::DelVtepAddress(*a));
                }
            }
        }
        (None, None) => {}
    }
    let want = &desired.entries;
    for (dst, route) in &have.routes {
        if want.routes.get(dst) != Some(route) {
            ops.push(Op::DelRoute(*dst, *route));
        }
    }
    for (ip, mac) in &have.neighbours {
        if want.neighbours.get(ip) != Some(mac) {
            ops.push(Op::DelNeighbour(*ip, *mac));
        }
    }
    for (mac, ip) in &have.fdb {
        if want.fdb.get(mac) != Some(ip) {
            ops.push(Op::DelFdb(*mac, *ip));
        }
    }
    for (mac, ip) in &want.fdb {
        if have.fdb.get(mac) != Some(ip) {
            ops.push(Op::SetFdb(*mac, *ip));
        }
    }
    for (ip, mac) in &want.neighbours {
        if have.neighbours.get(ip) != Some(mac) {
            ops.push(Op::SetNeighbour(*ip, *mac));
        }
    }
    for (dst, route) in &want.routes {
        if have.routes.get(dst) != Some(route) {
            ops.push(Op::AddRoute(*dst, *route));
        }
    }
    Ok(ops)
}

/// Entries that disappear with the VTEP device.
fn forget_vtep_entries(have: &mut Entries) {
    have.neighbours.clear();
    have.fdb.clear();
    have.routes.retain(|_, r| !r.via_vtep);
}
