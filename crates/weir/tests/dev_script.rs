//! scripts/dev.sh: shellcheck-clean, and each command installs only the Debian packages it
//! uses (`dev.sh packages COMMAND` prints them), `test` every package the project uses.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dev_sh() -> PathBuf {
    root().join("scripts/dev.sh")
}

/// `dev.sh packages COMMAND`: the list, or `None` when the command is refused.
fn packages(command: &str) -> Option<BTreeSet<String>> {
    let out = Command::new("bash")
        .arg(dev_sh())
        .args(["packages", command])
        .env_remove("WEIR_BENCH_CLUSTER")
        .output()
        .expect("bash");
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    })
}

/// The commands dev.sh's usage line names.
fn commands() -> Vec<String> {
    let text = std::fs::read_to_string(dev_sh()).unwrap();
    let usage = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("echo \"usage: bash scripts/dev.sh "))
        .expect("the usage line");
    usage
        .split(['"', ' '])
        .next()
        .unwrap()
        .split('|')
        .filter(|c| *c != "packages")
        .map(str::to_string)
        .collect()
}

#[test]
fn dev_sh_passes_shellcheck() {
    if !weir_testkit::can_run(weir_testkit::missing(false, &["shellcheck", "bash"])) {
        return;
    }
    let out = Command::new("shellcheck").arg(dev_sh()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn each_command_installs_only_what_it_uses() {
    if !weir_testkit::can_run(weir_testkit::missing(false, &["bash"])) {
        return;
    }
    let all = packages("test").expect("test's list");
    assert!(all.len() > 30, "{all:?}");
    let commands = commands();
    assert!(commands.len() >= 19, "{commands:?}");
    let heavy = ["qemu-system-x86", "podman", "containerd", "debootstrap"];
    for c in &commands {
        let list = packages(c).unwrap_or_else(|| panic!("dev.sh packages {c}: refused"));
        assert!(list.is_subset(&all), "{c}: {:?}", list.difference(&all));
        if c != "test" {
            assert!(list.len() < all.len(), "{c} installs the full list");
        }
        // What each family needs, and none of the others' heavy packages.
        let wanted: &[&str] = match c.as_str() {
            "vm" | "vm-bench" => &["qemu-system-x86", "busybox-static", "xz-utils", "ipvsadm"],
            "image" => &["podman", "debootstrap"],
            "cluster-daemonset" => &[
                "podman",
                "debootstrap",
                "runc",
                "containernetworking-plugins",
            ],
            "cluster"
            | "cluster-bench"
            | "cluster-agent-compare"
            | "conformance"
            | "policy-bench" => &["runc", "containernetworking-plugins", "python3-yaml"],
            "demo" => &["nftables", "nsd"],
            _ => &[],
        };
        for w in wanted {
            assert!(list.contains(*w), "{c} lacks {w}: {list:?}");
        }
        if c != "test" {
            for h in heavy.iter().filter(|h| !wanted.contains(h)) {
                assert!(!list.contains(*h), "{c} installs {h}");
            }
        }
    }
    assert_eq!(packages("dist"), Some(BTreeSet::new()));
    assert_eq!(packages("no-such-command"), None);
}
