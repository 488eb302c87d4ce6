//! ipset entries added and deleted over netlink (`weir_proxy::ipvs::ipset`, what an ipvs-mode
//! partial sync does), against the `ipset` tool doing the same, in throwaway network
//! namespaces (root and the `ipset` tool; skipped otherwise). Every set of kube-proxy's ipvs
//! layout, both families, is created by the same `ipset restore` a full sync runs; each
//! namespace must then list the same entries.

use std::process::Command;

use weir_kernel::NetNs;
use weir_model::IpFamily;
use weir_proxy::ipvs::ipset::Ipset;
use weir_proxy::ipvs::render::{empty_sets, ipset_full, ipset_rebuild, EntryChange, IpSet};

/// Root and the `ipset` tool, or the test is skipped (a failure under CI=true, naming what is missing).
fn runnable() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ipset"]))
}

/// A network namespace removed on drop (also when the test panics).
struct Ns(String);

impl Ns {
    fn new(name: String) -> Ns {
        let st = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(st.unwrap().success(), "ip netns add {name}");
        Ns(name)
    }

    /// `ipset restore` of `script` inside.
    fn restore(&self, script: &str) {
        let out = weir_testkit::output_with_input(
            Command::new("ip").args(["netns", "exec", &self.0, "ipset", "restore"]),
            script.as_bytes(),
        )
        .unwrap();
        assert!(
            out.status.success(),
            "{}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every entry of every set, as `ipset save` writes them, sorted.
    fn entries(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "ipset", "save"])
            .output()
            .unwrap();
        let mut adds: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("add "))
            .map(str::to_string)
            .collect();
        adds.sort();
        adds
    }

    fn netlink(&self, changes: &[EntryChange]) -> weir_proxy::Result<()> {
        NetNs::named(&self.0)
            .unwrap()
            .run(|| Ipset::open()?.apply(changes))
            .unwrap()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Every set of `family`, created empty, with two entries of its type for each.
fn layout(family: IpFamily) -> (String, Vec<EntryChange>) {
    let sets = empty_sets(family);
    let (a, b, net) = match family {
        IpFamily::V4 => ("10.96.0.1", "10.244.1.2", "192.0.2.0/24"),
        IpFamily::V6 => ("fd00:96::1", "fd00:244::2", "2001:db8::/64"),
    };
    let mut changes = Vec::new();
    for (name, set) in &sets {
        let entries = match set.kind {
            "hash:ip" => vec![a.to_string(), b.to_string()],
            "hash:ip,port" => vec![format!("{a},tcp:80"), format!("{b},sctp:30000")],
            "hash:ip,port,ip" => vec![format!("{b},udp:53,{b}"), format!("{a},tcp:8080,{b}")],
            "hash:ip,port,net" => vec![format!("{a},tcp:443,{net}"), format!("{a},tcp:443,{b}/32")],
            "bitmap:port" => vec!["30080".into(), "32767".into()],
            other => panic!("a set type this test does not know: {other}"),
        };
        changes.extend(entries.into_iter().map(|entry| EntryChange {
            add: true,
            set: name.clone(),
            entry,
        }));
    }
    (ipset_full(&sets, family), changes)
}

fn as_script(changes: &[EntryChange]) -> String {
    changes.iter().map(|c| format!("{c}\n")).collect()
}

#[test]
fn entries_over_netlink_match_the_ipset_tool_for_every_set_of_the_layout() {
    if !runnable() {
        return;
    }
    let pid = std::process::id();
    let by_netlink = Ns::new(format!("wis-nl-{pid}"));
    let by_tool = Ns::new(format!("wis-tool-{pid}"));
    for family in [IpFamily::V4, IpFamily::V6] {
        let (create, adds) = layout(family);
        by_netlink.restore(&create);
        by_tool.restore(&create);

        by_netlink.netlink(&adds).unwrap();
        by_tool.restore(&as_script(&adds));
        let listed = by_netlink.entries();
        assert_eq!(listed, by_tool.entries(), "{family:?} after adding");
        for c in &adds {
            assert!(
                listed
                    .iter()
                    .any(|l| l.starts_with(&format!("add {} ", c.set))),
                "{c} is not listed:\n{listed:?}"
            );
        }

        // Adding again and deleting what is absent are no errors (`-exist`).
        by_netlink.netlink(&adds).unwrap();
        let dels: Vec<EntryChange> = adds
            .iter()
            .step_by(2)
            .map(|c| EntryChange {
                add: false,
                ..c.clone()
            })
            .collect();
        by_netlink.netlink(&dels).unwrap();
        by_netlink.netlink(&dels).unwrap();
        by_tool.restore(&as_script(&dels));
        assert_eq!(
            by_netlink.entries(),
            by_tool.entries(),
            "{family:?} after deleting"
        );
        assert_eq!(by_netlink.entries().len(), listed.len() - dels.len());
    }
}

/// `layout`'s sets with its entries in them.
fn filled(family: IpFamily) -> std::collections::BTreeMap<String, IpSet> {
    let (_, adds) = layout(family);
    let mut sets = empty_sets(family);
    for c in adds {
        sets.get_mut(&c.set).unwrap().entries.insert(c.entry);
    }
    sets
}

#[test]
fn a_full_rebuild_filled_over_netlink_equals_the_tools() {
    if !runnable() {
        return;
    }
    let pid = std::process::id();
    let by_netlink = Ns::new(format!("wis-rb-nl-{pid}"));
    let by_tool = Ns::new(format!("wis-rb-tool-{pid}"));
    let mut total = 0;
    for family in [IpFamily::V4, IpFamily::V6] {
        let sets = filled(family);
        total += sets.values().map(|s| s.entries.len()).sum::<usize>();
        by_tool.restore(&ipset_full(&sets, family));
        let rebuild = ipset_rebuild(&sets, family);
        // A rebuild that died after filling leaves its temporary sets: the next one empties
        // and reuses them.
        by_netlink.restore(&rebuild.create);
        by_netlink.netlink(&rebuild.fill).unwrap();
        for _ in 0..2 {
            by_netlink.restore(&rebuild.create);
            by_netlink.netlink(&rebuild.fill).unwrap();
            by_netlink.restore(&rebuild.swap);
            let listed = by_netlink.entries();
            assert_eq!(listed, by_tool.entries(), "{family:?}");
            assert_eq!(listed.len(), total, "every entry once: {listed:?}");
            assert!(
                listed.iter().all(|l| !l.starts_with("add weir-")),
                "no temporary set left: {listed:?}"
            );
        }
    }
}

#[test]
fn a_refused_change_is_an_error_naming_the_set_and_the_entry() {
    if !runnable() {
        return;
    }
    let ns = Ns::new(format!("wis-err-{}", std::process::id()));
    let missing = EntryChange {
        add: true,
        set: "KUBE-CLUSTER-IP".into(),
        entry: "10.96.0.1,tcp:80".into(),
    };
    let e = ns.netlink(&[missing]).unwrap_err().to_string();
    assert!(e.contains("KUBE-CLUSTER-IP 10.96.0.1,tcp:80"), "{e}");
    assert!(e.contains("no such set"), "{e}");

    ns.restore("create P bitmap:port range 0-1023\n");
    let out_of_range = EntryChange {
        add: true,
        set: "P".into(),
        entry: "30080".into(),
    };
    let e = ns.netlink(&[out_of_range]).unwrap_err().to_string();
    assert!(e.contains("outside its range"), "{e}");
}
