//! `weir routes` as a process (root only): the real binary in two throwaway network namespaces
//! joined by a veth, fed by a manifest directory (or the fake API server); what it publishes
//! (the Node patch file) goes back into the Node manifests, as the lab or an operator would do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{runnable, KillOnDrop, WEIR};

/// Two namespaces `<tag>-1`, `<tag>-2` (10.78.0.1/24, 10.78.0.2/24), a manifest directory and
/// any running agent; all removed on drop.
struct Pair {
    tag: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Drop for Pair {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in [1, 2] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .status();
        }
    }
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-ec", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let p = Pair {
            tag: format!("wra-{tag}-{}", std::process::id()),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        std::fs::create_dir(p.manifests()).unwrap();
        let (a, b) = (p.ns(1), p.ns(2));
        sh(&format!(
            "ip netns add {a}; ip netns add {b}
             ip -n {a} link add eth0 type veth peer name eth0 netns {b}
             ip -n {a} addr add 10.78.0.1/24 dev eth0; ip -n {a} link set eth0 up
             ip -n {b} addr add 10.78.0.2/24 dev eth0; ip -n {b} link set eth0 up
             ip -n {a} link set lo up; ip -n {b} link set lo up"
        ));
        p
    }

    fn ns(&self, i: u8) -> String {
        format!("{}-{i}", self.tag)
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes node<i>'s manifest with these annotations.
    fn node(&self, i: u8, annotations: &BTreeMap<String, String>) {
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node{i}"), "annotations": annotations},
            "spec": {"podCIDR": format!("10.244.{i}.0/24")},
            "status": {"addresses": [{"type": "InternalIP", "address": format!("10.78.0.{i}")}]},
        });
        let path = self.manifests().join(format!("node{i}.yaml"));
        std::fs::write(path, serde_saphyr::to_string(&node).unwrap()).unwrap();
    }

    /// `weir routes <args>` in node<i>; the agent's pod MTU file is node<i>.mtu in the test's
    /// directory (never the host's /run/weir/routes/mtu).
    fn routes(&self, i: u8, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(i), WEIR, "routes"]);
        cmd.args(args);
        if args.first() != Some(&"cleanup") {
            cmd.arg("--mtu-file").arg(self.mtu_file(i));
        }
        cmd
    }

    fn mtu_file(&self, i: u8) -> PathBuf {
        self.file(&format!("node{i}.mtu"))
    }

    /// `weir routes --once` on node<i>, writing node<i>.patch.yaml and node<i>.status.json.
    fn once(&self, i: u8) -> Output {
        let publish = self.file(&format!("node{i}.patch.yaml"));
        let status = self.file(&format!("node{i}.status.json"));
        self.routes(i, &["--once", "--node-name", &format!("node{i}")])
            .arg("--manifests")
            .arg(self.manifests())
            .arg("--publish")
            .arg(publish)
            .arg("--status")
            .arg(status)
            .output()
            .unwrap()
    }

    /// The annotations in node<i>'s published patch.
    fn published(&self, i: u8) -> BTreeMap<String, String> {
        let text = std::fs::read_to_string(self.file(&format!("node{i}.patch.yaml"))).unwrap();
        let v: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        serde_json::from_value(v["metadata"]["annotations"].clone()).unwrap()
    }

    fn status(&self, i: u8) -> serde_json::Value {
        let text = std::fs::read_to_string(self.file(&format!("node{i}.status.json"))).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "weir routes failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agent_publishes_its_vtep_programs_peers_follows_manifests_and_cleans_up() {
    if !runnable() {
        return;
    }
    let mut p = Pair::new("vx");
    p.node(1, &BTreeMap::new());
    p.node(2, &BTreeMap::new());
    ok(&p.once(1));
    ok(&p.once(2));

    // Published: flannel's keys under weir.dev, the MAC the kernel's VTEP really has.
    let a1 = p.published(1);
    assert_eq!(a1["weir.dev/backend-type"], "vxlan");
    assert_eq!(a1["weir.dev/public-ip"], "10.78.0.1");
    let link = sh(&format!("ip -n {} -br link show weir.1", p.ns(1)));
    let mac = link.split_whitespace().nth(2).unwrap();
    assert_eq!(
        a1["weir.dev/backend-data"],
        format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#)
    );
    let s1 = p.status(1);
    assert_eq!(s1["mtu"], 1450);
    // The pod MTU for weir-cni: the VTEP's (underlay 1500 − 50).
    assert_eq!(std::fs::read_to_string(p.mtu_file(1)).unwrap(), "1450\n");
    let refused = s1["nodes"]["node2"]["refused"][0].as_str().unwrap();
    assert!(refused.contains("no VTEP published yet"), "{refused}");

    // The operator puts the annotations on the Nodes; the next run programs the peer.
    p.node(1, &a1);
    p.node(2, &p.published(2));
    ok(&p.once(1));
    ok(&p.once(2));
    assert_eq!(p.status(1)["nodes"]["node2"]["routed"][0], "10.244.2.0/24");
    let routes = sh(&format!("ip -n {} route show proto 87", p.ns(1)));
    assert_eq!(
        routes.trim(),
        "10.244.2.0/24 via 10.244.2.0 dev weir.1 onlink"
    );
    // Pod traffic stand-in: node1 reaches node2's VTEP gateway address through the overlay.
    let ping = sh(&format!(
        "ip netns exec {} busybox ping -c1 -W2 10.244.2.0",
        p.ns(1)
    ));
    assert!(ping.contains("1 packets received"), "{ping}");

    // The running agent follows the manifest directory: node2 leaves, its route goes.
    let log = std::fs::File::create(p.file("agent.log")).unwrap();
    p.child = Some(
        p.routes(
            1,
            &["--node-name", "node1", "--manifest-poll-interval", "100ms"],
        )
        .arg("--manifests")
        .arg(p.manifests())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap(),
    );
    std::fs::remove_file(p.manifests().join("node2.yaml")).unwrap();
    let ns1 = p.ns(1);
    wait_for("node2's route to go", || {
        sh(&format!("ip -n {ns1} route show proto 87"))
            .trim()
            .is_empty()
    });
    let mut child = p.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let log = std::fs::read_to_string(p.file("agent.log")).unwrap();
    assert!(log.contains("ip route del 10.244.2.0/24"), "{log}");

    // cleanup removes the VTEP (its entries go with it).
    let out = p.routes(1, &["cleanup"]).output().unwrap();
    ok(&out);
    assert!(!sh(&format!("ip -n {ns1} -o link show")).contains("weir.1"));
}

#[test]
fn bad_flags_are_clear_errors_that_change_nothing() {
    if !runnable() {
        return;
    }
    let p = Pair::new("bad");
    p.node(1, &BTreeMap::new());
    let out = p
        .routes(1, &["--once", "--node-name", "node1", "--vni", "0"])
        .arg("--manifests")
        .arg(p.manifests())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--vni 0 is outside 1..16777215"), "{err}");
    // No Node source: the error names the flags that give one.
    let out = p
        .routes(1, &["--once"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--manifests") && err.contains("--kubeconfig"),
        "{err}"
    );
    let out = p
        .routes(1, &["--once", "--node-name", "node1", "--iface", "nosuch0"])
        .arg("--manifests")
        .arg(p.manifests())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("underlay interface nosuch0: no such device"),
        "{err}"
    );
    // --iface names the underlay explicitly: the VTEP sends from its address.
    let out = p
        .routes(1, &["--once", "--node-name", "node1", "--iface", "eth0"])
        .arg("--manifests")
        .arg(p.manifests())
        .output()
        .unwrap();
    ok(&out);
    let link = sh(&format!("ip -n {} -d link show weir.1", p.ns(1)));
    assert!(link.contains("local 10.78.0.1 dev eth0"), "{link}");
    p.routes(1, &["cleanup"]).output().unwrap();
    // A manifest directory without this node's Node: nothing is created.
    let out = p
        .routes(1, &["--once", "--node-name", "elsewhere"])
        .arg("--manifests")
        .arg(p.manifests())
        .output()
        .unwrap();
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Node object named"));
    assert!(!sh(&format!("ip -n {} -o link show", p.ns(1))).contains("weir.1"));
}

/// node<i> as the API server holds it: InternalIP 10.78.0.<i>, pod CIDR 10.244.<i>.0/24.
fn api_node(i: u8) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: node{i}}}\n\
         spec: {{podCIDR: 10.244.{i}.0/24}}\n\
         status: {{addresses: [{{type: InternalIP, address: 10.78.0.{i}}}]}}\n"
    )
}

/// Nodes from the Kubernetes API (weir's fake server, the real list/watch protocol, in node1's
/// namespace): routes appear as Nodes join and go as they leave.
#[test]
fn host_gw_routes_follow_nodes_from_the_api() {
    if !runnable() {
        return;
    }
    let mut p = Pair::new("api");
    sh(&format!("ip -n {} link set lo up", p.ns(1)));
    let api =
        weir_fakeapi::FakeApi::start(Some(&p.ns(1)), "127.0.0.1:6443".parse().unwrap()).unwrap();
    api.apply_yaml(&api_node(1)).unwrap();
    api.apply_yaml(&api_node(2)).unwrap();
    let routes = |p: &Pair| {
        sh(&format!(
            "ip -n {} route show proto 87 | grep 10.244 || true",
            p.ns(1)
        ))
    };
    let child = p
        .routes(
            1,
            &[
                "--master=http://127.0.0.1:6443",
                "--node-name=node1",
                "--backend=host-gw",
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.child = Some(child);
    wait_for("node2's route", || {
        routes(&p).contains("10.244.2.0/24 via 10.78.0.2 dev eth0")
    });
    // A node joins, then another leaves: only their routes change.
    api.apply_yaml(&api_node(3)).unwrap();
    wait_for("node3's route", || {
        routes(&p).contains("10.244.3.0/24 via 10.78.0.3 dev eth0")
    });
    // A node host-gw cannot reach directly is refused, per node, in /metrics too (served by
    // default on 127.0.0.1:10263).
    api.apply_yaml(&api_node(4).replace("address: 10.78.0.4", "address: 10.99.0.4"))
        .unwrap();
    let metrics = || {
        sh(&format!(
            "ip netns exec {} curl -s http://127.0.0.1:10263/metrics || true",
            p.ns(1)
        ))
    };
    wait_for("node4 refused in /metrics", || {
        metrics().contains("weir_routes_node_refused{node=\"node4\"")
    });
    let m = metrics();
    assert!(m.contains("weir_routes_nodes_routed 2\n"), "{m}");
    assert!(!routes(&p).contains("10.244.4.0/24"), "{}", routes(&p));
    assert!(api.delete("Node", "", "node2"));
    wait_for("node2's route gone", || {
        !routes(&p).contains("10.244.2.0/24")
    });
    assert!(routes(&p).contains("10.244.3.0/24"), "{}", routes(&p));
    // The watcher asked for Nodes only: a node agent has no business with Services.
    let asked = api.requests();
    assert!(
        asked
            .iter()
            .all(|r| r.contains("/api/v1/nodes") || r.contains("/version")),
        "{asked:?}"
    );
}

/// vxlan through the API, as flanneld does it: each agent patches its VTEP MAC and underlay
/// address onto its own Node, and the other reads them from the watch and programs the peer.
#[test]
fn vxlan_agents_publish_their_vteps_on_their_nodes_through_the_api() {
    if !runnable() {
        return;
    }
    let p = Pair::new("vxapi");
    // The API server's own address is reached over loopback in node1's namespace.
    sh(&format!("ip -n {} link set lo up", p.ns(1)));
    let api =
        weir_fakeapi::FakeApi::start(Some(&p.ns(1)), "10.78.0.1:6443".parse().unwrap()).unwrap();
    api.apply_yaml(&api_node(1)).unwrap();
    api.apply_yaml(&api_node(2)).unwrap();
    let agent = |i: u8| {
        KillOnDrop(
            p.routes(
                i,
                &[
                    "--master=http://10.78.0.1:6443",
                    &format!("--node-name=node{i}"),
                    "--backend=vxlan",
                    "--sync-period=1s",
                ],
            )
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        )
    };
    let (_a1, _a2) = (agent(1), agent(2));
    let route = |i: u8, peer: u8| {
        sh(&format!(
            "ip -n {} route show proto 87 | grep '10.244.{peer}.0/24' || true",
            p.ns(i)
        ))
    };
    wait_for("node1 routes node2 over the overlay", || {
        route(1, 2).contains("via 10.244.2.0 dev weir.1")
    });
    wait_for("node2 routes node1 over the overlay", || {
        route(2, 1).contains("via 10.244.1.0 dev weir.1")
    });
    let patches: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH"))
        .collect();
    assert!(
        patches.iter().any(|r| r.contains("/api/v1/nodes/node1"))
            && patches.iter().any(|r| r.contains("/api/v1/nodes/node2")),
        "{patches:?}"
    );
    // The FDB entry for node2's VTEP points at its underlay address.
    let fdb = sh(&format!("bridge -n {} fdb show dev weir.1", p.ns(1)));
    assert!(fdb.contains("dst 10.78.0.2"), "{fdb}");
}
