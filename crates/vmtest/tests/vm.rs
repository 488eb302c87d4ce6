//! The harness proven against one booted VM: Debian's kernel runs, the host's tools and build tree
//! are there, the link types and IPVS the host kernel lacks work, and IPVS really balances TCP.
//! Every test skips (a recorded `SKIPPED ...` line) where qemu cannot run; under CI=true or with
//! WEIR_VM_REQUIRED=1 it fails instead. Names inside the guest carry a per-test tag, since the tests share the VM and run in
//! parallel.

use std::time::{Duration, Instant};

use weir_vmtest::vm_or_skip;

/// Runs a script (dedented, so heredocs in indented Rust strings work) and prints how long it
/// took (the numbers docs/vm.md quotes).
fn timed(vm: &weir_vmtest::Vm, what: &str, script: &str) -> String {
    let script: String = script
        .lines()
        .map(|l| format!("{}\n", l.trim_start()))
        .collect();
    let started = Instant::now();
    let out = vm.run_ok(&script);
    eprintln!("timing: {what}: {:.2} s", started.elapsed().as_secs_f64());
    out
}

#[test]
fn the_guest_runs_debians_kernel_not_the_hosts() {
    let vm = vm_or_skip!();
    let times = vm.boot_times();
    eprintln!(
        "timing: prepare {:.2} s, boot {:.2} s ({:?})",
        times.prepare.as_secs_f64(),
        times.boot.as_secs_f64(),
        times.accel
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest = timed(vm, "uname -r", "uname -r");
    assert_eq!(guest.trim(), vm.kernel_release());
    assert_ne!(
        guest.trim(),
        host.trim(),
        "the guest must not run the host's kernel"
    );
    assert!(
        guest.trim().ends_with("-amd64"),
        "Debian's generic flavour: {guest}"
    );
    assert!(
        vm.missing_modules().is_empty(),
        "modules that did not load at boot: {:?}",
        vm.missing_modules()
    );
}

#[test]
fn a_script_reports_its_output_and_status_and_a_failure_is_a_failure() {
    let vm = vm_or_skip!();
    let out = vm.run("echo out; echo err >&2; exit 7").unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str(), out.status),
        ("out\n", "err\n", 7)
    );
    eprintln!(
        "timing: trivial command round trip: {:.3} s",
        out.elapsed.as_secs_f64()
    );
    let failed = std::panic::catch_unwind(|| vm.run_ok("echo about to fail; false"));
    assert!(
        failed.is_err(),
        "run_ok must fail the test when the script fails"
    );
    // Output larger than any pipe buffer comes back whole.
    let big = vm.run_ok("i=0; while [ $i -lt 10000 ]; do echo line-$i; i=$((i+1)); done");
    assert_eq!(big.lines().count(), 10000);
    assert_eq!(big.lines().last(), Some("line-9999"));
}

/// A script's processes (and the servers it leaves running, such as a lab's agents) do not
/// inherit the agent's end of the virtio-serial port: one that did held it open for as long as
/// it lived (seen in `weir lab`'s detached agents as fd 3 -> /dev/vport2p1).
#[test]
fn a_script_does_not_inherit_the_agents_port() {
    let vm = vm_or_skip!();
    let fds = vm.run_ok("ls -l /proc/$$/fd");
    assert!(fds.contains("0 -> /dev/null"), "the listing ran: {fds}");
    assert!(!fds.contains("vport"), "{fds}");
}

#[test]
fn a_script_past_its_timeout_is_killed_and_reported() {
    let vm = vm_or_skip!();
    let started = Instant::now();
    let err = vm
        .run_timeout("echo started; sleep 30; echo never", Duration::from_secs(1))
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("timed out after 1 s"), "{msg}");
    assert!(msg.contains("started") && !msg.contains("never"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// Regression: ash's `read` drops the bytes of the line it is reading when a signal interrupts
/// it, and the agent read requests while its scripts ran as its children. A request that reached
/// the guest in pieces while a script ended (SIGCHLD) was lost, and its caller waited for an
/// answer that never came (CI saw `uname -r` time out beside the concurrent-scripts test).
#[test]
fn a_request_arriving_in_pieces_while_scripts_end_is_not_lost() {
    let vm = vm_or_skip!();
    // Scripts ending at different moments, so some end while the request is half sent.
    let enders: Vec<_> = (1..=4)
        .map(|i| {
            std::thread::spawn(move || vm.run_ok(&format!("sleep 0.{}; echo ended-{i}", 3 * i)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let out = vm
        .agent()
        .run_split_request("echo whole", Duration::from_secs(5), Duration::from_secs(3))
        .unwrap_or_else(|e| panic!("{e:#}\n--- console\n{}", vm.console_tail()));
    assert_eq!(out.stdout, "whole\n");
    for (i, t) in enders.into_iter().enumerate() {
        assert_eq!(t.join().unwrap(), format!("ended-{}\n", i + 1));
    }
}

#[test]
fn concurrent_scripts_each_get_their_own_output() {
    let vm = vm_or_skip!();
    let started = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|i| std::thread::spawn(move || vm.run_ok(&format!("sleep 1; echo worker-{i}"))))
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        assert_eq!(t.join().unwrap(), format!("worker-{i}\n"));
    }
    eprintln!(
        "timing: 4 concurrent 1-second scripts: {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn the_guest_sees_the_build_tree_and_writes_stay_in_the_guest() {
    let vm = vm_or_skip!();
    // This very test binary, freshly built under target/, runs in the guest.
    let me = std::env::current_exe().unwrap();
    let listed = timed(
        vm,
        "run a target/ binary",
        &format!("{} --list", me.display()),
    );
    assert!(
        listed.contains("the_guest_sees_the_build_tree_and_writes_stay_in_the_guest: test"),
        "{listed}"
    );
    // Writable everywhere (a tmpfs overlay), never reaching the host.
    let tag = format!("weir-vmtest-{}", std::process::id());
    let paths = [
        format!("/etc/{tag}"),
        format!("/var/lib/{tag}"),
        format!("/tmp/{tag}"),
        format!("/run/{tag}"),
    ];
    let script: String = paths
        .iter()
        .map(|p| format!("echo x > {p} && cat {p}\n"))
        .collect();
    assert_eq!(vm.run_ok(&script), "x\n".repeat(paths.len()));
    for p in &paths {
        assert!(!std::path::Path::new(p).exists(), "{p} leaked to the host");
    }
    // Files handed over after boot arrive through the I/O directory.
    let path = vm.put(&format!("{tag}.txt"), b"from the host\n").unwrap();
    assert_eq!(vm.run_ok(&format!("cat {path}")), "from the host\n");
}

#[test]
fn dummy_and_ipvlan_links_can_be_created() {
    let vm = vm_or_skip!();
    let ns = format!("links-{}", std::process::id());
    let out = timed(
        vm,
        "netns + dummy + ipvlan",
        &format!(
            "set -e
            ip netns add {ns}
            trap 'ip netns del {ns}' EXIT
            ip -n {ns} link add kube-ipvs0 type dummy
            ip -n {ns} addr add 10.96.0.10/32 dev kube-ipvs0
            ip -n {ns} link add eth1 type dummy
            ip -n {ns} link add ipvl0 link eth1 type ipvlan mode l2
            ip -n {ns} -d -o link show kube-ipvs0
            ip -n {ns} -d -o link show ipvl0
            ip -n {ns} -o addr show dev kube-ipvs0"
        ),
    );
    assert!(
        out.contains("kube-ipvs0") && out.contains(" dummy "),
        "{out}"
    );
    assert!(
        out.contains("ipvl0@eth1") && out.contains("ipvlan  mode l2"),
        "{out}"
    );
    assert!(out.contains("inet 10.96.0.10/32"), "{out}");
}

#[test]
fn every_ipvs_scheduler_kube_proxy_offers_is_available() {
    let vm = vm_or_skip!();
    let ns = format!("sched-{}", std::process::id());
    let schedulers = ["rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"];
    let adds: String = schedulers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "ip netns exec {ns} ipvsadm -A -t 10.96.1.{}:80 -s {s}\n",
                i + 1
            )
        })
        .collect();
    let out = vm.run_ok(&format!(
        "set -e\nip netns add {ns}\ntrap 'ip netns del {ns}' EXIT\n{adds}ip netns exec {ns} ipvsadm -Ln"
    ));
    for (i, s) in schedulers.iter().enumerate() {
        let line = format!("TCP  10.96.1.{}:80 {s}", i + 1);
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
}

/// Modules outside the boot list load when the kernel asks for them (a link type, an IPVS
/// scheduler) and when a script runs `modprobe` itself: the guest has its module tree.
#[test]
fn modules_outside_the_boot_list_load_on_demand() {
    let vm = vm_or_skip!();
    let ns = format!("ondemand-{}", std::process::id());
    let out = timed(
        vm,
        "on-demand modules",
        &format!(
            "set -e
            ip netns add {ns}
            trap 'ip netns del {ns}' EXIT
            ip -n {ns} link add ifbx type ifb
            ip netns exec {ns} ipvsadm -A -t 10.96.2.1:80 -s fo
            ip netns exec {ns} ipvsadm -Ln
            modprobe sch_sfq
            cut -d' ' -f1 /proc/modules | grep -x -e ifb -e ip_vs_fo -e sch_sfq | sort"
        ),
    );
    assert!(out.contains("TCP  10.96.2.1:80 fo"), "{out}");
    assert!(out.ends_with("ifb\nip_vs_fo\nsch_sfq\n"), "{out}");
}

/// The shape of kube-proxy's ipvs mode: the virtual IP on a `kube-ipvs0` dummy in a "node"
/// namespace, an IPVS virtual server with round-robin over two masquerading real servers in
/// their own namespaces, and a client in a third. Real TCP connections must alternate.
#[test]
fn ipvs_balances_real_tcp_connections_across_two_backends() {
    let vm = vm_or_skip!();
    let t = std::process::id();
    let (node, client, b1, b2) = (
        format!("node-{t}"),
        format!("client-{t}"),
        format!("b1-{t}"),
        format!("b2-{t}"),
    );
    // Batched (`ip -b`, `ipvsadm -R`): under software emulation every process start costs a
    // noticeable fraction of a second.
    let script = format!(
        r#"set -e
        cleanup() {{ kill $p1 $p2 2>/dev/null; for n in {node} {client} {b1} {b2}; do ip netns del $n; done; }}
        trap cleanup EXIT
        ip -b - <<EOF
        netns add {node}
        netns add {client}
        netns add {b1}
        netns add {b2}
        EOF
        ip -n {node} -b - <<EOF
        link set lo up
        link add vc type veth peer name eth0 netns {client}
        link add vb1 type veth peer name eth0 netns {b1}
        link add vb2 type veth peer name eth0 netns {b2}
        addr add 10.90.1.1/24 dev vc
        addr add 10.90.2.1/24 dev vb1
        addr add 10.90.3.1/24 dev vb2
        link set vc up
        link set vb1 up
        link set vb2 up
        link add kube-ipvs0 type dummy
        addr add 10.96.0.1/32 dev kube-ipvs0
        EOF
        for peer in {client}:10.90.1 {b1}:10.90.2 {b2}:10.90.3; do
          ip -n ${{peer%%:*}} -b - <<EOF
        link set lo up
        addr add ${{peer#*:}}.2/24 dev eth0
        link set eth0 up
        route add default via ${{peer#*:}}.1
        EOF
        done
        ip netns exec {node} sh -c 'sysctl -qw net.ipv4.ip_forward=1 && ipvsadm -R' <<EOF
        -A -t 10.96.0.1:80 -s rr
        -a -t 10.96.0.1:80 -r 10.90.2.2:8080 -m
        -a -t 10.96.0.1:80 -r 10.90.3.2:8080 -m
        EOF
        ip netns exec {b1} busybox nc -ll -p 8080 -e echo backend-1 >/dev/null 2>&1 & p1=$!
        ip netns exec {b2} busybox nc -ll -p 8080 -e echo backend-2 >/dev/null 2>&1 & p2=$!
        # Both servers listening before the first connection.
        for b in {b1} {b2}; do
          i=0; until ip netns exec $b netstat -ltn | grep -q ':8080 '; do
            i=$((i+1)); [ $i -lt 100 ] || {{ echo "$b never listened" >&2; exit 1; }}; sleep 0.1; done
        done
        ip netns exec {client} sh -c 'for i in 1 2 3 4 5 6; do busybox nc -w 5 10.96.0.1 80 </dev/null; done'
        ip netns exec {node} ipvsadm -Lnc
        "#
    );
    let out = timed(vm, "ipvs: 4 netns, 2 backends, 6 connections", &script);
    let answers: Vec<&str> = out.lines().filter(|l| l.starts_with("backend-")).collect();
    assert_eq!(answers.len(), 6, "six connections, six answers:\n{out}");
    // Round robin alternates strictly, starting with either backend.
    for pair in answers.windows(2) {
        assert_ne!(pair[0], pair[1], "rr must alternate:\n{out}");
    }
    assert_eq!(
        answers.iter().filter(|a| **a == "backend-1").count(),
        3,
        "{out}"
    );
    // IPVS's own connection table agrees: three connections through each real server.
    // (Not `--stats`: those counters are summed by a timer every two seconds.)
    for rs in ["10.90.2.2:8080", "10.90.3.2:8080"] {
        let through = out
            .lines()
            .filter(|l| l.starts_with("TCP") && l.contains("10.96.0.1:80") && l.ends_with(rs))
            .count();
        assert_eq!(through, 3, "connections through {rs}:\n{out}");
    }
}

/// kube-proxy's iptables and ipset shapes load (iptables-nft through nft_compat, the xt matches
/// and targets it uses, hash:ip,port sets) inside a namespace of the guest.
#[test]
fn iptables_ipset_and_nft_rules_of_kube_proxys_shapes_load() {
    let vm = vm_or_skip!();
    let ns = format!("fw-{}", std::process::id());
    let out = timed(
        vm,
        "iptables + ipset + nft",
        // Loaded the way kube-proxy loads them: one ipset restore, one iptables-restore.
        &format!(
            r#"set -e
            ip netns add {ns}
            trap 'ip netns del {ns}' EXIT
            x() {{ ip netns exec {ns} "$@"; }}
            x ipset restore <<EOF
            create KUBE-CLUSTER-IP hash:ip,port
            add KUBE-CLUSTER-IP 10.96.0.1,tcp:80
            create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
            add KUBE-NODE-PORT-TCP 30080
            EOF
            x iptables-restore <<EOF
            *nat
            :KUBE-MARK-MASQ - [0:0]
            :KUBE-POSTROUTING - [0:0]
            :KUBE-SERVICES - [0:0]
            -A POSTROUTING -j KUBE-POSTROUTING
            -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
            -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
            -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
            -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
            -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
            -A KUBE-SERVICES -m addrtype --dst-type LOCAL -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
            -A KUBE-SERVICES -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.0.0.1:8080
            COMMIT
            *mangle
            -A PREROUTING -m conntrack --ctstate NEW -j CONNMARK --set-mark 0x80/0x80
            COMMIT
            EOF
            x iptables-save
            x ipset list KUBE-CLUSTER-IP
            x nft list ruleset
            "#
        ),
    );
    for expected in [
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
        "-m addrtype --dst-type LOCAL -m set --match-set KUBE-NODE-PORT-TCP dst",
        "-m statistic --mode random --probability 0.50000000000",
        "-j MARK --set-xmark 0x4000/0x4000",
        "--comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE",
        "-j CONNMARK --set-xmark 0x80/0x80",
        "10.96.0.1,tcp:80",
        // The same rules seen through nft: iptables-nft wrote them as nf_tables rules.
        "chain KUBE-SERVICES {",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}
