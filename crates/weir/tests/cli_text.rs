//! What a user reads from the `weir` binary without root: `--help`, error messages, and
//! conditions that persist (said once, not every poll).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

fn weir(args: &[&str]) -> Output {
    Command::new(WEIR).args(args).output().expect("run weir")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The line of `text` that starts (after indentation) with `start`.
fn line<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.trim_start().starts_with(start))
        .unwrap_or_else(|| panic!("no line starting with {start:?} in:\n{text}"))
}

#[test]
fn top_level_help_names_every_proxy_mode_and_what_trace_does() {
    let o = weir(&["--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    assert_eq!(
        help.lines().next(),
        Some(
            "Kubernetes node networking: CNI, service proxy, routes, DNS, NetworkPolicy, diagnostics, lab"
        )
    );
    assert_eq!(
        line(&help, "proxy ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        "proxy The service proxy (kube-proxy's job): nftables, iptables, ipvs or userspace mode"
    );
    let trace = line(&help, "trace ");
    assert!(trace.contains("Walks a packet"), "{trace}");
    assert!(!trace.contains("Saves"), "{trace}");
    assert!(line(&help, "routes ").contains("host-gw or vxlan"));
    assert!(line(&help, "policy ").contains("NetworkPolicy for this node's pods"));
    let collect = stdout(&weir(&["trace", "--help"]));
    let collect = line(&collect, "collect ");
    assert!(
        collect.contains("ip rule, route, link, addr and neigh"),
        "{collect}"
    );
}

/// The option's help: the rest of its line and the lines below it up to the next option.
fn option_help(help: &str, flag: &str) -> String {
    let mut lines = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(flag));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
    let mut text = first.trim_start()[flag.len()..].to_string();
    for l in lines.take_while(|l| !l.trim_start().starts_with('-') && !l.trim().is_empty()) {
        text.push(' ');
        text.push_str(l.trim());
    }
    text
}

#[test]
fn flags_say_what_they_choose() {
    let proxy = stdout(&weir(&["proxy", "--help"]));
    let mode = option_help(&proxy, "--proxy-mode <PROXY_MODE>");
    assert!(mode.contains("How services are programmed"), "{mode}");
    // ipvs and userspace serve NodePorts on every local address too.
    let np = option_help(&proxy, "--nodeport-addresses <CIDR[,CIDR]|primary>");
    assert!(
        np.contains("every local address in iptables, ipvs and userspace modes"),
        "{np}"
    );
    let routes = stdout(&weir(&["routes", "--help"]));
    let backend = option_help(&routes, "--backend <BACKEND>");
    assert!(
        backend.contains("How pod traffic reaches other nodes"),
        "{backend}"
    );
    let trace = stdout(&weir(&["trace", "--help"]));
    let proto = option_help(&trace, "--proto <PROTO>");
    assert!(proto.contains("ICMP echo request"), "{proto}");
}

#[test]
fn proxy_config_that_is_not_one_is_named_not_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let passwd = "root:x:0:0:root:/root:/bin/bash\nsecret-user:x:1000:1000::/home/s:/bin/sh\n";
    std::fs::write(&file, passwd.repeat(40)).unwrap();
    let o = weir(&[
        "proxy",
        "--config",
        file.to_str().unwrap(),
        "--hostname-override=n1",
        "--validate",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "problem: {}: not a KubeProxyConfiguration",
            file.display()
        )),
        "{out}"
    );
    assert!(out.contains("\"root:x:0:0:root:/root:/bin/bash\""), "{out}");
    assert!(!out.contains("secret-user"), "{out}");
    assert_eq!(out.lines().count(), 2, "{out}");
    // Without --validate the agent does not start, saying the same on stderr.
    let o = weir(&[
        "proxy",
        "--config",
        file.to_str().unwrap(),
        "--hostname-override=n1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("weir proxy: "), "{err}");
    assert!(
        !err.contains("secret-user") && err.lines().count() == 1,
        "{err}"
    );
}

/// Waits up to 30 s for `path` to contain `what`; returns the file's text.
fn wait_for_text(path: &std::path::Path, what: &str) -> String {
    let started = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(what) || started.elapsed().as_secs() >= 30 {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `weir dns` on `dir`'s manifests, polled every 20 ms, its log in `log`.
fn dns_polling(dir: &std::path::Path, log: &std::path::Path) -> std::process::Child {
    Command::new(WEIR)
        .args([
            "dns",
            "--listen",
            "127.0.0.1:0",
            "--manifest-poll-interval",
            "20ms",
            // Outside names are not this test's business (the default forwards them to
            // /etc/resolv.conf).
            "--upstream-resolv-conf",
            "none",
            // Run in the host's namespace beside other tests: no /metrics listener.
            "--metrics-bind-address=0",
        ])
        .arg("--manifests")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

#[test]
fn a_missing_manifest_directory_is_said_once_and_when_it_appears() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    let log_path = tmp.path().join("log");
    let mut child = dns_polling(&dir, &log_path);
    // Once it has said so, about 25 more polls with the directory missing; then it appears
    // and the server starts.
    wait_for_text(&log_path, "waiting for a complete view");
    std::thread::sleep(Duration::from_millis(500));
    std::fs::create_dir(&dir).unwrap();
    wait_for_text(&log_path, "serving");
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log_path).unwrap();
    let missing = format!("{}: directory: cannot read", dir.display());
    // Once when it is missing, once as the reason for waiting (said once: the wait is
    // shorter than the 10 s between reminders), once when it is resolved.
    assert_eq!(log.matches(&missing).count(), 3, "{log}");
    assert_eq!(
        log.matches("waiting for a complete view of the cluster")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches(&format!("resolved: {missing}")).count(),
        1,
        "{log}"
    );
    assert!(log.contains("serving"), "{log}");
}

#[test]
fn a_broken_manifest_is_said_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("broken.yaml"), "just a line of text\n").unwrap();
    let log_path = tmp.path().join("log");
    let mut child = dns_polling(&dir, &log_path);
    wait_for_text(&log_path, "serving");
    // Some polls of the watcher after the first view.
    std::thread::sleep(Duration::from_millis(500));
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(log.matches("broken.yaml").count(), 1, "{log}");
}

/// Root (a network namespace of its own, `unshare -n`; without root or the tools a failure
/// under CI=true, a recorded skip otherwise): a reconciliation failing on every one-second
/// retry is said once, and its end once.
#[test]
fn a_failing_routes_reconciliation_is_said_once_and_when_it_recovers() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["unshare", "ip"])) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("nodes.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {podCIDR: 10.244.1.0/24}\n\
         status: {addresses: [{type: InternalIP, address: 192.168.9.1}]}\n",
    )
    .unwrap();
    let log_path = tmp.path().join("log");
    // The underlay device appears 2.5 s (two more retries) after the first failure is logged.
    let script = format!(
        "ip link set lo up; \
         (until grep -q 'reconciliation failed' {log}; do sleep 0.1; done; sleep 2.5; \
          ip link add under0 type veth peer name under1; ip link set under1 up; \
          ip addr add 192.168.9.1/24 dev under0; ip link set under0 up) & \
         exec {WEIR} routes --manifests {} --node-name n1 --backend vxlan --iface under0 \
         --mtu-file {} 2>{log}",
        manifests.display(),
        tmp.path().join("mtu").display(),
        log = log_path.display(),
    );
    let child = Command::new("unshare")
        .args(["-n", "sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = weir_testkit::KillOnDrop(child);
    wait_for_text(&log_path, "reconciled again after failing");
    drop(child);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(log.matches("reconciliation failed").count(), 1, "{log}");
    assert!(log.contains("under0: no such device"), "{log}");
    assert_eq!(
        log.matches("reconciled again after failing").count(),
        1,
        "{log}"
    );
}

/// `weir … | head -1`: the reader has gone before weir writes. Every command that prints ends
/// quietly (no panic, nothing on stderr) with 141, a shell's status for SIGPIPE.
#[test]
fn a_closed_stdout_pipe_ends_the_command_quietly() {
    for args in [
        &["proxy", "--validate", "--hostname-override=n1"][..],
        &[
            "proxy",
            "--validate",
            "-o",
            "json",
            "--hostname-override=n1",
        ],
        &[
            "agent",
            "--validate",
            "--hostname-override=n1",
            "--parts=proxy",
        ],
        &["version"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(WEIR)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(141), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn version_subcommand_as_text_and_json() {
    let o = weir(&["version"]);
    assert!(o.status.success());
    let line = stdout(&o);
    assert!(
        line.starts_with(&format!("weir {}", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    // The same line as --version.
    assert_eq!(line, stdout(&weir(&["--version"])));
    let o = weir(&["version", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(line.contains(v["line"].as_str().unwrap()), "{v}");
}

/// The examples, through the binary: each was exit 0 with nothing said.
#[test]
fn proxy_validate_refuses_what_it_would_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    let typo = file("typo.yaml", &format!("{head}clusterCidr: 10.0.0.0/8\n"));
    let beta = file("beta.yaml", "apiVersion: kubeproxy.config.k8s.io/v1beta9\n");
    let empty = file("empty.yaml", "");
    let cases: [(&[&str], &str); 5] = [
        (
            &["--config", &typo],
            "line 3: unknown field clusterCidr (did you mean clusterCIDR?)",
        ),
        (
            &["--config", &beta],
            "is not kubeproxy.config.k8s.io/v1alpha1",
        ),
        (
            &["--config", &empty],
            "empty: a KubeProxyConfiguration needs",
        ),
        (
            &["--kubeconfig", "/nonexistent"],
            "--kubeconfig: failed to read kubeconfig",
        ),
        (
            &["--min-sync-period", "10s", "--sync-period", "1s"],
            "min-sync-period: 10s is longer than the sync period 1s",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["proxy", "--validate", "--hostname-override=n1"];
        all.extend(args);
        let o = weir(&all);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}");
        assert!(out.contains(want), "{args:?}: {out}");
        assert!(!out.contains("Settings {"), "{out}");
    }
    // kube-proxy's own flags, and -v: accepted, applied.
    let o = weir(&[
        "proxy",
        "--validate",
        "--hostname-override=n1",
        "--proxy-mode=iptables",
        "--iptables-sync-period=20s",
        "--iptables-masquerade-bit=13",
        "--feature-gates=NFTablesNetlink=true",
        "-v",
        "2",
    ]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    for want in [
        "sync period          20s\n",
        "masquerade mark      0x2000\n",
        "log                  as --log-format, verbosity 2\n",
    ] {
        assert!(out.contains(want), "{want:?}: {out}");
    }
}

/// A DnsConfiguration weir dns would not apply is exit code 2 naming the file, line and field,
/// as weir proxy's KubeProxyConfiguration is (README's exit codes).
#[test]
fn a_bad_dns_configuration_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dns.yaml");
    std::fs::write(
        &file,
        "apiVersion: weir.dev/v1alpha1\nkind: DnsConfiguration\nsise: 3\n",
    )
    .unwrap();
    let o = weir(&["dns", "--validate", "--config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("line 3") && err.contains("unknown field `sise`"),
        "{err}"
    );
}

/// Completions and man pages come from the command-line definition: every subcommand is in
/// both, and a flag added to one shows in them without anyone writing it twice.
#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let bash = stdout(&weir(&["completions", "bash"]));
    for sub in [
        "agent", "proxy", "routes", "dns", "policy", "doctor", "trace", "version",
    ] {
        assert!(
            bash.contains(&format!("weir__subcmd__{sub}")),
            "{sub} missing from the bash completions"
        );
    }
    assert!(bash.contains("--from-host"), "trace's flags are completed");
    let dir = tempfile::tempdir().unwrap();
    let o = weir(&["man", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for page in [
        "weir.1",
        "weir-proxy.1",
        "weir-trace.1",
        "weir-dns-cleanup.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(text.contains(".TH"), "{page} is not a man page");
    }
    let proxy = std::fs::read_to_string(dir.path().join("weir-proxy.1")).unwrap();
    assert!(
        proxy.contains("hostname\\-override"),
        "weir proxy's flags are in its page"
    );
}

/// `weir routes --validate`: the settings, or every problem (an out-of-range VNI, an unreadable
/// kubeconfig) with exit 2, as `weir proxy --validate`; `-o json` for CI.
#[test]
fn routes_validate_prints_settings_or_exits_2_with_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().to_str().unwrap();
    let ok = weir(&[
        "routes",
        "--validate",
        "--manifests",
        manifests,
        "--node-name",
        "n1",
    ]);
    assert_eq!(ok.status.code(), Some(0));
    let text = stdout(&ok);
    assert!(
        text.contains("settings valid") && text.contains("vxlan (VNI 1, port 8472)"),
        "{text}"
    );
    let bad = weir(&[
        "routes",
        "--validate",
        "--manifests",
        manifests,
        "--node-name",
        "n1",
        "--vni",
        "0",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--vni 0 is outside"));
    let json = weir(&[
        "routes",
        "--validate",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--node-name",
        "n1",
        "-o",
        "json",
    ]);
    assert_eq!(json.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(doc["valid"], false);
    assert!(
        doc["problems"][0]
            .as_str()
            .unwrap()
            .contains("--kubeconfig"),
        "{doc}"
    );
}

/// The periodic resync is `--sync-period`, a Go duration, in every command (routes' former
/// `--resync-period` still taken, hidden); in `weir agent` the one `--sync-period` is also
/// the routes part's, and `--resync-period` sets the routes part's alone.
#[test]
fn sync_period_is_one_name_everywhere() {
    for cmd in ["proxy", "routes", "policy", "agent"] {
        let help = stdout(&weir(&[cmd, "--help"]));
        let text = option_help(&help, "--sync-period <DURATION>");
        assert!(text.contains("30s"), "weir {cmd}: {text}");
        assert!(!help.contains("--resync-period"), "weir {cmd}: hidden");
    }
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().to_str().unwrap();
    let routes_period = |extra: &[&str]| -> String {
        let mut args = vec!["routes", "--validate", "-o", "json", "--node-name", "n1"];
        args.extend_from_slice(&["--manifests", manifests]);
        args.extend_from_slice(extra);
        let o = weir(&args);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stdout(&o));
        let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        doc["settings"]["sync_period"].as_str().unwrap().to_string()
    };
    assert_eq!(routes_period(&[]), "30s");
    assert_eq!(routes_period(&["--sync-period=1m30s"]), "1m30s");
    assert_eq!(routes_period(&["--resync-period", "7s"]), "7s");
    let agent_routes_period = |extra: &[&str]| -> String {
        let mut args = vec!["agent", "--validate", "--hostname-override=n1"];
        args.extend_from_slice(&["--manifests", manifests]);
        args.extend_from_slice(extra);
        let o = weir(&args);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stdout(&o));
        line(&stdout(&o), "routes sync_period: ")
            .trim_start_matches("routes sync_period: ")
            .to_string()
    };
    assert_eq!(agent_routes_period(&[]), "30s");
    assert_eq!(agent_routes_period(&["--sync-period=12s"]), "12s");
    assert_eq!(agent_routes_period(&["--iptables-sync-period=20s"]), "20s");
    assert_eq!(
        agent_routes_period(&["--sync-period=12s", "--resync-period=5s"]),
        "5s"
    );
}

/// flanneld's flags on `weir routes`: what weir does anyway passes, the rest is named (a
/// notice or a refusal with weir's equivalent, exit 2), never "unexpected argument".
#[test]
fn flanneld_flags_are_named_not_unexpected() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().to_str().unwrap();
    let base = ["routes", "--node-name", "n1", "--manifests", manifests];
    let validate = |extra: &[&str]| -> (Option<i32>, serde_json::Value) {
        let mut args = base.to_vec();
        args.extend_from_slice(&["--validate", "-o", "json"]);
        args.extend_from_slice(extra);
        let o = weir(&args);
        (o.status.code(), serde_json::from_str(&stdout(&o)).unwrap())
    };
    let (code, doc) = validate(&[
        "--kube-subnet-mgr",
        "--ip-masq=false",
        "--kube-annotation-prefix=flannel.alpha.coreos.com",
        "--iptables-resync=10",
    ]);
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(
        doc["settings"]["annotation_prefix"],
        "flannel.alpha.coreos.com"
    );
    let notices = doc["notices"].to_string();
    assert!(
        notices.contains("--iptables-resync=10: accepted; no effect"),
        "{doc}"
    );
    let (code, doc) = validate(&["--subnet-file=/run/flannel/subnet.env", "--ip-masq"]);
    assert_eq!(code, Some(2), "{doc}");
    let problems = doc["problems"].to_string();
    assert!(
        problems.contains("--subnet-file=/run/flannel/subnet.env: refused")
            && problems.contains("--mtu-file")
            && problems.contains("--ip-masq=true: refused"),
        "{doc}"
    );
    // Run for real, a refused flag stops the command before it touches anything.
    let mut args = base.to_vec();
    args.push("--etcd-endpoints=http://127.0.0.1:2379");
    let o = weir(&args);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--etcd-endpoints=http://127.0.0.1:2379: refused: weir keeps nothing in etcd"),
        "{err}"
    );
    assert!(!err.contains("unexpected argument"), "{err}");
    let o = weir(&["routes", "--version"]);
    assert!(o.status.success() && stdout(&o).starts_with("weir "));
}
