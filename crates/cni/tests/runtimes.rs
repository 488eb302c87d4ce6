//! weir-cni driven by real container runtimes, exactly as an operator would wire it up: Debian's
//! podman 4.3 (CNI backend) and containerd 1.6 (`ctr run --cni`), each with a busybox rootfs built
//! from busybox-static (no image pull), a conflist chaining weir-cni → `portmap` → `tuning`, and every
//! directory the runtime uses private to the test.
//!
//! Each runtime runs inside a throw-away "node" namespace (`nsenter --net`, not `ip netns exec`,
//! which remounts /sys and so hides the cgroup hierarchy runc needs), so the bridge, veths and
//! portmap's iptables rules never touch the host.
//!
//! Neither runtime issues CNI GC (podman 4.3 and containerd 1.6 vendor libcni 1.1, which predates
//! GC), so each test then calls GC the way libcni ≥ 1.2.3's `GCNetworkList` does — cniVersion 1.1.0,
//! `cni.dev/valid-attachments` from the runtime's live containers, plus `cni.dev/attachments` —
//! and checks that a leaked attachment is reclaimed while the runtime's container keeps working.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{run_plugin, unique, TestNs};
use serde_json::{json, Value};
use weir_testkit::KillOnDrop;

/// Debian's reference plugins: portmap and tuning are chained after weir-cni.
const DEBIAN_CNI_DIR: &str = "/usr/lib/cni";

fn weir_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weir-cni"))
}

/// Runs `cmd`, returning its output; panics with both streams when it fails.
fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Fails the test with a clear reason when a tool the test drives is missing (scripts/dev.sh
/// installs them); never passes silently.
fn require(path: &str, package: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: install the Debian package {package} (scripts/dev.sh does)"
    );
}

/// A minimal root filesystem: busybox-static and the applets the tests use.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox is missing: install busybox-static");
    let bytes = std::fs::read(busybox).unwrap();
    assert!(
        !has_interpreter(&bytes),
        "{busybox} is dynamically linked: install busybox-static (the rootfs has no libc)"
    );
    let root = dir.join("rootfs");
    for sub in ["bin", "proc", "sys", "dev", "etc", "tmp", "run"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::write(root.join("bin/busybox"), &bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        root.join("bin/busybox"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    for applet in [
        "sh", "ip", "cat", "sleep", "httpd", "echo", "wget", "timeout",
    ] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    root
}

/// Does this 64-bit ELF executable ask for a dynamic loader (a PT_INTERP program header)?
fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (entsize, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let o = phoff + i * entsize;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == 3
    })
}

/// The plugin directory the runtime searches: weir-cni plus copies of Debian's chained plugins
/// (copies, not links: containerd's directory is bind-mounted over /usr/lib/cni).
fn plugin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(weir_binary(), bin.join("weir-cni")).unwrap();
    for p in ["portmap", "tuning", "loopback"] {
        let src = Path::new(DEBIAN_CNI_DIR).join(p);
        require(src.to_str().unwrap(), "containernetworking-plugins");
        std::fs::copy(&src, bin.join(p)).unwrap();
    }
    bin
}

/// The network: weir-cni, then portmap and tuning (a sysctl the test reads back in the container).
struct Network {
    name: String,
    kind: NetKind,
    data_dir: PathBuf,
}

enum NetKind {
    /// Bridge mode on `bridge`, pods from `<subnet_prefix>.0/24`.
    Bridge {
        bridge: String,
        subnet_prefix: &'static str,
    },
    /// eni-shared mode on the node's `eth1` (see [`EniNode`]).
    Eni(EniPlan),
}

/// A sysctl tuning sets inside the container; the kernel's default is 0.
const TUNED_SYSCTL: &str = "net.ipv4.conf.eth0.arp_announce";
const TUNED_VALUE: &str = "2";

impl Network {
    fn bridge(name: String, bridge: &str, subnet_prefix: &'static str, data_dir: PathBuf) -> Self {
        Network {
            name,
            kind: NetKind::Bridge {
                bridge: bridge.into(),
                subnet_prefix,
            },
            data_dir,
        }
    }

    fn gateway(&self) -> String {
        match &self.kind {
            NetKind::Bridge { subnet_prefix, .. } => format!("{subnet_prefix}.1"),
            NetKind::Eni(eni) => eni.gateway(),
        }
    }

    /// The prefix of weir's host-side veth names in this network.
    fn veth_prefix(&self) -> &'static str {
        match &self.kind {
            NetKind::Bridge { .. } => "weir",
            NetKind::Eni(_) => ENI_VETH_PREFIX,
        }
    }

    fn weir_plugin(&self) -> Value {
        match &self.kind {
            NetKind::Bridge {
                bridge,
                subnet_prefix,
            } => json!({
                "type": "weir-cni",
                "bridge": bridge,
                "ipam": {
                    "type": "weir-ipam",
                    "ranges": [[{"subnet": format!("{subnet_prefix}.0/24")}]],
                    "dataDir": self.data_dir,
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }),
            NetKind::Eni(eni) => json!({
                "type": "weir-cni",
                "mode": "eni-shared",
                "eniName": ENI_NAME,
                "eniGateway": eni.gateway(),
                "routeTable": ENI_TABLE,
                "vethPrefix": ENI_VETH_PREFIX,
                "eniAddresses": eni.addresses(),
                "dataDir": self.data_dir,
            }),
        }
    }

    /// `static_ports`: port mappings written into the conflist for runtimes (ctr) that cannot pass
    /// the `portMappings` capability; libcni hands a plugin's own `runtimeConfig` through as is.
    fn conflist(&self, static_ports: Option<Value>) -> String {
        let mut portmap = json!({"type": "portmap", "capabilities": {"portMappings": true}});
        if let Some(ports) = static_ports {
            portmap["runtimeConfig"] = json!({ "portMappings": ports });
        }
        json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                self.weir_plugin(),
                portmap,
                {"type": "tuning", "sysctl": {TUNED_SYSCTL: TUNED_VALUE}},
            ],
        })
        .to_string()
    }

    fn ip_file(&self, ip: &str) -> PathBuf {
        self.data_dir.join(&self.name).join(ip)
    }

    /// Every address file in the store (what is allocated).
    fn allocated(&self) -> Vec<String> {
        let mut ips: Vec<String> = std::fs::read_dir(self.data_dir.join(&self.name))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default();
        ips.sort();
        ips
    }
}

/// weir's host-side veths of `net` in the node namespace.
fn weir_veths(node: &TestNs, net: &Network) -> Vec<String> {
    node.sh("ip -o link show")
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap().to_string())
        .filter(|n| n.starts_with(net.veth_prefix()))
        .collect()
}

/// Lines of the node's iptables NAT table mentioning `port` (portmap's DNAT rules).
fn nat_rules_for(node: &TestNs, port: u16) -> Vec<String> {
    node.sh("iptables-save -t nat")
        .lines()
        .filter(|l| l.contains(&format!("--dport {port}")) || l.contains(&format!(":{port}")))
        .map(str::to_string)
        .collect()
}

/// HTTP GET from inside the node namespace (through portmap's DNAT to the container).
fn http_get(node: &TestNs, url: &str) -> String {
    node.sh(&format!("curl -s -m 3 {url}"))
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the test reads inside a running container: its eth0 IPv4 address and the tuned sysctl.
fn container_view(exec_output: &str) -> (String, String) {
    let ip = exec_output
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .unwrap_or_else(|| panic!("no inet address in: {exec_output}"))
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let sysctl = exec_output.lines().last().unwrap_or("").trim().to_string();
    (ip, sysctl)
}

/// Shell run inside the container by both tests.
const VIEW_SCRIPT: &str =
    "PATH=/bin; ip -4 addr show eth0; cat /proc/sys/net/ipv4/conf/eth0/arp_announce";

/// libcni ≥ 1.2.3's GCNetworkList, for weir-cni's entry of the list: cniVersion 1.1.0, the
/// runtime's live attachments in both reserved keys. Leaves a leaked attachment first (an ADD the
/// runtime forgot, as after a crash), then checks GC reclaims it and only it.
fn gc_as_libcni_would(node: &TestNs, net: &Network, live: &[(String, &str)]) {
    // Named after the network: the runtimes' tests run at once in one process, and a name
    // per process made two of them delete and create the same namespace (a CI failure).
    let leaked_ns = TestNs::new(&format!("wc-{}-leak", net.name));
    let mut conf = net.weir_plugin();
    conf["cniVersion"] = "1.0.0".into();
    conf["name"] = net.name.clone().into();
    let leaked_id = format!("leaked{}", std::process::id());
    let add = run_plugin(
        &weir_binary(),
        node,
        "ADD",
        &leaked_id,
        Some(&leaked_ns.path()),
        "eth0",
        &conf.to_string(),
    );
    let leaked_ip = add.ok().json()["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    assert!(net.ip_file(&leaked_ip).exists());
    let veths_before = weir_veths(node, net).len();

    let attachments: Vec<Value> = live
        .iter()
        .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
        .collect();
    conf["cniVersion"] = "1.1.0".into();
    conf["cni.dev/valid-attachments"] = attachments.clone().into();
    conf["cni.dev/attachments"] = attachments.into();
    let gc = run_plugin(&weir_binary(), node, "GC", "", None, "", &conf.to_string());
    assert_eq!(
        gc.code,
        Some(0),
        "GC as libcni >= 1.2.3 sends it failed: {} {}",
        gc.stdout,
        gc.stderr
    );
    assert!(
        !net.ip_file(&leaked_ip).exists(),
        "GC left the leaked allocation {leaked_ip}"
    );
    common::eventually("GC removed the leaked attachment's veth", || {
        weir_veths(node, net).len() == veths_before - 1
    });
    drop(leaked_ns);
}

// ---------------------------------------------------------------------------------------------
// podman

/// podman with a test-private configuration, storage, network config and plugin directories.
struct Podman {
    dir: tempfile::TempDir,
    node_path: PathBuf,
}

impl Podman {
    fn new(node: &TestNs, net: &Network, bin: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let netd = dir.path().join("net.d");
        std::fs::create_dir_all(&netd).unwrap();
        std::fs::write(
            netd.join(format!("{}.conflist", net.name)),
            net.conflist(None),
        )
        .unwrap();
        // cgroupfs + file events: no systemd or journald here. runc, not crun: crun 1.8 refuses the
        // cgroup v1/v2 hybrid layout. Explicit ulimits: podman's defaults exceed this sandbox's
        // hard limits and runc's setrlimit fails.
        let conf = format!(
            r#"[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
cgroup_manager = "cgroupfs"
lock_type = "file"
events_logger = "file"
events_logfile_path = "{events}"
runtime = "runc"
[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{netd}"
"#,
            events = dir.path().join("events.log").display(),
            bin = bin.display(),
            netd = netd.display(),
        );
        std::fs::write(dir.path().join("containers.conf"), conf).unwrap();
        Self {
            dir,
            node_path: node.path(),
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.node_path.display()))
            .arg("podman")
            .args(["--root", d.join("root").to_str().unwrap()])
            .args(["--runroot", d.join("runroot").to_str().unwrap()])
            .args(["--tmpdir", d.join("tmp").to_str().unwrap()])
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("CONTAINERS_CONF", d.join("containers.conf"))
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "-a", "-f", "-t", "0"]).output();
    }
}

#[test]
fn podman_runs_containers_on_a_weir_network() {
    require("/usr/bin/podman", "podman");
    require("/usr/sbin/runc", "runc");
    let started = Instant::now();
    let node = TestNs::new(&format!("{}-pod", unique("rt")));
    node.sh("ip link set lo up");
    let work = tempfile::tempdir().unwrap();
    let net = Network::bridge(
        format!("weirpodman{}", std::process::id()),
        "wrp0",
        "10.123.7",
        work.path().join("ipam"),
    );
    let bin = plugin_dir(work.path());
    let rootfs = busybox_rootfs(work.path());
    let podman = Podman::new(&node, &net, &bin);

    // podman validates each conflist by running every plugin with CNI_COMMAND=VERSION and dummy
    // CNI_* values; a network whose plugin fails that is not listed at all.
    let networks = run_ok(&mut podman.cmd(&["network", "ls", "--format", "{{.Name}}"]));
    assert!(
        networks.lines().any(|l| l == net.name),
        "podman does not list the weir network {} (VERSION probe failed?): {networks:?}",
        net.name
    );

    let name = format!("{}-c1", unique("rt"));
    let id = run_ok(&mut podman.cmd(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        &net.name,
        "-p",
        "18080:80",
        "--rootfs",
        rootfs.to_str().unwrap(),
        "/bin/sh",
        "-c",
        "echo hello-from-podman > /tmp/index.html; exec /bin/httpd -f -p 80 -h /tmp",
    ]))
    .trim()
    .to_string();

    // The address inside the container is the one weir allocated (its file names the container).
    let (ip, sysctl) = container_view(&run_ok(&mut podman.cmd(&[
        "exec",
        &name,
        "/bin/sh",
        "-c",
        VIEW_SCRIPT,
    ])));
    assert!(
        ip.starts_with("10.123.7."),
        "address {ip} not from the subnet"
    );
    assert_eq!(net.allocated(), vec![ip.clone()]);
    let owner = std::fs::read_to_string(net.ip_file(&ip)).unwrap();
    assert!(
        owner.starts_with(&id),
        "{ip} belongs to {owner:?}, not {id}"
    );
    let inspect: Value =
        serde_json::from_str(&run_ok(&mut podman.cmd(&["inspect", &name]))).unwrap();
    assert_eq!(
        inspect[0]["NetworkSettings"]["Networks"][&net.name]["IPAddress"],
        ip.as_str(),
        "podman's record of the address differs from the container's"
    );
    // tuning ran after weir-cni, in the container's namespace.
    assert_eq!(sysctl, TUNED_VALUE, "tuning's sysctl was not applied");
    // portmap published the port: the node reaches the container through it.
    let body = http_get(&node, &format!("http://{}:18080/", net.gateway()));
    assert_eq!(body.trim(), "hello-from-podman", "published port 18080");
    assert!(!nat_rules_for(&node, 18080).is_empty());
    assert_eq!(weir_veths(&node, &net).len(), 1);

    // podman 4.3 has no GC; call it as libcni >= 1.2.3 would, with podman's live container valid.
    gc_as_libcni_would(&node, &net, &[(id.clone(), "eth0")]);
    let body = http_get(&node, &format!("http://{}:18080/", net.gateway()));
    assert_eq!(
        body.trim(),
        "hello-from-podman",
        "GC cut off a live container"
    );

    // Removal: podman runs DEL through the whole list; nothing of the container remains.
    run_ok(&mut podman.cmd(&["rm", "-f", "-t", "0", &name]));
    assert!(net.allocated().is_empty(), "left: {:?}", net.allocated());
    common::eventually("the container's veth is gone", || {
        weir_veths(&node, &net).is_empty()
    });
    assert!(
        nat_rules_for(&node, 18080).is_empty(),
        "portmap rules left: {:?}",
        nat_rules_for(&node, 18080)
    );
    println!("podman test took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// containerd

/// A private containerd: its own root, state, sockets and config (CRI off: `ctr run --cni` does
/// CNI in the ctr client, and the CRI plugin would read the host's CNI directories).
struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Containerd {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let conf = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("containerd.sock").display(),
        );
        std::fs::write(d.join("config.toml"), conf).unwrap();
        let log = std::fs::File::create(d.join("containerd.log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let c = Self { dir, daemon };
        wait_until("containerd answers", Duration::from_secs(10), || {
            run(&mut c.ctr(&["version"])).status.success()
        });
        c
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ctr");
        c.arg("-a")
            .arg(self.socket())
            .args(["-n", "weirtest"])
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// `ctr run --rm --cni` in the foreground (ctr itself runs CNI ADD, and DEL once the task
    /// exits). ctr reads the fixed /etc/cni/net.d and Debian's /usr/lib/cni and caches results in
    /// /var/lib/cni, so it runs in a private mount namespace where the test's directories are
    /// bind-mounted over those (over all of /var/lib, which need not contain cni yet: only ctr and
    /// the plugins it runs see it, and they use nothing else there).
    fn run_with_cni(&self, node: &TestNs, netd: &Path, bin: &Path, args: &[&str]) -> KillOnDrop {
        require("/etc/cni/net.d", "containernetworking-plugins or podman");
        let ctr: Vec<String> = self
            .ctr(&[])
            .get_args()
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect();
        let script = format!(
            "mount --bind {netd} /etc/cni/net.d && mount --bind {bin} {cni_dir} && \
             mount --bind {var_lib} /var/lib && exec nsenter --net={node} ctr {ctr} run --rm --cni --null-io {args}",
            netd = shell_quote(&netd.to_string_lossy()),
            bin = shell_quote(&bin.to_string_lossy()),
            cni_dir = DEBIAN_CNI_DIR,
            var_lib = shell_quote(&self.private_var_lib().to_string_lossy()),
            node = node.path().display(),
            ctr = ctr.join(" "),
            args = args
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
        );
        let log = std::fs::File::create(self.dir.path().join("ctr-run.log")).unwrap();
        KillOnDrop(
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c", &script])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("spawn ctr run"),
        )
    }

    fn private_var_lib(&self) -> PathBuf {
        let dir = self.dir.path().join("var-lib");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn run_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ctr-run.log")).unwrap_or_default()
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Whatever a failed test left: tasks, containers, then the daemon (by its own pid).
        let tasks = run(&mut self.ctr(&["task", "ls", "-q"]));
        for id in String::from_utf8_lossy(&tasks.stdout).lines() {
            let _ = run(&mut self.ctr(&["task", "kill", "-s", "SIGKILL", id]));
            let _ = run(&mut self.ctr(&["task", "rm", "-f", id]));
        }
        let containers = run(&mut self.ctr(&["container", "ls", "-q"]));
        for id in String::from_utf8_lossy(&containers.stdout).lines() {
            let _ = run(&mut self.ctr(&["container", "rm", id]));
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

#[test]
fn containerd_runs_containers_on_a_weir_network() {
    require("/usr/bin/containerd", "containerd");
    require("/usr/sbin/runc", "runc");
    let started = Instant::now();
    let node = TestNs::new(&format!("{}-ctd", unique("rt")));
    node.sh("ip link set lo up");
    let work = tempfile::tempdir().unwrap();
    let net = Network::bridge(
        format!("weirctr{}", std::process::id()),
        "wrc0",
        "10.123.8",
        work.path().join("ipam"),
    );
    let bin = plugin_dir(work.path());
    let rootfs = busybox_rootfs(work.path());
    let netd = work.path().join("net.d");
    std::fs::create_dir_all(&netd).unwrap();
    let ports = json!([{"hostPort": 18081, "containerPort": 80, "protocol": "tcp"}]);
    std::fs::write(netd.join("10-weir.conflist"), net.conflist(Some(ports))).unwrap();

    let containerd = Containerd::start();
    let id = format!("{}-c1", unique("rt"));
    // ctr's spec for a bare rootfs has no PATH: absolute paths throughout.
    let mut ctr_run = containerd.run_with_cni(
        &node,
        &netd,
        &bin,
        &[
            "--rootfs",
            rootfs.to_str().unwrap(),
            &id,
            "/bin/sh",
            "-c",
            "echo hello-from-containerd > /tmp/index.html; exec /bin/httpd -f -p 80 -h /tmp",
        ],
    );
    wait_until(
        "ctr run set the network up",
        Duration::from_secs(15),
        || {
            if let Ok(Some(status)) = ctr_run.0.try_wait() {
                panic!("ctr run exited early ({status}): {}", containerd.run_log());
            }
            !net.allocated().is_empty() && !nat_rules_for(&node, 18081).is_empty()
        },
    );

    let (ip, sysctl) = container_view(&run_ok(&mut containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "view",
        &id,
        "/bin/sh",
        "-c",
        VIEW_SCRIPT,
    ])));
    assert!(
        ip.starts_with("10.123.8."),
        "address {ip} not from the subnet"
    );
    assert_eq!(net.allocated(), vec![ip.clone()]);
    // ctr names the attachment <namespace>-<id>.
    let cni_id = format!("weirtest-{id}");
    let owner = std::fs::read_to_string(net.ip_file(&ip)).unwrap();
    assert!(owner.starts_with(&cni_id), "{ip} belongs to {owner:?}");
    assert_eq!(sysctl, TUNED_VALUE, "tuning's sysctl was not applied");
    let body = http_get(&node, &format!("http://{}:18081/", net.gateway()));
    assert_eq!(body.trim(), "hello-from-containerd", "published port 18081");
    assert_eq!(weir_veths(&node, &net).len(), 1);

    // containerd 1.6 has no GC; call it as libcni >= 1.2.3 would.
    gc_as_libcni_would(&node, &net, &[(cni_id.clone(), "eth0")]);
    let body = http_get(&node, &format!("http://{}:18081/", net.gateway()));
    assert_eq!(
        body.trim(),
        "hello-from-containerd",
        "GC cut off a live container"
    );

    // Removal: kill the task; the foreground ctr runs DEL (with an empty CNI_NETNS) and --rm.
    run_ok(&mut containerd.ctr(&["task", "kill", "-s", "SIGKILL", &id]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctr_run.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "ctr run did not return");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(net.allocated().is_empty(), "left: {:?}", net.allocated());
    common::eventually("the container's veth is gone", || {
        weir_veths(&node, &net).is_empty()
    });
    assert!(
        nat_rules_for(&node, 18081).is_empty(),
        "portmap rules left: {:?}",
        nat_rules_for(&node, 18081)
    );
    assert!(
        !run_log_has_cni_error(&containerd.run_log()),
        "ctr reported a CNI error: {}",
        containerd.run_log()
    );
    println!("containerd test took {:?}", started.elapsed());
}

/// ctr logs a failed network removal but still exits with the task's status.
fn run_log_has_cni_error(log: &str) -> bool {
    log.contains("network review") || log.contains("level=error")
}

// ---------------------------------------------------------------------------------------------
// eni-shared mode: the same runtimes, pods on an addressless "ENI"

const ENI_NAME: &str = "eth1";
const ENI_TABLE: u32 = 1003;
const ENI_VETH_PREFIX: &str = "eni";
/// The VPC's web server, on the ENI subnet's gateway address.
const VPC_PORT: u16 = 8080;
const VPC_GREETING: &str = "hello-from-vpc";

/// The addresses the "cloud" assigned to the ENI: `<prefix>.10` (the ENI's own) to `.14`.
struct EniPlan {
    prefix: &'static str,
}

impl EniPlan {
    fn gateway(&self) -> String {
        format!("{}.1", self.prefix)
    }
    fn eni_address(&self) -> String {
        format!("{}.10", self.prefix)
    }
    fn addresses(&self) -> Vec<String> {
        (10..15).map(|i| format!("{}.{i}", self.prefix)).collect()
    }
}

/// The node's ENI (`eth1`, no address of its own until weir-cni gives it one) is a veth whose
/// peer lives in a "VPC" namespace that behaves like the cloud's router: it holds the subnet's
/// gateway address, delivers every address of the ENI's list to the ENI (static routes and
/// neighbours: the cloud knows where each address lives) and serves HTTP on the gateway address.
/// `rp_filter=1` on the node, as on the nodes eni-shared mode is for.
struct EniNode {
    vpc: TestNs,
    _httpd: KillOnDrop,
}

impl EniNode {
    fn new(node: &TestNs, plan: &EniPlan, work: &Path) -> Self {
        let vpc = TestNs::new(&format!("{}-vpc", node.name));
        let (n, v, gw) = (&node.name, &vpc.name, plan.gateway());
        let addresses = plan.addresses().join(" ");
        run_ok(Command::new("sh").args([
            "-ec",
            &format!(
                "ip netns exec {n} sysctl -qw net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.default.rp_filter=1
                 ip -n {v} link set lo up
                 ip -n {n} link add {ENI_NAME} type veth peer name eni-port netns {v}
                 ip -n {v} addr add {gw}/32 dev eni-port
                 ip -n {v} link set eni-port up
                 mac=$(ip netns exec {n} cat /sys/class/net/{ENI_NAME}/address)
                 for a in {addresses}; do
                   ip -n {v} route add $a/32 dev eni-port
                   ip -n {v} neigh replace $a lladdr $mac dev eni-port nud permanent
                 done"
            ),
        ]));
        let www = work.join("vpc-www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("index.html"), format!("{VPC_GREETING}\n")).unwrap();
        let busybox = ["/usr/bin/busybox", "/bin/busybox"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("busybox is missing: install busybox-static");
        let httpd = KillOnDrop(
            Command::new("nsenter")
                .arg(format!("--net={}", vpc.path().display()))
                .args([busybox, "httpd", "-f", "-p"])
                .arg(format!("{gw}:{VPC_PORT}"))
                .arg("-h")
                .arg(&www)
                .stdin(Stdio::null())
                .spawn()
                .expect("start the VPC's httpd"),
        );
        wait_until("the VPC's httpd listens", Duration::from_secs(5), || {
            vpc.sh("ss -ltn").contains(&format!(":{VPC_PORT}"))
        });
        EniNode { vpc, _httpd: httpd }
    }
}

/// Everything an eni-shared container must have, read from inside it (`exec` runs a shell
/// script there) and from the VPC: its address is one of the ENI's (never the ENI's own), it
/// reaches the VPC's server out of the ENI with that address, and the VPC reaches its server.
fn check_eni_container(
    node: &TestNs,
    eni: &EniNode,
    plan: &EniPlan,
    net: &Network,
    ip: &str,
    exec: &dyn Fn(&str) -> String,
    greeting: &str,
) {
    assert!(
        plan.addresses().contains(&ip.to_string()) && ip != plan.eni_address(),
        "address {ip} inside the container is not one of the ENI's pod addresses {:?}",
        plan.addresses()
    );
    assert_eq!(net.allocated(), vec![ip.to_string()]);
    let eni_addrs = node.sh(&format!("ip -4 -o addr show dev {ENI_NAME}"));
    assert!(
        eni_addrs.contains(&format!("{}/32", plan.eni_address())),
        "the ENI lacks its own address: {eni_addrs}"
    );
    let rules = node.sh("ip rule");
    for want in [
        format!("from all to {ip} lookup main"),
        format!("from {ip} lookup {ENI_TABLE}"),
    ] {
        assert!(rules.contains(&want), "no rule `{want}` in:\n{rules}");
    }
    // Out of the ENI: the container's default route → host veth → rule → ENI table → eth1.
    // (`timeout`, not wget's own -T: busybox-static 1.35's wget segfaults with -T.)
    let body = exec(&format!(
        "PATH=/bin; timeout 5 wget -q -O - http://{}:{VPC_PORT}/",
        plan.gateway()
    ));
    assert_eq!(
        body.trim(),
        VPC_GREETING,
        "container -> VPC through the ENI"
    );
    // Into the container from the VPC, and its reply back out of the ENI.
    let body = eni.vpc.sh(&format!("curl -s -m 3 http://{ip}:80/"));
    assert_eq!(body.trim(), greeting, "VPC -> container through the ENI");
}

/// After removal: no veth, no rule naming the address, no address file.
fn check_eni_removed(node: &TestNs, net: &Network, ip: &str) {
    assert!(net.allocated().is_empty(), "left: {:?}", net.allocated());
    common::eventually("the container's veth is gone", || {
        weir_veths(node, net).is_empty()
    });
    let rules = node.sh("ip rule");
    assert!(
        !rules.contains(&format!(" {ip} ")),
        "rules for {ip} left:\n{rules}"
    );
    let routes = node.sh("ip route");
    assert!(!routes.contains(ip), "host route to {ip} left:\n{routes}");
}

#[test]
fn podman_runs_containers_on_an_eni_shared_network() {
    require("/usr/bin/podman", "podman");
    require("/usr/sbin/runc", "runc");
    let started = Instant::now();
    let node = TestNs::new(&format!("{}-epod", unique("rt")));
    node.sh("ip link set lo up");
    let work = tempfile::tempdir().unwrap();
    let plan = EniPlan { prefix: "10.124.7" };
    let eni = EniNode::new(&node, &plan, work.path());
    let net = Network {
        name: format!("enipodman{}", std::process::id()),
        kind: NetKind::Eni(EniPlan {
            prefix: plan.prefix,
        }),
        data_dir: work.path().join("ipam"),
    };
    let bin = plugin_dir(work.path());
    let rootfs = busybox_rootfs(work.path());
    let podman = Podman::new(&node, &net, &bin);

    let name = format!("{}-e1", unique("rt"));
    let id = run_ok(&mut podman.cmd(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        &net.name,
        "--rootfs",
        rootfs.to_str().unwrap(),
        "/bin/sh",
        "-c",
        "echo hello-from-podman > /tmp/index.html; exec /bin/httpd -f -p 80 -h /tmp",
    ]))
    .trim()
    .to_string();
    let exec = |script: &str| run_ok(&mut podman.cmd(&["exec", &name, "/bin/sh", "-c", script]));
    let (ip, sysctl) = container_view(&exec(VIEW_SCRIPT));
    assert_eq!(sysctl, TUNED_VALUE, "tuning's sysctl was not applied");
    let owner = std::fs::read_to_string(net.ip_file(&ip)).unwrap();
    assert!(
        owner.starts_with(&id),
        "{ip} belongs to {owner:?}, not {id}"
    );
    let inspect: Value =
        serde_json::from_str(&run_ok(&mut podman.cmd(&["inspect", &name]))).unwrap();
    assert_eq!(
        inspect[0]["NetworkSettings"]["Networks"][&net.name]["IPAddress"],
        ip.as_str(),
        "podman's record of the address differs from the container's"
    );
    check_eni_container(&node, &eni, &plan, &net, &ip, &exec, "hello-from-podman");
    assert_eq!(weir_veths(&node, &net).len(), 1);

    gc_as_libcni_would(&node, &net, &[(id.clone(), "eth0")]);
    check_eni_container(&node, &eni, &plan, &net, &ip, &exec, "hello-from-podman");

    run_ok(&mut podman.cmd(&["rm", "-f", "-t", "0", &name]));
    check_eni_removed(&node, &net, &ip);
    println!("podman eni-shared test took {:?}", started.elapsed());
}

#[test]
fn containerd_runs_containers_on_an_eni_shared_network() {
    require("/usr/bin/containerd", "containerd");
    require("/usr/sbin/runc", "runc");
    let started = Instant::now();
    let node = TestNs::new(&format!("{}-ectd", unique("rt")));
    node.sh("ip link set lo up");
    let work = tempfile::tempdir().unwrap();
    let plan = EniPlan { prefix: "10.124.8" };
    let eni = EniNode::new(&node, &plan, work.path());
    let net = Network {
        name: format!("enictr{}", std::process::id()),
        kind: NetKind::Eni(EniPlan {
            prefix: plan.prefix,
        }),
        data_dir: work.path().join("ipam"),
    };
    let bin = plugin_dir(work.path());
    let rootfs = busybox_rootfs(work.path());
    let netd = work.path().join("net.d");
    std::fs::create_dir_all(&netd).unwrap();
    std::fs::write(netd.join("10-weir.conflist"), net.conflist(None)).unwrap();

    let containerd = Containerd::start();
    let id = format!("{}-e1", unique("rt"));
    let mut ctr_run = containerd.run_with_cni(
        &node,
        &netd,
        &bin,
        &[
            "--rootfs",
            rootfs.to_str().unwrap(),
            &id,
            "/bin/sh",
            "-c",
            "echo hello-from-containerd > /tmp/index.html; exec /bin/httpd -f -p 80 -h /tmp",
        ],
    );
    wait_until(
        "ctr run set the network up",
        Duration::from_secs(15),
        || {
            if let Ok(Some(status)) = ctr_run.0.try_wait() {
                panic!("ctr run exited early ({status}): {}", containerd.run_log());
            }
            !net.allocated().is_empty()
        },
    );
    let exec = |script: &str| {
        run_ok(&mut containerd.ctr(&[
            "task",
            "exec",
            "--exec-id",
            &exec_id(),
            &id,
            "/bin/sh",
            "-c",
            script,
        ]))
    };
    // The runtime may still be running the rest of the chain (tuning) when the address appears.
    wait_until("tuning ran", Duration::from_secs(10), || {
        container_view(&exec(VIEW_SCRIPT)).1 == TUNED_VALUE
    });
    let (ip, _) = container_view(&exec(VIEW_SCRIPT));
    let cni_id = format!("weirtest-{id}");
    let owner = std::fs::read_to_string(net.ip_file(&ip)).unwrap();
    assert!(owner.starts_with(&cni_id), "{ip} belongs to {owner:?}");
    check_eni_container(
        &node,
        &eni,
        &plan,
        &net,
        &ip,
        &exec,
        "hello-from-containerd",
    );
    assert_eq!(weir_veths(&node, &net).len(), 1);

    gc_as_libcni_would(&node, &net, &[(cni_id.clone(), "eth0")]);
    check_eni_container(
        &node,
        &eni,
        &plan,
        &net,
        &ip,
        &exec,
        "hello-from-containerd",
    );

    // Removal: the foreground ctr runs DEL (with an empty CNI_NETNS) once the task dies.
    run_ok(&mut containerd.ctr(&["task", "kill", "-s", "SIGKILL", &id]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctr_run.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "ctr run did not return");
        std::thread::sleep(Duration::from_millis(50));
    }
    check_eni_removed(&node, &net, &ip);
    assert!(
        !run_log_has_cni_error(&containerd.run_log()),
        "ctr reported a CNI error: {}",
        containerd.run_log()
    );
    println!("containerd eni-shared test took {:?}", started.elapsed());
}

/// A fresh exec id per `ctr task exec` (ids of finished execs may linger briefly).
fn exec_id() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("x{}", N.fetch_add(1, Ordering::Relaxed))
}
