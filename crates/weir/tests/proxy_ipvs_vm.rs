//! `weir proxy --proxy-mode ipvs` in the qemu VM (Debian's kernel has IPVS and `dummy`; this
//! machine's does not): kube-proxy's layout as `ipvsadm`, `ipset` and `iptables-save` show
//! it, and real packets through it — ClusterIP spread per scheduler (rr, sh), NodePort, LB
//! IP, hairpin, externalTrafficPolicy Local, rejection without endpoints, session affinity,
//! an incremental change, graceful termination, a restart keeping a connection, cleanup.
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
//! remote endpoint for traffic policy Local.

use std::time::{Duration, Instant};

mod common;
use common::{is_root, WEIR};

const SERVICES: &str = r#"apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: node-a}
  - {addresses: [10.244.2.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: loc, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.11
  externalTrafficPolicy: Local
  ports: [{port: 80, targetPort: 8080, nodePort: 30081}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: loc-1, namespace: default, labels: {kubernetes.io/service-name: loc}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: node-a}
  - {addresses: [10.244.2.12], nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: aff, namespace: default}
spec:
  clusterIP: 10.96.0.13
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: aff-1, namespace: default, labels: {kubernetes.io/service-name: aff}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.1.11], nodeName: node-a}
  - {addresses: [10.244.2.12], nodeName: node-b}
"#;

/// A service added by the incremental step.
const ADDED: &str = r#"---
apiVersion: v1
kind: Service
metadata: {name: added, namespace: default}
spec:
  clusterIP: 10.96.0.14
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: added-1, namespace: default, labels: {kubernetes.io/service-name: added}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
  - {addresses: [10.244.2.12], nodeName: node-b}
"#;

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

/// The backend's name per answer line ("p1 10.0.0.2" → "p1").
fn names(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

#[test]
fn ipvs_mode_in_the_vm() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let Some(vm) = weir_vmtest::shared_or_skip() else {
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
{SERVICES}EOF
for ns in $N $C $P1 $P2; do ip netns add $ns; inn $ns ip link set lo up; done
ip link add $T-nc netns $N type veth peer name eth0 netns $C
inn $N ip addr add 10.0.0.1/24 dev $T-nc; inn $N ip link set $T-nc up
inn $C ip addr add 10.0.0.2/24 dev eth0; inn $C ip link set eth0 up; inn $C ip route add default via 10.0.0.1
i=1; for P in $P1 $P2; do
  ip link add $T-p$i netns $N type veth peer name eth0 netns $P
  inn $N ip addr add 10.244.$i.1/24 dev $T-p$i; inn $N ip link set $T-p$i up
  inn $P ip addr add 10.244.$i.1$i/24 dev eth0; inn $P ip link set eth0 up; inn $P ip route add default via 10.244.$i.1
  setsid $WEIR lab echo-server --netns /run/netns/$P --name p$i >$D/echo$i.log 2>&1 </dev/null &
  echo $! > $D/echo$i.pid
  i=$((i+1))
done
wait_for "grep -q ready $D/echo1.log && grep -q ready $D/echo2.log"
start_proxy
wait_for "grep -q synced $D/proxy.log" 100
grep synced $D/proxy.log
"#
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
echo '## affinity'; for i in 1 2 3 4 5 6; do ask $P2 10.96.0.13 80; done
echo '## empty'; ask $P1 10.96.0.12 80
echo '## other-port'; ask $P1 10.96.0.10 81
echo '## end'
"#,
    );
    eprintln!("{out}");
    let section = |name: &str| -> String {
        out.split(&format!("## {name}\n"))
            .nth(1)
            .and_then(|s| s.split("## ").next())
            .unwrap_or_default()
            .to_string()
    };
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

    // --- incremental change: one service added, the others untouched
    let out = step(
        vm,
        &tag,
        "incremental",
        &format!(
            r#"inn $N ipvsadm -Sn | sort > $D/before
cat >> $D/m/services.yaml <<'EOF'
{ADDED}EOF
wait_for "inn $N ipvsadm -Ln | grep -q 10.96.0.14:80"
inn $N ipvsadm -Sn | sort > $D/after
diff $D/before $D/after || true
echo '## log'; grep synced $D/proxy.log | tail -1
echo '## ask'; ask $P1 10.96.0.14 80
"#
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
