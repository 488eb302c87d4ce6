//! Tests of the IPAM module: real files in per-test temporary directories, real locks, real
//! processes, and Debian's real host-local plugin for the side-by-side layout check.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use proptest::prelude::*;

use super::*;

const NET: &str = "testnet";

fn conf(json: &str) -> IpamConf {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// An IPAM conf with `ranges` (JSON) and its dataDir in `dir`.
fn conf_in(dir: &Path, ranges: &str) -> IpamConf {
    let mut c = conf(&format!(r#"{{"type":"weir-ipam","ranges":{ranges}}}"#));
    c.data_dir = Some(dir.to_path_buf());
    c
}

fn store(c: &IpamConf) -> Store {
    Store::open(c, NET).unwrap().with_boot_id(Some("boot-a"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(allocs: &[Allocation]) -> Vec<IpAddr> {
    allocs.iter().map(|a| a.address.addr()).collect()
}

fn alloc1(s: &Store, c: &IpamConf, id: &str) -> IpAddr {
    let a = s.allocate(c, id, "eth0").unwrap();
    assert_eq!(a.len(), 1);
    a[0].address.addr()
}

/// Names in the store directory other than the lock, cursors, boot id and address files.
fn stray_files(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| {
            n != LOCK_FILE
                && n != BOOT_ID_FILE
                && !n.starts_with(LAST_RESERVED_PREFIX)
                && n.parse::<IpAddr>().is_err()
        })
        .collect()
}

// ---------------------------------------------------------------- configuration

#[test]
fn config_parses_and_fills_host_local_defaults() {
    let c = conf(
        r#"{"type":"host-local","ranges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00::/120","gateway":"fd00::fe"}]],
            "reserved":["10.244.1.9"],"dataDir":"/run/x","routes":[{"dst":"0.0.0.0/0"},{"dst":"10.0.0.0/8","gw":"10.244.1.254"}]}"#,
    );
    c.validate().unwrap();
    assert_eq!(c.data_dir(), Path::new("/run/x"));
    assert_eq!(
        c.routes[0],
        RouteConf {
            dst: "0.0.0.0/0".parse().unwrap(),
            gw: None
        }
    );
    assert_eq!(c.routes[1].gw, Some(ip("10.244.1.254")));
    let sets = c.range_sets();
    assert_eq!(sets.len(), 2);
    let v4 = &sets[0][0];
    assert_eq!(
        (v4.effective_start(), v4.effective_end()),
        (ip("10.244.1.1"), ip("10.244.1.254"))
    );
    assert_eq!(v4.effective_gateway(), ip("10.244.1.1"));
    let v6 = &sets[1][0];
    assert_eq!(
        (v6.effective_start(), v6.effective_end()),
        (ip("fd00::1"), ip("fd00::ff"))
    );
    assert_eq!(v6.effective_gateway(), ip("fd00::fe"));

    // legacy single-subnet form: one range set, placed first; default data dir
    let legacy = conf(r#"{"type":"host-local","subnet":"10.1.0.0/16"}"#);
    legacy.validate().unwrap();
    assert_eq!(legacy.range_sets().len(), 1);
    assert_eq!(legacy.data_dir(), Path::new("/var/lib/cni/networks"));
    // serde round trip
    let back: IpamConf = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn config_errors_name_the_field() {
    let cases = [
        (
            r#"[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24","rangeEnd":"10.0.2.5"}]]"#,
            "ipam.ranges[0][1].rangeEnd",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","rangeEnd":"10.0.0.40"}]]"#,
            "ipam.ranges[0][0].rangeEnd",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.1"}]]"#,
            "ipam.ranges[0][0].rangeStart",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/24","rangeStart":"fd00::1"}]]"#,
            "ipam.ranges[0][0].rangeStart",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/24","gateway":"10.0.9.1"}]]"#,
            "ipam.ranges[0][0].gateway",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]"#,
            "ipam.ranges[0][1].subnet",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.128/25"}]]"#,
            "ipam.ranges[1][0]",
        ),
        (
            r#"[[{"subnet":"10.0.0.0/31"}]]"#,
            "ipam.ranges[0][0].subnet",
        ),
        (r#"[[]]"#, "ipam.ranges[0]"),
        (r#"[]"#, "ipam.ranges"),
    ];
    for (ranges, field) in cases {
        let err = conf(&format!(r#"{{"type":"weir-ipam","ranges":{ranges}}}"#))
            .validate()
            .unwrap_err();
        assert!(
            err.starts_with(&format!("{field}:")),
            "{ranges}: {err:?} should name {field}"
        );
    }
    // overlapping the legacy subnet names both forms correctly
    let c = conf(
        r#"{"type":"weir-ipam","subnet":"10.0.0.0/24","ranges":[[{"subnet":"10.0.0.0/24"}]]}"#,
    );
    let err = c.validate().unwrap_err();
    assert!(
        err.starts_with("ipam.ranges[0][0]:") && err.contains("ipam.subnet"),
        "{err}"
    );
    let c = conf(r#"{"type":"weir-ipam","subnet":"10.0.0.0/32"}"#);
    assert!(c.validate().unwrap_err().starts_with("ipam.subnet:"));
    // unknown keys are rejected, in ipam and in a range
    assert!(serde_json::from_str::<IpamConf>(r#"{"type":"weir-ipam","rangez":[]}"#).is_err());
    assert!(serde_json::from_str::<IpamConf>(
        r#"{"type":"weir-ipam","ranges":[[{"subnet":"10.0.0.0/24","gw":"10.0.0.1"}]]}"#
    )
    .is_err());
    // open() validates the conf and the network name
    let ok = conf(r#"{"type":"weir-ipam","subnet":"10.0.0.0/24"}"#);
    for bad in ["", ".", "..", "a/b", "x\0y"] {
        assert!(
            matches!(Store::open(&ok, bad), Err(IpamError::Config(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(
        Store::open(&conf(r#"{"type":"weir-ipam"}"#), "n"),
        Err(IpamError::Config(_))
    ));
}

// ---------------------------------------------------------------- allocation order

#[test]
fn skips_gateway_and_reserved_and_uses_host_local_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = conf_in(
        tmp.path(),
        r#"[[{"subnet":"10.9.0.0/24","rangeEnd":"10.9.0.6"}]]"#,
    );
    c.reserved = vec![ip("10.9.0.3"), ip("10.9.0.5")];
    let s = store(&c);
    let a = s.allocate(&c, "c1", "eth0").unwrap();
    assert_eq!(
        a,
        vec![Allocation {
            address: "10.9.0.2/24".parse().unwrap(),
            gateway: Some(ip("10.9.0.1")),
            range_set: 0
        }]
    );
    assert_eq!(alloc1(&s, &c, "c2"), ip("10.9.0.4"));
    assert_eq!(alloc1(&s, &c, "c3"), ip("10.9.0.6"));
    assert!(matches!(
        s.allocate(&c, "c4", "eth0"),
        Err(IpamError::Exhausted { range_set: 0, .. })
    ));

    let dir = tmp.path().join(NET);
    assert_eq!(s.dir(), dir);
    assert_eq!(
        fs::read_to_string(dir.join("10.9.0.2")).unwrap(),
        "c1\r\neth0"
    );
    assert_eq!(
        fs::read_to_string(dir.join("last_reserved_ip.0")).unwrap(),
        "10.9.0.6"
    );
    assert!(dir.join("lock").is_file());
    assert_eq!(
        fs::read_to_string(dir.join(BOOT_ID_FILE)).unwrap(),
        "boot-a"
    );
    assert_eq!(stray_files(&dir), Vec::<String>::new());

    // an explicit gateway inside the range is skipped; the default start .1 is then usable
    let tmp2 = tempfile::tempdir().unwrap();
    let c2 = conf_in(
        tmp2.path(),
        r#"[[{"subnet":"10.9.0.0/29","gateway":"10.9.0.2"}]]"#,
    );
    let s2 = store(&c2);
    let got: Vec<IpAddr> = (0..5).map(|i| alloc1(&s2, &c2, &format!("x{i}"))).collect();
    assert_eq!(
        got,
        ["10.9.0.1", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"].map(ip)
    );
}

#[test]
fn round_robin_continues_after_last_reserved_ip_and_wraps_across_ranges() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(
        tmp.path(),
        r#"[[{"subnet":"10.8.0.0/29"},{"subnet":"10.8.1.0/24","rangeStart":"10.8.1.10","rangeEnd":"10.8.1.11"}]]"#,
    );
    let s = store(&c);
    assert_eq!(alloc1(&s, &c, "a"), ip("10.8.0.2"));
    assert_eq!(alloc1(&s, &c, "b"), ip("10.8.0.3"));
    assert_eq!(s.release("a", "eth0").unwrap(), vec![ip("10.8.0.2")]);
    // a released address is not reused before the range has been run through
    assert_eq!(alloc1(&s, &c, "c"), ip("10.8.0.4"));
    // the cursor is the on-disk last_reserved_ip.0 (as host-local would have left it)
    fs::write(tmp.path().join(NET).join("last_reserved_ip.0"), "10.8.0.6").unwrap();
    assert_eq!(
        alloc1(&s, &c, "d"),
        ip("10.8.1.10"),
        "end of range 0 continues at range 1's start"
    );
    assert_eq!(alloc1(&s, &c, "e"), ip("10.8.1.11"));
    assert_eq!(
        alloc1(&s, &c, "f"),
        ip("10.8.0.2"),
        "end of the last range wraps to range 0 (skipping .1, the gateway)"
    );
    assert_eq!(
        alloc1(&s, &c, "g"),
        ip("10.8.0.5"),
        "held addresses are skipped"
    );
    // a cursor outside the set (ranges changed) restarts at the first range's start
    fs::write(
        tmp.path().join(NET).join("last_reserved_ip.0"),
        "192.168.0.1",
    )
    .unwrap();
    s.release("b", "eth0").unwrap();
    assert_eq!(alloc1(&s, &c, "h"), ip("10.8.0.3"));
}

#[test]
fn allocate_is_idempotent_per_container_and_ifname() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(
        tmp.path(),
        r#"[[{"subnet":"10.7.0.0/24"}],[{"subnet":"fd07::/64"}]]"#,
    );
    let s = store(&c);
    let first = s.allocate(&c, "ctr", "eth0").unwrap();
    assert_eq!(s.allocate(&c, "ctr", "eth0").unwrap(), first);
    assert_eq!(
        s.allocate(&c, " ctr ", "eth0").unwrap(),
        first,
        "IDs are trimmed like host-local does"
    );
    let other_if = s.allocate(&c, "ctr", "net1").unwrap();
    assert_ne!(ips(&other_if), ips(&first));
    assert_eq!(s.lookup("ctr", "eth0").unwrap().len(), 2);
    assert_eq!(s.allocations().unwrap().len(), 4);
    // a partial allocation (only the v4 set, e.g. left by a narrower config) is completed, not redone
    s.release("ctr", "eth0").unwrap();
    let c_v4 = conf_in(tmp.path(), r#"[[{"subnet":"10.7.0.0/24"}]]"#);
    let v4 = s.allocate(&c_v4, "ctr", "eth0").unwrap();
    let both = s.allocate(&c, "ctr", "eth0").unwrap();
    assert_eq!(both[0], v4[0]);
    assert_eq!(both.len(), 2);
}

#[test]
fn dual_stack_gives_one_address_per_range_set() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(
        tmp.path(),
        r#"[[{"subnet":"10.6.0.0/24"}],[{"subnet":"fd06::/120","rangeStart":"fd06::10","gateway":"fd06::1"}]]"#,
    );
    let s = store(&c);
    let a = s.allocate(&c, "ctr", "eth0").unwrap();
    assert_eq!(
        a,
        vec![
            Allocation {
                address: "10.6.0.2/24".parse().unwrap(),
                gateway: Some(ip("10.6.0.1")),
                range_set: 0
            },
            Allocation {
                address: "fd06::10/120".parse().unwrap(),
                gateway: Some(ip("fd06::1")),
                range_set: 1
            },
        ]
    );
    let dir = tmp.path().join(NET);
    assert_eq!(
        fs::read_to_string(dir.join("fd06::10")).unwrap(),
        "ctr\r\neth0"
    );
    assert_eq!(
        fs::read_to_string(dir.join("last_reserved_ip.1")).unwrap(),
        "fd06::10"
    );
    let mut released = s.release("ctr", "eth0").unwrap();
    released.sort();
    assert_eq!(released, vec![ip("10.6.0.2"), ip("fd06::10")]);
}

#[test]
fn exhaustion_rolls_back_the_whole_allocation() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(
        tmp.path(),
        r#"[[{"subnet":"10.5.0.0/24"}],[{"subnet":"10.5.1.0/30"}]]"#,
    );
    let s = store(&c);
    assert_eq!(
        ips(&s.allocate(&c, "a", "eth0").unwrap()),
        vec![ip("10.5.0.2"), ip("10.5.1.2")]
    );
    let err = s.allocate(&c, "b", "eth0").unwrap_err();
    assert!(
        matches!(&err, IpamError::Exhausted { range_set: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("10.5.1.1-10.5.1.2"), "{err}");
    assert_eq!(
        s.lookup("b", "eth0").unwrap(),
        Vec::<IpAddr>::new(),
        "set 0's address was rolled back"
    );
    assert_eq!(s.allocations().unwrap().len(), 2);
    assert_eq!(stray_files(&tmp.path().join(NET)), Vec::<String>::new());
}

// ---------------------------------------------------------------- release, gc, legacy files

#[test]
fn release_and_gc() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.4.0.0/24"}]]"#);
    let s = store(&c);
    // nothing was ever allocated: success, and nothing is created
    assert_eq!(s.release("x", "eth0").unwrap(), Vec::<IpAddr>::new());
    assert_eq!(s.gc(&[]).unwrap(), Vec::<IpAddr>::new());
    assert_eq!(s.lookup("x", "eth0").unwrap(), Vec::<IpAddr>::new());
    assert!(!tmp.path().join(NET).exists());

    let a = alloc1(&s, &c, "a");
    let b = alloc1(&s, &c, "b");
    let b1 = s.allocate(&c, "b", "net1").unwrap()[0].address.addr();
    let d = alloc1(&s, &c, "d");
    assert_eq!(s.release("a", "eth0").unwrap(), vec![a]);
    assert_eq!(
        s.release("a", "eth0").unwrap(),
        Vec::<IpAddr>::new(),
        "release is idempotent"
    );
    assert_eq!(
        s.release("b", "eth1").unwrap(),
        Vec::<IpAddr>::new(),
        "other ifname untouched"
    );
    let valid = vec![
        ("b".to_string(), "eth0".to_string()),
        ("zzz".to_string(), "eth0".to_string()),
    ];
    let mut released = s.gc(&valid).unwrap();
    released.sort();
    assert_eq!(released, vec![b1, d]);
    assert_eq!(
        s.allocations().unwrap(),
        vec![(b, "b".to_string(), "eth0".to_string())]
    );
    assert_eq!(s.gc(&valid).unwrap(), Vec::<IpAddr>::new());
}

#[test]
fn legacy_container_id_only_files_are_understood() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.3.0.0/24"}]]"#);
    let s = store(&c);
    s.check_writable().unwrap();
    let dir = tmp.path().join(NET);
    fs::write(dir.join("10.3.0.7"), "old-ctr").unwrap();
    fs::write(dir.join("10.3.0.8"), "new-ctr\r\neth0\n").unwrap();
    fs::write(dir.join("10.3.0.9"), "").unwrap(); // e.g. a writer killed mid-write
    fs::write(dir.join("not-an-ip"), "old-ctr").unwrap();
    assert_eq!(
        s.allocations().unwrap(),
        vec![
            (ip("10.3.0.7"), "old-ctr".into(), "".into()),
            (ip("10.3.0.8"), "new-ctr".into(), "eth0".into()),
            (ip("10.3.0.9"), "".into(), "".into())
        ]
    );
    assert_eq!(s.lookup("old-ctr", "eth0").unwrap(), vec![ip("10.3.0.7")]);
    assert_eq!(s.lookup("new-ctr", "eth0").unwrap(), vec![ip("10.3.0.8")]);
    assert_eq!(
        ips(&s.allocate(&c, "old-ctr", "eth0").unwrap()),
        vec![ip("10.3.0.7")],
        "idempotent on legacy files"
    );
    // gc keeps a legacy file whose container is still valid, releases the ownerless one
    let valid = [
        ("old-ctr".to_string(), "eth0".to_string()),
        ("new-ctr".to_string(), "eth0".to_string()),
    ];
    assert_eq!(s.gc(&valid).unwrap(), vec![ip("10.3.0.9")]);
    assert_eq!(s.release("old-ctr", "eth0").unwrap(), vec![ip("10.3.0.7")]);
    assert!(
        dir.join("not-an-ip").exists(),
        "foreign files are left alone"
    );
}

#[test]
fn stale_temp_files_are_cleaned_and_never_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.2.0.0/24"}]]"#);
    let s = store(&c);
    let a = alloc1(&s, &c, "a");
    let dir = tmp.path().join(NET);
    // what a process killed between writing and linking/renaming leaves behind
    fs::write(dir.join(".weir-tmp.4242.0"), "b\r\neth0").unwrap();
    fs::write(dir.join(".weir-tmp.4242.1"), "10.2.0.9").unwrap();
    assert_eq!(
        s.allocations().unwrap(),
        vec![(a, "a".into(), "eth0".into())]
    );
    assert_eq!(stray_files(&dir), Vec::<String>::new());
}

// ---------------------------------------------------------------- requested addresses

#[test]
fn requested_addresses_are_given_or_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = conf_in(
        tmp.path(),
        r#"[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20","gateway":"10.1.0.12"}],
            [{"subnet":"fd00::/120"}]]"#,
    );
    c.reserved = vec![ip("10.1.0.13")];
    let dir = tmp.path().join(NET);
    let s = store(&c);
    let got = s
        .allocate_requested(&c, "a", "eth0", &[ip("10.1.0.15")])
        .unwrap();
    assert_eq!(got[0].address, "10.1.0.15/24".parse().unwrap());
    assert_eq!(got[0].gateway, Some(ip("10.1.0.12")));
    assert_eq!(
        got[1].address.addr(),
        ip("fd00::2"),
        "the other range set as usual"
    );
    assert_eq!(
        fs::read_to_string(dir.join("last_reserved_ip.0")).unwrap(),
        "10.1.0.15",
        "a requested address moves the cursor, as in host-local"
    );
    // asking again for what the attachment holds is the same answer; asking for another is not
    assert_eq!(
        ips(&s
            .allocate_requested(&c, "a", "eth0", &[ip("10.1.0.15")])
            .unwrap()),
        vec![ip("10.1.0.15"), ip("fd00::2")]
    );
    assert!(matches!(
        s.allocate_requested(&c, "a", "eth0", &[ip("10.1.0.16")]),
        Err(IpamError::Taken(m)) if m.contains("already holds 10.1.0.15")
    ));

    // taken by another attachment: refused, naming the holder, and nothing of b's is left
    let before = s.allocations().unwrap();
    match s.allocate_requested(&c, "b", "eth0", &[ip("10.1.0.15")]) {
        Err(IpamError::Taken(m)) => {
            assert!(m.contains("10.1.0.15") && m.contains("\"a\""), "{m}")
        }
        other => panic!("expected Taken, got {other:?}"),
    }
    // the second range set's request is taken: the first set's fresh address is rolled back
    assert!(matches!(
        s.allocate_requested(&c, "b", "eth0", &[ip("fd00::2")]),
        Err(IpamError::Taken(_))
    ));
    assert_eq!(s.allocations().unwrap(), before);

    // refused before the store is touched, each with its reason
    for (req, why) in [
        (vec![ip("10.1.0.5")], "outside every range"),
        (vec![ip("10.2.0.15")], "outside every range"),
        (vec![ip("10.1.0.12")], "gateway"),
        (vec![ip("10.1.0.13")], "ipam.reserved"),
        (
            vec![ip("10.1.0.16"), ip("10.1.0.17")],
            "both in range set 0",
        ),
    ] {
        match s.allocate_requested(&c, "b", "eth0", &req) {
            Err(IpamError::Requested(m)) => assert!(m.contains(why), "{req:?}: {m}"),
            other => panic!("{req:?}: expected Requested, got {other:?}"),
        }
    }
    assert_eq!(s.allocations().unwrap(), before);
    // the same address asked for twice (CNI_ARGS and runtimeConfig) is one request
    assert_eq!(
        ips(&s
            .allocate_requested(
                &c,
                "b",
                "eth0",
                &[ip("fd00::9"), ip("10.1.0.16"), ip("fd00::9")]
            )
            .unwrap()),
        vec![ip("10.1.0.16"), ip("fd00::9")]
    );
}

#[test]
fn host_local_honours_what_weir_allocated_on_request_and_vice_versa() {
    let Some(net) = SharedWithHostLocal::new(r#"[[{"subnet":"10.78.0.0/28"}]]"#) else {
        return;
    };
    let c = &net.conf;
    let s = store(c);
    // host-local takes a requested address; weir refuses it to another container
    let hl = net.host_local_add("hl", r#","runtimeConfig":{"ips":["10.78.0.9"]}"#);
    assert_eq!(hl, ip("10.78.0.9"));
    assert!(matches!(
        s.allocate_requested(c, "w", "eth0", &[hl]),
        Err(IpamError::Taken(_))
    ));
    // weir takes a requested address; host-local refuses it
    s.allocate_requested(c, "w", "eth0", &[ip("10.78.0.7")])
        .unwrap();
    let err = net
        .host_local("ADD", "hl2", r#","args":{"cni":{"ips":["10.78.0.7"]}}"#)
        .unwrap_err();
    assert!(err.contains("10.78.0.7"), "{err}");
}

// ---------------------------------------------------------------- reboot reconciliation

/// Sets `path`'s mtime to a day before this boot: what a file from an earlier boot looks like.
fn from_an_earlier_boot(path: &Path) {
    let boot = super::store::system_boot_time().expect("btime in /proc/stat");
    let then = boot - std::time::Duration::from_secs(86_400);
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(then)
        .unwrap();
}

#[test]
fn stale_cutoff_needs_a_boot_time_and_a_stamp_older_than_the_boot() {
    use std::time::{Duration, SystemTime};
    let boot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let cutoff = boot - BOOT_STALE_MARGIN;
    assert_eq!(super::store::stale_cutoff(None, None), None);
    assert_eq!(super::store::stale_cutoff(Some(boot), None), Some(cutoff));
    let old_stamp = boot - Duration::from_secs(3600);
    assert_eq!(
        super::store::stale_cutoff(Some(boot), Some(old_stamp)),
        Some(cutoff)
    );
    // a "previous boot" stamp dated after this boot began: the clock moved, trust no file time
    assert_eq!(super::store::stale_cutoff(Some(boot), Some(boot)), None);
    assert_eq!(super::store::stale_cutoff(Some(boot), Some(cutoff)), None);
}

#[test]
fn boot_reconcile_releases_only_allocations_older_than_the_boot() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.1.0.0/24"}]]"#);
    let dir = tmp.path().join(NET);
    let boot = |id: &str| Store::open(&c, NET).unwrap().with_boot_id(Some(id));
    let a = boot("A");
    let x = alloc1(&a, &c, "x");
    let y = alloc1(&a, &c, "y");
    assert_eq!(
        boot("A").lookup("y", "eth0").unwrap(),
        vec![y],
        "same boot: kept"
    );

    // a new boot id, but the stamp was written after this boot began by the file times: the clock
    // cannot be trusted, so nothing is released and the new boot is recorded
    assert_eq!(boot("B").allocations().unwrap().len(), 2);
    assert_eq!(fs::read_to_string(dir.join(BOOT_ID_FILE)).unwrap(), "B");

    // reboot for real: x's file and the stamp predate the boot, y's does not (written since)
    from_an_earlier_boot(&dir.join(x.to_string()));
    from_an_earlier_boot(&dir.join(BOOT_ID_FILE));
    let c2 = boot("C");
    assert_eq!(c2.lookup("x", "eth0").unwrap(), Vec::<IpAddr>::new());
    assert_eq!(
        c2.allocations().unwrap(),
        vec![(y, "y".into(), "eth0".into())],
        "an allocation written in this boot is never released"
    );
    assert_eq!(fs::read_to_string(dir.join(BOOT_ID_FILE)).unwrap(), "C");
    assert_eq!(
        alloc1(&c2, &c, "z"),
        ip("10.1.0.4"),
        "the round-robin cursor survives"
    );

    // a store without the boot id file (fresh, or taken over from host-local): nothing released
    from_an_earlier_boot(&dir.join(y.to_string()));
    fs::remove_file(dir.join(BOOT_ID_FILE)).unwrap();
    assert_eq!(boot("D").allocations().unwrap().len(), 2);
    assert_eq!(fs::read_to_string(dir.join(BOOT_ID_FILE)).unwrap(), "D");
    // a disabled source never releases; the default source is the kernel's boot id
    from_an_earlier_boot(&dir.join(BOOT_ID_FILE));
    let unchecked = Store::open(&c, NET).unwrap().with_boot_id(None);
    assert_eq!(unchecked.allocations().unwrap().len(), 2);
    let real = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(
        Store::open(&c, NET).unwrap().allocations().unwrap(),
        vec![(ip("10.1.0.4"), "z".into(), "eth0".into())],
        "y predates the boot now; z does not"
    );
    assert_eq!(
        fs::read_to_string(dir.join(BOOT_ID_FILE)).unwrap(),
        real.trim()
    );
}

#[test]
fn gc_after_a_reboot_keeps_what_it_is_told_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.1.0.0/24"}]]"#);
    let dir = tmp.path().join(NET);
    let a = Store::open(&c, NET).unwrap().with_boot_id(Some("A"));
    let live = alloc1(&a, &c, "live");
    let dead = alloc1(&a, &c, "dead");
    for f in [live.to_string(), dead.to_string(), BOOT_ID_FILE.to_string()] {
        from_an_earlier_boot(&dir.join(f));
    }
    // GC is the first operation of the new boot: its valid list protects "live" from the
    // reboot reconciliation too, however old its file looks
    let b = Store::open(&c, NET).unwrap().with_boot_id(Some("B"));
    b.gc(&[("live".into(), "eth0".into())]).unwrap();
    assert_eq!(
        b.allocations().unwrap(),
        vec![(live, "live".into(), "eth0".into())]
    );
    assert!(!dir.join(dead.to_string()).exists());

    // the same when the first operation is a read through a handle that knows the valid list
    // (the plugin's GC lists allocations before collecting)
    let c2 = alloc1(&b, &c, "dead2");
    for f in [live.to_string(), c2.to_string(), BOOT_ID_FILE.to_string()] {
        from_an_earlier_boot(&dir.join(f));
    }
    let after = Store::open(&c, NET)
        .unwrap()
        .with_boot_id(Some("C"))
        .keeping(&[("live".into(), "eth0".into())]);
    assert_eq!(
        after.allocations().unwrap(),
        vec![(live, "live".into(), "eth0".into())]
    );
}

// ---------------------------------------------------------------- STATUS

#[test]
fn check_writable_creates_the_store_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = conf_in(tmp.path(), r#"[[{"subnet":"10.0.0.0/24"}]]"#);
    c.data_dir = Some(tmp.path().join("deep/er"));
    let s = store(&c);
    s.check_writable().unwrap();
    let dir = tmp.path().join("deep/er").join(NET);
    assert!(dir.is_dir());
    assert_eq!(stray_files(&dir), Vec::<String>::new());
    // a directory that cannot be created, even by root
    let mut c = c.clone();
    c.data_dir = Some("/proc/sys/weir-ipam-test".into());
    assert!(matches!(
        store(&c).check_writable(),
        Err(IpamError::Io { .. })
    ));
}

/// A read-only store: a tmpfs remounted read-only in a private mount namespace of one thread.
#[test]
fn read_only_store_fails_check_writable_but_still_reads() {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let res = std::thread::spawn(move || -> Result<(), String> {
        // CLONE_NEWNS unshares only this thread's view (and its fs struct); it ends with the thread.
        if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
            return Err(format!("SKIP: a private mount namespace (root; unshare(CLONE_NEWNS): {e})"));
        }
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
            .map_err(|e| format!("make-rprivate: {e}"))?;
        mount(Some("tmpfs"), &root, Some("tmpfs"), MsFlags::empty(), Some("size=1m")).map_err(|e| e.to_string())?;
        let c = conf_in(&root, r#"[[{"subnet":"10.0.0.0/24"}]]"#);
        let s = store(&c);
        let a = alloc1(&s, &c, "a");
        s.check_writable().map_err(|e| format!("writable tmpfs: {e}"))?;
        mount(None::<&str>, &root, None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>)
            .map_err(|e| format!("remount ro: {e}"))?;
        let e = s.check_writable().expect_err("check_writable on a read-only store must fail");
        assert!(matches!(&e, IpamError::Io { source, .. } if source.raw_os_error() == Some(libc::EROFS)), "{e}");
        assert!(matches!(s.allocate(&c, "b", "eth0"), Err(IpamError::Io { .. })));
        assert_eq!(s.lookup("a", "eth0").unwrap(), vec![a], "reads still work");
        Ok(())
    })
    .join()
    .unwrap();
    match res {
        // on the test's thread, which names the test: a failure under CI=true, else recorded
        Err(m) if m.starts_with("SKIP: ") => {
            assert!(!weir_testkit::can_run(Some(m[6..].to_string())))
        }
        other => other.unwrap(),
    }
}

// ---------------------------------------------------------------- concurrency

#[test]
fn fifty_threads_with_their_own_store_never_share_an_address() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.50.0.0/26"}]]"#);
    let got: Vec<IpAddr> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let c = &c;
                sc.spawn(move || {
                    let s = Store::open(c, NET).unwrap().with_boot_id(Some("boot-a"));
                    alloc1(&s, c, &format!("ctr{i}"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 50, "{got:?}");
    assert_eq!(store(&c).allocations().unwrap().len(), 50);
}

const CHILD_DIR: &str = "WEIR_IPAM_TEST_CHILD_DIR";
const CHILD_ID: &str = "WEIR_IPAM_TEST_CHILD_ID";
const CHILD_MARK: &str = "WEIR_IPAM_CHILD_GOT";

/// Child role of `fifty_processes_never_share_an_address` (a no-op in a normal test run).
#[test]
fn child_process_allocate() {
    let (Ok(dir), Ok(id)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_ID)) else {
        return;
    };
    let c = conf_in(Path::new(&dir), r#"[[{"subnet":"10.51.0.0/26"}]]"#);
    let s = Store::open(&c, NET).unwrap().with_boot_id(Some("boot-a"));
    println!("{CHILD_MARK} {id} {}", alloc1(&s, &c, &id));
}

#[test]
fn fifty_processes_never_share_an_address() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let name = format!(
        "{}::child_process_allocate",
        module_path!().split_once("::").unwrap().1
    );
    let children: Vec<_> = (0..50)
        .map(|i| {
            Command::new(&exe)
                .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_DIR, tmp.path())
                .env(CHILD_ID, format!("proc{i}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut got = HashMap::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.split_once(CHILD_MARK).map(|(_, rest)| rest))
            .expect("child result line");
        let (id, addr) = line.trim().split_once(' ').unwrap();
        assert!(
            got.insert(addr.parse::<IpAddr>().unwrap(), id.to_string())
                .is_none(),
            "{addr} handed out twice"
        );
    }
    assert_eq!(got.len(), 50);
    let c = conf_in(tmp.path(), r#"[[{"subnet":"10.51.0.0/26"}]]"#);
    let on_disk: HashMap<IpAddr, String> = store(&c)
        .allocations()
        .unwrap()
        .into_iter()
        .map(|(ip, id, _)| (ip, id))
        .collect();
    assert_eq!(on_disk, got);
}

// ---------------------------------------------------------------- side by side with host-local

const HOST_LOCAL: &str = "/usr/lib/cni/host-local";

/// A network weir and host-local share: one store directory, `ranges` read by weir as `conf` and
/// by host-local from the network configuration it is sent.
struct SharedWithHostLocal {
    tmp: tempfile::TempDir,
    ranges: &'static str,
    conf: IpamConf,
}

impl SharedWithHostLocal {
    /// None when host-local is not installed (apt-get install containernetworking-plugins):
    /// the test is skipped and recorded, or fails under CI=true (weir_testkit).
    fn new(ranges: &'static str) -> Option<Self> {
        if !weir_testkit::can_run(weir_testkit::commands(&[HOST_LOCAL])) {
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let conf = conf_in(tmp.path(), ranges);
        Some(Self { tmp, ranges, conf })
    }

    /// The network's store directory.
    fn dir(&self) -> std::path::PathBuf {
        self.tmp.path().join(NET)
    }

    /// Runs host-local's `cmd` for (`id`, eth0), with `extra` top-level keys in the network
    /// configuration; its stdout, or its stdout and stderr as the error.
    fn host_local(&self, cmd: &str, id: &str, extra: &str) -> Result<String, String> {
        use std::io::Write;
        let config = format!(
            r#"{{"cniVersion":"1.0.0","name":"{NET}","type":"bridge"{extra},
                "ipam":{{"type":"host-local","dataDir":"{}","ranges":{}}}}}"#,
            self.tmp.path().display(),
            self.ranges
        );
        let mut child = Command::new(HOST_LOCAL)
            .env_clear()
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", "/proc/self/ns/net")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(config.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// A successful host-local ADD's address.
    fn host_local_add(&self, id: &str, extra: &str) -> IpAddr {
        let result = self.host_local("ADD", id, extra).unwrap();
        let v: serde_json::Value = serde_json::from_str(&result).unwrap();
        let addr: ipnet::IpNet = v["ips"][0]["address"].as_str().unwrap().parse().unwrap();
        addr.addr()
    }
}

#[test]
fn host_local_and_weir_read_each_others_stores() {
    let Some(net) = SharedWithHostLocal::new(r#"[[{"subnet":"10.77.0.0/28"}]]"#) else {
        return;
    };
    let (c, dir) = (&net.conf, net.dir());

    // host-local allocates first; weir finds it, in host-local's own file format
    let hl1 = net.host_local_add("hl1", "");
    assert_eq!(hl1, ip("10.77.0.2"));
    assert_eq!(
        fs::read_to_string(dir.join("10.77.0.2")).unwrap(),
        "hl1\r\neth0"
    );
    let s = store(c);
    assert_eq!(s.lookup("hl1", "eth0").unwrap(), vec![hl1]);
    assert_eq!(
        s.allocations().unwrap(),
        vec![(hl1, "hl1".into(), "eth0".into())]
    );
    assert_eq!(
        ips(&s.allocate(c, "hl1", "eth0").unwrap()),
        vec![hl1],
        "weir sees host-local's allocation as held"
    );

    // weir continues host-local's round-robin and does not collide
    let w1 = alloc1(&s, c, "w1");
    assert_eq!(w1, ip("10.77.0.3"));
    // host-local continues weir's round-robin, and refuses a second address for weir's container
    let hl2 = net.host_local_add("hl2", "");
    assert_eq!(hl2, ip("10.77.0.4"));
    let dup = net.host_local("ADD", "w1", "").unwrap_err();
    assert!(dup.contains("duplicate allocation"), "{dup}");

    // host-local's DEL releases weir's file; weir's release removes host-local's
    net.host_local("DEL", "w1", "").unwrap();
    assert_eq!(s.lookup("w1", "eth0").unwrap(), Vec::<IpAddr>::new());
    assert_eq!(s.release("hl2", "eth0").unwrap(), vec![hl2]);
    assert_eq!(
        s.gc(&[("hl1".into(), "eth0".into())]).unwrap(),
        Vec::<IpAddr>::new()
    );
    assert_eq!(
        s.allocations().unwrap(),
        vec![(hl1, "hl1".into(), "eth0".into())]
    );
    // host-local still works on the store weir has written to (lock, cursor, boot id file)
    let hl3 = net.host_local_add("hl3", "");
    assert_eq!(hl3, ip("10.77.0.5"));
    net.host_local("DEL", "hl1", "").unwrap();
    assert_eq!(
        s.allocations().unwrap(),
        vec![(hl3, "hl3".into(), "eth0".into())]
    );
}

/// Issue 7, defect 6: weir ran in an earlier boot (its stamp is old), host-local allocated in this
/// boot before weir ran again. weir must release the earlier boot's allocation and keep
/// host-local's, and never hand host-local's address out a second time.
#[test]
fn after_a_reboot_weir_keeps_what_host_local_allocated_in_this_boot() {
    // two addresses only, so a wrong release shows up as a duplicate at once
    let ranges = r#"[[{"subnet":"10.79.0.0/24","rangeStart":"10.79.0.2","rangeEnd":"10.79.0.3"}]]"#;
    let Some(net) = SharedWithHostLocal::new(ranges) else {
        return;
    };
    let (c, dir) = (&net.conf, net.dir());

    // the earlier boot: weir allocated 10.79.0.2 and stamped the store
    let earlier = Store::open(c, NET)
        .unwrap()
        .with_boot_id(Some("earlier-boot"));
    assert_eq!(alloc1(&earlier, c, "old"), ip("10.79.0.2"));
    from_an_earlier_boot(&dir.join("10.79.0.2"));
    from_an_earlier_boot(&dir.join(BOOT_ID_FILE));

    // this boot: host-local runs first
    let hl = net.host_local_add("hl", "");
    assert_eq!(hl, ip("10.79.0.3"));

    // then weir: the earlier boot's address is free again, host-local's is not
    let now = Store::open(c, NET).unwrap().with_boot_id(Some("this-boot"));
    assert_eq!(now.lookup("hl", "eth0").unwrap(), vec![hl]);
    assert_eq!(now.lookup("old", "eth0").unwrap(), Vec::<IpAddr>::new());
    assert_eq!(alloc1(&now, c, "w1"), ip("10.79.0.2"));
    assert!(
        matches!(
            now.allocate(c, "w2", "eth0"),
            Err(IpamError::Exhausted { .. })
        ),
        "10.79.0.3 is host-local's: the range is full"
    );
    assert_eq!(
        fs::read_to_string(dir.join("10.79.0.3")).unwrap(),
        "hl\r\neth0"
    );
    net.host_local("DEL", "hl", "").unwrap();
}

// ---------------------------------------------------------------- property test

#[derive(Debug, Clone)]
struct RangeSpec {
    base: u32, // offset of the subnet inside 10.0.0.0/8, aligned
    prefix: u8,
    start: Option<u32>,
    end: Option<u32>,
    gateway: Option<u32>,
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u8, u8),
    Release(u8, u8),
    Gc(u16),
}

fn range_spec() -> impl Strategy<Value = RangeSpec> {
    (0u32..4, 27u8..=30).prop_flat_map(|(n, prefix)| {
        let size = 1u32 << (32 - prefix);
        (
            Just(n * size),
            Just(prefix),
            proptest::option::of(1..size - 1),
            proptest::option::of(1..size - 1),
            proptest::option::of(0..size),
        )
            .prop_map(|(base, prefix, start, end, gateway)| {
                let (start, end) = match (start, end) {
                    (Some(s), Some(e)) if s > e => (Some(e), Some(s)),
                    other => other,
                };
                RangeSpec {
                    base,
                    prefix,
                    start,
                    end,
                    gateway,
                }
            })
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..8, 0u8..2).prop_map(|(i, f)| Op::Alloc(i, f)),
        2 => (0u8..8, 0u8..2).prop_map(|(i, f)| Op::Release(i, f)),
        1 => any::<u16>().prop_map(Op::Gc),
    ]
}

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n))
}

fn range_json(r: &RangeSpec, second_octet: u32) -> String {
    let off = second_octet << 16;
    let mut j = format!(r#"{{"subnet":"{}/{}""#, v4(off + r.base), r.prefix);
    for (k, v) in [
        ("rangeStart", r.start),
        ("rangeEnd", r.end),
        ("gateway", r.gateway),
    ] {
        if let Some(v) = v {
            j += &format!(r#","{k}":"{}""#, v4(off + r.base + v));
        }
    }
    j + "}"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn prop_no_address_is_ever_held_twice(
        set0 in range_spec(),
        set1 in proptest::option::of(range_spec()),
        reserved in proptest::collection::vec(0u32..16, 0..5),
        ops in proptest::collection::vec(op(), 1..30),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut ranges = format!("[[{}]", range_json(&set0, 0));
        if let Some(s1) = &set1 {
            ranges += &format!(",[{}]", range_json(s1, 1));
        }
        ranges += "]";
        let mut c = conf_in(tmp.path(), &ranges);
        c.reserved = reserved.iter().map(|r| v4(set0.base + r)).collect();
        c.validate().unwrap();
        let sets = c.resolved().unwrap();
        let s = store(&c);
        let usable: Vec<HashSet<IpAddr>> = sets
            .iter()
            .map(|set| super::allocator::candidates(set, None, &c.reserved).map(|(ip, _)| ip).collect())
            .collect();
        let key = |i: u8, f: u8| (format!("ctr{i}"), format!("eth{f}"));
        let mut model: HashMap<(String, String), Vec<IpAddr>> = HashMap::new();

        for op in ops {
            match op {
                Op::Alloc(i, f) => {
                    let k = key(i, f);
                    match s.allocate(&c, &k.0, &k.1) {
                        Ok(a) => {
                            prop_assert_eq!(a.len(), sets.len());
                            let got = ips(&a);
                            if let Some(before) = model.get(&k) {
                                prop_assert_eq!(&got, before, "idempotent");
                            }
                            for (n, al) in a.iter().enumerate() {
                                prop_assert_eq!(al.range_set, n);
                                prop_assert!(usable[n].contains(&al.address.addr()), "{} not usable in set {}", al.address, n);
                                for (other, held) in &model {
                                    prop_assert!(other == &k || !held.contains(&al.address.addr()), "{} held twice", al.address);
                                }
                            }
                            model.insert(k, got);
                        }
                        Err(IpamError::Exhausted { range_set, .. }) => {
                            prop_assert!(!model.contains_key(&k));
                            let held_in_set = model.values().filter(|v| usable[range_set].contains(&v[range_set])).count();
                            prop_assert_eq!(held_in_set, usable[range_set].len(), "exhausted while addresses were free");
                        }
                        Err(e) => prop_assert!(false, "{}", e),
                    }
                }
                Op::Release(i, f) => {
                    let k = key(i, f);
                    let mut got = s.release(&k.0, &k.1).unwrap();
                    got.sort();
                    let mut want = model.remove(&k).unwrap_or_default();
                    want.sort();
                    prop_assert_eq!(got, want);
                }
                Op::Gc(mask) => {
                    let valid: Vec<(String, String)> =
                        (0..16u8).filter(|b| mask & (1 << b) != 0).map(|b| key(b / 2, b % 2)).collect();
                    let mut got = s.gc(&valid).unwrap();
                    got.sort();
                    let mut want: Vec<IpAddr> =
                        model.iter().filter(|(k, _)| !valid.contains(k)).flat_map(|(_, v)| v.clone()).collect();
                    want.sort();
                    model.retain(|k, _| valid.contains(k));
                    prop_assert_eq!(got, want);
                }
            }
            // the store's view == the model == the address files on disk
            let mut want: Vec<(IpAddr, String, String)> = model
                .iter()
                .flat_map(|((id, ifn), v)| v.iter().map(move |ip| (*ip, id.clone(), ifn.clone())))
                .collect();
            want.sort();
            prop_assert_eq!(s.allocations().unwrap(), want.clone());
            let dir = tmp.path().join(NET);
            if !dir.exists() {
                prop_assert!(want.is_empty());
                continue;
            }
            let mut files: Vec<IpAddr> = fs::read_dir(&dir)
                .unwrap()
                .filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok())
                .collect();
            files.sort();
            prop_assert_eq!(files, want.iter().map(|w| w.0).collect::<Vec<_>>());
            prop_assert_eq!(stray_files(&dir), Vec::<String>::new());
        }
    }
}
