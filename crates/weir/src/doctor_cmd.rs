//! `weir doctor`: the checks of `weir_netdiag::doctor` on this node, a lab node (`--netns`) or a
//! collected directory (`--dir`), with a pod's DNS checked from its namespace (`--pod-netns`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use weir_netdiag::doctor::{self, PodDns};
use weir_netdiag::live::Target;
use weir_netdiag::state::NodeState;

#[derive(Args)]
pub struct DoctorArgs {
    /// Check the node inside this network namespace (a name under /run/netns, or a path).
    #[arg(long, conflicts_with_all = ["dir", "input"])]
    netns: Option<String>,
    /// Check saved outputs: a directory (`weir trace collect`, or files saved by hand), one
    /// file holding one output or many (a ticket body), or `-` for standard input.
    #[arg(long, value_name = "DIR|FILE|-", conflicts_with = "input")]
    dir: Option<PathBuf>,
    /// The same as --dir.
    #[arg(value_name = "DIR|FILE|-")]
    input: Option<PathBuf>,
    /// Also check this pod's DNS: its network namespace (name or path). `--pod` as in
    /// `weir trace`.
    #[arg(long, visible_alias = "pod")]
    pod_netns: Option<String>,
    /// The pod's resolv.conf (default: read through a process living in --pod-netns).
    #[arg(long, requires = "pod_netns")]
    resolv_conf: Option<PathBuf>,
    /// Kubernetes objects for the NetworkPolicy checks: a manifest file or directory, or a
    /// `kubectl get namespaces,pods,networkpolicies -A -o yaml` dump (repeatable). In --dir,
    /// files holding objects are read without it.
    #[arg(long, value_name = "FILE|DIR")]
    objects: Vec<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut notes = Vec::new();
    let input = args.dir.as_ref().or(args.input.as_ref());
    let st = match input {
        Some(input) => {
            let (st, read_notes) = crate::diag_input::read(input)?;
            if st.nothing_read() && args.objects.is_empty() {
                anyhow::bail!("{}", weir_netdiag::state::what_to_collect(input));
            }
            notes.extend(read_notes);
            st
        }
        None => {
            let target = Target {
                netns: args.netns.clone(),
            };
            let runs = target.collect();
            let mut outputs = Vec::new();
            for r in runs {
                match r.result {
                    Ok(text) => outputs.push((r.output, text)),
                    Err(e) => notes.push(format!("{}: {e}", r.command)),
                }
            }
            NodeState::from_outputs(outputs)
        }
    };
    let mut st = st;
    if !args.objects.is_empty() {
        let mut objects = st.objects.take().unwrap_or_default();
        for path in &args.objects {
            objects
                .add_path(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
        }
        st.objects = Some(objects);
    }
    if let Some(o) = &st.objects {
        let c = &o.cluster;
        notes.push(format!(
            "objects: {} Namespace(s), {} Pod(s), {} NetworkPolicy(ies) from {}",
            c.namespaces.len(),
            c.pods.len(),
            c.policies.len(),
            o.files.join(", ")
        ));
        notes.extend(o.errors.iter().map(|e| format!("objects: {e}")));
        notes.extend(o.warnings.iter().map(|w| format!("objects: {w}")));
    }
    let pod = match &args.pod_netns {
        Some(ns) => Some(pod_dns(ns, args.resolv_conf.as_ref())?),
        // A directory may hold the pod's resolv.conf (pod-resolv.conf): its lines are checked.
        None => PodDns::from_saved(&st),
    };
    let checks = doctor::run_all(&st, pod.as_ref());
    if args.json {
        let doc = serde_json::json!({
            "read": st.sections,
            "checks": checks,
            "notes": notes,
            "assumptions": st.assumptions,
            "unreadable": st.unreadable,
            "skipped": st.skipped.iter().map(|(o, s)| serde_json::json!({
                "file": o.file_name(), "line": s.line, "text": s.text, "reason": s.reason,
                "from": s.origin,
            })).collect::<Vec<_>>(),
        });
        // A closed pipe (`| head`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        // What was read comes first: a paste's parts, and what nothing reads.
        let mut text = if input.is_some() {
            weir_netdiag::intake::render(&st.sections)
        } else {
            String::new()
        };
        text.push_str(&doctor::render_table(&checks));
        for u in &st.unreadable {
            text.push_str(&format!(
                "unreadable: {u}: left out; the checks that need it cannot tell\n"
            ));
        }
        for n in &notes {
            text.push_str(&format!("note: {n}\n"));
        }
        for a in &st.assumptions {
            text.push_str(&format!("assumed: {a}\n"));
        }
        if !st.skipped.is_empty() {
            text.push_str(&format!(
                "{} unreadable line(s) left out (see --json)\n",
                st.skipped.len()
            ));
        }
        let _ = write!(std::io::stdout(), "{text}");
    }
    // Input that could not be read is not a pass.
    Ok(
        if doctor::any_failed(&checks) || !st.unreadable.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// The pod's resolv.conf and a probe of each nameserver from inside its namespace.
fn pod_dns(ns: &str, resolv_conf: Option<&PathBuf>) -> anyhow::Result<PodDns> {
    let target = Target {
        netns: Some(ns.to_string()),
    };
    let (source, text) = match resolv_conf {
        Some(p) => (
            p.display().to_string(),
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        ),
        None => target
            .resolv_conf_of_a_process()
            .map_err(anyhow::Error::msg)?,
    };
    let probes = doctor::nameservers(&text)
        .into_iter()
        .filter(|ip| !ip.is_loopback())
        .map(|ip| (ip, target.probe_dns(ip)))
        .collect();
    Ok(PodDns {
        source,
        resolv_conf: text,
        probes,
    })
}
