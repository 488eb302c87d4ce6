//! `weir lab …`: a whole cluster simulated with network namespaces on this machine.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use weir_lab::lab::{self, Binaries};
use weir_lab::{matrix, state_root, CniKind, Topology};

#[derive(clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum CniArg {
    Weir,
    Reference,
}

#[derive(Subcommand)]
enum LabCommand {
    /// Create the namespaces, links, routes, pods (via the CNI plugin) and echo servers of a topology.
    Up {
        /// The topology file (YAML).
        topology: PathBuf,
    },
    /// Remove everything a lab is made of (also after a crash).
    Down {
        /// The lab's name.
        lab: String,
    },
    /// Namespaces, pods, addresses and echo servers of a lab.
    Status {
        lab: String,
        #[arg(long)]
        json: bool,
    },
    /// Run a command inside one of the lab's namespaces.
    Exec {
        lab: String,
        /// `<node>`, `<node>/<pod>`, `out` or `sw`.
        target: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Probe the connectivity matrix (exit code 1 if any probe fails).
    Check {
        lab: String,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Bring up the built-in two-node lab, print the matrix, tear it down.
    Demo {
        /// Keep the lab running afterwards.
        #[arg(long)]
        keep: bool,
        /// Lab name (default: demo); set it to run several demos at once.
        #[arg(long)]
        name: Option<String>,
        /// Which CNI plugin creates the pods.
        #[arg(long, value_enum)]
        cni: Option<CniArg>,
        /// Print the matrix as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve `<name> <peer ip>` on TCP and UDP (run by the lab in every namespace).
    #[command(hide = true)]
    EchoServer {
        #[arg(long)]
        netns: Option<PathBuf>,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = weir_lab::echo::ECHO_PORT)]
        port: u16,
    },
}

/// `weir` itself and `weir-cni` next to it (or `$WEIR_CNI`).
fn binaries() -> anyhow::Result<Binaries> {
    let weir = std::env::current_exe().context("cannot locate the weir binary")?;
    let weir_cni = match std::env::var_os("WEIR_CNI").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => weir.with_file_name("weir-cni"),
    };
    Ok(Binaries { weir, weir_cni })
}

fn progress(line: &str) {
    eprintln!("{line}");
}

pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    let root = state_root();
    match args.command {
        LabCommand::Up { topology } => {
            let text = std::fs::read_to_string(&topology)
                .with_context(|| format!("read {}", topology.display()))?;
            let topo = Topology::parse(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", topology.display()))?;
            let state = lab::up(&topo, &binaries()?, &root, &mut progress)?;
            eprintln!(
                "lab {} is up: {} nodes, {} pods (state in {})",
                state.lab,
                state.nodes.len(),
                state.pods.len(),
                root.join(&state.lab).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Down { lab: name } => {
            let report = lab::down(&name, &binaries()?, &root, &mut progress)?;
            for w in &report.warnings {
                eprintln!("warning: {w}");
            }
            if report.namespaces.is_empty() && !report.state_removed {
                eprintln!("lab {name}: nothing to remove");
            } else {
                eprintln!(
                    "lab {name} is down: {} namespaces, {} processes, {} pods deleted via CNI",
                    report.namespaces.len(),
                    report.killed.len(),
                    report.cni_deleted
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Status { lab: name, json } => {
            let rows = lab::status(&name, &root)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", lab::render_status(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Exec {
            lab: name,
            target,
            command,
        } => {
            let ns_name = lab::target_netns(&name, &target)?;
            let ns = weir_kernel_netns(&ns_name)?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("enter netns {ns_name}"))?;
            let err = std::process::Command::new(&command[0])
                .args(&command[1..])
                .exec();
            bail!("exec {}: {err}", command[0])
        }
        LabCommand::Check { lab: name, json } => {
            let state = lab::load_state(&name, &root)?;
            Ok(check(&state, json))
        }
        LabCommand::Demo {
            keep,
            name,
            cni,
            json,
        } => demo(keep, name, cni, json, &root),
        LabCommand::EchoServer { netns, name, port } => {
            weir_lab::echo::serve(netns.as_deref(), &name, port)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn weir_kernel_netns(name: &str) -> anyhow::Result<std::fs::File> {
    let path = weir_lab::ns::path(name);
    std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))
}

fn check(state: &weir_lab::LabState, json: bool) -> ExitCode {
    let probes = matrix::plan(state);
    let results = matrix::run(&probes);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&results).expect("results serialize")
        );
    } else {
        print!("{}", matrix::render_matrix(&results));
        println!("{}", matrix::summary(&results));
    }
    if results.iter().all(|r| r.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn demo(
    keep: bool,
    name: Option<String>,
    cni: Option<CniArg>,
    json: bool,
    root: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let mut topo = Topology::default_demo();
    if let Some(name) = name {
        topo.name = name;
    }
    if let Some(cni) = cni {
        topo.cni = match cni {
            CniArg::Weir => CniKind::Weir,
            CniArg::Reference => CniKind::Reference,
        };
    }
    topo.validate()?;
    let bins = binaries()?;
    let teardown = |bins: &Binaries| -> anyhow::Result<()> {
        let report = lab::down(&topo.name, bins, root, &mut progress)?;
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
        eprintln!(
            "lab {} torn down ({} namespaces)",
            topo.name,
            report.namespaces.len()
        );
        Ok(())
    };
    let state = match lab::up(&topo, &bins, root, &mut progress) {
        Ok(s) => s,
        Err(e) => {
            if !keep {
                if let Err(d) = teardown(&bins) {
                    eprintln!("warning: teardown failed: {d:#}");
                }
            }
            return Err(e.context(format!("demo lab {} did not come up", topo.name)));
        }
    };
    let code = check(&state, json);
    if keep {
        eprintln!(
            "lab {} kept; try `weir lab exec {} a/a1 -- ip route`, remove it with `weir lab down {}`",
            topo.name, topo.name, topo.name
        );
    } else {
        teardown(&bins)?;
    }
    Ok(code)
}
