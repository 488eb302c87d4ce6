//! weir as the networking of a real Kubernetes cluster: kube-apiserver, controller-manager
//! and scheduler of the version scripts/cluster/kube/go.mod pins (built from Go modules; a
//! 1.20 build from Debian's source through `WEIR_KUBE_BUILD`), two nodes each with its own
//! containerd (CRI) and kubelet calling weir-cni, and weir proxy, weir routes (host-gw) and
//! weir dns on every node (scripts/cluster/up.sh). Every check goes through the objects the
//! real controllers make (Deployment → ReplicaSet → Pods → EndpointSlices).
//!
//! Root; the Kubernetes build from `bash scripts/dev.sh test` (fails under CI=true without
//! it, skips with a message elsewhere).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::cluster::Cluster;
use common::WEIR;

/// The demo workload (shared with `bash scripts/dev.sh cluster`).
const WEB: &str = include_str!("../../../scripts/cluster/demo.yaml");

/// The distinct answers of `tries` requests.
fn answers(tries: usize, mut get: impl FnMut() -> Option<String>) -> BTreeSet<String> {
    (0..tries).filter_map(|_| get()).collect()
}

fn names(pods: &[(String, String, String)]) -> BTreeSet<String> {
    pods.iter().map(|p| p.0.clone()).collect()
}

/// Requests sent in a loop from the client pod's namespace (curl, 1 s timeout) until stopped:
/// (sent, failed).
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(netns: String, url: String) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let (s, n, f) = (stop.clone(), sent.clone(), failed.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let ok = std::process::Command::new("ip")
                    .args(["netns", "exec", &netns, "curl", "-sf", "-m", "1", &url])
                    .output()
                    .is_ok_and(|o| o.status.success());
                n.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    f.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Load {
            stop,
            sent,
            failed,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

#[test]
fn weir_networks_a_real_two_node_cluster() {
    if !weir_testkit::can_run(common::cluster::missing()) {
        return;
    }
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let c = Cluster::up("kc");
    let long = Duration::from_secs(90);

    // A 1.20 apiserver: slices from v1beta1, the Service field selector refused; a current
    // one serves both, and weir falls back to neither.
    for node in c.nodes {
        let log = c.log(&format!("{node}-proxy"));
        let noted = log.contains("reading discovery.k8s.io/v1beta1")
            && log.contains("refuses the field selector");
        let fell_back = log.contains("does not serve discovery.k8s.io/v1")
            || log.contains("refuses the field selector");
        if common::cluster::is_legacy() {
            assert!(
                noted,
                "{node}'s proxy did not note the 1.20 API differences:\n{log}"
            );
        } else {
            assert!(
                !fell_back,
                "{node}'s proxy fell back on a current apiserver:\n{log}"
            );
        }
    }

    c.apply(WEB);
    c.wait("3 web pods Running", long, || c.pods("app=web").len() == 3);
    c.wait("the client pod", long, || c.pods("app!=web").len() == 1);
    let web = c.pods("app=web");
    let on: BTreeSet<&str> = web.iter().map(|p| p.2.as_str()).collect();
    c.step(&format!("pods running: {web:?}"));
    let cluster_ip = c.k(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let want = names(&web);

    // Pod → pod, to every web pod directly (node-1's across the host-gw route).
    for (name, ip, node) in &web {
        let got = c.http_from_pod("client", ip, 8080);
        assert_eq!(
            got.as_deref(),
            Some(name.as_str()),
            "client (node-2) → {name} at {ip} on {node}"
        );
    }
    assert!(
        on.contains("node-1"),
        "no web pod landed on node-1, so nothing crossed nodes: {web:?}"
    );
    c.step("pod → pod across nodes: every web pod answers the client on node-2");

    // Pod → ClusterIP: every endpoint is reached.
    c.wait("the ClusterIP to reach all 3 pods", long, || {
        answers(12, || c.http_from_pod("client", &cluster_ip, 80)) == want
    });
    c.step(&format!("pod → ClusterIP {cluster_ip}: all 3 endpoints"));

    // Outside (the control plane's namespace, beyond the nodes' underlay) → NodePort of each node.
    for ip in c.node_ips {
        let url = format!("http://{ip}:30080/");
        let seen = answers(15, || c.curl_from(&c.cp_ns(), &url));
        assert!(
            seen.len() >= 2 && seen.is_subset(&want),
            "outside → NodePort on {ip}: {seen:?}"
        );
    }
    c.step("outside → NodePort 30080 on both nodes: answered by several endpoints");

    // Names through the resolv.conf the kubelet wrote (clusterDNS 10.96.0.10 → weir dns).
    let (_, resolv) = c.exec("client", "busybox cat /etc/resolv.conf");
    assert!(
        resolv.contains("nameserver 10.96.0.10")
            && resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    let (_, a) = c.exec("client", "busybox nslookup web");
    assert!(
        a.contains("web.default.svc.cluster.local") && a.contains(&cluster_ip),
        "web → {cluster_ip}:\n{a}"
    );
    let (_, h) = c.exec("client", "busybox nslookup web-headless");
    for (_, ip, _) in &web {
        assert!(h.contains(ip), "headless answer lacks {ip}:\n{h}");
    }
    let (_, e) = c.exec("client", "busybox nslookup docs");
    assert!(
        e.contains("canonical name = web.default.svc.cluster.local"),
        "ExternalName → CNAME:\n{e}"
    );
    c.step("DNS via the kubelet's resolv.conf: ClusterIP, headless (3 pods), ExternalName (CNAME)");

    // Scale 3 → 0 → 3.
    c.k(&["scale", "deploy/web", "--replicas=0"]);
    c.wait("no web pod left in the rules", long, || {
        (0..2).all(|n| web.iter().all(|(_, ip, _)| !c.nft(n).contains(ip.as_str())))
    });
    assert_eq!(c.http_from_pod("client", &cluster_ip, 80), None);
    c.k(&["scale", "deploy/web", "--replicas=3"]);
    c.wait("3 web pods again", long, || c.pods("app=web").len() == 3);
    let web = c.pods("app=web");
    let want = names(&web);
    c.wait("the ClusterIP to reach the 3 new pods", long, || {
        answers(12, || c.http_from_pod("client", &cluster_ip, 80)) == want
    });
    c.step("scale 3 → 0 (no endpoint in either node's rules, no answer) → 3 (all answer)");

    // A rolling update under continuous requests from the client's namespace.
    let (_, client_ip, _) = c.pods("app!=web").remove(0);
    let client_ns = c
        .pod_netns(1, &client_ip)
        .expect("the client pod's network namespace");
    let load = Load::start(client_ns.clone(), format!("http://{cluster_ip}/"));
    std::thread::sleep(Duration::from_secs(1));
    c.k(&["set", "env", "deploy/web", "GENERATION=2"]);
    c.k(&["rollout", "status", "deploy/web", "--timeout=120s"]);
    std::thread::sleep(Duration::from_secs(1));
    let (sent, failed) = load.finish();
    let after = c.pods("app=web");
    assert_eq!(after.len(), 3);
    assert!(names(&after).is_disjoint(&want), "every pod replaced");
    c.wait("the ClusterIP to reach the new pods", long, || {
        answers(12, || c.http_from_pod("client", &cluster_ip, 80)) == names(&after)
    });
    assert!(sent > 20, "the load ran: {sent} requests");
    c.step(&format!(
        "rolling update under load: {sent} requests, {failed} failed ({:.1}%)",
        100.0 * failed as f64 / sent as f64
    ));

    // A deleted pod's endpoint leaves both nodes' rules: measured.
    let (victim, victim_ip, _) = after[0].clone();
    let t0 = Instant::now();
    c.k(&["delete", "pod", &victim, "--wait=false"]);
    c.wait(
        "the deleted pod's endpoint out of both nodes' rules",
        long,
        || {
            (0..2).all(|n| !c.nft(n).contains(&format!("{victim_ip} . ")))
                && (0..2).all(|n| !c.nft(n).contains(&format!(": {victim_ip} .")))
        },
    );
    let gone = t0.elapsed();
    assert!(
        gone < Duration::from_secs(10),
        "endpoint removal took {gone:?}"
    );
    c.step(&format!(
        "pod deleted → its endpoint out of both nodes' rules in {} ms",
        gone.as_millis()
    ));
    c.wait("3 web pods after the deletion", long, || {
        c.pods("app=web").len() == 3
    });

    // kubelet restart: pods keep running and serving, new pods start after it.
    c.ctl("restart", "node-1-kubelet");
    let before = c.pods("app=web");
    c.wait("the ClusterIP through the kubelet restart", long, || {
        answers(12, || c.http_from_pod("client", &cluster_ip, 80)) == names(&before)
    });
    c.k(&["scale", "deploy/web", "--replicas=4"]);
    c.wait("a fourth pod after the kubelet restart", long, || {
        c.pods("app=web").len() == 4
    });
    c.step("kubelet restart on node-1: pods kept serving, a new pod started");

    // apiserver restart: rules kept, health truthful, resync after.
    c.ctl("stop", "kube-apiserver");
    c.wait("weir proxy's /healthz to say stale (503)", long, || {
        c.health(0, 10256) == 503
    });
    let during = answers(8, || {
        c.curl_from(&c.node_ns(1), &format!("http://{cluster_ip}/"))
    });
    assert!(
        !during.is_empty(),
        "the rules kept serving while the apiserver was down"
    );
    c.ctl("start", "kube-apiserver");
    c.wait("weir proxy's /healthz back to 200", long, || {
        (0..2).all(|n| c.health(n, 10256) == 200)
    });
    c.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: after, namespace: default}\n\
         spec: {selector: {app: web}, ports: [{port: 81, targetPort: 8080}]}\n",
    );
    let after_ip = c.k(&["get", "svc", "after", "-o", "jsonpath={.spec.clusterIP}"]);
    c.wait("a Service made after the restart to answer", long, || {
        c.http_from_pod("client", &after_ip, 81).is_some()
    });
    c.step("apiserver restart: rules kept, /healthz 503 while down, 200 after; new Service synced");

    // Every pod deleted: no veth, no address file, no nft element left.
    c.k(&["delete", "deploy/web"]);
    c.k(&["delete", "pod", "client", "--grace-period=1"]);
    c.wait("every pod gone", long, || {
        c.k(&["get", "pods", "-o", "name"]).trim().is_empty()
    });
    for n in 0..2 {
        let node = c.nodes[n];
        c.wait(&format!("no pod veth left on {node}"), long, || {
            !c.in_ns_text(&c.node_ns(n), "ip -o link show type veth")
                .contains("weir")
        });
        let dir = c.path(&format!("{node}/cni/networks/weir"));
        let files: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|f| f.starts_with("10.244."))
                    .collect()
            })
            .unwrap_or_default();
        assert!(files.is_empty(), "{node}: address files left: {files:?}");
    }
    // The rules follow the EndpointSlices, which the controller-manager empties after the
    // pods are gone (seconds later on a loaded machine): wait for both, then name which lags.
    let slice_addresses = || {
        c.k(&[
            "get",
            "endpointslices",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}: {.endpoints[*].addresses}{\"\\n\"}{end}",
        ])
    };
    let pod_addresses_in_rules = |n: usize| {
        let nft = c.nft(n);
        nft.contains("10.244.1.") || nft.contains("10.244.2.")
    };
    let t0 = Instant::now();
    while t0.elapsed() < long && (0..2).any(pod_addresses_in_rules) {
        std::thread::sleep(Duration::from_millis(200));
    }
    for n in 0..2 {
        assert!(
            !pod_addresses_in_rules(n),
            "{}: pod addresses left in nftables {long:?} after the pods went; the slices say:\n{}\n{}",
            c.nodes[n],
            slice_addresses(),
            c.nft(n)
        );
    }
    c.step("every pod deleted: no veth, no address file, no nft element left");

    // Node deleted → its pod route gone from the other node.
    let route = "10.244.2.0/24 via 10.77.0.12";
    assert!(c.in_ns_text(&c.node_ns(0), "ip route").contains(route));
    c.ctl("stop", "node-2-kubelet");
    c.k(&["delete", "node", "node-2"]);
    c.wait("node-2's pod route gone from node-1", long, || {
        !c.in_ns_text(&c.node_ns(0), "ip route").contains(route)
    });
    c.step("node-2 deleted: its pod route left node-1");
}

/// One cluster at a time in this binary: each is ten processes, and this machine has two
/// cores.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The parity workload: four pods spread over both nodes and one Service per probe kind.
const PARITY: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: par, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: par}}
  template:
    metadata: {labels: {app: par}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: par}}}
      containers:
      - name: httpd
        image: localhost/weir/busybox:1.35
        imagePullPolicy: Never
        command: ["/bin/sh", "-c", "mkdir -p /www && echo $HOSTNAME > /www/index.html && exec busybox httpd -f -p 8080 -h /www"]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: par, namespace: default}
spec: {selector: {app: par}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-np, namespace: default}
spec: {type: NodePort, selector: {app: par}, ports: [{port: 80, targetPort: 8080, nodePort: 30082}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-local, namespace: default}
spec: {type: NodePort, externalTrafficPolicy: Local, selector: {app: par}, ports: [{port: 80, targetPort: 8080, nodePort: 30081}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-affinity, namespace: default}
spec: {sessionAffinity: ClientIP, selector: {app: par}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-none, namespace: default}
spec: {selector: {app: nothing}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-solo, namespace: default}
spec: {selector: {solo: "yes"}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: pclient, namespace: default}
spec:
  nodeName: node-2
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: localhost/weir/busybox:1.35, imagePullPolicy: Never, command: ["/bin/sh", "-c", "exec sleep 100000"]}
"#;

/// Services whose fields came after 1.20: internalTrafficPolicy (1.22), trafficDistribution
/// (PreferSameZone and PreferSameNode, 1.34), all answered from the client on node-2 (zone
/// b: the nodes are labelled zone-a and zone-b first).
const PARITY_CURRENT: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: par-itp, namespace: default}
spec: {internalTrafficPolicy: Local, selector: {app: par}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-zone, namespace: default}
spec: {trafficDistribution: PreferSameZone, selector: {app: par}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: par-node, namespace: default}
spec: {trafficDistribution: PreferSameNode, selector: {app: par}, ports: [{port: 80, targetPort: 8080}]}
"#;

/// The ready endpoints of a Service's EndpointSlices.
fn ready_endpoints(c: &Cluster, service: &str) -> usize {
    let v = c.json(&[
        "get",
        "endpointslices",
        "-l",
        &format!("kubernetes.io/service-name={service}"),
    ]);
    v["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] == true)
            .count()
    })
}

/// One curl from a namespace: the body, or how it failed (curl's exit code: 7 refused,
/// 28 timed out).
fn curl(ns: &str, url: &str) -> Result<String, String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sS", "-m", "2", url])
        .output()
        .expect("curl");
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        Some(7) => Err("refused".into()),
        Some(28) => Err("timeout".into()),
        code => Err(format!("curl exit {code:?}")),
    }
}

/// The distinct answers (pod names or failures) of `tries` requests.
fn distinct(tries: usize, ns: &str, url: &str) -> BTreeSet<String> {
    (0..tries)
        .map(|_| curl(ns, url).unwrap_or_else(|e| format!("({e})")))
        .collect()
}

/// The lab's service probe kinds, answered through whichever proxy runs on the nodes now:
/// probe → what answered, with pod names replaced by which group they belong to.
fn parity_answers(c: &Cluster) -> Vec<(String, String)> {
    let pods = c.pods("app=par");
    let all = names(&pods);
    let on = |node: &str| -> BTreeSet<String> {
        pods.iter()
            .filter(|p| p.2 == node)
            .map(|p| p.0.clone())
            .collect()
    };
    let describe = |seen: &BTreeSet<String>| -> String {
        if *seen == all {
            "all 4 pods".into()
        } else if *seen == on("node-1") {
            "node-1's pods only".into()
        } else if *seen == on("node-2") {
            "node-2's pods only".into()
        } else {
            format!("{seen:?}")
        }
    };
    let ip = |svc: &str| c.k(&["get", "svc", svc, "-o", "jsonpath={.spec.clusterIP}"]);
    let (_, client_ip, _) = c.pods("app!=par").remove(0);
    let client = c.pod_netns(1, &client_ip).expect("the client's namespace");
    let (solo, solo_ip, solo_node) = c
        .pods("solo=yes")
        .first()
        .cloned()
        .expect("the pod labelled solo");
    let solo_n = usize::from(solo_node == "node-2");
    let solo_ns = c
        .pod_netns(solo_n, &solo_ip)
        .expect("the solo pod's namespace");
    let cp = c.cp_ns();
    let mut a = vec![(
        "ClusterIP from a pod (40 tries)".to_string(),
        describe(&distinct(40, &client, &format!("http://{}/", ip("par")))),
    )];
    let hairpin = distinct(5, &solo_ns, &format!("http://{}/", ip("par-solo")));
    a.push((
        "hairpin: a pod to itself through its Service".into(),
        if hairpin == BTreeSet::from([solo.clone()]) {
            "itself".into()
        } else {
            format!("{hairpin:?}")
        },
    ));
    for (n, node_ip) in c.node_ips.iter().enumerate() {
        a.push((
            format!("NodePort on node-{} from outside (40 tries)", n + 1),
            describe(&distinct(40, &cp, &format!("http://{node_ip}:30082/"))),
        ));
        a.push((
            format!(
                "eTP Local NodePort on node-{} from outside (20 tries)",
                n + 1
            ),
            describe(&distinct(20, &cp, &format!("http://{node_ip}:30081/"))),
        ));
    }
    a.push((
        "no endpoints".into(),
        format!(
            "{:?}",
            distinct(2, &client, &format!("http://{}/", ip("par-none")))
        ),
    ));
    if !common::cluster::is_legacy() {
        for (svc, what) in [
            ("par-itp", "internalTrafficPolicy Local"),
            ("par-zone", "trafficDistribution PreferSameZone"),
            ("par-node", "trafficDistribution PreferSameNode"),
        ] {
            a.push((
                format!("{what} from node-2's pod (20 tries)"),
                describe(&distinct(20, &client, &format!("http://{}/", ip(svc)))),
            ));
        }
    }
    let sticky = distinct(15, &client, &format!("http://{}/", ip("par-affinity")));
    a.push((
        "ClientIP affinity (15 tries)".into(),
        format!(
            "{} distinct pod(s){}",
            sticky.len(),
            if sticky.iter().any(|s| s.starts_with('(')) {
                format!(" {sticky:?}")
            } else {
                String::new()
            }
        ),
    ));
    a
}

/// Real kube-proxy in its nftables and iptables modes (1.20: iptables only), then weir proxy
/// in iptables and nftables modes, one after another on the same cluster, the same objects and
/// the same pods: the probe kinds of the lab's matrix, internalTrafficPolicy and
/// trafficDistribution give the same answers.
#[test]
fn weir_proxy_answers_as_real_kube_proxy_does() {
    if !weir_testkit::can_run(common::cluster::missing()) {
        return;
    }
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let legacy = common::cluster::is_legacy();
    let first = if legacy {
        "kube-proxy-iptables"
    } else {
        "kube-proxy-nftables"
    };
    let c = Cluster::up_with("kp", first);
    let long = Duration::from_secs(90);
    // Zones before any slice exists: the EndpointSlice controller hints by the nodes' zones.
    for (node, zone) in [("node-1", "zone-a"), ("node-2", "zone-b")] {
        c.k(&[
            "label",
            "node",
            node,
            &format!("topology.kubernetes.io/zone={zone}"),
        ]);
    }
    c.apply(PARITY);
    if !legacy {
        c.apply(PARITY_CURRENT);
    }
    c.wait("4 par pods, 2 per node", long, || {
        let p = c.pods("app=par");
        p.len() == 4 && p.iter().filter(|p| p.2 == "node-1").count() == 2
    });
    c.wait("the client pod", long, || c.pods("app!=par").len() == 1);
    let first_pod = c.pods("app=par")[0].0.clone();
    c.k(&["label", "pod", &first_pod, "solo=yes"]);
    // Running is not ready: the proxies are compared once the API has every endpoint ready
    // (a CI run compared kube-proxy while node-2's pods were still failing readiness).
    c.wait("4 ready endpoints of par, 1 of par-solo", long, || {
        ready_endpoints(&c, "par") == 4 && ready_endpoints(&c, "par-solo") == 1
    });

    let wait_serving = |who: &str| {
        let url = format!(
            "http://{}/",
            c.k(&["get", "svc", "par", "-o", "jsonpath={.spec.clusterIP}"])
        );
        c.wait(&format!("{who} to serve the ClusterIP"), long, || {
            (0..2).all(|n| c.health(n, 10256) == 200) && c.curl_from(&c.node_ns(1), &url).is_some()
        });
        // every Service programmed: the last one applied answers too
        let last = if legacy { "par-solo" } else { "par-node" };
        let last = format!(
            "http://{}/",
            c.k(&["get", "svc", last, "-o", "jsonpath={.spec.clusterIP}"])
        );
        c.wait(&format!("{who} to serve every Service"), long, || {
            c.curl_from(&c.node_ns(1), &last).is_some()
        });
        // Past one --min-sync-period (1 s for both) since the API settled: the proxy has
        // synced what it has.
        std::thread::sleep(Duration::from_secs(2));
    };
    // Each proxy in turn: stop the one before, clean its rules up, start the next.
    let mut proxies: Vec<(&str, &str)> = Vec::new();
    if !legacy {
        proxies.push(("kube-proxy nftables", "kube-proxy-nftables"));
    }
    proxies.extend([
        ("kube-proxy iptables", "kube-proxy-iptables"),
        ("weir proxy iptables", "iptables"),
        ("weir proxy nftables", "nftables"),
    ]);
    let mut results: Vec<(&str, Vec<(String, String)>)> = Vec::new();
    let mut running = first;
    for (who, process) in proxies {
        if process != running {
            for n in 0..2 {
                let node = c.nodes[n];
                let cleanup = if running.starts_with("kube-proxy") {
                    c.ctl("stop", &format!("{node}-{running}"));
                    format!("{} --cleanup >/dev/null 2>&1; true", c.kube_proxy())
                } else {
                    c.ctl("stop", &format!("{node}-proxy"));
                    format!("{WEIR} proxy cleanup")
                };
                let out = c.in_ns(&c.node_ns(n), &cleanup);
                assert!(out.status.success(), "{cleanup} on {node}");
                if process.starts_with("kube-proxy") {
                    c.ctl("start", &format!("{node}-{process}"));
                } else {
                    c.start_weir_proxy(n, process);
                }
            }
            running = process;
        }
        wait_serving(who);
        results.push((who, parity_answers(&c)));
        c.step(&format!("{who}'s answers taken"));
    }

    eprint!("\n{:<56}", "probe");
    for (who, _) in &results {
        eprint!(" {who:<24}");
    }
    eprintln!();
    for (i, (probe, _)) in results[0].1.iter().enumerate() {
        eprint!("{probe:<56}");
        for (_, answers) in &results {
            eprint!(" {:<24}", answers[i].1);
        }
        eprintln!();
    }
    let mut expected = vec![
        "all 4 pods",
        "itself",
        "all 4 pods",
        "node-1's pods only",
        "all 4 pods",
        "node-2's pods only",
        "{\"(refused)\"}",
    ];
    if !legacy {
        expected.extend(["node-2's pods only"; 3]);
    }
    expected.push("1 distinct pod(s)");
    let kube: Vec<&str> = results[0].1.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(kube, expected, "{}'s own answers", results[0].0);
    for (who, answers) in &results[1..] {
        assert_eq!(
            answers, &results[0].1,
            "{who} differs from {}",
            results[0].0
        );
    }
}
