//! NSD in the outside world: its config and the external zone it serves.

use std::net::Ipv4Addr;
use std::path::Path;

use super::state::EXTERNAL_ZONE;

/// NSD's zone file for [`EXTERNAL_ZONE`]: `www` is the outside's address (where its echo
/// server answers).
pub fn external_zone(outside: Ipv4Addr) -> String {
    format!(
        "$ORIGIN {EXTERNAL_ZONE}.\n$TTL 300\n\
         @ IN SOA ns.{EXTERNAL_ZONE}. admin.{EXTERNAL_ZONE}. 1 3600 600 86400 60\n\
         @ IN NS ns\nns IN A {outside}\nwww IN A {outside}\n"
    )
}

pub(super) fn nsd_conf(dir: &Path, listen: Ipv4Addr) -> String {
    let d = dir.display();
    format!(
        "server:\n  ip-address: {listen}\n  port: 53\n  username: \"\"\n  chroot: \"\"\n  \
         zonesdir: \"{d}\"\n  pidfile: \"{d}/nsd.pid\"\n  database: \"\"\n  \
         zonelistfile: \"{d}/zone.list\"\n  xfrdfile: \"{d}/xfrd.state\"\n  xfrdir: \"{d}\"\n  \
         logfile: \"{d}/nsd.log\"\n  server-count: 1\nremote-control:\n  control-enable: no\n\
         zone:\n  name: {EXTERNAL_ZONE}\n  zonefile: \"{d}/{EXTERNAL_ZONE}.zone\"\n"
    )
}
