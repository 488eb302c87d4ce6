//! `weir routes --validate`: the settings the agent would run with, or every problem with
//! them, without touching the node; exit 2 on a problem, as `weir proxy --validate`.

use std::process::ExitCode;

use serde_json::json;

use super::{config, BackendName, RoutesFlags};
use crate::foreign_flags::Findings;
use crate::proxy_cmd::go_duration;
use crate::runtime::source::Origin;

/// The settings as (name, value) rows, or the problems found (`refused`: the flanneld flags
/// refused, problems too).
fn report(
    flags: &RoutesFlags,
    refused: Vec<String>,
) -> Result<Vec<(&'static str, String)>, Vec<String>> {
    let mut problems = refused;
    let fail = |problems: &[String], e: anyhow::Error| {
        let mut all = problems.to_vec();
        all.push(format!("{e:#}"));
        all
    };
    let origin = flags.source.origin().map_err(|e| fail(&problems, e))?;
    let node = flags.node.resolve().map_err(|e| fail(&problems, e))?;
    if let Err(e) = config(&node, &flags.options) {
        problems.push(format!("{e:#}"));
    }
    let source = match &origin {
        Origin::Manifests { dir, poll, .. } => {
            if !dir.is_dir() {
                problems.push(format!("--manifests {}: not a directory", dir.display()));
            }
            format!(
                "manifests {} (polled every {})",
                dir.display(),
                go_duration(*poll)
            )
        }
        Origin::Api {
            kubeconfig, master, ..
        } => {
            if let Some(path) = kubeconfig {
                if let Err(e) = weir_source::api::check_kubeconfig(path) {
                    problems.push(format!("--kubeconfig: {e}"));
                }
            }
            match (kubeconfig, master) {
                (Some(k), _) => format!("Kubernetes API, kubeconfig {}", k.display()),
                (None, Some(m)) => format!("Kubernetes API at {m}"),
                (None, None) => "Kubernetes API, in-cluster".into(),
            }
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let o = &flags.options;
    let backend = match o.backend {
        BackendName::HostGw => "host-gw".to_string(),
        BackendName::Vxlan => format!("vxlan (VNI {}, port {})", o.vni, o.port),
    };
    Ok(vec![
        ("node", node),
        ("source", source),
        ("backend", backend),
        ("sync_period", go_duration(flags.sync_period)),
        (
            "metrics",
            flags
                .metrics_bind_address
                .0
                .map_or("off".into(), |a| a.to_string()),
        ),
        ("mtu_file", o.mtu_file.display().to_string()),
        ("annotation_prefix", o.annotation_prefix.clone()),
    ])
}

/// Prints the report as text or JSON (with the notices of `found`); exit 0 when valid, 2
/// with every problem otherwise.
pub fn run(flags: &RoutesFlags, found: Findings, json_output: bool) -> ExitCode {
    let notices = found.notices;
    let result = report(flags, found.refused);
    if json_output {
        let doc = match &result {
            Ok(rows) => json!({
                "valid": true,
                "settings": rows.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "notices": notices,
                "problems": [],
            }),
            Err(problems) => json!({ "valid": false, "notices": notices, "problems": problems }),
        };
        outln!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        for n in &notices {
            outln!("notice: {n}");
        }
        match &result {
            Ok(rows) => {
                outln!("weir routes: settings valid");
                for (k, v) in rows {
                    outln!("  {k:<18} {v}");
                }
            }
            Err(problems) => {
                for p in problems {
                    eprintln!("weir routes: {p}");
                }
            }
        }
    }
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
