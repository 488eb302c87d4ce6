//! One invocation of the plugin: environment + stdin in, stdout text (or a CNI error) out.

use crate::bridge::{ipam_err, Attachment};
use crate::config::{declared_version, NetConf};
use crate::ipam::Store;
use crate::spec::{
    parse_command, CniError, CniResult, Command, Env, ErrorCode, Outcome, CURRENT_VERSION,
    SUPPORTED_VERSIONS,
};

/// What the process prints and how it exits.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub stdout: String,
    pub success: bool,
}

/// Runs one command. Never panics on bad input: every failure becomes a CNI error reply.
pub fn run(get_env: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Reply {
    let version = declared_version(stdin)
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| CURRENT_VERSION.to_string());
    match dispatch(get_env, stdin) {
        Ok(stdout) => Reply {
            stdout,
            success: true,
        },
        Err(e) => Reply {
            stdout: e.to_json(&version),
            success: false,
        },
    }
}

fn dispatch(get_env: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> CniResult<String> {
    // VERSION needs CNI_COMMAND only (runtimes probe it with placeholder values elsewhere), and
    // answers in the version the caller declared, when we speak it.
    if parse_command(&get_env)? == Command::Version {
        let version = declared_version(stdin)
            .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
            .unwrap_or_else(|| CURRENT_VERSION.to_string());
        return Ok(serde_json::json!({
            "cniVersion": version,
            "supportedVersions": SUPPORTED_VERSIONS,
        })
        .to_string());
    }
    let env = Env::parse(get_env)?;
    // eni-shared mode has its own configuration and operations (crates/cni/src/eni/).
    if crate::eni::config::is_eni_shared(stdin) {
        return crate::eni::dispatch(&env, stdin);
    }
    let mut conf = NetConf::parse(stdin)?;
    if env.command == Command::Add {
        conf.read_requests(&env.args)?;
        conf.resolve_mtu()?;
    }
    let needs = |min: &str, what: &str| crate::spec::require_version(&conf.cni_version, min, what);
    let attachment = Attachment {
        conf: &conf,
        container_id: &env.container_id,
        ifname: &env.ifname,
    };
    match env.command {
        Command::Version => unreachable!("answered above"),
        Command::Add => {
            let store = Store::open(&conf.ipam, &conf.name).map_err(ipam_err)?;
            let netns = env.netns.as_deref().expect("validated for ADD");
            let outcome = attachment.add(netns, &store)?;
            Ok(outcome.to_json(&conf.cni_version))
        }
        Command::Del => {
            let store = Store::open(&conf.ipam, &conf.name).map_err(ipam_err)?;
            attachment.del(&store)?;
            Ok(String::new())
        }
        Command::Check if conf.disable_check => Ok(String::new()),
        Command::Check => {
            needs("0.4.0", "CHECK")?;
            let prev = conf.prev_result.as_ref().ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidConfig,
                    "CHECK needs prevResult in the configuration",
                )
            })?;
            let prev = Outcome::from_value(prev)?;
            let store = Store::open(&conf.ipam, &conf.name).map_err(ipam_err)?;
            attachment.check(
                env.netns.as_deref().expect("validated for CHECK"),
                &store,
                &prev,
            )?;
            Ok(String::new())
        }
        Command::Gc if conf.disable_gc => Ok(String::new()),
        Command::Gc => {
            needs("1.1.0", "GC")?;
            // Without the list every attachment would look stale: refuse rather than cut off pods.
            let listed = conf.valid_attachments.as_ref().ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidConfig,
                    "GC needs cni.dev/valid-attachments in the configuration (an empty list if \
                     nothing is valid)",
                )
            })?;
            let valid: Vec<(String, String)> = listed
                .iter()
                .map(|a| (a.container_id.clone(), a.ifname.clone()))
                .collect();
            gc(&conf, &valid)?;
            Ok(String::new())
        }
        Command::Status => {
            needs("1.1.0", "STATUS")?;
            status(&conf)?;
            Ok(String::new())
        }
    }
}

/// Tears down every attachment this network's store knows that is not in `valid`, releases its
/// addresses, removes this network's orphaned veths and resyncs its masquerade sets. Nothing of
/// another network is touched: its allocations live in another store, its veths carry its alias.
fn gc(conf: &NetConf, valid: &[(String, String)]) -> CniResult<()> {
    let store = Store::open(&conf.ipam, &conf.name)
        .map_err(ipam_err)?
        .keeping(valid);
    let mut stale: Vec<(String, String)> = store
        .allocations()
        .map_err(ipam_err)?
        .into_iter()
        .map(|(_, id, ifname)| (id, ifname))
        .filter(|a| !valid.contains(a))
        .collect();
    stale.sort();
    stale.dedup();
    for (id, ifname) in &stale {
        // IDs recorded by older runtimes may not pass today's validation: never build names from them.
        if crate::spec::validate_container_id(id).is_ok()
            && crate::spec::validate_ifname(ifname).is_ok()
        {
            let ips = store.lookup(id, ifname).map_err(ipam_err)?;
            Attachment {
                conf,
                container_id: id,
                ifname,
            }
            .teardown(&ips, &store)?;
        }
    }
    store.gc(valid).map_err(ipam_err)?;
    let live: Vec<(String, String)> = store
        .allocations()
        .map_err(ipam_err)?
        .into_iter()
        .map(|(_, id, ifname)| (id, ifname))
        .collect();
    let mut host = weir_kernel::Rtnl::new()
        .map_err(|e| CniError::new(ErrorCode::Io, format!("netlink socket: {e}")))?;
    for orphan in crate::bridge::orphan_veths(&mut host, &conf.name, &conf.bridge, &live)? {
        match host.link_del(orphan.index, &orphan.name) {
            Err(e) if !e.is_not_found() => {
                return Err(CniError::new(ErrorCode::Netlink, e.to_string()))
            }
            _ => {}
        }
    }
    if conf.ip_masq {
        // GC doubles as the resync of this network's masquerade objects (rebuilt from the store).
        let live_ips: Vec<std::net::IpAddr> = store
            .allocations()
            .map_err(ipam_err)?
            .into_iter()
            .map(|(ip, _, _)| ip)
            .collect();
        crate::masq::NetMasq {
            scope: crate::masq::Scope::for_network(&conf.name),
            direct: conf.masquerade_exempt(),
            stamp: store.dir().join(crate::bridge::MASQ_STAMP),
        }
        .resync(&live_ips)?;
    }
    Ok(())
}

/// Can the plugin serve ADDs? The store must be writable and, with ipMasq, nft must be present.
fn status(conf: &NetConf) -> CniResult<()> {
    let unavailable = |m: String| CniError::new(ErrorCode::NotAvailable, m);
    let store =
        Store::open(&conf.ipam, &conf.name).map_err(|e| unavailable(format!("IPAM store: {e}")))?;
    store
        .check_writable()
        .map_err(|e| unavailable(format!("IPAM store is not writable: {e}")))?;
    let allocated: Vec<std::net::IpAddr> = store
        .allocations()
        .map_err(|e| unavailable(format!("IPAM store cannot be read: {e}")))?
        .into_iter()
        .map(|(ip, _, _)| ip)
        .collect();
    if let Some((set, ranges)) = exhausted_range_set(&conf.ipam, &allocated) {
        return Err(unavailable(format!(
            "no free address: range set {set} ({ranges}) is fully allocated"
        )));
    }
    if conf.ip_masq {
        let nft = std::process::Command::new("nft").arg("--version").output();
        if !nft.is_ok_and(|o| o.status.success()) {
            return Err(unavailable(
                "ipMasq is on but the nft command is not available".into(),
            ));
        }
    }
    Ok(())
}

/// The first range set with no free address (ADD needs one from every set), with its ranges.
/// Free means inside a range, not its gateway, not `reserved`, not allocated.
fn exhausted_range_set(
    ipam: &crate::ipam::IpamConf,
    allocated: &[std::net::IpAddr],
) -> Option<(usize, String)> {
    use std::collections::HashSet;
    use std::net::IpAddr;
    fn num(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(a) => u32::from(a).into(),
            IpAddr::V6(a) => a.into(),
        }
    }
    let taken: HashSet<IpAddr> = allocated.iter().copied().collect();
    for (i, set) in ipam.range_sets().iter().enumerate() {
        let mut free = false;
        for r in set {
            let (start, end) = (r.effective_start(), r.effective_end());
            let same_family = |ip: &IpAddr| ip.is_ipv4() == start.is_ipv4();
            let inside =
                |ip: &IpAddr| same_family(ip) && (num(start)..=num(end)).contains(&num(*ip));
            let mut unusable: HashSet<IpAddr> = taken.iter().copied().filter(inside).collect();
            unusable.extend(ipam.reserved.iter().copied().filter(inside));
            let gw = r.effective_gateway();
            if inside(&gw) {
                unusable.insert(gw);
            }
            let size = num(end).saturating_sub(num(start)).saturating_add(1);
            if size > unusable.len() as u128 {
                free = true;
                break;
            }
        }
        if !free {
            let ranges = set
                .iter()
                .map(|r| format!("{}-{}", r.effective_start(), r.effective_end()))
                .collect::<Vec<_>>()
                .join(", ");
            return Some((i, ranges));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(ranges: &str, reserved: &str) -> crate::ipam::IpamConf {
        let conf = format!(
            r#"{{"cniVersion":"1.1.0","name":"n","type":"weir-cni",
                "ipam":{{"type":"weir-ipam","ranges":{ranges}{reserved}}}}}"#
        );
        NetConf::parse(conf.as_bytes()).unwrap().ipam
    }

    fn run_env(env: &[(&str, &str)], stdin: &str) -> (Reply, serde_json::Value) {
        let env: std::collections::HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let reply = run(|k| env.get(k).cloned(), stdin.as_bytes());
        let json = serde_json::from_str(&reply.stdout).unwrap();
        (reply, json)
    }

    #[test]
    fn version_needs_only_cni_command_and_answers_in_the_callers_version() {
        // podman validates a conflist this way: dummy values in every other variable
        let dummies = [
            ("CNI_COMMAND", "VERSION"),
            ("CNI_CONTAINERID", "dummy"),
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy"),
            ("CNI_PATH", "dummy"),
        ];
        let (reply, v) = run_env(&dummies, r#"{"cniVersion":"0.4.0"}"#);
        assert!(reply.success, "{}", reply.stdout);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert!(v["supportedVersions"].as_array().unwrap().len() >= 5);
        // an unknown or missing version gets ours
        let (_, v) = run_env(&dummies, r#"{"cniVersion":"7.0.0"}"#);
        assert_eq!(v["cniVersion"], CURRENT_VERSION);
        let (reply, v) = run_env(&[("CNI_COMMAND", "VERSION")], "");
        assert!(reply.success);
        assert_eq!(v["cniVersion"], CURRENT_VERSION);
    }

    #[test]
    fn gc_without_the_valid_attachments_list_is_a_config_error() {
        let conf = r#"{"cniVersion":"1.1.0","name":"n","type":"weir-cni",
            "ipam":{"type":"weir-ipam","ranges":[[{"subnet":"10.9.0.0/24"}]],"dataDir":"/nonexistent/weir-test"}}"#;
        let (reply, v) = run_env(&[("CNI_COMMAND", "GC")], conf);
        assert!(!reply.success);
        assert_eq!(v["code"], 7);
        assert!(v["msg"]
            .as_str()
            .unwrap()
            .contains("cni.dev/valid-attachments"));
        // eni-shared mode likewise (it stops before touching the host)
        let eni = r#"{"cniVersion":"1.1.0","name":"eni1","type":"weir-cni","mode":"eni-shared",
            "eniName":"eth1","eniGateway":"10.12.192.1","routeTable":1003,
            "eniAddresses":["10.12.192.10","10.12.192.11"],"dataDir":"/nonexistent/weir-test"}"#;
        let (reply, v) = run_env(&[("CNI_COMMAND", "GC")], eni);
        assert!(!reply.success);
        assert_eq!(v["code"], 7, "{}", reply.stdout);
        assert!(
            v["msg"]
                .as_str()
                .unwrap()
                .contains("cni.dev/valid-attachments"),
            "{}",
            reply.stdout
        );
    }

    #[test]
    fn a_full_range_set_is_reported_and_a_free_one_is_not() {
        // a /30: .1 is the gateway, .2 the only usable address
        let small = ipam(r#"[[{"subnet":"10.9.0.0/30"}]]"#, "");
        assert_eq!(exhausted_range_set(&small, &[]), None);
        let (set, ranges) = exhausted_range_set(&small, &["10.9.0.2".parse().unwrap()]).unwrap();
        assert_eq!(set, 0);
        assert!(ranges.contains("10.9.0.2"), "{ranges}");
        // allocations outside the set do not count
        assert_eq!(
            exhausted_range_set(&small, &["10.9.1.2".parse().unwrap()]),
            None
        );
        // a second range in the set still has room
        let two = ipam(
            r#"[[{"subnet":"10.9.0.0/30"},{"subnet":"10.9.1.0/30"}]]"#,
            "",
        );
        assert_eq!(
            exhausted_range_set(&two, &["10.9.0.2".parse().unwrap()]),
            None
        );
        // reserved addresses are not free
        let v6 = ipam(
            r#"[[{"subnet":"10.9.0.0/24"}],[{"subnet":"fd00::/126"}]]"#,
            r#","reserved":["fd00::2"]"#,
        );
        let got = exhausted_range_set(&v6, &["fd00::3".parse().unwrap()]);
        assert_eq!(got.map(|g| g.0), Some(1));
    }

    fn run_with(command: &str, conf: &str) -> Reply {
        let env = |k: &str| {
            match k {
                "CNI_COMMAND" => Some(command),
                "CNI_CONTAINERID" => Some("c1"),
                "CNI_IFNAME" => Some("eth0"),
                "CNI_NETNS" => Some("/nonexistent/netns"),
                _ => None,
            }
            .map(str::to_string)
        };
        run(env, conf.as_bytes())
    }

    #[test]
    fn disable_check_and_disable_gc_answer_without_looking() {
        let dir = tempfile::tempdir().unwrap();
        let conf = |extra: &str| {
            format!(
                r#"{{"cniVersion":"1.1.0","name":"n","type":"weir-cni"{extra},
                    "ipam":{{"type":"host-local","subnet":"10.5.0.0/24","dataDir":"{}"}}}}"#,
                dir.path().display()
            )
        };
        // CHECK without prevResult and with a missing netns would fail; disableCheck skips it
        assert!(!run_with("CHECK", &conf("")).success);
        assert_eq!(
            run_with("CHECK", &conf(r#","disableCheck":true"#)),
            Reply {
                stdout: String::new(),
                success: true
            }
        );
        // GC with disableGC touches nothing. (A 1.0.0 config, so that a real GC would stop at the
        // version check rather than reach this host's interfaces.)
        let old = |extra: &str| conf(extra).replace("1.1.0", "1.0.0");
        assert!(!run_with("GC", &old("")).success);
        assert!(run_with("GC", &old(r#","disableGC":true"#)).success);
        assert!(!dir.path().join("n").exists());
    }
}
