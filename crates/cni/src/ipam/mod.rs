//! Built-in IPAM: host-local-compatible ranges and on-disk store.
//!
//! `config` is the `ipam` section (ranges, gateway, reserved addresses), `allocator` host-local's
//! round-robin order, and `store` the per-network directory (one file per address, under a flock),
//! readable and writable by the reference `host-local` plugin in both directions, and `requested`
//! places addresses a runtime asks for. After a reboot the first operation releases the allocations
//! it can prove are from earlier boots (see [`Store`] and its `weir-boot-id` file).
//!
//! Dependencies run one way: `store` uses `requested` and `allocator`, which use `config` (and
//! [`IpamError`]) but never `store`.

mod allocator;
mod config;
mod requested;
mod store;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::PathBuf;

pub use config::{IpamConf, RangeConf, RouteConf, DEFAULT_DATA_DIR};
pub use store::{
    Store, BOOT_ID_FILE, BOOT_STALE_MARGIN, LAST_RESERVED_PREFIX, LINE_BREAK, LOCK_FILE,
};

/// One address handed out from range set `range_set`.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// The address with its subnet's prefix length.
    pub address: ipnet::IpNet,
    pub gateway: Option<IpAddr>,
    pub range_set: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("no IP addresses available in range set {range_set}: {detail}")]
    Exhausted { range_set: usize, detail: String },
    #[error("IPAM store {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    /// A requested address no range set can give (outside the ranges, a gateway, reserved...).
    #[error("{0}")]
    Requested(String),
    /// A requested address another attachment holds.
    #[error("{0}")]
    Taken(String),
}
