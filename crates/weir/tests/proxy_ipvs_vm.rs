//! `weir proxy --proxy-mode ipvs` in the qemu VM (Debian's kernel has IPVS and `dummy`; this
//! machine's does not): kube-proxy's layout as `ipvsadm`, `ipset` and `iptables-save` show
//! it, and real packets through it — ClusterIP spread per scheduler (rr, sh), NodePort, LB
//! IP, hairpin, externalTrafficPolicy Local, rejection without endpoints, session affinity,
//! externalIPs, internalTrafficPolicy Local, terminating endpoints, topology hints, an
//! incremental change, graceful termination, a restart keeping a connection, cleanup,
//! IPv6 and SCTP packets; and `weir lab` with ipvs proxies on the lab_services probe set and
//! on the dual-stack lab (with `weir trace` on two of its IPv6 packets).
//! One VM boot for the binary; skips with a clear message where qemu cannot run
//! (docs/vm.md).
//!
//! Topology inside the VM (names carry the test's pid):
//!
//! ```text
//!  client ns 10.0.0.2 ── 10.0.0.1  node ns (weir proxy)  10.244.1.1 ── pod p1 10.244.1.11 (node-a)
//!                                                        10.244.2.1 ── pod p2 10.244.2.12 ("node-b")
//! ```
//! p2 is attached to the same namespace but its EndpointSlice says node-b, so it is a
//! remote endpoint for traffic policy Local — and for hairpin: p2 reaching itself through a
//! service would be masqueraded on its own node, so no step has p2 ask a service that may
//! send it to itself.

use std::time::{Duration, Instant};

mod common;
use common::services::{assert_services_within, SERVICES, TWO_NODES};
use common::{vm_lab, WEIR};

/// A TCP Service (clusterIP, `spec`'s other fields) and, when it has endpoints, its
/// EndpointSlice (`(address, node)` pairs, port 8080).
fn service(name: &str, cluster_ip: &str, spec: &str, endpoints: &[(&str, &str)]) -> String {
    service_proto(name, cluster_ip, "TCP", spec, endpoints)
}

/// [`service`] for another protocol (the EndpointSlice's port carries it); the clusterIP's
/// family makes the slice's addressType.
fn service_proto(
    name: &str,
    cluster_ip: &str,
    protocol: &str,
    spec: &str,
    endpoints: &[(&str, &str)],
) -> String {
    let address_type = if cluster_ip.contains(':') {
        "IPv6"
    } else {
        "IPv4"
    };
    let mut yaml = format!(
        "---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
{spec}"
    );
    if !endpoints.is_empty() {
        yaml += &format!(
            "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: {address_type}
ports: [{{port: 8080, protocol: {protocol}}}]
endpoints:
"
        );
        for (addr, node) in endpoints {
            yaml += &format!("  - {{addresses: [{addr}], nodeName: {node}}}\n");
        }
    }
    yaml
}

const P1: (&str, &str) = ("10.244.1.11", "node-a");
const P2: (&str, &str) = ("10.244.2.12", "node-b");

/// The services the proxy starts with.
fn services() -> String {
    [
        service(
            "web",
            "10.96.0.10",
            "  type: LoadBalancer
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.80}]}
",
            &[P1, P2],
        ),
        service(
            "loc",
            "10.96.0.11",
            "  type: NodePort
  externalTrafficPolicy: Local
  ports: [{port: 80, targetPort: 8080, nodePort: 30081}]
",
            &[P1, P2],
        ),
        service(
            "empty",
            "10.96.0.12",
            "  ports: [{port: 80, targetPort: 8080}]\n",
            &[],
        ),
        service(
            "aff",
            "10.96.0.13",
            "  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{port: 80, targetPort: 8080}]
",
            &[P1, P2],
        ),
    ]
    .concat()
}

/// A service added by the incremental step (its endpoint is the file's last line, which the
/// graceful-termination step removes).
fn added() -> String {
    service(
        "added",
        "10.96.0.14",
        "  ports: [{port: 80, targetPort: 8080}]\n",
        &[P2],
    )
}

/// Shell prelude every step shares: names, helpers.
fn prelude(tag: &str) -> String {
    format!(
        r#"T={tag}; N=$T-n; C=$T-c; P1=$T-1; P2=$T-2; D=/tmp/$T
WEIR={WEIR}
inn() {{ ip netns exec "$@"; }}
# one TCP request: prints the echo server's "<name> <peer ip>"
ask() {{ inn $1 busybox nc -w 2 $2 $3 </dev/null 2>&1 | head -1; }}
# waits (up to $2 or 40 s) until the command succeeds
wait_for() {{ end=$(($(date +%s) + ${{2:-40}})); until eval "$1" >/dev/null 2>&1; do [ $(date +%s) -lt $end ] || {{ echo "timed out: $1"; return 1; }}; sleep 0.2; done; }}
start_proxy() {{
  # `ip netns exec` forks: the shell inside records weir's own pid, then becomes weir
  inn $N sh -c 'echo $$ > '$D/proxy.pid'; exec "$@"' sh $WEIR proxy --proxy-mode ipvs "$@" \
    --manifests $D/m --state-dir $D/state --cluster-cidr 10.244.0.0/16 \
    --hostname-override node-a --manifest-poll-interval 100ms --min-sync-period 0s \
    >>$D/proxy.log 2>&1 </dev/null &
  wait_for "[ -s $D/proxy.pid ]"
}}
# gone, or a zombie: the guest's init does not reap the orphans of finished scripts
gone() {{ ! kill -0 $1 2>/dev/null || grep -q '^State:.*Z' /proc/$1/status; }}
stop_proxy() {{ p=$(cat $D/proxy.pid); rm $D/proxy.pid; kill $p; wait_for "gone $p"; }}
"#
    )
}

struct Teardown<'a> {
    vm: &'a weir_vmtest::Vm,
    tag: String,
}

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        let script = format!(
            "{}
[ -f /tmp/$T.trace ] && tail -40 /tmp/$T.trace; rm -f /tmp/$T.trace
echo '## proxy log'; tail -8 $D/proxy.log; ps -ef | grep -v grep | grep 'weir proxy' 
for f in $D/*.pid; do kill $(cat $f) 2>/dev/null; done
for ns in $N $C $P1 $P2; do ip netns del $ns 2>/dev/null; done
rm -rf $D; true",
            prelude(&self.tag)
        );
        if let Ok(out) = self.vm.run(&script) {
            if std::thread::panicking() {
                eprintln!("trace of the last step:\n{}", out.stdout);
            }
        }
    }
}

fn step(vm: &weir_vmtest::Vm, tag: &str, what: &str, script: &str) -> String {
    let started = Instant::now();
    let out = vm
        .run_timeout(
            &format!("{}set -e\n{script}", prelude(tag)),
            Duration::from_secs(240),
        )
        .expect("the VM answers");
    eprintln!("timing: {what}: {:?}", started.elapsed());
    assert_eq!(
        out.status, 0,
        "{what} failed:\n--- stdout\n{}\n--- stderr\n{}",
        out.stdout, out.stderr
    );
    out.stdout
}

/// IPv6 and SCTP through ipvs mode: an IPv6 ClusterIP (its own family's virtual server, ipsets
/// and ip6tables rules), an SCTP ClusterIP and an SCTP NodePort over both pods.
fn v6_and_sctp() -> String {
    [
        service(
            "six",
            "fd00:96::10",
            "  ipFamilies: [IPv6]
  ports: [{port: 80, targetPort: 8080}]
",
            &[("fd00:244:1::11", "node-a")],
        ),
        service_proto(
            "sc",
            "10.96.0.15",
            "SCTP",
            "  type: NodePort
  ports: [{port: 80, targetPort: 8080, protocol: SCTP, nodePort: 30082}]
",
            &[P1, P2],
        ),
    ]
    .concat()
}

/// The services of the policies step, as crates/proxy/tests/fixtures/parity has them for the
/// other modes: an externalIP, internalTrafficPolicy Local, endpoints that are all terminating
/// (p1 still serving, p2 not) and zone hints (p1 for zone-a, p2 for zone-b), with this node's
/// Node object in zone-a.
fn policies() -> String {
    let slice = |name: &str, endpoints: &str| {
        format!(
            "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{port: 8080, protocol: TCP}}]
endpoints:
{endpoints}"
        )
    };
    [
        // First: the services after it are waited for, and the hints need the node's zone.
        "---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
"
        .to_string(),
        service(
            "eip",
            "10.96.0.16",
            "  externalIPs: [198.51.100.16]\n  ports: [{port: 80, targetPort: 8080}]\n",
            &[P1, P2],
        ),
        service(
            "itp",
            "10.96.0.17",
            "  internalTrafficPolicy: Local\n  ports: [{port: 80, targetPort: 8080}]\n",
            &[P1, P2],
        ),
        service("term", "10.96.0.18", "  ports: [{port: 80, targetPort: 8080}]\n", &[]),
        slice(
            "term",
            "  - {addresses: [10.244.1.11], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
  - {addresses: [10.244.2.12], nodeName: node-b, conditions: {ready: false, serving: false, terminating: true}}
",
        ),
        service("hints", "10.96.0.19", "  ports: [{port: 80, targetPort: 8080}]\n", &[]),
        slice(
            "hints",
            "  - {addresses: [10.244.1.11], nodeName: node-a, zone: zone-a, hints: {forZones: [{name: zone-a}]}}
  - {addresses: [10.244.2.12], nodeName: node-b, zone: zone-b, hints: {forZones: [{name: zone-b}]}}
",
        ),
    ]
    .concat()
}

/// The parity cells the other steps leave: externalIPs, internalTrafficPolicy Local,
/// terminating endpoints and topology hints, with packets (a step of [`ipvs_mode_in_the_vm`]
/// after its datapath step).
fn traffic_policies(vm: &weir_vmtest::Vm, tag: &str) {
    let out = step(
        vm,
        tag,
        "policies",
        &format!(
            r#"cat > $D/m/policies.yaml <<'EOF'
{policies}EOF
wait_for "inn $N ipvsadm -Ln -t 10.96.0.19:80 | grep -q 10.244.1.11"
echo '## ipvsadm'; for vs in 198.51.100.16:80 10.96.0.17:80 10.96.0.18:80 10.96.0.19:80; do inn $N ipvsadm -Ln -t $vs | grep -E '^TCP|->' | grep -v 'RemoteAddress'; done
echo '## eip'; for i in 1 2 3 4; do ask $C 198.51.100.16 80; done
echo '## itp'; for i in 1 2 3 4; do ask $P2 10.96.0.17 80; done
echo '## term'; for i in 1 2 3 4; do ask $P2 10.96.0.18 80; done
echo '## hints'; for i in 1 2 3 4; do ask $P2 10.96.0.19 80; done
echo '## end'
"#,
            policies = policies()
        ),
    );
    eprintln!("{out}");
    let section = |name: &str| section_of(&out, name);
    // externalIP from outside: its own virtual server, both pods, masqueraded (kube-proxy's
    // KUBE-EXTERNAL-IP rule marks it)
    assert!(
        section("ipvsadm").contains("TCP  198.51.100.16:80 rr"),
        "{out}"
    );
    let eip = section("eip");
    let eip_names = names(&eip);
    assert_eq!(eip_names.len(), 4, "{out}");
    assert!(
        eip_names.contains(&"p1") && eip_names.contains(&"p2"),
        "{out}"
    );
    assert!(!eip.contains("10.0.0.2"), "not masqueraded: {out}");
    // The other three: only p1 (the local, the serving, the hinted endpoint), from p2
    // routed, so p2's own address is kept.
    for s in ["itp", "term", "hints"] {
        let got = section(s);
        assert!(
            got.lines().count() == 4 && got.lines().all(|l| l == "p1 10.244.2.12"),
            "{s}: {out}"
        );
    }
}

/// Python (the host's, so also the guest's): an echo server for what `weir lab echo-server`
/// does not speak (TCP over IPv6, SCTP), answering "<name> <peer address>"; and its client,
/// which prints that line or "error <reason>".
const PY_SERVER: &str = r#"import socket, sys, threading
name = sys.argv[1]
def serve(family, proto, addr):
    s = socket.socket(family, socket.SOCK_STREAM, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(addr)
    s.listen(16)
    while True:
        c, peer = s.accept()
        c.sendall(("%s %s\n" % (name, peer[0])).encode())
        c.close()
for args in ((socket.AF_INET6, 0, ("::", 8080)), (socket.AF_INET, socket.IPPROTO_SCTP, ("0.0.0.0", 8080))):
    threading.Thread(target=serve, args=args, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;
const PY_CLIENT: &str = r#"import socket, sys
host, port, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_SCTP if proto == "sctp" else 0)
s.settimeout(3)
try:
    s.connect((host, port))
    print(s.recv(100).decode().strip())
except OSError as e:
    print("error", e)
"#;

/// The lines a step printed after its `## <name>` marker, up to the next marker.
fn section_of(out: &str, name: &str) -> String {
    out.split(&format!("## {name}\n"))
        .nth(1)
        .and_then(|s| s.split("## ").next())
        .unwrap_or_default()
        .to_string()
}

/// The backend's name per answer line ("p1 10.0.0.2" → "p1"); lines that are not an
/// answer ("nc: timed out") have none, so they never count as one.
fn names(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.len() > 1 && w.starts_with('p') && w[1..].bytes().all(|b| b.is_ascii_digit()))
        .collect()
}

/// IPv6 and SCTP packets through ipvs mode (a step of [`ipvs_mode_in_the_vm`], after its
/// datapath step: the proxy is running, p1 and p2 answer).
fn ipv6_and_sctp(vm: &weir_vmtest::Vm, tag: &str) {
    let out = step(
        vm,
        tag,
        "ipv6 and sctp",
        &format!(
            r#"cat > $D/echo.py <<'EOF'
{PY_SERVER}EOF
cat > $D/ask.py <<'EOF'
{PY_CLIENT}EOF
i=1; for P in $P1 $P2; do
  inn $P ip -6 addr add fd00:244:$i::1$i/64 dev eth0 nodad
  inn $P ip -6 route add default via fd00:244:$i::1
  inn $P setsid python3 $D/echo.py p$i >$D/py$i.log 2>&1 </dev/null &
  echo $! > $D/py$i.pid
  i=$((i+1))
done
inn $N sysctl -qw net.ipv6.conf.all.forwarding=1
wait_for "grep -q ready $D/py1.log && grep -q ready $D/py2.log"
cat >> $D/m/services.yaml <<'EOF'
{extra}EOF
wait_for "inn $N ipvsadm -Ln | grep -q 'fd00:96::10' && inn $N ipvsadm -Ln | grep -q 10.96.0.15:80"
echo '## ipvsadm'; inn $N ipvsadm -Ln | grep -A2 -E 'fd00:96::10|SCTP'
echo '## ipset'; inn $N ipset list KUBE-6-CLUSTER-IP | grep -i fd00; inn $N ipset list KUBE-NODE-PORT-SCTP-HASH | grep 30082
echo '## six'; for i in 1 2; do inn $P2 python3 $D/ask.py fd00:96::10 80 tcp; done
echo '## sctp'; for i in 1 2 3 4; do inn $P1 python3 $D/ask.py 10.96.0.15 80 sctp; done
echo '## sctp-nodeport'; for i in 1 2; do inn $C python3 $D/ask.py 10.0.0.1 30082 sctp; done
echo '## end'
"#,
            extra = v6_and_sctp()
        ),
    );
    eprintln!("{out}");
    let section = |name: &str| section_of(&out, name);
    let ipvs = section("ipvsadm");
    for want in [
        "TCP  [fd00:96::10]:80 rr",
        "-> [fd00:244:1::11]:8080",
        "SCTP 10.96.0.15:80 rr",
        "SCTP 10.0.0.1:30082 rr",
    ] {
        assert!(ipvs.contains(want), "missing {want:?}: {ipvs}");
    }
    let sets = section("ipset");
    assert!(
        sets.contains("fd00:96::10,tcp:80") && sets.contains("10.0.0.1,sctp:30082"),
        "{sets}"
    );
    // IPv6: p2 reaches p1 through the v6 ClusterIP (routed, so its own address is kept)
    let six = section("six");
    assert!(
        six.lines().count() == 2 && six.lines().all(|l| l == "p1 fd00:244:2::12"),
        "{six}"
    );
    // SCTP ClusterIP: spread over both pods (rr), the pod's own address kept except on the
    // hairpin to itself
    let sctp = section("sctp");
    let sctp_names = names(&sctp);
    assert_eq!(sctp_names.len(), 4, "{sctp}");
    assert!(
        sctp_names.contains(&"p1") && sctp_names.contains(&"p2"),
        "{sctp}"
    );
    assert!(sctp.contains("p2 10.244.1.11"), "{sctp}");
    // SCTP NodePort from outside: answered and masqueraded
    let np = section("sctp-nodeport");
    assert_eq!(names(&np).len(), 2, "{np}");
    assert!(
        np.lines()
            .all(|l| l.starts_with('p') && !l.contains("10.0.0.2")),
        "{np}"
    );
}

#[test]
fn ipvs_mode_in_the_vm() {
    let Some((vm, _turn)) = vm_lab::vm_turn() else {
        return;
    };
    let tag = format!("iv{}", std::process::id());
    let _teardown = Teardown {
        vm,
        tag: tag.clone(),
    };

    // --- topology, echo servers, the proxy
    step(
        vm,
        &tag,
        "topology",
        &format!(
            r#"mkdir -p $D/m
cat > $D/m/services.yaml <<'EOF'
{services}EOF
for ns in $N $C $P1 $P2; do ip netns add $ns; inn $ns ip link set lo up; done
ip link add $T-nc netns $N type veth peer name eth0 netns $C
inn $N ip addr add 10.0.0.1/24 dev $T-nc; inn $N ip link set $T-nc up
inn $C ip addr add 10.0.0.2/24 dev eth0; inn $C ip link set eth0 up; inn $C ip route add default via 10.0.0.1
i=1; for P in $P1 $P2; do
  ip link add $T-p$i netns $N type veth peer name eth0 netns $P
  inn $N ip addr add 10.244.$i.1/24 dev $T-p$i; inn $N ip link set $T-p$i up
  inn $P ip addr add 10.244.$i.1$i/24 dev eth0; inn $P ip link set eth0 up; inn $P ip route add default via 10.244.$i.1
  # (the node's IPv6 side now: a node address added later changes the NodePort addresses,
  # and the next periodic check would turn some later step's partial sync into a full one)
  inn $N ip -6 addr add fd00:244:$i::1/64 dev $T-p$i nodad
  setsid $WEIR lab echo-server --netns /run/netns/$P --name p$i >$D/echo$i.log 2>&1 </dev/null &
  echo $! > $D/echo$i.pid
  i=$((i+1))
done
wait_for "grep -q ready $D/echo1.log && grep -q ready $D/echo2.log"
start_proxy
wait_for "grep -q synced $D/proxy.log" 100
grep synced $D/proxy.log
"#,
            services = services()
        ),
    );

    // --- kube-proxy's layout
    let layout = step(
        vm,
        &tag,
        "layout",
        r#"echo '## ipvsadm'; inn $N ipvsadm -Ln
echo '## ipvsadm-save'; inn $N ipvsadm -Sn
echo '## dummy'; inn $N ip -o addr show dev kube-ipvs0
echo '## ipset'; inn $N ipset list -n
echo '## loopback'; inn $N ipset list KUBE-LOOP-BACK
echo '## nat'; inn $N iptables -t nat -S
echo '## filter'; inn $N iptables -S
echo '## sysctl'; inn $N sysctl -n net.ipv4.vs.conntrack net.ipv4.vs.expire_nodest_conn net.ipv4.vs.expire_quiescent_template
"#,
    );
    eprintln!("{layout}");
    for want in [
        "TCP  10.96.0.10:80 rr",
        "  -> 10.244.1.11:8080             Masq    1",
        "  -> 10.244.2.12:8080             Masq    1",
        "TCP  192.0.2.80:80 rr",
        "TCP  10.0.0.1:30080 rr",
        "TCP  10.96.0.13:80 rr persistent 600",
        "-A -t 10.96.0.12:80 -s rr\n",
        "inet 10.96.0.10/32",
        "inet 192.0.2.80/32",
        "KUBE-CLUSTER-IP\n",
        "KUBE-LOAD-BALANCER\n",
        "KUBE-NODE-PORT-TCP\n",
        "KUBE-NODE-PORT-LOCAL-TCP\n",
        "10.244.1.11,tcp:8080,10.244.1.11",
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        "-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER",
        "## sysctl\n1\n1\n1\n",
    ] {
        assert!(layout.contains(want), "missing {want:?}");
    }
    // eTP Local: the NodePort's virtual server has only the local endpoint.
    let np_local = layout
        .split("TCP  10.0.0.1:30081 rr")
        .nth(1)
        .and_then(|s| s.split("\nTCP").next())
        .unwrap();
    assert!(
        np_local.contains("10.244.1.11") && !np_local.contains("10.244.2.12"),
        "{np_local}"
    );

    // --- datapath
    let out = step(
        vm,
        &tag,
        "datapath",
        r#"echo '## rr'; for i in 1 2 3 4; do ask $P1 10.96.0.10 80; done
echo '## hairpin'; for i in 1 2 3 4; do ask $P1 10.96.0.10 80; done | grep '^p1' || true
echo '## nodeport'; for i in 1 2; do ask $C 10.0.0.1 30080; done
echo '## lb'; for i in 1 2; do ask $C 192.0.2.80 80; done
echo '## local'; for i in 1 2 3; do ask $C 10.0.0.1 30081; done
echo '## affinity'; for i in 1 2 3 4 5 6; do ask $P1 10.96.0.13 80; done
echo '## empty'; ask $P1 10.96.0.12 80
echo '## other-port'; ask $P1 10.96.0.10 81
echo '## end'
"#,
    );
    eprintln!("{out}");
    let section = |name: &str| section_of(&out, name);
    let rr = section("rr");
    let rr_names = names(&rr);
    // rr from one client: the two backends alternate.
    assert_eq!(rr_names.len(), 4, "{rr}");
    assert_eq!(rr_names.iter().filter(|n| **n == "p1").count(), 2, "{rr}");
    assert_eq!(rr_names.iter().filter(|n| **n == "p2").count(), 2, "{rr}");
    // Hairpin: p1 reaching itself through the service sees the node's address, not its own.
    let hairpin = section("hairpin");
    assert!(
        !hairpin.is_empty() && hairpin.lines().all(|l| l == "p1 10.244.1.1"),
        "{hairpin}"
    );
    // NodePort and LB from outside (policy Cluster): answered, masqueraded.
    for s in ["nodeport", "lb"] {
        let got = section(s);
        assert_eq!(names(&got).len(), 2, "{s}: {got}");
        assert!(
            !got.contains("10.0.0.2"),
            "{s} should be masqueraded: {got}"
        );
    }
    // eTP Local: only the local endpoint, and the client's own address kept.
    let local = section("local");
    assert!(
        local.lines().count() == 3 && local.lines().all(|l| l == "p1 10.0.0.2"),
        "{local}"
    );
    // ClientIP affinity: one backend for every connection.
    let aff = section("affinity");
    let aff_names = names(&aff);
    assert_eq!(aff_names.len(), 6, "{aff}");
    assert!(aff_names.iter().all(|n| *n == aff_names[0]), "{aff}");
    // No endpoints: refused at once (IPVS answers ICMP port unreachable), not a timeout.
    let empty = section("empty");
    assert!(
        names(&empty).first().is_none_or(|n| !n.starts_with('p')),
        "{empty}"
    );
    assert!(empty.to_lowercase().contains("refused"), "{empty}");
    // A VIP's other ports are rejected (KUBE-IPVS-FILTER), not the node's own.
    assert!(section("other-port").to_lowercase().contains("refused"));

    // --- externalIPs, iTP Local, terminating endpoints, topology hints
    traffic_policies(vm, &tag);

    // --- IPv6 and SCTP
    ipv6_and_sctp(vm, &tag);

    // --- incremental change: one service added, the others untouched
    let out = step(
        vm,
        &tag,
        "incremental",
        &format!(
            r#"inn $N ipvsadm -Sn | sort > $D/before
cat >> $D/m/services.yaml <<'EOF'
{added}EOF
wait_for "inn $N ipvsadm -Ln | grep -q 10.96.0.14:80"
inn $N ipvsadm -Sn | sort > $D/after
diff $D/before $D/after || true
echo '## log'; grep synced $D/proxy.log | tail -1
echo '## ask'; ask $P1 10.96.0.14 80
"#,
            added = added()
        ),
    );
    eprintln!("{out}");
    let diff: Vec<&str> = out
        .lines()
        .take_while(|l| !l.starts_with("## log"))
        .filter(|l| l.starts_with('<') || l.starts_with('>'))
        .collect();
    assert_eq!(
        diff,
        vec![
            "> -A -t 10.96.0.14:80 -s rr",
            "> -a -t 10.96.0.14:80 -r 10.244.2.12:8080 -m -w 1"
        ],
        "{out}"
    );
    assert!(
        out.contains("kind=Partial") && out.contains("touched=1"),
        "{out}"
    );
    assert!(out.contains("## ask\np2 10.244.1.11"), "{out}");

    // --- restart keeps an established connection; graceful termination of its backend
    let out = step(
        vm,
        &tag,
        "restart and graceful termination",
        r#"exec 2>/tmp/$T.trace; set -x  # shown if the step fails
# the client writes a line each time the test drops a marker file
( echo one; for m in go2 go3 done; do
    while [ ! -f $D/$m ]; do sleep 0.2; done; [ $m = done ] || echo ${m#go}; done
) 2>/dev/null | inn $P1 busybox nc 10.96.0.14 80 >$D/conn.out 2>&1 &
wait_for "grep -q 'one' $D/conn.out"
n=$(grep -c synced $D/proxy.log)
stop_proxy
start_proxy
wait_for "[ \$(grep -c synced $D/proxy.log) -gt $n ]" 100
echo '## restarted'; tail -1 $D/proxy.log
touch $D/go2
wait_for "grep -q ' 2$' $D/conn.out"
echo '## conn'; cat $D/conn.out
# p2 leaves "added" (the last lines of the file) while the connection is open
sed -i '$d' $D/m/services.yaml
sed -i '$s/endpoints:/endpoints: []/' $D/m/services.yaml
wait_for "inn $N ipvsadm -Ln -t 10.96.0.14:80 | grep -q 'Masq    0 '"
echo '## draining'; inn $N ipvsadm -Ln -t 10.96.0.14:80
touch $D/go3
wait_for "grep -q ' 3$' $D/conn.out"
echo '## after'; cat $D/conn.out
set +x
echo '## new'; ask $P1 10.96.0.14 80 || true
touch $D/done
echo '## end'
"#,
    );
    eprintln!("{out}");
    let conn = out
        .split("## conn\n")
        .nth(1)
        .unwrap()
        .split("##")
        .next()
        .unwrap();
    assert!(conn.contains("p2 10.244.1.11 one"), "{conn}");
    assert!(
        conn.contains("p2 10.244.1.11 2"),
        "the connection did not survive the restart: {conn}"
    );
    let draining = out
        .split("## draining\n")
        .nth(1)
        .unwrap()
        .split("##")
        .next()
        .unwrap();
    // weight 0, one active connection: drained, not cut
    assert!(
        draining.contains("10.244.2.12:8080             Masq    0      1"),
        "{draining}"
    );
    assert!(
        out.contains("p2 10.244.1.11 3"),
        "the draining connection was cut: {out}"
    );
    // no new connection goes to the draining real server: the service has none left
    let new = out
        .split("## new\n")
        .nth(1)
        .unwrap()
        .split("##")
        .next()
        .unwrap();
    assert!(new.to_lowercase().contains("refused"), "{new}");

    // --- another scheduler: sh (source hashing) sends one client to one backend
    let out = step(
        vm,
        &tag,
        "scheduler sh",
        r#"n=$(grep -c synced $D/proxy.log)
stop_proxy
start_proxy --ipvs-scheduler sh
wait_for "[ \$(grep -c synced $D/proxy.log) -gt $n ]" 100
echo '## sh'; for i in 1 2 3 4 5 6; do ask $P1 10.96.0.10 80; done
echo '## rr-left'; inn $N ipvsadm -Ln | grep -c ' rr' || true
"#,
    );
    eprintln!("{out}");
    let sh = out
        .split("## sh\n")
        .nth(1)
        .unwrap()
        .split("##")
        .next()
        .unwrap();
    let sh_names = names(sh);
    assert_eq!(sh_names.len(), 6, "{sh}");
    assert!(sh_names.iter().all(|n| *n == sh_names[0]), "{sh}");
    assert!(
        out.contains("## rr-left\n0\n"),
        "every virtual server changed scheduler: {out}"
    );

    outside_changes_are_repaired(vm, &tag);

    // --- cleanup leaves nothing
    let out = step(
        vm,
        &tag,
        "cleanup",
        r#"stop_proxy
inn $N $WEIR proxy cleanup --proxy-mode ipvs
echo '## ipvs'; inn $N ipvsadm -Sn
echo '## link'; inn $N ip link show kube-ipvs0 2>&1 || true
echo '## sets'; inn $N ipset list -n
echo '## rules'; inn $N iptables-save | grep -c KUBE- || true
echo '## rules6'; inn $N ip6tables-save | grep -c KUBE- || true
"#,
    );
    eprintln!("{out}");
    assert!(out.contains("## ipvs\n## link"), "{out}");
    assert!(out.contains("does not exist"), "{out}");
    assert!(
        out.contains("## sets\n## rules\n0\n## rules6\n0\n"),
        "{out}"
    );
}

/// Outside changes to what ipvs mode wrote, none of which a partial sync looks at (its cost
/// follows the change, not the cluster): the agent's periodic `intact` check (--sync-period
/// 1s) repairs them with no object change. A virtual server deleted with `ipvsadm -D`, a VIP
/// deleted from kube-ipvs0, a flushed nat `KUBE-MARK-MASQ`, and a new node address, which
/// gets its NodePort virtual server. Then a new service still arrives by a partial sync.
fn outside_changes_are_repaired(vm: &weir_vmtest::Vm, tag: &str) {
    let extra = service(
        "extra",
        "10.96.0.15",
        "  ports: [{port: 80, targetPort: 8080}]\n",
        &[P1],
    );
    let out = step(
        vm,
        tag,
        "outside changes",
        &format!(
            r#"n=$(grep -c synced $D/proxy.log)
stop_proxy
start_proxy --sync-period 1s
wait_for "[ \$(grep -c synced $D/proxy.log) -gt $n ]" 100
inn $N ipvsadm -D -t 10.96.0.10:80
wait_for "inn $N ipvsadm -Ln -t 10.96.0.10:80" 60
echo '## web'; ask $C 10.96.0.10 80
inn $N ip addr del 10.96.0.10/32 dev kube-ipvs0
wait_for "inn $N ip -o addr show dev kube-ipvs0 | grep -q 10.96.0.10/32" 60
echo '## vip'; ask $C 10.96.0.10 80
inn $N iptables -t nat -F KUBE-MARK-MASQ
wait_for "inn $N iptables -t nat -S KUBE-MARK-MASQ | grep -q -- '-A KUBE-MARK-MASQ'" 60
echo '## masq'; inn $N iptables -t nat -S KUBE-MARK-MASQ
inn $N ip addr add 10.0.0.9/24 dev $T-nc
wait_for "inn $N ipvsadm -Ln -t 10.0.0.9:30080" 60
echo '## new node address'; ask $C 10.0.0.9 30080
echo '## resynced'; grep -c 'changed behind its back' $D/proxy.log
grep -c 'NodePort addresses changed' $D/proxy.log
cat > $D/m/extra.yaml <<'EOF'
{extra}EOF
wait_for "inn $N ipvsadm -Ln -t 10.96.0.15:80" 60
echo '## extra'; ask $C 10.96.0.15 80
"#
        ),
    );
    eprintln!("{out}");
    // (No check that the deleted server was gone: with a 1 s period the repair may already
    // have run. The resync count below shows each outside change was seen.)
    let answered = |section: &str| {
        let after = out.split(&format!("## {section}\n")).nth(1).unwrap();
        assert!(
            after.starts_with("p1 ") || after.starts_with("p2 "),
            "{section}: {out}"
        );
    };
    for section in ["web", "vip", "new node address", "extra"] {
        answered(section);
    }
    assert!(
        out.contains(
            "## masq\n-N KUBE-MARK-MASQ\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"
        ),
        "{out}"
    );
    // one full resync per outside change: the server, the VIP, the chain, the address
    assert!(out.contains("## resynced\n4\n1\n"), "{out}");
}

/// `weir lab up --proxy-mode ipvs` on the two-node lab of `lab_services`, then `weir lab check`:
/// the same service probe set and semantic checks the nftables, iptables and userspace modes
/// pass on this kernel (ClusterIP from pods and nodes, NodePort, LB IP, eTP Local keeping the
/// client's address, hairpin, health check node port, no-endpoints rejection), and the pod
/// matrix; then `weir lab down` leaves no namespace. Node a has no endpoint of `edge`
/// (externalTrafficPolicy Local): its pods reach edge's LB IP through the cluster endpoints,
/// outside clients of its NodePort get no answer, and its health check node port answers 503.
#[test]
fn lab_services_ipvs_in_the_vm() {
    let Some((vm, _turn)) = vm_lab::vm_turn() else {
        return;
    };
    let name = format!("lv{}", std::process::id());
    let run = vm_lab::run(
        vm,
        &name,
        &format!("name: {name}\n{TWO_NODES}{SERVICES}"),
        "ipvs",
        &format!(
            "echo '## check' >&2; {WEIR} lab check $LAB >&2
echo '## ipvsadm a' >&2; ip netns exec wl-$LAB-a ipvsadm -Ln >&2
echo '## firewall a' >&2; ip netns exec wl-$LAB-a iptables -S KUBE-PROXY-FIREWALL >&2
echo '## health listener a' >&2; ip netns exec wl-$LAB-a ss -Hltn 'sport = :30002' >&2
echo '## health set a' >&2; ip netns exec wl-$LAB-a ipset list KUBE-HEALTH-CHECK-NODE-PORT >&2
echo '## end' >&2
grep -h 'synced mode' $WEIR_LAB_STATE/$LAB/logs/proxy-[ab].log | head -2 >&2
set -e
{WEIR} lab down $LAB >&2
echo \"## namespaces left: $(ls /run/netns | grep -c ^wl-$LAB- || true)\" >&2"
        ),
    );
    let log = &run.log;
    assert!(
        log.contains("weir proxy --proxy-mode ipvs healthy on 2"),
        "{log}"
    );
    // The lab's refusal window is scaled in the VM (vm_lab::TIMEOUT_SCALE), and so is this.
    assert_services_within(
        run.json["services"].as_array().unwrap(),
        Duration::from_secs(vm_lab::TIMEOUT_SCALE.into()),
    );
    for r in run.json["matrix"].as_array().unwrap() {
        assert_eq!(r["ok"], true, "pod matrix with ipvs proxies: {r}");
    }
    assert!(run.check_ok, "{log}");
    // the services really went through IPVS: node a's virtual servers
    assert!(log.contains("TCP  203.0.113.2:8443 rr"), "{log}");
    let section = |from: &str, to: &str| {
        let start = log
            .find(from)
            .unwrap_or_else(|| panic!("no {from}:\n{log}"));
        let rest = &log[start..];
        rest[..rest.find(to).unwrap_or(rest.len())].to_string()
    };
    // edge (policy Local) has no endpoint on node a: its LB IP's virtual server holds the
    // cluster endpoints (b1, b2) as kube-proxy's does, for node a's pods ...
    // (the real-server lines under its header)
    let edge_lb: String = section("TCP  203.0.113.2:8443 rr", "## firewall a")
        .lines()
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("->"))
        .collect::<Vec<_>>()
        .join("\n");
    for b in ["10.244.2.2:8080", "10.244.2.3:8080"] {
        assert!(
            edge_lb.contains(b),
            "edge's LB virtual server lacks {b}:\n{edge_lb}"
        );
    }
    // ... and outside clients are dropped before IPVS, on the LB IP and the NodePort.
    let firewall = section("## firewall a", "## health listener a");
    for vip in [
        "-d 203.0.113.2/32 -p tcp -m tcp --dport 8443",
        "-d 172.30.0.11/32 -p tcp -m tcp --dport 30001",
    ] {
        assert!(
            firewall.lines().any(|l| l.contains(vip)
                && l.contains("has no local endpoints")
                && l.ends_with("-j DROP")),
            "no drop for outside clients of {vip}:\n{firewall}"
        );
    }
    // The health check node port is the proxy's own listener, in the accept set, and no
    // virtual server takes it.
    let ipvs_a = section("## ipvsadm a", "## firewall a");
    assert!(!ipvs_a.contains(":30002 "), "{ipvs_a}");
    assert!(
        section("## health listener a", "## health set a").contains("LISTEN"),
        "{log}"
    );
    let hc_set = section("## health set a", "## end");
    assert!(hc_set.lines().any(|l| l.trim() == "30002"), "{hc_set}");
    assert!(log.contains("## namespaces left: 0"), "{log}");
}

/// The dual-stack lab's test: it reads weir_lab's topology, so it needs the `lab` feature (as
/// `weir lab` does).
#[cfg(feature = "lab")]
mod dual_stack {
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::Value;

    use super::common::dualstack::{assert_every_probe_in_both_families, is_v6, s};
    use super::common::{vm_lab, WEIR};

    /// The dual-stack lab (issue 22; weir_lab::DUAL_STACK_TOPOLOGY) with ipvs proxies: every
    /// probe of `weir lab check` passes in both families, with every IPv6 row there (the
    /// assertions of lab_dualstack.rs, shared); node a holds IPv6 virtual servers with
    /// masquerading real servers, the IPv6 ClusterIPs on kube-ipvs0, the `KUBE-6-CLUSTER-IP`
    /// ipset (family inet6) and ip6tables' MASQUERADE; NodePorts of policy Cluster from
    /// outside are masqueraded in both families. Then `weir trace` on node a's `weir trace
    /// collect` dir agrees with the probes on two IPv6 packets — pod a2 → web's IPv6 ClusterIP
    /// (an endpoint on each node) and outside → np's NodePort on node a's IPv6 address (its
    /// endpoint on node b) —: per endpoint, delivered, leaving with the source the echo
    /// server saw, and what goes on to node b walked there too and delivered unchanged. Last, node a's proxy, restarted with IPv6 forwarding off, turns it on again
    /// (it serves IPv6 virtual servers; before it did, it left it off).
    #[test]
    fn dual_stack_lab_ipvs_in_the_vm() {
        let Some((vm, _turn)) = vm_lab::vm_turn() else {
            return;
        };
        let name = format!("dv{}", std::process::id());
        let topology =
            weir_lab::DUAL_STACK_TOPOLOGY.replacen("name: dual\n", &format!("name: {name}\n"), 1);
        // Every probe must pass; a check that failed is run once more (`run_rechecked`).
        let run = vm_lab::run_rechecked(
            vm,
            &name,
            &topology,
            "ipvs",
            &format!(
                r###"echo '## ipvsadm a' >&2; ip netns exec wl-$LAB-a ipvsadm -Ln >&2
echo '## kube-ipvs0 a' >&2; ip netns exec wl-$LAB-a ip -6 addr show dev kube-ipvs0 >&2
echo '## ipsets a' >&2; ip netns exec wl-$LAB-a ipset list KUBE-6-CLUSTER-IP >&2
echo '## ip6tables nat a' >&2; ip netns exec wl-$LAB-a ip6tables -t nat -S KUBE-POSTROUTING >&2
TC=/tmp/tc-$LAB-a
{WEIR} trace collect $TC --netns wl-$LAB-a >/dev/null 2>&1
echo '## trace cluster-ip' >&2
{WEIR} trace --json --pod wl-$LAB-a-a2 --to fd00:10:96::1 --dport 80 $TC >&2 2>/dev/null
echo '## trace node-port' >&2
{WEIR} trace --json --from fd00:198:51:100::1 --iif eth0 --to fd00:172:30::b --dport 30081 $TC >&2 2>/dev/null
{WEIR} trace collect $TC-b --netns wl-$LAB-b >/dev/null 2>&1
for SRC in fd00:10:244:1::3 fd00:172:30::b; do
  echo "## trace on b from $SRC" >&2
  {WEIR} trace --json --from $SRC --iif eth0 --to fd00:10:244:2::2 --dport 8080 $TC-b >&2 2>/dev/null
done
echo '## end trace' >&2
for p in $(ip netns pids wl-$LAB-a); do
  tr '\0' ' ' < /proc/$p/cmdline | grep -q ' proxy --manifests ' && P=$p
done
[ -n "$P" ] || echo '## no weir proxy process in node a' >&2
CMD=$(tr '\0' ' ' < /proc/$P/cmdline)
ip netns exec wl-$LAB-a sysctl -qw net.ipv6.conf.all.forwarding=0
kill $P; while kill -0 $P 2>/dev/null; do sleep 0.2; done
ip netns exec wl-$LAB-a setsid $CMD >/tmp/proxy-again-$LAB.log 2>&1 </dev/null 3>&- &
AGAIN=$!
for i in $(seq 300); do grep -q 'synced' /tmp/proxy-again-$LAB.log && break; sleep 0.2; done
echo "## ipv6 forwarding after a restart: $(ip netns exec wl-$LAB-a sysctl -n net.ipv6.conf.all.forwarding)" >&2
kill $AGAIN"###
            ),
        );
        let log = &run.log;
        let section = |from: &str, to: &str| {
            let start = log
                .find(from)
                .unwrap_or_else(|| panic!("no {from}:\n{log}"))
                + from.len();
            let rest = &log[start..];
            rest[..rest.find(to).unwrap_or(rest.len())].to_string()
        };
        assert_every_probe_in_both_families(&run.json, "ipvs");
        assert!(run.check_ok, "{log}");
        // IPVS did it: IPv6 virtual servers and masquerading real servers, the ClusterIPs on
        // kube-ipvs0, the IPv6 ipsets, ip6tables' masquerade.
        let ipvs = section("## ipvsadm a", "## kube-ipvs0 a");
        for want in [
            "TCP  [fd00:10:96::1]:80 rr",
            "-> [fd00:10:244:2::2]:8080      Masq",
            "UDP  [fd00:10:96::2]:53 rr",
            "TCP  [fd00:172:30::b]:30081 rr",
        ] {
            assert!(ipvs.contains(want), "missing {want:?}:\n{ipvs}");
        }
        assert!(
            section("## kube-ipvs0 a", "## ipsets a").contains("inet6 fd00:10:96::1/128"),
            "{log}"
        );
        let sets = section("## ipsets a", "## ip6tables nat a");
        assert!(
            sets.contains("family inet6") && sets.contains("fd00:10:96::1,tcp:80"),
            "{sets}"
        );
        assert!(
            section("## ip6tables nat a", "## trace cluster-ip").contains("-j MASQUERADE"),
            "{log}"
        );
        // Masquerade in both families: NodePorts of policy Cluster from outside reach their
        // endpoints from a node address, not the client's.
        let services = run.json["services"].as_array().unwrap();
        for v6 in [false, true] {
            let rows: Vec<&Value> = services
                .iter()
                .filter(|r| r["kind"] == "node-port" && r["from"] == "outside")
                .filter(|r| is_v6(r, "to_ip") == v6)
                .collect();
            assert!(!rows.is_empty(), "no outside node-port row (v6 {v6})");
            for r in rows {
                for a in r["answers"].as_array().unwrap() {
                    assert_ne!(a["source"], r["from_ip"], "not masqueraded: {r}");
                }
            }
        }

        // Trace agrees with the probes, endpoint by endpoint: node a's walk per endpoint, and
        // for b1's (on node b) the packet node a sends walked on from node b's eth0.
        let names: BTreeMap<String, String> = run.json["matrix"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (s(r, "to_ip"), s(r, "to")))
            .collect();
        let trace = |marker: &str| -> Value {
            let text = section(marker, "\n## ");
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{marker}: {e}:\n{text}\n{log}"));
            v["trace"].clone()
        };
        for (marker, service, from, to) in [
            ("## trace cluster-ip", "web", "a2", "fd00:10:96::1"),
            ("## trace node-port", "np", "outside", "fd00:172:30::b"),
        ] {
            let t = trace(marker);
            let per = t["endpoint_outcomes"].as_array().unwrap();
            let legs: Vec<&Value> = if per.is_empty() {
                vec![&t]
            } else {
                per.iter().collect()
            };
            let traced: BTreeSet<(String, String)> = legs
                .iter()
                .map(|l| {
                    assert_eq!(l["verdict"], "delivered", "{marker}: {l}");
                    let (dst, src) = (s(&l["egress"], "dst"), s(&l["egress"], "src"));
                    if dst.starts_with("fd00:10:244:2:") {
                        // On to node b: delivered there unchanged.
                        let on_b = trace(&format!("## trace on b from {src}"));
                        assert_eq!(on_b["verdict"], "delivered", "{marker} on b: {on_b}");
                        assert_eq!(s(&on_b["packet"], "dst"), dst, "{marker} on b: {on_b}");
                        assert_eq!(on_b["packet"]["dport"], l["egress"]["dport"], "{on_b}");
                        assert_eq!(s(&on_b["egress"], "dst"), dst, "{marker} on b: {on_b}");
                        assert_eq!(s(&on_b["egress"], "src"), src, "{marker} on b: {on_b}");
                        assert_eq!(on_b["egress"]["local"], false, "{marker} on b: {on_b}");
                    }
                    (names.get(&dst).cloned().unwrap_or(dst), src)
                })
                .collect();
            let probe = services
                .iter()
                .find(|r| r["service"] == service && r["from"] == from && r["to_ip"] == to)
                .unwrap_or_else(|| panic!("no probe {service} {from} → {to}"));
            let seen: BTreeSet<(String, String)> = probe["answers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (s(a, "by"), s(a, "source")))
                .collect();
            assert_eq!(traced, seen, "{marker}: trace vs the probe {probe}\n{t}");
        }
        assert!(
            log.contains("## ipv6 forwarding after a restart: 1"),
            "the ipvs proxy left IPv6 forwarding off:\n{log}"
        );
    }
}

/// nftables mode's ruleset, as the renderer writes it (the golden scripts of
/// crates/proxy/tests/nft.rs, which hold short-circuited frontends), loads on Debian 12's
/// kernel. Until this test the node-originated marking rules looked the short-circuit verdict
/// maps up as sets (`... @sc4 meta mark set ...`), which 6.1 refuses with EINVAL, so nftables
/// mode could not sync at all on a stock Debian 12 node; this machine's 6.18 accepts it.
#[test]
fn nftables_ruleset_loads_on_debians_kernel() {
    let Some((vm, _turn)) = vm_lab::vm_turn() else {
        return;
    };
    let ns = format!("nf{}", std::process::id());
    let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../proxy/tests/golden");
    let out = vm
        .run_timeout(
            &format!(
                "uname -r; ip netns add {ns}; rc=0
for f in v1 v2; do
  ip netns exec {ns} nft -f {golden}/$f.nft || rc=1
  ip netns exec {ns} nft list set inet weir sckeys4 >/dev/null || rc=1
done
ip netns del {ns}; exit $rc"
            ),
            Duration::from_secs(120),
        )
        .expect("the VM answers");
    assert_eq!(
        out.status,
        0,
        "the nftables ruleset does not load on {}:\n{}",
        out.stdout.trim(),
        out.stderr
    );
}
