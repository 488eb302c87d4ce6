//! doctor's NetworkPolicy checks, one table per check: each case is a set of policies over
//! the same pods, the status the check must give and a piece of its evidence.

use weir_netdiag::doctor::{Check, Status};
use weir_netdiag::doctor_policy::{
    policy_dns, policy_ip_family, policy_named_port, policy_selector,
};
use weir_netdiag::objects::Objects;

/// kube-system's DNS pod (ports dns/UDP 53, dns-tcp/TCP 53) and shop's pods: web-0 (http
/// 8080), db-0 (pg 5432, dual-stack), a hostNetwork agent and a finished job.
const PODS: &str = r#"
- {apiVersion: v1, kind: Namespace, metadata: {name: kube-system}}
- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}
- {apiVersion: v1, kind: Namespace, metadata: {name: empty}}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: kube-system, name: coredns-0, labels: {k8s-app: kube-dns}}
  spec: {nodeName: n1, containers: [{name: c, ports: [{name: dns, containerPort: 53, protocol: UDP}, {name: dns-tcp, containerPort: 53}]}]}
  status: {phase: Running, podIP: 10.0.9.2}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: web-0, labels: {app: web}}
  spec: {nodeName: n1, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
  status: {phase: Running, podIP: 10.0.0.1}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: db-0, labels: {app: db}}
  spec: {nodeName: n1, containers: [{name: c, ports: [{name: pg, containerPort: 5432}]}]}
  status: {phase: Running, podIP: 10.0.0.2, podIPs: [{ip: 10.0.0.2}, {ip: "fd00::2"}]}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: agent, labels: {app: agent}}
  spec: {nodeName: n1, hostNetwork: true, containers: [{name: c}]}
  status: {phase: Running, podIP: 192.168.1.1}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: shop, name: job-0, labels: {app: job}}
  spec: {nodeName: n1, containers: [{name: c}]}
  status: {phase: Failed, podIP: 10.0.0.3}
"#;

/// The pods and `policies` (YAML list items of kind NetworkPolicy in shop, `spec` only: one
/// per line as `name: {spec}`).
fn objects(with_pods: bool, policies: &[(&str, &str)]) -> Objects {
    let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
    if with_pods {
        text.push_str(PODS);
    }
    for (name, spec) in policies {
        text.push_str(&format!(
            "- {{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {{namespace: shop, name: {name}}}, spec: {spec}}}\n"
        ));
    }
    let mut o = Objects::default();
    o.add_text("objects.yaml", &text);
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    o
}

struct Case {
    name: &'static str,
    policies: &'static [(&'static str, &'static str)],
    status: Status,
    /// A piece of the evidence (empty: anything).
    says: &'static str,
}

fn run(check: fn(Option<&Objects>) -> Check, cases: &[Case]) {
    for case in cases {
        let o = objects(true, case.policies);
        let c = check(Some(&o));
        let evidence = c.evidence.join("\n");
        assert_eq!(c.status, case.status, "{}: {evidence}", case.name);
        assert!(evidence.contains(case.says), "{}: {evidence}", case.name);
        if c.status == Status::Warn {
            assert!(c.fix.is_some(), "{}: a warning says what to do", case.name);
        }
    }
    // Without objects the check cannot judge, and says what it needs.
    let c = check(None);
    assert_eq!(c.status, Status::Skip);
    assert!(c.evidence[0].contains("--objects"));
    // Policies but no pods: which pods they select is unknown.
    let c = check(Some(&objects(false, &[("p", "{podSelector: {}}")])));
    assert_eq!(c.status, Status::Skip, "{:?}", c.evidence);
}

const DENY_EGRESS: (&str, &str) = ("deny-egress", "{podSelector: {}, policyTypes: [Egress]}");

#[test]
fn policy_dns_warns_where_egress_isolation_leaves_no_port_53() {
    run(
        policy_dns,
        &[
            Case {
                name: "default deny egress alone",
                policies: &[DENY_EGRESS],
                status: Status::Warn,
                says: "shop/db-0, shop/web-0 isolated for egress by shop/deny-egress: no rule allows UDP or TCP port 53",
            },
            Case {
                name: "deny plus DNS to kube-dns by number",
                policies: &[DENY_EGRESS, ("dns", "{podSelector: {}, policyTypes: [Egress], egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}], ports: [{protocol: UDP, port: 53}]}]}")],
                status: Status::Ok,
                says: "2 pod(s) isolated for egress",
            },
            Case {
                name: "DNS by the named port kube-dns declares",
                policies: &[DENY_EGRESS, ("dns", "{podSelector: {}, egress: [{to: [{namespaceSelector: {}}], ports: [{protocol: UDP, port: dns}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "a named port only pods of shop are asked for (none declares dns)",
                policies: &[DENY_EGRESS, ("dns", "{podSelector: {}, egress: [{to: [{podSelector: {}}], ports: [{protocol: UDP, port: dns}]}]}")],
                status: Status::Warn,
                says: "isolated for egress by shop/deny-egress, shop/dns",
            },
            Case {
                name: "an egress rule without ports allows 53 too",
                policies: &[DENY_EGRESS, ("to-kube-system", "{podSelector: {}, egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "only TCP 443 allowed",
                policies: &[("web-out", "{podSelector: {matchLabels: {app: web}}, egress: [{ports: [{port: 443}]}]}")],
                status: Status::Warn,
                says: "shop/web-0 isolated for egress by shop/web-out",
            },
            Case {
                name: "a port range over 53",
                policies: &[("low-ports", "{podSelector: {}, egress: [{ports: [{protocol: UDP, port: 1, endPort: 1024}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "ingress isolation only",
                policies: &[("deny-ingress", "{podSelector: {}}")],
                status: Status::Ok,
                says: "0 pod(s) isolated for egress",
            },
            Case {
                name: "53 allowed only to a peer that cannot be read",
                policies: &[DENY_EGRESS, ("dns", "{podSelector: {}, egress: [{to: [{ipBlock: {cidr: not-a-cidr}}], ports: [{protocol: UDP, port: 53}]}]}")],
                status: Status::Warn,
                says: "isolated for egress by shop/deny-egress, shop/dns",
            },
            Case {
                name: "a policy selecting only the hostNetwork pod isolates nothing",
                policies: &[("agent-out", "{podSelector: {matchLabels: {app: agent}}, policyTypes: [Egress]}")],
                status: Status::Ok,
                says: "0 pod(s)",
            },
            Case {
                name: "one group without DNS among two",
                policies: &[
                    ("web-out", "{podSelector: {matchLabels: {app: web}}, egress: [{ports: [{port: 443}]}]}"),
                    ("db-out", "{podSelector: {matchLabels: {app: db}}, egress: [{ports: [{protocol: UDP, port: 53}]}]}"),
                ],
                status: Status::Warn,
                says: "shop/web-0 isolated for egress by shop/web-out:",
            },
        ],
    );
}

#[test]
fn policy_selector_warns_about_policies_that_select_no_pod() {
    run(
        policy_selector,
        &[
            Case {
                name: "a typo in a label value",
                policies: &[("db-in", "{podSelector: {matchLabels: {app: dbb}}}")],
                status: Status::Warn,
                says: "shop/db-in: podSelector app=dbb matches no pod in namespace shop (its pods have app=db, app=web)",
            },
            Case {
                name: "a label that matches",
                policies: &[("db-in", "{podSelector: {matchLabels: {app: db}}}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "an expression that matches",
                policies: &[("not-web", "{podSelector: {matchExpressions: [{key: app, operator: NotIn, values: [web]}]}}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "a key no pod has",
                policies: &[("tier", "{podSelector: {matchLabels: {tier: fe}}}")],
                status: Status::Warn,
                says: "podSelector tier=fe matches no pod in namespace shop (none of its 2 pod(s) has those label keys)",
            },
            Case {
                name: "only a hostNetwork pod matches",
                policies: &[("agent", "{podSelector: {matchLabels: {app: agent}}}")],
                status: Status::Warn,
                says: "shop/agent: podSelector app=agent matches no pod",
            },
            Case {
                name: "only a finished pod matches",
                policies: &[("job", "{podSelector: {matchLabels: {app: job}}}")],
                status: Status::Warn,
                says: "shop/job: podSelector app=job matches no pod",
            },
            Case {
                name: "the labels of a pod in another namespace",
                policies: &[("dns", "{podSelector: {matchLabels: {k8s-app: kube-dns}}}")],
                status: Status::Warn,
                says: "k8s-app=kube-dns matches no pod in namespace shop",
            },
        ],
    );
    // `{}` in a namespace without pods protects pods yet to come: a note, not a warning.
    let mut o = objects(true, &[]);
    o.add_text(
        "more.yaml",
        "{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {namespace: empty, name: deny}, spec: {podSelector: {}}}",
    );
    let c = policy_selector(Some(&o));
    assert_eq!(c.status, Status::Ok);
    assert!(
        c.evidence[0].contains("1 policy(ies) with `podSelector: {}`"),
        "{:?}",
        c.evidence
    );
}

#[test]
fn policy_named_port_warns_about_ports_no_reached_pod_declares() {
    run(
        policy_named_port,
        &[
            Case {
                name: "ingress by a port the selected pod declares",
                policies: &[("web-in", "{podSelector: {matchLabels: {app: web}}, ingress: [{ports: [{port: http}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "ingress by a misspelt port",
                policies: &[("web-in", "{podSelector: {matchLabels: {app: web}}, ingress: [{ports: [{port: htp}]}]}")],
                status: Status::Warn,
                says: "shop/web-in: spec.ingress[0] port \"htp\" (TCP): none of its 1 pod(s) it selects declares it",
            },
            Case {
                name: "ingress by a port declared with another protocol",
                policies: &[("web-in", "{podSelector: {matchLabels: {app: web}}, ingress: [{ports: [{protocol: UDP, port: http}]}]}")],
                status: Status::Warn,
                says: "(shop/web-0 declares it as TCP)",
            },
            Case {
                name: "egress to the pods that declare it",
                policies: &[("web-out", "{podSelector: {matchLabels: {app: web}}, egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: pg}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "egress to pods that do not declare it",
                policies: &[("db-out", "{podSelector: {matchLabels: {app: db}}, egress: [{to: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: pg}]}]}")],
                status: Status::Warn,
                says: "shop/db-out: spec.egress[0] port \"pg\" (TCP): none of its 1 destination pod(s) declares it",
            },
            Case {
                name: "egress anywhere by a port the DNS pod declares",
                policies: &[("dns", "{podSelector: {}, egress: [{ports: [{protocol: UDP, port: dns}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "egress to an ipBlock holding the pod that declares it",
                policies: &[("web-out", "{podSelector: {matchLabels: {app: web}}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/30}}], ports: [{port: pg}]}]}")],
                status: Status::Ok,
                says: "",
            },
            Case {
                name: "a policy selecting no pod is the selector check's",
                policies: &[("ghost", "{podSelector: {matchLabels: {app: ghost}}, ingress: [{ports: [{port: nope}]}]}")],
                status: Status::Ok,
                says: "",
            },
        ],
    );
}

#[test]
fn policy_ip_family_warns_about_one_family_ipblocks_on_dual_stack_pods() {
    run(
        policy_ip_family,
        &[
            Case {
                name: "ingress from the underlay's IPv4 block to a dual-stack pod",
                policies: &[("db-in", "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{ipBlock: {cidr: 172.30.0.0/24}}]}]}")],
                status: Status::Warn,
                says: "shop/db-in: spec.ingress[0] allows IPv4 addresses only (ipBlock 172.30.0.0/24), but 1 of its 1 pod(s) are dual-stack (shop/db-0 has fd00::2): their IPv6 traffic from those places is denied",
            },
            Case {
                name: "the same with its IPv6 twin",
                policies: &[("db-in", "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{ipBlock: {cidr: 172.30.0.0/24}}, {ipBlock: {cidr: 'fd00:172:30::/64'}}]}]}")],
                status: Status::Ok,
                says: "1 policy(ies) select dual-stack pods; their 1 rule(s) with ipBlocks cover both families",
            },
            Case {
                name: "egress to the internet in IPv4 only, from every pod of shop",
                policies: &[("out", "{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: [169.254.169.254/32]}}]}]}")],
                status: Status::Warn,
                says: "shop/out: spec.egress[0] allows IPv4 addresses only (ipBlock 0.0.0.0/0), but 1 of its 2 pod(s) are dual-stack (shop/db-0 has fd00::2): their IPv6 traffic to those places is denied",
            },
            Case {
                name: "IPv6 only is one family too",
                policies: &[("out6", "{podSelector: {matchLabels: {app: db}}, egress: [{to: [{ipBlock: {cidr: '::/0'}}]}]}")],
                status: Status::Warn,
                says: "allows IPv6 addresses only (ipBlock ::/0), but 1 of its 1 pod(s) are dual-stack (shop/db-0 has 10.0.0.2): their IPv4 traffic",
            },
            Case {
                name: "single-stack pods: an IPv4 block covers them",
                policies: &[("web-in", "{podSelector: {matchLabels: {app: web}}, ingress: [{from: [{ipBlock: {cidr: 172.30.0.0/24}}]}]}")],
                status: Status::Ok,
                says: "no policy selects a dual-stack pod",
            },
            Case {
                name: "selectors reach pods in both families",
                policies: &[("db-in", "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]}")],
                status: Status::Ok,
                says: "their 0 rule(s) with ipBlocks",
            },
        ],
    );
}
