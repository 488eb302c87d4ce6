//! The Kubernetes API source (kube-rs) against weir's fake API server: lists, watches,
//! selectors, pagination, 410 Gone, restarts and staleness, without root.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use weir_fakeapi::{Emulate, FakeApi};
use weir_source::api::{start_api_source, ApiOptions, ApiReport, ApiSource};
use weir_source::{Event, Kind, Object};

const WORLD: &str = "
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other-proxy, namespace: shop, labels: {service.kubernetes.io/service-proxy-name: foo}}
spec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: shop}
spec: {clusterIP: None, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.5]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: headless-1, namespace: shop, labels: {kubernetes.io/service-name: headless, service.kubernetes.io/headless: ''}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.6]}]
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
";

fn server() -> FakeApi {
    let api = FakeApi::start(None, "127.0.0.1:0".parse().unwrap()).unwrap();
    api.set_faults(|f| f.bookmark_interval = Duration::from_millis(200));
    api
}

fn options(api: &FakeApi) -> ApiOptions {
    ApiOptions {
        master: Some(api.url()),
        node_name: Some("node-a".into()),
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        stale_after: Duration::from_millis(500),
        ..ApiOptions::default()
    }
}

struct Running {
    source: ApiSource,
    events: mpsc::Receiver<Event>,
    reports: mpsc::Receiver<ApiReport>,
}

fn start(api: &FakeApi) -> Running {
    start_with(options(api))
}

fn start_with(opts: ApiOptions) -> Running {
    let (tx, events) = mpsc::channel();
    let (rtx, reports) = mpsc::channel();
    let rtx = std::sync::Mutex::new(rtx);
    let source = start_api_source(opts, tx, move |r| {
        let _ = rtx.lock().unwrap().send(r.clone());
    })
    .unwrap();
    Running {
        source,
        events,
        reports,
    }
}

fn names(list: &[Object]) -> Vec<String> {
    let mut n: Vec<String> = list.iter().map(|o| o.key().to_string()).collect();
    n.sort();
    n
}

/// The next event matching `f`, within 10 s.
fn next_event(r: &Running, what: &str, f: impl Fn(&Event) -> bool) -> Event {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match r.events.recv_timeout(left) {
            Ok(ev) if f(&ev) => return ev,
            Ok(_) => {}
            Err(_) => panic!("no {what} within 10s"),
        }
    }
}

fn listed(r: &Running, kind: Kind) -> Vec<Object> {
    match next_event(
        r,
        &format!("list of {kind:?}"),
        |e| matches!(e, Event::Listed(k, _) if *k == kind),
    ) {
        Event::Listed(_, l) => l,
        _ => unreachable!(),
    }
}

/// The first list of each of the three kinds, by kind: the watchers list at once, in no set
/// order (waiting for them one kind after another dropped a list that came early: a CI
/// failure, "no list of Node").
fn initial_lists(r: &Running) -> std::collections::BTreeMap<Kind, Vec<String>> {
    let mut lists = std::collections::BTreeMap::new();
    while lists.len() < 3 {
        match next_event(r, "a list", |e| matches!(e, Event::Listed(..))) {
            Event::Listed(k, l) => lists.insert(k, names(&l)),
            _ => unreachable!(),
        };
    }
    lists
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn initial_lists_honour_kube_proxys_selectors_and_then_changes_stream() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    let r = start(&api);
    let lists = initial_lists(&r);
    assert_eq!(lists[&Kind::Service], ["Service/shop/web"]);
    assert_eq!(lists[&Kind::EndpointSlice], ["EndpointSlice/shop/web-1"]);
    assert_eq!(lists[&Kind::Node], ["Node/node-a"], "only this node");
    wait_until("ready", || r.source.status().ready());
    assert_eq!(r.source.status().check(), Ok(()));
    let reqs = api.requests();
    assert!(
        reqs.iter().any(|q| q.contains("/api/v1/services?")
            && q.contains("labelSelector=%21service.kubernetes.io%2Fservice-proxy-name")
            && q.contains("fieldSelector=spec.clusterIP%21%3DNone")),
        "{reqs:#?}"
    );

    // Changes arrive as single events once the watches run.
    api.apply_yaml(
        "apiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: shop}\n\
         spec: {clusterIP: 10.96.0.12, ports: [{port: 81}]}\n",
    )
    .unwrap();
    let ev = next_event(&r, "the new service", |e| matches!(e, Event::Applied(_)));
    let Event::Applied(o) = ev else {
        unreachable!()
    };
    assert_eq!(o.key().to_string(), "Service/shop/new");
    assert!(api.delete("EndpointSlice", "shop", "web-1"));
    let ev = next_event(&r, "the deletion", |e| matches!(e, Event::Deleted(_)));
    assert_eq!(
        ev,
        Event::Deleted(weir_source::ObjectKey::new(
            Kind::EndpointSlice,
            "shop",
            "web-1"
        ))
    );
    // A service that becomes headless leaves the selection: a deletion, as the API server
    // sends it.
    api.apply_yaml(
        "apiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: shop}\n\
         spec: {clusterIP: None, ports: [{port: 81}]}\n",
    )
    .unwrap();
    next_event(
        &r,
        "the now headless service's deletion",
        |e| matches!(e, Event::Deleted(k) if k.name == "new"),
    );
    wait_until("the object count report", || {
        r.reports.try_iter().any(|rep| {
            rep == ApiReport::Objects {
                kind: Kind::EndpointSlice,
                objects: 0,
            }
        })
    });
}

#[test]
fn a_large_list_arrives_in_pages_as_one_complete_list() {
    let api = server();
    let mut yaml = String::new();
    for i in 0..1203 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: big}}\n\
             spec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    api.apply_yaml(&yaml).unwrap();
    let r = start(&api);
    assert_eq!(listed(&r, Kind::Service).len(), 1203);
    let pages = api
        .requests()
        .iter()
        .filter(|q| q.starts_with("GET /api/v1/services?") && !q.contains("watch=true"))
        .count();
    assert_eq!(pages, 3, "kube-rs pages by 500: {:#?}", api.requests());
}

#[test]
fn no_view_until_every_initial_list_is_complete() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    api.set_faults(|f| f.hold_lists = true);
    let r = start(&api);
    std::thread::sleep(Duration::from_millis(700));
    assert!(r.events.try_recv().is_err(), "nothing before the lists");
    assert!(!r.source.status().ready());
    let why = r.source.status().check().unwrap_err();
    assert!(why.contains("initial list"), "{why}");
    api.set_faults(|f| f.hold_lists = false);
    wait_until("ready", || r.source.status().ready());
}

#[test]
fn a_dropped_watch_and_a_restarted_server_resume_without_a_relist() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    let r = start(&api);
    wait_until("ready", || r.source.status().ready());
    let lists_before = api
        .requests()
        .iter()
        .filter(|q| !q.contains("watch=true") && !q.contains("/version"))
        .count();
    api.drop_connections();
    api.apply_yaml("apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {seen: once}}\n")
        .unwrap();
    next_event(
        &r,
        "the change after a dropped watch",
        |e| matches!(e, Event::Applied(o) if o.key().name == "node-a"),
    );
    let before_restart = api.requests().len();
    api.restart().unwrap();
    assert!(api.delete("Node", "", "node-a"));
    next_event(
        &r,
        "the deletion after a restart",
        |e| matches!(e, Event::Deleted(k) if k.name == "node-a"),
    );
    // Every kind watches again, from where it was (a resourceVersion, not a new list).
    wait_until("every kind's watch resumed", || {
        let since = api.requests().split_off(before_restart);
        ["/api/v1/services?", "/endpointslices?", "/api/v1/nodes?"]
            .iter()
            .all(|p| {
                since
                    .iter()
                    .any(|q| q.contains(p) && q.contains("watch=true"))
            })
    });
    let lists_after = api
        .requests()
        .iter()
        .filter(|q| !q.contains("watch=true") && !q.contains("/version"))
        .count();
    assert_eq!(lists_before, lists_after, "resumed, not listed again");
}

#[test]
fn an_expired_resource_version_relists_and_applies_deletions_missed_in_the_gap() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    let r = start(&api);
    initial_lists(&r);
    api.stop();
    // While weir cannot see it: web goes, another comes, and etcd compacts the history.
    assert!(api.delete("Service", "shop", "web"));
    api.apply_yaml(
        "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\n\
         spec: {clusterIP: 10.96.0.20, ports: [{port: 443}]}\n",
    )
    .unwrap();
    api.compact();
    api.restart().unwrap();
    let relisted = listed(&r, Kind::Service);
    assert_eq!(names(&relisted), ["Service/shop/api"]);
    // The watch was told 410 Gone (a failure report naming it), hence the list.
    let failures: Vec<String> = r
        .reports
        .try_iter()
        .filter_map(|x| match x {
            ApiReport::Failed {
                kind: Kind::Service,
                error,
                ..
            } => Some(error),
            _ => None,
        })
        .collect();
    assert!(
        failures
            .iter()
            .any(|e| e.contains("too old resource version")),
        "{failures:?}"
    );
}

#[test]
fn an_unreachable_server_is_stale_after_the_grace_and_recovers() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    let r = start(&api);
    wait_until("ready", || r.source.status().ready());
    api.stop();
    wait_until("stale", || {
        r.source
            .status()
            .check()
            .is_err_and(|e| e.contains("stale"))
    });
    assert!(r.source.status().ready(), "the last view stands");
    api.restart().unwrap();
    wait_until("recovered", || r.source.status().check().is_ok());
}

#[test]
fn a_bad_kubeconfig_is_a_clear_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, "clusters: [oops").unwrap();
    let (tx, _rx) = mpsc::channel::<Event>();
    let err = start_api_source(
        ApiOptions {
            kubeconfig: Some(path.clone()),
            ..ApiOptions::default()
        },
        tx,
        |_| {},
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    let (tx, _rx) = mpsc::channel::<Event>();
    let err = start_api_source(
        ApiOptions {
            master: Some("not a url".into()),
            ..ApiOptions::default()
        },
        tx,
        |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("--master"), "{err}");
}

/// A kubeconfig pointing at the fake server works like --master.
#[test]
fn a_kubeconfig_file_names_the_server() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{}'}}}}]\n\
             users: [{{name: u, user: {{token: abc}}}}]\n\
             contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
            api.url()
        ),
    )
    .unwrap();
    let r = start_with(ApiOptions {
        kubeconfig: Some(path),
        master: None,
        ..options(&api)
    });
    wait_until("ready", || r.source.status().ready());
}

/// kube-apiserver 1.20 (as `weir proxy` met a real one): EndpointSlices only in
/// `discovery.k8s.io/v1beta1`, and the Service field selector refused with 400. The source
/// reads v1beta1 slices (node and zone from `topology`) and filters headless Services itself.
#[test]
fn a_1_20_server_gets_v1beta1_slices_and_the_service_field_selector_applied_here() {
    let api = server();
    api.emulate(Emulate::Kube1_20);
    api.apply_yaml(WORLD).unwrap();
    let r = start(&api);
    let lists = initial_lists(&r);
    assert_eq!(
        lists[&Kind::Service],
        ["Service/shop/web"],
        "headless left out here, other-proxy by the label selector the server applies"
    );
    assert_eq!(lists[&Kind::EndpointSlice], ["EndpointSlice/shop/web-1"]);
    assert_eq!(lists[&Kind::Node], ["Node/node-a"]);
    wait_until("ready", || r.source.status().ready());
    assert_eq!(r.source.status().check(), Ok(()));
    let reports: Vec<ApiReport> = r.reports.try_iter().collect();
    let compat: Vec<&ApiReport> = reports
        .iter()
        .filter(|r| matches!(r, ApiReport::Compat { .. }))
        .collect();
    assert_eq!(compat.len(), 2, "one note per adapted kind: {compat:#?}");
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .any(|q| q.starts_with("GET /apis/discovery.k8s.io/v1beta1/endpointslices?")),
        "{reqs:#?}"
    );
    assert!(
        !reqs
            .iter()
            .any(|q| q.starts_with("GET /apis/discovery.k8s.io/v1/endpointslices")),
        "discovery first, no request the server cannot serve: {reqs:#?}"
    );
    let services: Vec<&String> = reqs
        .iter()
        .filter(|q| q.starts_with("GET /api/v1/services?"))
        .collect();
    assert!(
        services[0].contains("fieldSelector=") && !services[1].contains("fieldSelector="),
        "kube-proxy's selector first, then none: {services:#?}"
    );

    // A v1beta1 endpoint's topology names its node and zone.
    api.apply_yaml(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {name: web-2, namespace: shop, labels: {kubernetes.io/service-name: web}}\n\
         addressType: IPv4\n\
         endpoints: [{addresses: [10.244.1.9], nodeName: node-b, zone: zone-2}]\n",
    )
    .unwrap();
    let ev = next_event(&r, "the new slice", |e| matches!(e, Event::Applied(_)));
    let Event::Applied(Object::EndpointSlice(slice)) = ev else {
        panic!("not a slice: {ev:?}")
    };
    assert_eq!(slice.endpoints[0].node_name().map(|n| &**n), Some("node-b"));
    assert_eq!(slice.endpoints[0].zone().map(|z| &**z), Some("zone-2"));

    // New headless Services stay out; one that was in and turns headless is deleted.
    api.apply_yaml(
        "apiVersion: v1\nkind: Service\nmetadata: {name: hl2, namespace: shop}\n\
         spec: {clusterIP: None, ports: [{port: 81}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n\
         spec: {clusterIP: None, ports: [{port: 80}]}\n",
    )
    .unwrap();
    let ev = next_event(&r, "a service event", |e| {
        matches!(e, Event::Applied(Object::Service(_)) | Event::Deleted(_))
    });
    assert_eq!(
        ev,
        Event::Deleted(weir_source::ObjectKey::new(Kind::Service, "shop", "web")),
        "hl2 was never sent"
    );
}

/// Today's servers: discovery says v1, the selector is sent and taken, no note.
#[test]
fn a_current_server_gets_v1_slices_and_the_selector_with_no_compat_note() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    let r = start(&api);
    initial_lists(&r);
    let reqs = api.requests();
    assert!(
        reqs.iter().any(|q| q == "GET /apis/discovery.k8s.io/v1"),
        "{reqs:#?}"
    );
    assert!(!reqs.iter().any(|q| q.contains("v1beta1")), "{reqs:#?}");
    assert!(
        r.reports
            .try_iter()
            .all(|r| !matches!(r, ApiReport::Compat { .. })),
        "no compat note"
    );
}

const POLICY_WORLD: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: a}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop, labels: {app: web}}
spec: {nodeName: node-a, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
status: {phase: Running, podIPs: [{ip: 10.244.0.5}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: shop}
spec: {podSelector: {}}
";

/// `weir policy`'s kinds: Namespaces, Pods with their policy part, NetworkPolicies with
/// their warnings; nothing else is asked for.
#[test]
fn policy_kinds_are_watched_only_when_asked_and_pods_carry_their_policy_part() {
    let api = server();
    api.apply_yaml(WORLD).unwrap();
    api.apply_yaml(POLICY_WORLD).unwrap();
    let kinds = vec![Kind::Namespace, Kind::Pod, Kind::NetworkPolicy];
    let r = start_with(ApiOptions {
        kinds: kinds.clone(),
        policy_pods: true,
        node_name: None,
        ..options(&api)
    });
    let lists = initial_lists(&r);
    assert_eq!(lists.keys().copied().collect::<Vec<_>>(), {
        let mut k = kinds.clone();
        k.sort();
        k
    });
    wait_until("ready", || r.source.status().ready());
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .all(|q| !q.contains("/services") && !q.contains("/endpointslices")),
        "{reqs:#?}"
    );
    assert!(
        reqs.iter()
            .any(|q| q.starts_with("GET /apis/networking.k8s.io/v1/networkpolicies?")),
        "{reqs:#?}"
    );

    // A policy with something weir cannot enforce as written: kept, with its warning.
    api.apply_yaml(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {name: odd, namespace: shop}\n\
         spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}\n",
    )
    .unwrap();
    let ev = next_event(&r, "the new policy", |e| matches!(e, Event::Applied(_)));
    let Event::Applied(Object::NetworkPolicy(p)) = ev else {
        panic!("not a policy: {ev:?}")
    };
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert_eq!(p.warnings[0].field, "spec.ingress[0].from[0].ipBlock.cidr");

    // A new pod comes with labels, node and named ports.
    api.apply_yaml(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: db-0, namespace: shop, labels: {app: db}}\n\
         spec: {nodeName: node-b, containers: [{name: c, ports: [{name: pg, containerPort: 5432}]}]}\n\
         status: {phase: Running, podIP: 10.244.1.7}\n",
    )
    .unwrap();
    let ev = next_event(&r, "the new pod", |e| matches!(e, Event::Applied(_)));
    let Event::Applied(Object::Pod(pod)) = ev else {
        panic!("not a pod: {ev:?}")
    };
    let part = &pod.policy.as_ref().expect("the policy part").value;
    assert_eq!(part.node.as_deref(), Some("node-b"));
    assert_eq!(part.labels.get("app"), Some("db"));
    assert_eq!(
        part.named_port("pg", weir_model::weir_policy::model::Protocol::Tcp),
        Some(5432)
    );
}
