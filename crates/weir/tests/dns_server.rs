//! `weir dns` as a process (root only): the real binary in a throwaway network namespace,
//! asked by the real `dig`, forwarding to a real NSD in a second namespace joined by a veth
//! pair. Names: `wdn-<s|u>-<tag>-<pid>`; everything is removed on drop, even after a panic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{runnable, KillOnDrop, WEIR};

const SERVER_IP: &str = "10.53.0.1";
const UPSTREAM_IP: &str = "10.53.0.2";
/// Nobody answers here: the forwarder's failover must skip it.
const DEAD_UPSTREAM_IP: &str = "10.53.0.9";

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

struct Env {
    server_ns: String,
    upstream_ns: String,
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl Env {
    fn new(tag: &str) -> Env {
        let pid = std::process::id();
        let env = Env {
            server_ns: format!("wdn-s-{tag}-{pid}"),
            upstream_ns: format!("wdn-u-{tag}-{pid}"),
            dir: tempfile::tempdir().unwrap(),
            children: Vec::new(),
        };
        for ns in [&env.server_ns, &env.upstream_ns] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
            run(Command::new("ip").args(["netns", "add", ns]));
        }
        // The veth pair is created inside the namespaces: the host's interfaces are never
        // involved, and the names only need to be unique per namespace.
        env.sh(
            &env.server_ns,
            &format!(
                "ip link set lo up && ip link add up0 type veth peer name up0 netns {u} && \
                 ip addr add {SERVER_IP}/24 dev up0 && ip link set up0 up && \
                 ip -n {u} link set lo up && ip -n {u} addr add {UPSTREAM_IP}/24 dev up0 && \
                 ip -n {u} link set up0 up",
                u = env.upstream_ns
            ),
        );
        env
    }

    fn sh(&self, ns: &str, script: &str) -> Output {
        run(Command::new("ip").args(["netns", "exec", ns, "sh", "-c", script]))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// NSD serving `example.test` (one A, and 100 A records that need TCP) on UPSTREAM_IP:53.
    fn start_upstream(&mut self) {
        let d = self.path("nsd");
        std::fs::create_dir(&d).unwrap();
        let mut zone = String::from(
            "$ORIGIN example.test.\n$TTL 300\n\
             @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60\n\
             @ IN NS ns\nns IN A 10.53.0.2\nwww IN A 192.0.2.80\n",
        );
        for i in 1..=100 {
            zone.push_str(&format!("big IN A 198.51.100.{i}\n"));
        }
        std::fs::write(d.join("example.test.zone"), zone).unwrap();
        let d = d.display();
        std::fs::write(
            self.path("nsd/nsd.conf"),
            format!(
                "server:\n  ip-address: {UPSTREAM_IP}\n  port: 53\n  username: \"\"\n  \
                 chroot: \"\"\n  zonesdir: \"{d}\"\n  pidfile: \"{d}/nsd.pid\"\n  \
                 database: \"\"\n  zonelistfile: \"{d}/zone.list\"\n  \
                 xfrdfile: \"{d}/xfrd.state\"\n  xfrdir: \"{d}\"\n  logfile: \"{d}/nsd.log\"\n  \
                 server-count: 1\nremote-control:\n  control-enable: no\n\
                 zone:\n  name: example.test\n  zonefile: \"{d}/example.test.zone\"\n"
            ),
        )
        .unwrap();
        let conf = self.path("nsd/nsd.conf");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.upstream_ns, "nsd", "-d", "-c"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nsd (Debian package nsd) must be installed");
        self.children.push(child);
        let ns = self.upstream_ns.clone();
        wait_until("nsd answers", || {
            dig_in(&ns, UPSTREAM_IP, &["www.example.test", "A"]).status == "NOERROR"
        });
    }

    fn manifests(&self) -> PathBuf {
        self.path("manifests")
    }

    fn start_weir_dns(&mut self) {
        self.write_manifests();
        self.spawn_weir_dns(&["--autopath"]);
        wait_until("weir dns answers", || {
            self.dig(&["dns-version.cluster.local", "TXT"]).status == "NOERROR"
        });
    }

    /// The manifest directory with the fixture's objects.
    fn write_manifests(&self) {
        std::fs::create_dir(self.manifests()).unwrap();
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../dns/tests/fixtures/cluster.yaml");
        std::fs::copy(fixture, self.manifests().join("cluster.yaml")).unwrap();
    }

    /// Starts `weir dns` on the manifest directory (which may not exist yet) with `extra`
    /// arguments; returns at once.
    fn spawn_weir_dns(&mut self, extra: &[&str]) {
        self.spawn_weir_dns_on(&format!("{SERVER_IP}:53"), extra);
    }

    /// [`Env::spawn_weir_dns`] listening on `listen`.
    fn spawn_weir_dns_on(&mut self, listen: &str, extra: &[&str]) {
        std::fs::write(
            self.path("resolv.conf"),
            format!("search example.test\nnameserver {DEAD_UPSTREAM_IP}\nnameserver {UPSTREAM_IP}\noptions ndots:5\n"),
        )
        .unwrap();
        let log = std::fs::File::create(self.path("weir-dns.log")).unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.server_ns,
                WEIR,
                "dns",
                "--listen",
                listen,
            ])
            .arg("--manifests")
            .arg(self.manifests())
            .arg("--upstream-resolv-conf")
            .arg(self.path("resolv.conf"))
            .args([
                "--zone",
                "cluster.local",
                "--manifest-poll-interval",
                "100ms",
            ])
            .args(extra)
            .env("RUST_LOG", "info,weir_dns=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    /// `weir dns` with `--config` holding `yaml` (and no upstream flag), on `listen`.
    fn spawn_weir_dns_config(&mut self, listen: &str, yaml: &str) {
        let config = self.path(&format!("dns-{}.yaml", self.children.len()));
        std::fs::write(&config, yaml).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("weir-dns.log"))
            .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.server_ns, WEIR, "dns", "--config"])
            .arg(&config)
            .arg("--manifests")
            .arg(self.manifests())
            .args(["--listen", listen, "--manifest-poll-interval", "100ms"])
            .env("RUST_LOG", "info,weir_dns=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
        let server = listen.rsplit_once(':').unwrap().0.to_string();
        let ns = self.server_ns.clone();
        wait_until("weir dns answers", || {
            dig_in(&ns, &server, &["dns-version.cluster.local", "TXT"]).status == "NOERROR"
        });
    }

    /// `curl` in the server's namespace: (HTTP status, body); status 0 when nothing answers.
    fn http_get(&self, url: &str) -> (u16, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.server_ns, "curl", "-s", "-m", "2"])
            .args(["-w", "\n%{http_code}", url])
            .output()
            .expect("curl must be installed");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn dig(&self, args: &[&str]) -> Dig {
        dig_in(&self.server_ns, SERVER_IP, args)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("weir-dns.log")).unwrap_or_default()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.server_ns, &self.upstream_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What dig printed, parsed.
#[derive(Debug)]
struct Dig {
    status: String,
    flags: Vec<String>,
    /// (owner, ttl, type, data) of the answer section.
    answers: Vec<(String, u32, String, String)>,
    /// Types in the authority section.
    authority: Vec<String>,
    raw: String,
}

impl Dig {
    fn data(&self) -> Vec<String> {
        let mut d: Vec<String> = self.answers.iter().map(|a| a.3.clone()).collect();
        d.sort();
        d
    }
}

fn dig_in(ns: &str, server: &str, args: &[&str]) -> Dig {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "dig",
            &format!("@{server}"),
            "+time=4",
            "+tries=1",
        ])
        .args(args)
        .output()
        .expect("dig (bind9-dnsutils) must be installed");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    let status = raw
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("NO-ANSWER")
        .to_string();
    let flags = raw
        .split(";; flags: ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let section = |title: &str| -> Vec<Vec<String>> {
        raw.split(title)
            .nth(1)
            .map(|s| {
                s.lines()
                    .skip(1)
                    .take_while(|l| !l.trim().is_empty())
                    .map(|l| l.split_whitespace().map(String::from).collect())
                    .collect()
            })
            .unwrap_or_default()
    };
    let answers = section(";; ANSWER SECTION:")
        .into_iter()
        .map(|f| {
            (
                f[0].clone(),
                f[1].parse().unwrap(),
                f[3].clone(),
                f[4..].join(" "),
            )
        })
        .collect();
    let authority = section(";; AUTHORITY SECTION:")
        .into_iter()
        .map(|f| f[3].clone())
        .collect();
    Dig {
        status,
        flags,
        answers,
        authority,
        raw,
    }
}

#[test]
fn weir_dns_serves_the_zone_forwards_and_follows_changes() {
    if !runnable() {
        return;
    }
    let mut env = Env::new("a");
    env.start_upstream();
    env.start_weir_dns();

    // Every record type of the specification, as dig sees them over UDP.
    let cases: &[(&[&str], &[&str])] = &[
        (&["web.shop.svc.cluster.local", "A"], &["10.96.0.20"]),
        (&["WEB.shop.svc.Cluster.Local", "AAAA"], &["fd00:96::20"]),
        (
            &["db.shop.svc.cluster.local", "A"],
            &["10.244.1.5", "10.244.2.6"],
        ),
        (&["db-0.db.shop.svc.cluster.local", "A"], &["10.244.1.5"]),
        (
            &["_http._tcp.web.shop.svc.cluster.local", "SRV"],
            &["0 100 80 web.shop.svc.cluster.local."],
        ),
        (
            &["_pg._tcp.db.shop.svc.cluster.local", "SRV"],
            &[
                "0 100 5432 10-244-2-6.db.shop.svc.cluster.local.",
                "0 100 5432 db-0.db.shop.svc.cluster.local.",
                "0 100 5432 db-9.db.shop.svc.cluster.local.",
            ],
        ),
        (&["-x", "10.96.0.20"], &["web.shop.svc.cluster.local."]),
        (&["-x", "10.244.1.5"], &["db-0.db.shop.svc.cluster.local."]),
        (
            &["ext.shop.svc.cluster.local", "CNAME"],
            &["db.example.com."],
        ),
        (&["dns-version.cluster.local", "TXT"], &["\"1.0.1\""]),
        (&["cluster.local", "NS"], &["ns.dns.cluster.local."]),
    ];
    for (args, want) in cases {
        let d = env.dig(args);
        assert_eq!(d.status, "NOERROR", "{args:?}\n{}", d.raw);
        assert!(
            d.flags.contains(&"aa".to_string()),
            "{args:?}: {:?}",
            d.flags
        );
        assert_eq!(d.data(), *want, "{args:?}\n{}", d.raw);
        assert!(d.answers.iter().all(|a| a.1 == 5), "TTL 5: {}", d.raw);
    }
    let soa = env.dig(&["cluster.local", "SOA"]);
    assert!(
        soa.data()[0].starts_with("ns.dns.cluster.local. hostmaster.cluster.local. "),
        "{}",
        soa.raw
    );

    // TCP gives the same answers.
    let tcp = env.dig(&["+tcp", "db.shop.svc.cluster.local", "A"]);
    assert_eq!(tcp.data(), vec!["10.244.1.5", "10.244.2.6"], "{}", tcp.raw);

    // Outside the zone: forwarded to NSD, past the dead first upstream (one timeout, then it
    // is skipped), not authoritative, recursion available.
    let started = Instant::now();
    let www = env.dig(&["www.example.test", "A"]);
    assert_eq!(www.status, "NOERROR", "{}\n{}", www.raw, env.log());
    assert_eq!(www.data(), vec!["192.0.2.80"]);
    assert!(!www.flags.contains(&"aa".to_string()) && www.flags.contains(&"ra".to_string()));
    // It cannot be faster than the attempt timeout (1.5 s) at the dead upstream: this
    // proves the dead one was tried first and failed over, and that no earlier query had
    // been forwarded (positive in-zone answers never are).
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "{:?}\n{}",
        started.elapsed(),
        env.log()
    );
    let started = Instant::now();
    let nx_out = env.dig(&["missing.example.test", "A"]);
    assert_eq!(nx_out.status, "NXDOMAIN", "{}", nx_out.raw);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the dead upstream is skipped once marked down: {:?}",
        started.elapsed()
    );
    // NXDOMAIN vs NODATA, both with the SOA for negative caching. (With autopath, the
    // NXDOMAIN name is first tried as a search expansion: `nope.` goes upstream too.)
    let nodata = env.dig(&["db-0.db.shop.svc.cluster.local", "AAAA"]);
    assert_eq!(
        (nodata.status.as_str(), nodata.answers.len()),
        ("NOERROR", 0),
        "{}",
        nodata.raw
    );
    assert_eq!(nodata.authority, vec!["SOA"]);
    let nx = env.dig(&["nope.shop.svc.cluster.local", "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);
    assert_eq!(nx.authority, vec!["SOA"]);

    // 100 records: NSD truncates over UDP, the forwarder retries over TCP, and weir's own
    // UDP answer is truncated to 1232 bytes with TC; dig retries over TCP and gets them all.
    let big = env.dig(&["+bufsize=1232", "big.example.test", "A"]);
    assert_eq!(big.answers.len(), 100, "{}", big.raw);
    let cut = env.dig(&["+bufsize=1232", "+ignore", "big.example.test", "A"]);
    assert!(cut.flags.contains(&"tc".to_string()), "{}", cut.raw);
    // The ExternalName chased through the forwarder: CNAME, then the target's addresses.
    std::fs::write(
        env.manifests().join("ext2.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: ext2, namespace: shop}\n\
         spec: {type: ExternalName, externalName: www.example.test}\n",
    )
    .unwrap();
    wait_until("ext2 appears", || {
        env.dig(&["ext2.shop.svc.cluster.local", "A"]).status == "NOERROR"
    });
    let chased = env.dig(&["ext2.shop.svc.cluster.local", "A"]);
    assert_eq!(
        chased.data(),
        vec!["192.0.2.80", "www.example.test."],
        "{}",
        chased.raw
    );

    // Autopath: a pod in `shop` looking up `www.example.test` (fewer dots than ndots:5)
    // first asks for it under its namespace's search domain; one answer ends the search.
    let first = env.dig(&["www.example.test.shop.svc.cluster.local", "A"]);
    assert_eq!(first.status, "NOERROR", "{}", first.raw);
    assert_eq!(
        first.data(),
        vec!["192.0.2.80", "www.example.test."],
        "{}",
        first.raw
    );
    let none = env.dig(&["nothing.example.test.shop.svc.cluster.local", "A"]);
    assert_eq!(none.status, "NXDOMAIN", "{}", none.raw);

    // Garbage on the wire changes nothing.
    env.sh(
        &env.server_ns,
        &format!(
            "bash -c 'for i in 1 2 3 4 5 6 7 8; do head -c $((i * 40)) /dev/urandom > /dev/udp/{SERVER_IP}/53; done'"
        ),
    );

    // A zone change is served within one second of the file being written.
    let written = Instant::now();
    std::fs::write(
        env.manifests().join("late.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: late, namespace: shop}\n\
         spec: {clusterIP: 10.96.0.77}\n",
    )
    .unwrap();
    loop {
        let d = env.dig(&["late.shop.svc.cluster.local", "A"]);
        if d.data() == vec!["10.96.0.77"] {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(1),
            "change not served within 1 s: {}\n{}",
            d.raw,
            env.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("zone change served after {:?}", written.elapsed());
    // And a deletion.
    std::fs::remove_file(env.manifests().join("late.yaml")).unwrap();
    wait_until("late is gone", || {
        env.dig(&["late.shop.svc.cluster.local", "A"]).status == "NXDOMAIN"
    });
    // Still alive after all of it.
    assert_eq!(
        env.dig(&["web.shop.svc.cluster.local", "A"]).data(),
        vec!["10.96.0.20"]
    );
}

/// An unknown `--pods` mode is rejected by the parser, naming the three modes (verified
/// itself is tested against the API in dns_api.rs).
#[test]
fn pods_mode_is_checked() {
    let out = Command::new(WEIR)
        .args(["dns", "--pods", "secure"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("disabled, insecure, verified"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A DnsConfiguration's stub domain, host entries and rewrites, asked by dig: the default
/// upstream is dead, so only the stub domain's own upstream (NSD) can answer `example.test`.
#[test]
fn config_file_stub_domains_hosts_and_rewrites() {
    if !runnable() {
        return;
    }
    let mut env = Env::new("c");
    env.start_upstream();
    env.write_manifests();
    let yaml = format!(
        "apiVersion: weir.dev/v1alpha1\nkind: DnsConfiguration\nzone: cluster.local\n\
         upstreams: [{DEAD_UPSTREAM_IP}]\n\
         stubDomains:\n  example.test: [{UPSTREAM_IP}]\n\
         hosts:\n  - {{ip: 10.9.8.7, names: [db.corp.internal, pg.corp.internal]}}\n\
         \x20 - {{ip: 'fd00::7', names: [db.corp.internal]}}\n\
         rewrites:\n  - {{exact: shop-web.corp.internal, to: web.shop.svc.cluster.local}}\n\
         \x20 - {{exact: old-web.shop.svc.cluster.local, to: web.shop.svc.cluster.local}}\n\
         \x20 - {{suffix: alias.test, to: example.test}}\n"
    );
    env.spawn_weir_dns_config(&format!("{SERVER_IP}:53"), &yaml);
    let dig = |args: &[&str]| env.dig(args);

    // The stub domain's upstream answers its zone.
    let www = dig(&["www.example.test", "A"]);
    assert_eq!(www.data(), ["192.0.2.80"], "{}\n{}", www.raw, env.log());
    // Other outside names go to the default upstream, which is dead.
    assert_eq!(dig(&["www.elsewhere.invalid", "A"]).status, "SERVFAIL");

    // Host entries: A, AAAA, NODATA for other types, PTR; authoritative.
    let a = dig(&["DB.corp.internal", "A"]);
    assert_eq!(a.data(), ["10.9.8.7"], "{}", a.raw);
    assert!(a.flags.contains(&"aa".to_string()), "{}", a.raw);
    assert_eq!(a.answers[0].0, "DB.corp.internal.");
    assert_eq!(dig(&["db.corp.internal", "AAAA"]).data(), ["fd00::7"]);
    let mx = dig(&["pg.corp.internal", "MX"]);
    assert_eq!((mx.status.as_str(), mx.answers.len()), ("NOERROR", 0));
    assert_eq!(
        dig(&["-x", "10.9.8.7"]).data(),
        ["db.corp.internal.", "pg.corp.internal."]
    );

    // Rewrites: answered as the new name, shown under the name asked.
    for name in ["shop-web.corp.internal", "old-web.shop.svc.cluster.local"] {
        let r = dig(&[name, "A"]);
        assert_eq!(r.data(), ["10.96.0.20"], "{name}: {}", r.raw);
        assert_eq!(r.answers[0].0, format!("{name}."), "{}", r.raw);
        assert!(
            r.raw.contains(&format!(";{name}.\t")),
            "question kept: {}",
            r.raw
        );
    }
    let alias = dig(&["www.alias.test", "A"]);
    assert_eq!(alias.data(), ["192.0.2.80"], "{}", alias.raw);
    assert_eq!(alias.answers[0].0, "www.alias.test.");
    // The zone itself is unchanged, over TCP too.
    assert_eq!(
        dig(&["web.shop.svc.cluster.local", "A"]).data(),
        ["10.96.0.20"]
    );
    assert_eq!(
        dig(&["+tcp", "old-web.shop.svc.cluster.local", "A"]).data(),
        ["10.96.0.20"]
    );
    assert_eq!(
        dig(&["nope.shop.svc.cluster.local", "A"]).status,
        "NXDOMAIN"
    );
}

/// Without any upstream setting `weir dns` forwards to /etc/resolv.conf (as CoreDNS's
/// `forward . /etc/resolv.conf`; `ip netns exec` mounts /etc/netns/<ns>/resolv.conf over
/// it); `--upstream-resolv-conf none` and `upstreams: []` answer REFUSED instead.
#[test]
fn outside_names_go_to_resolv_conf_by_default_and_refused_when_told() {
    if !runnable() {
        return;
    }
    let mut env = Env::new("r");
    env.start_upstream();
    env.write_manifests();
    let etc = PathBuf::from("/etc/netns").join(&env.server_ns);
    std::fs::create_dir_all(&etc).unwrap();
    struct RemoveDir(PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _etc = RemoveDir(etc.clone());
    std::fs::write(
        etc.join("resolv.conf"),
        format!("nameserver {UPSTREAM_IP}\n"),
    )
    .unwrap();
    env.sh(
        &env.server_ns,
        "ip addr add 127.0.0.2/8 dev lo && ip addr add 127.0.0.3/8 dev lo",
    );

    env.spawn_weir_dns_config("127.0.0.1:53", "{}\n");
    let www = dig_in(&env.server_ns, "127.0.0.1", &["www.example.test", "A"]);
    assert_eq!(www.data(), ["192.0.2.80"], "{}\n{}", www.raw, env.log());

    // Three servers in one namespace: only the first keeps the default /metrics address
    // (127.0.0.1:9153); the others turn theirs off, in the file and by flag.
    env.spawn_weir_dns_config("127.0.0.2:53", "upstreams: []\nmetricsBindAddress: \"\"\n");
    let refused = dig_in(&env.server_ns, "127.0.0.2", &["www.example.test", "A"]);
    assert_eq!(refused.status, "REFUSED", "{}", refused.raw);

    let log = std::fs::File::create(env.path("none.log")).unwrap();
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &env.server_ns,
            WEIR,
            "dns",
            "--upstream-resolv-conf",
            "none",
        ])
        .arg("--manifests")
        .arg(env.manifests())
        .args(["--listen", "127.0.0.3:53", "--metrics-bind-address=0"])
        .stderr(log)
        .spawn()
        .unwrap();
    env.children.push(child);
    wait_until("the third server answers", || {
        dig_in(
            &env.server_ns,
            "127.0.0.3",
            &["web.shop.svc.cluster.local", "A"],
        )
        .status
            == "NOERROR"
    });
    let refused = dig_in(&env.server_ns, "127.0.0.3", &["www.example.test", "A"]);
    assert_eq!(refused.status, "REFUSED", "{}", refused.raw);
}

/// The value of the sample `series` in an OpenMetrics text (0 when the series is absent).
fn sample(text: &str, series: &str) -> f64 {
    weir_dns::metrics::sample(text, series).unwrap_or(0.0)
}

/// `weir dns --healthz-bind-address --metrics-bind-address`, driven by `curl` and `dig`:
/// /healthz is 503 while the manifest directory is missing and 200 once the zone is served;
/// /livez is 200 throughout; /metrics counts what dig asked, by rcode and transport, the
/// forwarder's cache miss then hit, the dead upstream's failure, and the zone's records as a
/// service is added.
#[test]
fn health_and_metrics_follow_the_zone_and_the_queries() {
    if !runnable() {
        return;
    }
    let mut env = Env::new("h");
    env.start_upstream();
    const AT: &str = concat!("server=\"dns://", "10.53.0.1", ":53\",zone=\".\"");
    let healthz = format!("http://{SERVER_IP}:8080/healthz");
    let livez = format!("http://{SERVER_IP}:8080/livez");
    let metrics = format!("http://{SERVER_IP}:9153/metrics");
    env.spawn_weir_dns(&[
        "--healthz-bind-address",
        &format!("{SERVER_IP}:8080"),
        "--metrics-bind-address",
        &format!("{SERVER_IP}:9153"),
    ]);

    // No manifest directory yet: alive, not ready, and not serving DNS.
    wait_until("the health port answers", || env.http_get(&livez).0 == 200);
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = env.http_get(&healthz);
    assert_eq!(code, 503, "{body}\n{}", env.log());
    assert_eq!(
        env.dig(&["web.shop.svc.cluster.local", "A"]).status,
        "NO-ANSWER"
    );
    let (code, text) = env.http_get(&metrics);
    assert_eq!(code, 200);
    assert_eq!(sample(&text, "weir_dns_zone_records"), 0.0, "{text}");

    env.write_manifests();
    wait_until("/healthz says ready", || env.http_get(&healthz).0 == 200);
    // Ready means answering: the first query after it is served.
    let web = env.dig(&["web.shop.svc.cluster.local", "A"]);
    assert_eq!(web.data(), vec!["10.96.0.20"], "{}", web.raw);
    assert_eq!(env.http_get(&livez).0, 200);

    let before = env.http_get(&metrics).1;
    let records = sample(&before, "weir_dns_zone_records");
    assert!(records > 10.0, "{before}");
    assert!(sample(&before, "weir_dns_zone_names") > 10.0, "{before}");

    assert_eq!(
        env.dig(&["web.shop.svc.cluster.local", "A"]).status,
        "NOERROR"
    );
    assert_eq!(
        env.dig(&["db.shop.svc.cluster.local", "A"]).status,
        "NOERROR"
    );
    assert_eq!(
        env.dig(&["nope.shop.svc.cluster.local", "A"]).status,
        "NXDOMAIN"
    );
    assert_eq!(
        env.dig(&["+tcp", "web.shop.svc.cluster.local", "A"]).status,
        "NOERROR"
    );
    assert_eq!(
        env.dig(&["+tcp", "nope.cluster.local", "A"]).status,
        "NXDOMAIN"
    );
    // Outside the zone: the dead first upstream fails, NSD answers; then from the cache.
    assert_eq!(
        env.dig(&["www.example.test", "A"]).data(),
        vec!["192.0.2.80"]
    );
    assert_eq!(
        env.dig(&["www.example.test", "A"]).data(),
        vec!["192.0.2.80"]
    );

    let after = env.http_get(&metrics).1;
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    let responses = |t: &str, rc: &str| {
        delta(&format!(
            "coredns_dns_responses_total{{{AT},proto=\"{t}\",rcode=\"{rc}\"}}"
        ))
    };
    assert_eq!(responses("udp", "NOERROR"), 4.0, "{after}");
    assert_eq!(responses("udp", "NXDOMAIN"), 1.0, "{after}");
    assert_eq!(responses("tcp", "NOERROR"), 1.0, "{after}");
    assert_eq!(responses("tcp", "NXDOMAIN"), 1.0, "{after}");
    let server = format!("{{server=\"dns://{SERVER_IP}:53\"}}");
    assert_eq!(
        delta(&format!("coredns_cache_misses_total{server}")),
        1.0,
        "{after}"
    );
    assert_eq!(
        delta(&format!("coredns_cache_hits_total{server}")),
        1.0,
        "{after}"
    );
    assert!(
        sample(&after, &format!("coredns_cache_entries{server}")) >= 1.0,
        "{after}"
    );
    // Every query above is in the request-duration histogram, by type (CoreDNS's names).
    let requests = |ty: &str| {
        delta(&format!(
            "coredns_dns_request_duration_seconds_count{{{AT},type=\"{ty}\"}}"
        ))
    };
    assert_eq!(requests("A"), 7.0, "{after}");
    let inf = format!("coredns_dns_request_duration_seconds_bucket{{{AT},type=\"A\",le=\"+Inf\"}}");
    assert_eq!(delta(&inf), 7.0, "{after}");
    let udp_a = format!("coredns_dns_requests_total{{{AT},proto=\"udp\",family=\"1\",type=\"A\"}}");
    assert_eq!(delta(&udp_a), 5.0, "{after}");
    let dead = format!("{{upstream=\"{DEAD_UPSTREAM_IP}:53\"}}");
    let live = format!("{{upstream=\"{UPSTREAM_IP}:53\"}}");
    assert_eq!(
        delta(&format!("weir_dns_upstream_failures_total{dead}")),
        1.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, &format!("weir_dns_upstream_failures_total{live}")),
        0.0
    );
    assert_eq!(
        sample(&after, &format!("weir_dns_upstream_up{dead}")),
        0.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, &format!("weir_dns_upstream_up{live}")),
        1.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "weir_dns_upstream_in_flight"),
        0.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            &format!("coredns_forward_max_concurrent_rejects_total{server}")
        ),
        0.0,
        "{after}"
    );

    // A ClusterIP service with one address adds its A record and its PTR.
    std::fs::write(
        env.manifests().join("late.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: late, namespace: shop}\n\
         spec: {clusterIP: 10.96.0.77}\n",
    )
    .unwrap();
    wait_until("late appears", || {
        env.dig(&["late.shop.svc.cluster.local", "A"]).status == "NOERROR"
    });
    let grown = env.http_get(&metrics).1;
    assert_eq!(
        sample(&grown, "weir_dns_zone_records"),
        records + 2.0,
        "{grown}"
    );
    assert!(
        sample(&grown, "weir_dns_zone_builds_total")
            > sample(&before, "weir_dns_zone_builds_total")
    );
    // Still ready.
    assert_eq!(env.http_get(&healthz).0, 200);
}

/// `weir dns --node-local` in a namespace standing for a node: the link-local address goes on
/// `lo`, the cache answers there, and its DNS traffic makes no conntrack entry while other
/// traffic to the same address does (conntrack is switched on in the namespace by a rule of
/// the test's own, so "no entry" is not vacuous). A restart finds both in place.
#[test]
fn node_local_setup_puts_the_address_on_lo_and_leaves_its_dns_untracked() {
    if !runnable() {
        return;
    }
    const LOCAL: &str = "169.254.20.10";
    let mut env = Env::new("n");
    env.write_manifests();
    let ns = env.server_ns.clone();
    // Something in the namespace needs conntrack, as a node's proxy rules do.
    env.sh(
        &ns,
        "nft add table ip wdntest && \
         nft add chain ip wdntest c '{ type filter hook output priority 0; }' && \
         nft add rule ip wdntest c ct state new counter",
    );
    for round in 0..2 {
        // Round 0: datagrams to the cache's port from before it starts (with no address yet
        // there is no route, so none leaves): an address that appeared before the NOTRACK
        // table left tracked entries (seen in CI when the first query raced the setup).
        let sender = (round == 0).then(|| {
            KillOnDrop(
                Command::new("ip")
                    .args(["netns", "exec", &ns, "bash", "-c"])
                    .arg(format!(
                        "while :; do echo x 2>/dev/null >/dev/udp/{LOCAL}/53; sleep 0.001; done"
                    ))
                    .spawn()
                    .unwrap(),
            )
        });
        env.spawn_weir_dns_on(&format!("{LOCAL}:53"), &["--node-local"]);
        wait_until("the node-local cache answers", || {
            dig_in(&ns, LOCAL, &["web.shop.svc.cluster.local", "A"]).data() == ["10.96.0.20"]
        });
        drop(sender);
        let lo = env.sh(&ns, "ip -o addr show dev lo");
        let lo = String::from_utf8_lossy(&lo.stdout);
        assert_eq!(lo.matches(&format!(" {LOCAL}/32 ")).count(), 1, "{lo}");
        let tables = env.sh(&ns, "nft list tables");
        let tables = String::from_utf8_lossy(&tables.stdout);
        assert_eq!(tables.matches("weir-nodelocal-dns").count(), 1, "{tables}");
        assert_eq!(
            dig_in(&ns, LOCAL, &["+tcp", "db.shop.svc.cluster.local", "A"]).data(),
            ["10.244.1.5", "10.244.2.6"]
        );
        // Another port of the same address is tracked as usual.
        env.sh(
            &ns,
            &format!("bash -c 'echo x > /dev/udp/{LOCAL}/54' || true"),
        );
        let ct = env.sh(&ns, "conntrack -L 2>/dev/null");
        let ct = String::from_utf8_lossy(&ct.stdout);
        assert!(
            ct.split_whitespace().any(|f| f == "dport=54"),
            "round {round}: not tracked at all?\n{ct}"
        );
        // Whole fields: the port-54 datagram's reply tuple may read "dport=53813" (CI did).
        assert!(
            !ct.split_whitespace().any(|f| f == "dport=53"),
            "round {round}: DNS tracked\n{ct}"
        );
        // Stop it (SIGKILL, as a crash: no cleanup runs); the next round starts over the
        // address and table it left.
        let mut child = env.children.pop().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        env.sh(&ns, "conntrack -F 2>/dev/null || true");
    }
    // Without an address of its own it refuses, saying why.
    let out = Command::new(WEIR)
        .args(["dns", "--node-local", "--listen", "0.0.0.0:53"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs the cache's own address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--node-local` removes what it set up when stopped (SIGTERM): the address on `lo` and the
/// NOTRACK table; with `--keep-node-local` both stay, and `weir dns cleanup` removes them
/// (a second cleanup finds nothing and succeeds).
#[test]
fn node_local_cleans_up_at_exit_unless_kept() {
    if !runnable() {
        return;
    }
    const LOCAL: &str = "169.254.20.10";
    let mut env = Env::new("k");
    env.write_manifests();
    let ns = env.server_ns.clone();
    let state = |env: &Env| {
        let lo = env.sh(&ns, "ip -o addr show dev lo");
        let tables = env.sh(&ns, "nft list tables");
        (
            String::from_utf8_lossy(&lo.stdout).contains(&format!(" {LOCAL}/32 ")),
            String::from_utf8_lossy(&tables.stdout).contains("ip weir-nodelocal-dns"),
        )
    };
    let stop = |env: &mut Env| {
        let mut child = env.children.pop().unwrap();
        run(Command::new("kill").args(["-TERM", &child.id().to_string()]));
        child.wait().unwrap()
    };
    for keep in [false, true] {
        let mut args = vec!["--node-local"];
        if keep {
            args.push("--keep-node-local");
        }
        env.spawn_weir_dns_on(&format!("{LOCAL}:53"), &args);
        wait_until("the node-local cache answers", || {
            dig_in(&ns, LOCAL, &["web.shop.svc.cluster.local", "A"]).data() == ["10.96.0.20"]
        });
        assert_eq!(state(&env), (true, true), "keep={keep}");
        let status = stop(&mut env);
        if keep {
            assert_eq!(state(&env), (true, true), "kept\n{}", env.log());
        } else {
            assert!(status.success(), "{status:?}\n{}", env.log());
            assert_eq!(state(&env), (false, false), "cleaned up\n{}", env.log());
        }
    }
    for _ in 0..2 {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, WEIR, "dns", "cleanup", "--listen"])
            .arg(format!("{LOCAL}:53"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(state(&env), (false, false));
    }
}
