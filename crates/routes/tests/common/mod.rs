//! A small routed cluster of network namespaces for the kernel tests: nodes on two underlay
//! subnets joined by a router, each node with one pod (a namespace behind a veth).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use weir_kernel::{NetNs, Rtnl};
use weir_model::k8s_openapi::api::core::v1::Node;
use weir_model::{Object, Snapshot};
use weir_routes::annotations::{Annotations, VtepData};
use weir_routes::kernel::{reconcile, Reconciled};
use weir_routes::{Backend, Config};

/// Root and `ip`, or the test is skipped (a failure under CI=true, naming what is missing).
pub fn runnable() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ip"]))
}

/// Runs a command; panics with its output when it fails.
pub fn run(args: &str) -> String {
    let argv: Vec<&str> = args.split_whitespace().collect();
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "`{args}` failed: {text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One simulated node: its namespace, underlay address, pod namespace and pod addresses.
pub struct SimNode {
    pub name: String,
    pub ns: String,
    pub pod_ns: String,
    pub ip: IpAddr,
    /// 1-based index: pod CIDRs 10.244.<i>.0/24 and fd00:244:<i>::/64.
    pub i: u8,
}

impl SimNode {
    pub fn pod_v4(&self) -> IpAddr {
        format!("10.244.{}.2", self.i).parse().unwrap()
    }
    pub fn pod_v6(&self) -> IpAddr {
        format!("fd00:244:{}::2", self.i).parse().unwrap()
    }
    pub fn rtnl(&self) -> Rtnl {
        Rtnl::in_netns(&NetNs::named(&self.ns).unwrap()).unwrap()
    }
}

/// The namespaces of one test; all deleted on drop (also after a panic).
pub struct Cluster {
    pub tag: String,
    pub router: String,
    pub nodes: Vec<SimNode>,
    /// Namespaces created so far, deleted on drop.
    namespaces: Vec<String>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

impl Cluster {
    /// `subnets[i]` is the underlay subnet (1 = 10.77.1.0/24, 2 = 10.77.2.0/24) of node i+1.
    /// The router has 10.77.<s>.1 on a bridge per subnet; nodes use it as their default route.
    pub fn new(tag: &str, subnets: &[u8]) -> Self {
        let tag = format!("wr{}{tag}", std::process::id());
        let mut c = Cluster {
            router: format!("{tag}-r"),
            tag: tag.clone(),
            nodes: Vec::new(),
            namespaces: Vec::new(),
        };
        c.add_ns(&c.router.clone());
        let r = c.router.clone();
        run(&format!("ip -n {r} link set lo up"));
        run(&format!(
            "ip netns exec {r} sysctl -qw net.ipv4.ip_forward=1"
        ));
        let mut bridges: Vec<u8> = subnets.to_vec();
        bridges.sort();
        bridges.dedup();
        for s in &bridges {
            run(&format!("ip -n {r} link add br{s} type bridge"));
            run(&format!("ip -n {r} addr add 10.77.{s}.1/24 dev br{s}"));
            run(&format!("ip -n {r} link set br{s} up"));
        }
        for (k, s) in subnets.iter().enumerate() {
            let i = k as u8 + 1;
            c.add_node(i, *s);
        }
        c
    }

    fn add_ns(&mut self, name: &str) {
        run(&format!("ip netns add {name}"));
        self.namespaces.push(name.to_string());
        // No duplicate address detection: a tentative link-local address delays the first
        // IPv6 packets by a second or more, which is not what these tests measure.
        run(&format!(
            "ip netns exec {name} sysctl -qw net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.all.accept_dad=0"
        ));
    }

    fn add_node(&mut self, i: u8, subnet: u8) {
        let (r, ns, pod) = (
            self.router.clone(),
            format!("{}-n{i}", self.tag),
            format!("{}-p{i}", self.tag),
        );
        self.add_ns(&ns);
        self.add_ns(&pod);
        let ip = format!("10.77.{subnet}.{}", 10 + i);
        for cmd in [
            format!("ip -n {r} link add n{i} type veth peer name eth0 netns {ns}"),
            format!("ip -n {r} link set n{i} master br{subnet} up"),
            format!("ip -n {ns} link set lo up"),
            format!("ip -n {ns} addr add {ip}/24 dev eth0"),
            format!("ip -n {ns} link set eth0 up"),
            format!("ip -n {ns} route add default via 10.77.{subnet}.1"),
            format!("ip netns exec {ns} sysctl -qw net.ipv4.ip_forward=1"),
            format!("ip netns exec {ns} sysctl -qw net.ipv6.conf.all.forwarding=1"),
            // The pod: a namespace behind a veth, as weir-cni's ptp mode would make it.
            format!("ip -n {ns} link add pod type veth peer name eth0 netns {pod}"),
            format!("ip -n {ns} addr add 10.244.{i}.1/24 dev pod"),
            format!("ip -n {ns} addr add fd00:244:{i}::1/64 dev pod nodad"),
            format!("ip -n {ns} link set pod up"),
            format!("ip -n {pod} link set lo up"),
            format!("ip -n {pod} link set eth0 mtu 1450"),
            format!("ip -n {pod} addr add 10.244.{i}.2/24 dev eth0"),
            format!("ip -n {pod} addr add fd00:244:{i}::2/64 dev eth0 nodad"),
            format!("ip -n {pod} link set eth0 up"),
            format!("ip -n {pod} route add default via 10.244.{i}.1"),
            format!("ip -n {pod} -6 route add default via fd00:244:{i}::1"),
        ] {
            run(&cmd);
        }
        self.nodes.push(SimNode {
            name: format!("node{i}"),
            ns,
            pod_ns: pod,
            ip: ip.parse().unwrap(),
            i,
        });
    }

    pub fn node(&self, i: u8) -> &SimNode {
        &self.nodes[i as usize - 1]
    }
}

/// The Node object of `n`, with `annotations`.
pub fn node_object(
    n: &SimNode,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Object {
    let cidrs = [
        format!("10.244.{}.0/24", n.i),
        format!("fd00:244:{}::/64", n.i),
    ];
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": n.name, "annotations": annotations},
        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
        "status": {"addresses": [{"type": "InternalIP", "address": n.ip.to_string()}]},
    }))
    .unwrap();
    node.into()
}

/// Runs the agent's reconciliation once on node `n` for the given Node objects.
pub fn sync(n: &SimNode, backend: &Backend, objects: &[Object]) -> Reconciled {
    let cfg = Config::new(&n.name, backend.clone());
    let mut rtnl = n.rtnl();
    let r = reconcile(&mut rtnl, &cfg, &Snapshot::from_objects(objects), None).unwrap();
    assert!(r.failed.is_empty(), "{}: {:?}", n.name, r.failed);
    r
}

/// What a node publishes after a sync (the annotations `weir routes --publish` writes).
pub fn published(r: &Reconciled, backend: &Backend) -> std::collections::BTreeMap<String, String> {
    let keys = Annotations::new(weir_routes::annotations::DEFAULT_PREFIX);
    let (vtep, underlay) = match (backend, &r.desired.vtep) {
        (Backend::Vxlan(vx), Some(v)) => (
            Some(VtepData {
                vni: Some(vx.vni),
                mac: v.mac,
            }),
            Some(v.local),
        ),
        _ => (None, None),
    };
    keys.publish(backend.type_name(), vtep.as_ref(), underlay)
}

/// A TCP connection from pod `from` to pod `to` at `to_ip` that carries `bytes` each way.
pub fn tcp(from: &SimNode, to: &SimNode, to_ip: IpAddr, bytes: usize) -> Result<(), String> {
    let listener = NetNs::named(&to.pod_ns)
        .unwrap()
        .run(|| TcpListener::bind(SocketAddr::new(to_ip, 0)))
        .unwrap()
        .map_err(|e| format!("bind {to_ip}: {e}"))?;
    let addr = listener.local_addr().unwrap();
    let mut client = NetNs::named(&from.pod_ns)
        .unwrap()
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(3)))
        .unwrap()
        .map_err(|e| format!("{} -> {addr}: {e}", from.name))?;
    client
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    // The handshake completed, so the connection is queued: accept does not block.
    let (mut server, _) = listener.accept().map_err(|e| e.to_string())?;
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let payload: Vec<u8> = (0..bytes).map(|k| (k % 251) as u8).collect();
    let sender = {
        let mut client = client.try_clone().unwrap();
        let payload = payload.clone();
        std::thread::spawn(move || client.write_all(&payload))
    };
    let mut got = vec![0; bytes];
    server
        .read_exact(&mut got)
        .map_err(|e| format!("{} -> {addr}: receive: {e}", from.name))?;
    sender.join().unwrap().map_err(|e| e.to_string())?;
    if got != payload {
        return Err("payload corrupted".into());
    }
    server.write_all(b"pong").map_err(|e| e.to_string())?;
    let mut pong = [0u8; 4];
    client
        .read_exact(&mut pong)
        .map_err(|e| format!("{addr} -> {}: reply: {e}", from.name))?;
    Ok(())
}

/// iproute2's view of weir's state on a node: routes of proto 87, neighbours, FDB, the VTEP.
pub fn dump(n: &SimNode) -> String {
    let ns = &n.ns;
    let mut out = run(&format!("ip -n {ns} route show proto 87"));
    out += &run(&format!("ip -n {ns} -6 route show proto 87"));
    if run(&format!("ip -n {ns} -o link show")).contains("weir.1") {
        out += &run(&format!("ip -n {ns} neigh show dev weir.1 nud permanent"));
        out += &run(&format!(
            "ip -n {ns} -6 neigh show dev weir.1 nud permanent"
        ));
        out += &run(&format!("bridge -n {ns} fdb show dev weir.1"));
        out += &run(&format!("ip -n {ns} -d link show weir.1"));
        out += &run(&format!("ip -n {ns} addr show dev weir.1"));
    }
    out
}

/// A TCP stream from pod `from` to pod `to` that keeps carrying data (4 kB every 5 ms) in the
/// background until [`Flow::finish`], which says whether every byte arrived intact on the one
/// connection and how long the longest silence at the receiver was (an outage shows there even
/// though TCP would hide it by retransmitting).
pub struct Flow {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writer: std::thread::JoinHandle<std::io::Result<u64>>,
    reader: std::thread::JoinHandle<std::io::Result<(u64, Duration)>>,
}

impl Flow {
    pub fn start(from: &SimNode, to: &SimNode, to_ip: IpAddr) -> Flow {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = NetNs::named(&to.pod_ns)
            .unwrap()
            .run(|| TcpListener::bind(SocketAddr::new(to_ip, 0)))
            .unwrap()
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = NetNs::named(&from.pod_ns)
            .unwrap()
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(3)))
            .unwrap()
            .unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let writer = std::thread::spawn(move || {
            let mut sent = 0u64;
            let chunk: Vec<u8> = (0..4096u32).map(|k| (k % 251) as u8).collect();
            while !stop2.load(Ordering::SeqCst) {
                client.write_all(&chunk)?;
                sent += chunk.len() as u64;
                std::thread::sleep(Duration::from_millis(5));
            }
            client.shutdown(std::net::Shutdown::Write)?;
            Ok(sent)
        });
        let reader = std::thread::spawn(move || {
            let mut got = 0u64;
            let mut buf = vec![0u8; 4096];
            let mut last = std::time::Instant::now();
            let mut longest = Duration::ZERO;
            loop {
                let n = server.read(&mut buf)?;
                longest = longest.max(last.elapsed());
                last = std::time::Instant::now();
                if n == 0 {
                    return Ok((got, longest));
                }
                for (k, b) in buf[..n].iter().enumerate() {
                    let expected = (((got as usize + k) % 4096) % 251) as u8;
                    if *b != expected {
                        return Err(std::io::Error::other("corrupted byte"));
                    }
                }
                got += n as u64;
            }
        });
        Flow {
            stop,
            writer,
            reader,
        }
    }

    /// Stops the flow; Ok((bytes, longest silence)) when all of them arrived.
    pub fn finish(self) -> Result<(u64, Duration), String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let sent = self.writer.join().unwrap();
        let sent = sent.map_err(|e| format!("send: {e}"))?;
        let received = self.reader.join().unwrap();
        let (got, longest) = received.map_err(|e| format!("receive: {e}"))?;
        if sent != got {
            return Err(format!("sent {sent} bytes, received {got}"));
        }
        Ok((got, longest))
    }
}
