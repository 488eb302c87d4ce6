//! One invocation of the plugin: environment + stdin in, stdout text (or a CNI error) out. The
//! configuration picks the mode; each verb goes through the [`Mode`] trait.

use crate::bridge::BridgeMode;
use crate::config::declared_version;
use crate::eni::EniSharedMode;
use crate::mode::{AttachmentId, Mode};
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

/// What `weir-cni --version` prints (as containernetworking/plugins' `--version` does): the
/// plugin's version and the CNI versions it speaks.
pub fn version_text() -> String {
    format!(
        "CNI plugin weir-cni version {}\nCNI protocol versions supported: {}",
        env!("CARGO_PKG_VERSION"),
        SUPPORTED_VERSIONS.join(", ")
    )
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
    let mode = select_mode(&env, stdin)?;
    run_verb(mode.as_ref(), &env)
}

/// The mode the configuration asks for, its configuration parsed: eni-shared has its own
/// (crates/cni/src/eni/config.rs); anything else is bridge mode's.
fn select_mode(env: &Env, stdin: &[u8]) -> CniResult<Box<dyn Mode>> {
    if crate::eni::config::is_eni_shared(stdin) {
        return Ok(Box::new(EniSharedMode::parse(stdin)?));
    }
    Ok(Box::new(BridgeMode::parse(stdin, env)?))
}

/// The protocol's part of a verb, the same in every mode (the cniVersion it needs, what it must
/// find in the configuration), then the mode's part.
fn run_verb(mode: &dyn Mode, env: &Env) -> CniResult<String> {
    let conf = mode.common();
    let needs = |min: &str, what: &str| crate::spec::require_version(conf.cni_version, min, what);
    let attachment = AttachmentId {
        container_id: &env.container_id,
        ifname: &env.ifname,
    };
    match env.command {
        Command::Version => unreachable!("answered before the configuration is read"),
        Command::Add => {
            let netns = env.netns.as_deref().expect("validated for ADD");
            let outcome = mode.add(attachment, netns)?;
            Ok(outcome.to_json(conf.cni_version))
        }
        Command::Del => {
            mode.del(attachment)?;
            Ok(String::new())
        }
        Command::Check if conf.disable_check => Ok(String::new()),
        Command::Check => {
            needs("0.4.0", "CHECK")?;
            let prev = conf.prev_result.ok_or_else(|| {
                CniError::new(
                    ErrorCode::InvalidConfig,
                    "CHECK needs prevResult in the configuration",
                )
            })?;
            let prev = Outcome::from_value(prev)?;
            let netns = env.netns.as_deref().expect("validated for CHECK");
            mode.check(attachment, netns, &prev)?;
            Ok(String::new())
        }
        Command::Gc if conf.disable_gc => Ok(String::new()),
        Command::Gc => {
            needs("1.1.0", "GC")?;
            // Without the list every attachment would look stale: refuse rather than cut off pods.
            let listed = conf.valid_attachments.ok_or_else(|| {
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
            mode.gc(&valid)?;
            Ok(String::new())
        }
        Command::Status => {
            needs("1.1.0", "STATUS")?;
            mode.status()?;
            Ok(String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
