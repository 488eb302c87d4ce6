//! Agreement with the kernel on NetworkPolicy (root): weir-policy's own renderer writes the
//! table for a small cluster into a node namespace whose pods are namespaces on veths; real
//! TCP connections from the pods are allowed or dropped by the kernel, and `trace` on the
//! node's live state must agree, naming the policy that allowed each one or the policies
//! that isolate the pod that dropped it. Before the table every path is open, so each drop
//! seen is the table's.

mod common;

use std::time::Duration;

use common::ns::Ns;
use weir_netdiag::objects::Objects;
use weir_netdiag::trace::{PolicyDecision, PolicyVerdict, Verdict};

/// How long a connection the kernel lets through may take (a dropped SYN never completes).
const CONNECT_LIMIT: Duration = Duration::from_secs(1);

/// Namespace shop on node n1: web-0, db-0 (named port pg = 5432), cache-0 and free-0.
const OBJECTS: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: web-0, labels: {app: web}}
  spec: {nodeName: n1, containers: [{name: c}]}
  status: {phase: Running, podIP: 10.81.0.2}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: db-0, labels: {app: db}}
  spec: {nodeName: n1, containers: [{name: c, ports: [{name: pg, containerPort: 5432}]}]}
  status: {phase: Running, podIP: 10.81.0.3}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: cache-0, labels: {app: cache}}
  spec: {nodeName: n1, containers: [{name: c}]}
  status: {phase: Running, podIP: 10.81.0.4}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: free-0, labels: {app: free}}
  spec: {nodeName: n1, containers: [{name: c}]}
  status: {phase: Running, podIP: 10.81.0.5}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {namespace: shop, name: default-deny}
  spec:
    podSelector: {matchExpressions: [{key: app, operator: NotIn, values: [free]}]}
    policyTypes: [Ingress]
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {namespace: shop, name: db-from-web}
  spec:
    podSelector: {matchLabels: {app: db}}
    ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: pg}]}]
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {namespace: shop, name: web-egress}
  spec:
    podSelector: {matchLabels: {app: web}}
    policyTypes: [Egress]
    egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: 5432}]}]
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {namespace: shop, name: cache-open}
  spec:
    podSelector: {matchLabels: {app: cache}}
    ingress: [{}]
"#;

/// A pod: its namespace, name, address and the node's side of its veth.
struct Pod {
    ns: Ns,
    name: &'static str,
    ip: &'static str,
    host_if: &'static str,
}

fn pods(tag: &str, node: &Ns) -> Vec<Pod> {
    let specs = [
        ("web-0", "10.81.0.2", "hweb0"),
        ("db-0", "10.81.0.3", "hdb0"),
        ("cache-0", "10.81.0.4", "hcache0"),
        ("free-0", "10.81.0.5", "hfree0"),
    ];
    specs
        .into_iter()
        .map(|(name, ip, host_if)| {
            let ns = Ns::new("wtp", &format!("{tag}{}", &host_if[1..]));
            node.sh(&format!(
                "ip link add {host_if} type veth peer name eth0 netns {} \
                 && ip link set {host_if} up && ip route add {ip} dev {host_if} scope link \
                 && sysctl -qw net.ipv4.conf.{host_if}.proxy_arp=1 \
                 && sysctl -qw net.ipv4.neigh.{host_if}.proxy_delay=0",
                ns.0
            ));
            ns.sh(&format!(
                "ip addr add {ip}/32 dev eth0 && ip link set eth0 up \
                 && ip route add default dev eth0"
            ));
            Pod {
                ns,
                name,
                ip,
                host_if,
            }
        })
        .collect()
}

/// One probe: a pod dials another's port; whether the table lets it through, and what trace
/// must say at each pod it passes (direction, pod, verdict, allowing policy, isolating ones).
struct Probe {
    from: &'static str,
    to: &'static str,
    port: u16,
    allowed: bool,
    decisions: &'static [(
        &'static str,
        &'static str,
        PolicyVerdict,
        &'static str,
        &'static [&'static str],
    )],
}

const PROBES: &[Probe] = &[
    Probe {
        from: "web-0",
        to: "db-0",
        port: 5432,
        allowed: true,
        decisions: &[
            (
                "egress",
                "shop/web-0",
                PolicyVerdict::Allowed,
                "shop/web-egress",
                &["shop/web-egress"],
            ),
            (
                "ingress",
                "shop/db-0",
                PolicyVerdict::Allowed,
                "shop/db-from-web",
                &["shop/db-from-web", "shop/default-deny"],
            ),
        ],
    },
    // The port web-egress does not name: web-0's own egress drops it.
    Probe {
        from: "web-0",
        to: "db-0",
        port: 5433,
        allowed: false,
        decisions: &[(
            "egress",
            "shop/web-0",
            PolicyVerdict::Dropped,
            "",
            &["shop/web-egress"],
        )],
    },
    // cache-0 is no web pod: db-0's ingress drops it.
    Probe {
        from: "cache-0",
        to: "db-0",
        port: 5432,
        allowed: false,
        decisions: &[
            ("egress", "", PolicyVerdict::NotIsolated, "", &[]),
            (
                "ingress",
                "shop/db-0",
                PolicyVerdict::Dropped,
                "",
                &["shop/db-from-web", "shop/default-deny"],
            ),
        ],
    },
    Probe {
        from: "db-0",
        to: "web-0",
        port: 8080,
        allowed: false,
        decisions: &[
            ("egress", "", PolicyVerdict::NotIsolated, "", &[]),
            (
                "ingress",
                "shop/web-0",
                PolicyVerdict::Dropped,
                "",
                &["shop/default-deny"],
            ),
        ],
    },
    Probe {
        from: "db-0",
        to: "cache-0",
        port: 8080,
        allowed: true,
        decisions: &[
            ("egress", "", PolicyVerdict::NotIsolated, "", &[]),
            (
                "ingress",
                "shop/cache-0",
                PolicyVerdict::Allowed,
                "shop/cache-open",
                &["shop/cache-open", "shop/default-deny"],
            ),
        ],
    },
    Probe {
        from: "cache-0",
        to: "free-0",
        port: 8080,
        allowed: true,
        decisions: &[
            ("egress", "", PolicyVerdict::NotIsolated, "", &[]),
            ("ingress", "", PolicyVerdict::NotIsolated, "", &[]),
        ],
    },
];

fn same(d: &PolicyDecision, want: &(&str, &str, PolicyVerdict, &str, &[&str])) -> bool {
    let (direction, pod, verdict, by, isolated) = want;
    d.direction == *direction
        && d.pod.as_deref().unwrap_or("") == *pod
        && d.verdict == *verdict
        && d.allowed_by.as_deref().unwrap_or("") == *by
        && d.isolated_by == *isolated
}

#[test]
fn trace_names_the_policy_the_kernel_enforced() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["ip", "nft", "sysctl"])) {
        return;
    }
    let node = Ns::new("wtp", "node");
    node.sh("sysctl -qw net.ipv4.ip_forward=1");
    let pods = pods("k", &node);
    let pod = |name: &str| pods.iter().find(|p| p.name == name).expect("a pod");
    let _listeners: Vec<_> = [
        ("web-0", 8080),
        ("db-0", 5432),
        ("db-0", 5433),
        ("cache-0", 8080),
        ("free-0", 8080),
    ]
    .into_iter()
    .map(|(name, port)| pod(name).ns.listen("0.0.0.0", port))
    .collect();

    // Without a table every path is open (and trace sees no policy): each drop below is
    // the table's.
    for probe in PROBES {
        let (from, to) = (pod(probe.from), pod(probe.to));
        let dst = format!("{}:{}", to.ip, probe.port);
        assert!(
            from.ns.connects(&dst, CONNECT_LIMIT),
            "{} → {dst} without the table",
            probe.from
        );
        let t = node.trace(from.ip, to.ip, probe.port, from.host_if);
        assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
        assert!(t.policy.is_empty());
    }

    let mut objects = Objects::default();
    objects.add_text("objects.yaml", OBJECTS);
    assert!(
        objects.warnings.is_empty() && objects.errors.is_empty(),
        "{objects:?}"
    );
    let table = weir_policy::nft::render(&weir_policy::plan(&objects.cluster, "n1"));
    node.sh(&format!("nft -f - <<'EOF'\n{table}EOF"));

    let mut rows = Vec::new();
    for probe in PROBES {
        let (from, to) = (pod(probe.from), pod(probe.to));
        let dst = format!("{}:{}", to.ip, probe.port);
        let kernel = from.ns.connects(&dst, CONNECT_LIMIT);
        let t = node.trace(from.ip, to.ip, probe.port, from.host_if);
        let traced = t.verdict == Verdict::Delivered;
        rows.push(format!(
            "{} → {dst}: kernel {}, trace {}: {}",
            probe.from,
            if kernel { "allowed" } else { "dropped" },
            if traced { "allowed" } else { "dropped" },
            t.cause.as_deref().unwrap_or("delivered")
        ));
        assert_eq!(kernel, probe.allowed, "{}", rows.last().unwrap());
        assert_eq!(traced, kernel, "{}", rows.last().unwrap());
        assert_eq!(t.policy.len(), probe.decisions.len(), "{:#?}", t.policy);
        for (got, want) in t.policy.iter().zip(probe.decisions) {
            assert!(same(got, want), "{got:#?} is not {want:?}");
        }
        if kernel {
            // The reply passes as part of the connection.
            assert!(
                t.hops.iter().any(|h| h.stage.starts_with("reply")
                    && h.note.contains("part of a connection already allowed")),
                "{:#?}",
                t.hops
            );
        } else {
            let cause = t.cause.as_deref().unwrap();
            assert!(
                cause.starts_with("FORWARD: NetworkPolicy: no policy allows"),
                "{cause}"
            );
            assert!(t
                .hops
                .iter()
                .any(|h| h.note.starts_with("DROPPED by NetworkPolicy:")));
        }
    }
    eprintln!("{}", rows.join("\n"));
}
