//! The only side effects of this crate: running the tools operators paste the output of, on this
//! node or inside a named network namespace (`ip netns exec NAME …`), and reading `/proc/sys`
//! through `sysctl -a`. Everything they return goes through the same parsers as a collected
//! directory, so live and offline diagnoses cannot drift apart.

use std::process::Command;

use crate::state::Output;

/// Where the commands run.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// A namespace under `/run/netns` (`ip netns add` name); `None`: this process's namespace.
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
        Output::IpLink => &["ip", "-j", "-d", "link"],
        Output::IpAddr => &["ip", "-j", "addr"],
        Output::IpNeigh => &["ip", "-j", "neigh"],
        Output::IpvsadmLn => &["ipvsadm", "-Ln"],
        Output::Sysctl => &["sysctl", "-a"],
        Output::ConntrackStats => &["conntrack", "-S"],
    }
}

impl Target {
    fn command(&self, argv: &[&str]) -> Command {
        match &self.netns {
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
            return Err(format!(
                "{} exited with {}: {}",
                argv.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs every output's command. The sysctls are cut down to the ones diagnosis reads.
    pub fn collect(&self) -> Vec<Ran> {
        Output::ALL
            .into_iter()
            .map(|output| {
                let argv = command_for(output);
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
