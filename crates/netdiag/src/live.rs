//! The only side effects of this crate: running the tools operators paste the output of, on this
//! node or inside a named network namespace (`ip netns exec NAME …`), and reading `/proc/sys`
//! through `sysctl -a`. Everything they return goes through the same parsers as a collected
//! directory, so live and offline diagnoses cannot drift apart.

use std::process::Command;

use crate::state::Output;

/// Where the commands run.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// A namespace: a name under `/run/netns` (`ip netns add`), or a path such as
    /// `/proc/PID/ns/net`; `None`: this process's namespace.
    pub netns: Option<String>,
}

/// One command's result.
#[derive(Debug, Clone)]
pub struct Ran {
    pub output: Output,
    pub command: String,
    /// `Ok(stdout)`, or why there is no output (tool missing, non-zero exit with stderr).
    pub result: Result<String, String>,
}

/// The command line that produces an output.
pub fn command_for(output: Output) -> &'static [&'static str] {
    match output {
        Output::IptablesSave => &["iptables-save"],
        Output::Ip6tablesSave => &["ip6tables-save"],
        Output::NftRuleset => &["nft", "-j", "list", "ruleset"],
        Output::IpsetList => &["ipset", "list"],
        Output::IpRule => &["ip", "-j", "rule"],
        Output::IpRoute => &["ip", "-j", "route", "show", "table", "all"],
        Output::Ip6Rule => &["ip", "-6", "-j", "rule"],
        Output::Ip6Route => &["ip", "-6", "-j", "route", "show", "table", "all"],
        Output::IpLink => &["ip", "-j", "-d", "link"],
        Output::IpAddr => &["ip", "-j", "addr"],
        Output::IpNeigh => &["ip", "-j", "neigh"],
        Output::IpvsadmLn => &["ipvsadm", "-Ln"],
        Output::Sysctl => &["sysctl", "-a"],
        Output::ConntrackStats => &["conntrack", "-S"],
        // Read when pasted, not collected: `conntrack -L` can hold a million entries, and
        // `ip route get` needs a destination.
        Output::ConntrackList => &["conntrack", "-L"],
        Output::IpRouteGet => &["ip", "route", "get"],
        Output::IpvsadmConns => &["ipvsadm", "-Lnc"],
        Output::HairpinMode => &["sh", "-c", "grep . /sys/class/net/*/brif/*/hairpin_mode"],
        Output::KernelLog => &["dmesg"],
        Output::Tcpdump => &["tcpdump", "-n"],
        // Run in the pod's namespace, not the node's: not part of a node's collection.
        Output::PodIpAddr => &["ip", "addr"],
        Output::PodResolvConf => &["cat", "/etc/resolv.conf"],
    }
}

impl Target {
    fn command(&self, argv: &[&str]) -> Command {
        match &self.netns {
            Some(ns) if ns.contains('/') => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={ns}")).args(argv);
                c
            }
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).args(argv);
                c
            }
            None => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
        }
    }

    /// Runs one tool; its stdout, or why not.
    pub fn run(&self, argv: &[&str]) -> Result<String, String> {
        let out = self
            .command(argv)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stderr: Vec<&str> = stderr
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            return Err(format!("{}: {}", out.status, stderr.join("; ")));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs every output's command. The sysctls are cut down to the ones diagnosis reads.
    pub fn collect(&self) -> Vec<Ran> {
        Output::ALL
            .into_iter()
            .filter(|o| {
                !matches!(
                    o,
                    Output::PodIpAddr
                        | Output::PodResolvConf
                        | Output::ConntrackList
                        | Output::IpRouteGet
                        | Output::IpvsadmConns
                        | Output::HairpinMode
                        | Output::KernelLog
                        | Output::Tcpdump
                )
            })
            .map(|output| {
                let argv = command_for(output);
                // ipvsadm loads ip_vs when it is missing: diagnosis must not change the node.
                if output == Output::IpvsadmLn && self.run(&["cat", "/proc/net/ip_vs"]).is_err() {
                    return Ran {
                        output,
                        command: argv.join(" "),
                        result: Err("IPVS not loaded (no /proc/net/ip_vs): not run".into()),
                    };
                }
                let mut result = self.run(argv);
                if output == Output::Sysctl {
                    // `sysctl -a` exits non-zero when a few keys are unreadable (e.g.
                    // `stable_secret`) but still prints the rest: keep what it printed.
                    result = match result {
                        Ok(t) => Ok(relevant_sysctls(&t)),
                        Err(_) => self.run_lenient(argv).map(|t| relevant_sysctls(&t)),
                    };
                }
                Ran {
                    output,
                    command: argv.join(" "),
                    result,
                }
            })
            .collect()
    }

    fn run_lenient(&self, argv: &[&str]) -> Result<String, String> {
        let out = self
            .command(argv)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
        if out.stdout.is_empty() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The sysctl lines diagnosis reads: forwarding, reverse-path filtering and marks, bridge
/// netfilter, conntrack size, IPVS.
pub fn relevant_sysctls(all: &str) -> String {
    const CONF_KEYS: &[&str] = &[
        "forwarding",
        "rp_filter",
        "src_valid_mark",
        "send_redirects",
        "proxy_arp",
        "accept_local",
        "route_localnet",
    ];
    let keep = |key: &str| {
        if key == "net.ipv4.ip_forward"
            || key == "net.ipv4.ip_local_port_range"
            || key.starts_with("net.bridge.")
            || key.starts_with("net.ipv4.vs.")
            || key.starts_with("net.netfilter.nf_conntrack_count")
            || key.starts_with("net.netfilter.nf_conntrack_max")
            || key.starts_with("net.netfilter.nf_conntrack_buckets")
        {
            return true;
        }
        let conf = key
            .strip_prefix("net.ipv4.conf.")
            .or_else(|| key.strip_prefix("net.ipv6.conf."));
        conf.and_then(|rest| rest.rsplit_once('.'))
            .is_some_and(|(_, name)| CONF_KEYS.contains(&name))
    };
    all.lines()
        .filter(|l| l.split_once('=').is_some_and(|(k, _)| keep(k.trim())))
        .map(|l| format!("{l}\n"))
        .collect()
}

impl Target {
    /// Whether a DNS server answers a query sent from this namespace within about a second:
    /// `dig` exits 0 on any reply (REFUSED and SERVFAIL included: the server is alive) and 9
    /// when nothing came back.
    pub fn probe_dns(&self, server: std::net::IpAddr) -> Result<(), String> {
        let at = format!("@{server}");
        let argv = [
            "dig",
            "+time=1",
            "+tries=1",
            "+norecurse",
            at.as_str(),
            ".",
            "NS",
        ];
        let out = self
            .command(&argv)
            .output()
            .map_err(|e| format!("cannot run dig: {e}"))?;
        match out.status.code() {
            Some(0) => Ok(()),
            Some(9) => Err("no answer within 1 s".into()),
            _ => Err(format!(
                "dig failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            )),
        }
    }

    /// A pod's side, run in the pod's namespace (this target): its `ip addr` (the address and the
    /// `eth0@ifN` peer index that names its host veth) and the resolv.conf a process in it sees.
    /// Saved next to the node's outputs, they let `weir trace DIR` start from the pod and
    /// `weir doctor --dir` check its resolv.conf.
    pub fn collect_pod(&self) -> Vec<Ran> {
        vec![
            Ran {
                output: Output::PodIpAddr,
                command: format!(
                    "ip addr (in the pod's namespace {})",
                    self.netns.as_deref().unwrap_or("?")
                ),
                result: self.run(&["ip", "addr"]),
            },
            Ran {
                output: Output::PodResolvConf,
                command: "the pod's /etc/resolv.conf (through a process in its namespace)".into(),
                result: self.resolv_conf_of_a_process().map(|(_, text)| text),
            },
        ]
    }

    /// The resolv.conf a process living in this namespace sees (`/proc/PID/root/etc/resolv.conf`
    /// of the first process found in it), with its path.
    pub fn resolv_conf_of_a_process(&self) -> Result<(String, String), String> {
        use std::os::unix::fs::MetadataExt;
        let ns = self.netns.as_deref().ok_or("no namespace given")?;
        let path = if ns.contains('/') {
            std::path::PathBuf::from(ns)
        } else {
            std::path::Path::new("/run/netns").join(ns)
        };
        let target = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut pids: Vec<u32> = std::fs::read_dir("/proc")
            .map_err(|e| format!("/proc: {e}"))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort();
        for pid in pids {
            let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) else {
                continue;
            };
            if m.ino() == target.ino() && m.dev() == target.dev() {
                let file = format!("/proc/{pid}/root/etc/resolv.conf");
                return std::fs::read_to_string(&file)
                    .map(|t| (file.clone(), t))
                    .map_err(|e| format!("{file}: {e}"));
            }
        }
        Err(format!(
            "no process lives in {}: give the pod's resolv.conf with --resolv-conf",
            path.display()
        ))
    }
}

/// What `weir trace collect` wrote, as `manifest.json` records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ManifestEntry {
    pub output: String,
    pub command: String,
    /// The file written, or `None` when the command gave no output.
    pub file: Option<String>,
    pub bytes: usize,
    pub error: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub tool: String,
    pub netns: Option<String>,
    /// Seconds since the Unix epoch.
    pub collected_at: u64,
    pub entries: Vec<ManifestEntry>,
}

/// Defined with the outputs ([`crate::state`]), which skips it when reading a directory back.
pub use crate::state::MANIFEST_FILE;

/// Writes each output that ran to its conventional file in `dir` (created if missing) and a
/// `manifest.json` listing every command with its file or its error. Refuses to overwrite any
/// existing file: a previous collection is evidence too.
pub fn write_collection(
    dir: &std::path::Path,
    target: &Target,
    runs: &[Ran],
) -> std::io::Result<Manifest> {
    use std::io::{Error, ErrorKind};
    std::fs::create_dir_all(dir)?;
    let mut names: Vec<&str> = runs.iter().map(|r| r.output.file_name()).collect();
    names.push(MANIFEST_FILE);
    for n in &names {
        if dir.join(n).exists() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} already exists: collect into a new directory",
                    dir.join(n).display()
                ),
            ));
        }
    }
    let mut entries = Vec::new();
    for r in runs {
        let (file, bytes, error) = match &r.result {
            Ok(text) => {
                std::fs::write(dir.join(r.output.file_name()), text)?;
                (Some(r.output.file_name().to_string()), text.len(), None)
            }
            Err(e) => (None, 0, Some(e.clone())),
        };
        entries.push(ManifestEntry {
            output: serde_json::to_value(r.output)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            command: r.command.clone(),
            file,
            bytes,
            error,
        });
    }
    let manifest = Manifest {
        tool: format!("weir-netdiag {}", env!("CARGO_PKG_VERSION")),
        netns: target.netns.clone(),
        collected_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        entries,
    };
    let json = serde_json::to_string_pretty(&manifest).map_err(Error::other)?;
    std::fs::write(dir.join(MANIFEST_FILE), json + "\n")?;
    Ok(manifest)
}
