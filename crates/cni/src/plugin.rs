//! One invocation of the plugin: environment + stdin in, stdout text (or a CNI error) out.

use crate::bridge::{ipam_err, Attachment};
use crate::config::{declared_version, NetConf};
use crate::ipam::Store;
use crate::spec::{
    version_at_least, CniError, CniResult, Command, Env, ErrorCode, Outcome, CURRENT_VERSION,
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
    let env = Env::parse(get_env)?;
    if env.command == Command::Version {
        return Ok(serde_json::json!({
            "cniVersion": CURRENT_VERSION,
            "supportedVersions": SUPPORTED_VERSIONS,
        })
        .to_string());
    }
    // eni-shared mode has its own configuration and operations (crates/cni/src/eni/).
    if crate::eni::config::is_eni_shared(stdin) {
        return crate::eni::dispatch(&env, stdin);
    }
    let mut conf = NetConf::parse(stdin)?;
    if env.command == Command::Add {
        conf.read_requests(&env.args)?;
    }
    let needs = |min: &str, what: &str| {
        if version_at_least(&conf.cni_version, min) {
            Ok(())
        } else {
            Err(CniError::new(
                ErrorCode::IncompatibleVersion,
                format!(
                    "{what} needs cniVersion {min} or later, the configuration says {}",
                    conf.cni_version
                ),
            ))
        }
    };
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
            let valid: Vec<(String, String)> = conf
                .valid_attachments
                .iter()
                .flatten()
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

/// Tears down every attachment the store knows that is not in `valid`, then releases its addresses.
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
            .teardown(&ips)?;
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
    for orphan in crate::bridge::orphan_veths(&mut host, &live)? {
        match host.link_del(orphan.index, &orphan.name) {
            Err(e) if !e.is_not_found() => {
                return Err(CniError::new(ErrorCode::Netlink, e.to_string()))
            }
            _ => {}
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
