//! `weir`: the node agent's command line. Each subcommand lives in its own module.

use clap::{Parser, Subcommand};

mod lab_cmd;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "Kubernetes node networking: CNI, service proxy, DNS, diagnostics, lab"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A whole cluster simulated with network namespaces on this machine.
    Lab(lab_cmd::LabArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Lab(args) => lab_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("weir: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
