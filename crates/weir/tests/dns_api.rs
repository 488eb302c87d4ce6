//! `weir dns` fed by the Kubernetes API (root only): the real binary in a throwaway network
//! namespace, watching weir's fake API server (the real list/watch protocol) on the
//! namespace's loopback, asked by the real `dig`. Names: `wda-<tag>-<pid>`; the namespace and
//! the processes are removed on drop, even after a panic.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{runnable, WEIR};
use weir_fakeapi::FakeApi;

/// The API's objects: a ClusterIP service; a headless one with its slice labelled as the
/// EndpointSlice controller labels a headless service's slices (kube-proxy's selector leaves
/// both out); a service another proxy implementation owns (also left out by kube-proxy).
const OBJECTS: &str = "
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec:
  clusterIP: None
  clusterIPs: [None]
  ports: [{name: pg, port: 5432}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-1
  namespace: shop
  labels: {kubernetes.io/service-name: db, service.kubernetes.io/headless: ''}
addressType: IPv4
ports: [{name: pg, port: 5432}]
endpoints:
  - {addresses: [10.244.1.7], hostname: db-0, conditions: {ready: true}}
---
apiVersion: v1
kind: Service
metadata:
  name: other
  namespace: shop
  labels: {service.kubernetes.io/service-proxy-name: someone-else}
spec:
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30]
  ports: [{port: 80}]
";

const POD: &str = "
apiVersion: v1
kind: Pod
metadata: {name: api-0, namespace: shop}
spec: {containers: [{name: c, image: x}]}
status: {phase: Running, podIP: 10.244.1.5, podIPs: [{ip: 10.244.1.5}]}
";

struct Env {
    ns: String,
    dir: tempfile::TempDir,
    api: Option<FakeApi>,
    server: Option<Child>,
}

impl Env {
    fn new(tag: &str) -> Env {
        let ns = format!("wda-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        let ok = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        ok(&["netns", "add", &ns]);
        let env = Env {
            ns: ns.clone(),
            dir: tempfile::tempdir().unwrap(),
            api: None,
            server: None,
        };
        ok(&["-n", &ns, "link", "set", "lo", "up"]);
        env
    }

    fn start(&mut self, objects: &str, extra: &[&str]) {
        let api = FakeApi::start(Some(&self.ns), "127.0.0.1:6443".parse().unwrap()).unwrap();
        api.set_faults(|f| f.bookmark_interval = Duration::from_millis(500));
        api.apply_yaml(objects).unwrap();
        self.api = Some(api);
        let log = std::fs::File::create(self.dir.path().join("weir-dns.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, WEIR, "dns"])
            .args(["--master", "http://127.0.0.1:6443"])
            .args(["--listen", "127.0.0.1:53", "--zone", "cluster.local"])
            // Outside names are not this test's business: REFUSED, as before forwarding to
            // /etc/resolv.conf became the default.
            .args(["--upstream-resolv-conf", "none"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.server = Some(child);
        let t = Instant::now();
        while self.dig("dns-version.cluster.local", "TXT").0 != "NOERROR" {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "weir dns never answered: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn api(&self) -> &FakeApi {
        self.api.as_ref().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("weir-dns.log")).unwrap_or_default()
    }

    /// (status, answer data sorted).
    fn dig(&self, name: &str, qtype: &str) -> (String, Vec<String>) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "dig", "@127.0.0.1"])
            .args(["+time=2", "+tries=1", "+noall", "+comments", "+answer"])
            .args([name, qtype])
            .output()
            .expect("dig (bind9-dnsutils) must be installed");
        let text = String::from_utf8_lossy(&out.stdout);
        let status = text
            .split("status: ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or("NO-ANSWER")
            .to_string();
        let mut data: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 5).then(|| f[4..].join(" "))
            })
            .collect();
        data.sort();
        (status, data)
    }

    /// Polls dig until the answer is `want`; returns how long that took after `since`.
    fn until(&self, since: Instant, name: &str, qtype: &str, want: (&str, &[&str])) -> Duration {
        loop {
            let got = self.dig(name, qtype);
            if got.0 == want.0 && got.1 == want.1 {
                return since.elapsed();
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "{name} {qtype}: still {got:?}, want {want:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.api.take();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// The zone follows the API objects within a second of each change (the bound).
const FOLLOW: Duration = Duration::from_secs(1);

/// Records appear, change and disappear with the API's objects; headless services and
/// services of another proxy are answered (DNS asks for every Service and EndpointSlice, not
/// with kube-proxy's selectors), and Pods are not watched unless `--pods verified`.
#[test]
fn records_follow_the_api_objects_within_a_second() {
    if !runnable() {
        return;
    }
    let mut env = Env::new("f");
    env.start(OBJECTS, &[]);
    let web = "web.shop.svc.cluster.local";
    let db = "db.shop.svc.cluster.local";
    assert_eq!(
        env.dig(web, "A"),
        ("NOERROR".into(), vec!["10.96.0.20".into()])
    );
    assert_eq!(
        env.dig(db, "A"),
        ("NOERROR".into(), vec!["10.244.1.7".into()])
    );
    assert_eq!(
        env.dig("db-0.db.shop.svc.cluster.local", "A").1,
        ["10.244.1.7"]
    );
    assert_eq!(
        env.dig("_pg._tcp.db.shop.svc.cluster.local", "SRV").1,
        ["0 100 5432 db-0.db.shop.svc.cluster.local."]
    );
    assert_eq!(
        env.dig("other.shop.svc.cluster.local", "A").1,
        ["10.96.0.30"]
    );
    let asked = env.api().requests();
    let services: Vec<&String> = asked.iter().filter(|r| r.contains("/services")).collect();
    assert!(!services.is_empty(), "{asked:?}");
    for r in &services {
        assert!(!r.contains("Selector"), "DNS asked with a selector: {r}");
    }
    assert!(
        !asked.iter().any(|r| r.contains("/pods")),
        "Pods watched without --pods verified: {asked:?}"
    );

    // Appears.
    let t = Instant::now();
    env.api()
        .apply_yaml(
            &OBJECTS
                .replace("name: web,", "name: shop2,")
                .replace("10.96.0.20", "10.96.0.21"),
        )
        .unwrap();
    let appeared = env.until(
        t,
        "shop2.shop.svc.cluster.local",
        "A",
        ("NOERROR", &["10.96.0.21"]),
    );
    // Changes: a second ready endpoint of the headless service.
    let t = Instant::now();
    env.api()
        .apply_yaml(&OBJECTS.replace(
            "hostname: db-0, conditions: {ready: true}}",
            "hostname: db-0, conditions: {ready: true}}\n  - {addresses: [10.244.2.8], hostname: db-1}",
        ))
        .unwrap();
    let changed = env.until(t, db, "A", ("NOERROR", &["10.244.1.7", "10.244.2.8"]));
    // Disappears.
    let t = Instant::now();
    assert!(env.api().delete("Service", "shop", "web"));
    let gone = env.until(t, web, "A", ("NXDOMAIN", &[]));
    eprintln!("appeared {appeared:?}, changed {changed:?}, disappeared {gone:?}");
    for (what, took) in [
        ("appear", appeared),
        ("change", changed),
        ("disappear", gone),
    ] {
        assert!(took < FOLLOW, "{what} took {took:?}");
    }
}

/// `--pods verified`: a pod name answers only with an address a Pod in that namespace holds,
/// following the Pod watch (the Pod appears and goes away); other namespaces and addresses
/// nobody holds are NXDOMAIN.
#[test]
fn pods_verified_answers_only_addresses_of_pods_in_the_namespace() {
    if !runnable() {
        return;
    }
    let mut env = Env::new("p");
    env.start(&format!("{OBJECTS}\n---\n{POD}"), &["--pods", "verified"]);
    let name = "10-244-1-5.shop.pod.cluster.local";
    assert_eq!(
        env.dig(name, "A"),
        ("NOERROR".into(), vec!["10.244.1.5".into()])
    );
    assert_eq!(env.dig(name, "AAAA"), ("NOERROR".into(), vec![]), "NODATA");
    for other in [
        "10-244-1-5.other.pod.cluster.local",
        "10-244-1-6.shop.pod.cluster.local",
    ] {
        assert_eq!(env.dig(other, "A").0, "NXDOMAIN", "{other}");
    }
    assert!(env.api().requests().iter().any(|r| r.contains("/pods")));

    let t = Instant::now();
    assert!(env.api().delete("Pod", "shop", "api-0"));
    let gone = env.until(t, name, "A", ("NXDOMAIN", &[]));
    let t = Instant::now();
    env.api()
        .apply_yaml(&POD.replace("10.244.1.5", "10.244.1.6"))
        .unwrap();
    let moved = env.until(
        t,
        "10-244-1-6.shop.pod.cluster.local",
        "A",
        ("NOERROR", &["10.244.1.6"]),
    );
    assert_eq!(env.dig(name, "A").0, "NXDOMAIN", "the old address");
    assert!(gone < FOLLOW && moved < FOLLOW, "{gone:?} {moved:?}");
}

/// The source is chosen clearly: --manifests cannot be combined with --master, and a
/// kubeconfig that does not exist is an error before anything is served.
#[test]
fn api_flags_are_checked() {
    let out = Command::new(WEIR)
        .args([
            "dns",
            "--manifests",
            "/tmp",
            "--master",
            "http://127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be used with"), "{err}");
    let out = Command::new(WEIR)
        .args(["dns", "--kubeconfig", "/nonexistent/kubeconfig"])
        .args(["--listen", "127.0.0.1:0", "--upstream-resolv-conf", "none"])
        .arg("--metrics-bind-address=0") // the host's namespace: no listener
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}
