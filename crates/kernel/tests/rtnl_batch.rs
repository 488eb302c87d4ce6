//! `Rtnl::addrs_change` against the real kernel (root and `ip`: without them a failure under
//! CI=true, a recorded skip otherwise): hundreds of addresses added and deleted in batches,
//! checked with `ip`, the tool an operator reads; an add of what is there and a delete of what
//! is gone are success; a refused request is named in the error and does not stop the
//! requests after it.

use std::net::Ipv4Addr;
use std::process::Command;

use ipnet::IpNet;
use weir_kernel::{NetNs, Rtnl};

/// Root and `ip`, or the test is skipped (a failure under CI=true, naming what is missing).
fn runnable() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ip"]))
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace of this test's own, deleted on drop (also after a panic).
struct Scratch(String);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn v4(i: u32) -> IpNet {
    IpNet::from(std::net::IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 97, 0, 0)) + i,
    )))
}

#[test]
fn addresses_are_added_and_deleted_in_batches() {
    if !runnable() {
        return;
    }
    let ns = Scratch(format!("wk{}-batch", std::process::id()));
    ip(&["netns", "add", &ns.0]);
    // A bridge stands in for kube-ipvs0's dummy, which this kernel lacks.
    ip(&["-n", &ns.0, "link", "add", "vips", "type", "bridge"]);
    let mut rtnl = Rtnl::in_netns(&NetNs::named(&ns.0).unwrap()).unwrap();
    let index = rtnl.require_link("vips").unwrap().index;
    let addresses_on_link = || {
        let out = ip(&["-n", &ns.0, "-o", "addr", "show", "dev", "vips"]);
        out.lines()
            .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
            .collect::<Vec<_>>()
    };

    // 600 IPv4 and 50 IPv6 addresses: several datagrams' worth.
    let mut adds: Vec<(IpNet, bool)> = (0..600).map(|i| (v4(i), true)).collect();
    adds.extend((1..=50).map(|i| (format!("fd00:97::{i:x}/128").parse().unwrap(), true)));
    rtnl.addrs_change(index, &adds).unwrap();
    let on_link = addresses_on_link();
    assert_eq!(on_link.len(), 650, "{on_link:?}");
    assert!(
        on_link.contains(&"10.97.2.87/32".to_string()),
        "{on_link:?}"
    );
    assert!(
        on_link.contains(&"fd00:97::32/128".to_string()),
        "{on_link:?}"
    );

    // Again: every address is there already, which is success.
    rtnl.addrs_change(index, &adds).unwrap();
    assert_eq!(addresses_on_link().len(), 650);

    // Half the IPv4 ones deleted, with five that were never there.
    let deletes: Vec<(IpNet, bool)> = (300..605).map(|i| (v4(i), false)).collect();
    rtnl.addrs_change(index, &deletes).unwrap();
    let on_link = addresses_on_link();
    assert_eq!(on_link.len(), 350, "{on_link:?}");
    assert!(
        !on_link.contains(&"10.97.1.44/32".to_string()),
        "{on_link:?}"
    );

    // A refused request (a multicast address) is named; the requests around it are made.
    let mixed: Vec<(IpNet, bool)> = vec![
        (v4(1000), true),
        ("ff02::1/128".parse().unwrap(), true),
        (v4(1001), true),
    ];
    let err = rtnl.addrs_change(index, &mixed).unwrap_err();
    assert!(
        err.to_string().starts_with("add address ff02::1/128: "),
        "{err}"
    );
    let on_link = addresses_on_link();
    assert!(
        on_link.contains(&"10.97.3.232/32".to_string())
            && on_link.contains(&"10.97.3.233/32".to_string()),
        "{on_link:?}"
    );

    // A link that does not exist: every request is refused, the first is named.
    let err = rtnl.addrs_change(u32::MAX - 7, &adds[..3]).unwrap_err();
    assert!(
        err.to_string().starts_with("add address 10.97.0.0/32: "),
        "{err}"
    );
}
