//! Real packets through a rendered ruleset, inside throwaway network namespaces (root only;
//! skipped otherwise). The "node" namespace holds the ruleset; a "pod" namespace behind a
//! veth answers on 10.244.0.5 and 10.244.1.5 port 8080 with the address it was reached at.

use std::path::Path;
use std::process::Command;

use weir_model::{plan, ProxyConfig, Snapshot};
use weir_proxy::nft::{render_full, NftOptions};
use weir_source::ManifestDir;

const SCRIPT: &str = r#"
set -e
nft -f "$RULES"
unshare --net sleep 60 &
POD=$!
sleep 0.2
ip link set lo up
ip link add veth0 type veth peer name veth1
ip link set veth1 netns $POD
ip addr add 10.244.0.1/16 dev veth0
ip link set veth0 up
ip route add 10.96.0.0/16 dev veth0
nsenter -t $POD -n sh -ec '
  ip link set lo up
  ip addr add 10.244.0.5/16 dev veth1
  ip addr add 10.244.1.5/16 dev veth1
  ip link set veth1 up
'
nsenter -t $POD -n python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(64)
while True:
    c, _ = s.accept(); c.sendall(c.getsockname()[0].encode()); c.close()
' &
SRV=$!
trap 'kill $SRV $POD 2>/dev/null || true' EXIT
sleep 0.5
python3 - <<'PY'
import socket, collections
def get(vip, port=80):
    c = socket.create_connection((vip, port), timeout=3)
    d = c.recv(100).decode(); c.close(); return d
seen = collections.Counter(get("10.96.0.10") for _ in range(40))
print("web", dict(seen))
assert set(seen) == {"10.244.0.5", "10.244.1.5"}, seen
np = collections.Counter(get("10.244.0.1", 30080) for _ in range(20))
print("nodeport", dict(np))
assert set(np) <= {"10.244.0.5", "10.244.1.5"} and np, np
sticky = collections.Counter(get("10.96.0.30") for _ in range(20))
print("sticky", dict(sticky))
assert len(sticky) == 1, sticky
try:
    get("10.96.0.40"); raise SystemExit("empty service answered")
except ConnectionRefusedError:
    print("empty: refused")
PY
"#;

#[test]
fn packets_are_balanced_sticky_nodeported_and_rejected() {
    let needs = weir_testkit::missing(true, &["nft", "ip", "unshare", "nsenter", "python3"]);
    if !weir_testkit::can_run(needs) {
        return;
    }
    let mut d =
        ManifestDir::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datapath"));
    assert!(d.scan().errors.is_empty());
    let cfg = ProxyConfig {
        node_name: "node-a".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        node_ips: vec!["10.244.0.1".parse().unwrap()],
        ..Default::default()
    };
    let p = plan(&Snapshot::from_objects(&d.objects()), &cfg);
    let rules = std::env::temp_dir().join(format!("weir-datapath-{}.nft", std::process::id()));
    std::fs::write(&rules, render_full(&p, &NftOptions::default())).unwrap();
    let out = Command::new("unshare")
        .args(["--net", "sh", "-c", SCRIPT])
        .env("RULES", &rules)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&rules);
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{log}");
    assert!(out.status.success(), "{log}");
}
