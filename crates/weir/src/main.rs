//! `weir`: the node agent's command line. Each subcommand lives in its own module.

use clap::{Parser, Subcommand, ValueEnum};

/// `print!` to stdout that ends the process quietly on a closed pipe (see `out`).
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write(format_args!($($arg)*)) };
}

/// `println!` to stdout that ends the process quietly on a closed pipe (see `out`).
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

mod agent_cmd;
mod conditions;
mod diag_input;
mod dns_cmd;
mod doctor_cmd;
mod foreign_flags;
mod generate_cmd;
#[cfg(feature = "lab")]
mod lab_cmd;
mod manifest_view;
mod out;
mod policy_cmd;
mod proxy_cmd;
mod routes_cmd;
mod runtime;
mod trace_cmd;
mod version_cmd;

#[derive(Parser)]
#[command(name = "weir", version = env!("WEIR_VERSION_LINE"))]
#[cfg_attr(
    feature = "lab",
    command(
        about = "Kubernetes node networking: CNI, service proxy, routes, DNS, NetworkPolicy, diagnostics, lab"
    )
)]
#[cfg_attr(
    not(feature = "lab"),
    command(
        about = "Kubernetes node networking: CNI, service proxy, routes, DNS, NetworkPolicy, diagnostics"
    )
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text for people or as JSON objects (one per line) for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Set once from the command line before any subcommand starts logging.
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

#[derive(Subcommand)]
enum Command {
    /// The one node agent: the service proxy, node routes and NetworkPolicy in one process
    /// over one set of watches (`--parts` to choose).
    Agent(Box<agent_cmd::AgentArgs>),
    /// A whole cluster simulated with network namespaces on this machine.
    #[cfg(feature = "lab")]
    Lab(lab_cmd::LabArgs),
    /// The service proxy (kube-proxy's job): nftables, iptables, ipvs or userspace mode.
    Proxy(Box<proxy_cmd::ProxyArgs>),
    /// Routes to the other nodes' pods from Node objects (flanneld's job): host-gw or vxlan.
    Routes(routes_cmd::RoutesArgs),
    /// The cluster DNS server (CoreDNS's job): the Kubernetes DNS zone, forwarding, cache.
    Dns(dns_cmd::DnsArgs),
    /// NetworkPolicy for this node's pods (a network plugin's policy controller's job), in
    /// nftables table inet weir-policy.
    Policy(policy_cmd::PolicyArgs),
    /// Checks a node (or a lab node, or a collected directory) for known networking faults.
    Doctor(doctor_cmd::DoctorArgs),
    /// Walks a packet through a node's state: where it goes or why it is dropped (`trace
    /// collect DIR` saves a node's state).
    Trace(trace_cmd::TraceArgs),
    /// Prints weir's version, git commit and build (`-o json` for scripts).
    Version(version_cmd::VersionArgs),
    /// Prints a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate_cmd::CompletionsArgs),
    /// Writes man pages for weir and every subcommand into a directory.
    Man(generate_cmd::ManArgs),
}

/// Logs to stderr in `--log-format`; `RUST_LOG` filters (default `info`).
fn init_logging() {
    init_logging_with(None, None)
}

/// [`init_logging`] with a format that overrides `--log-format` (kube-proxy's
/// `--logging-format`) and a filter used when `RUST_LOG` is unset (kube-proxy's `-v`).
fn init_logging_with(format: Option<LogFormat>, filter: Option<String>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(filter.as_deref().unwrap_or("info"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let format = format.or(LOG_FORMAT.get().copied());
    let _ = match format.unwrap_or(LogFormat::Text) {
        // Fields stay fields (`"fields":{"node":"n1",...}`), not words in the message.
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}

fn main() -> std::process::ExitCode {
    // kube-proxy's flag spelling (`--iptables_sync_period`) for `weir proxy`.
    let cli = Cli::parse_from(proxy_cmd::kube_proxy_spelling(
        std::env::args_os().collect(),
    ));
    let _ = LOG_FORMAT.set(cli.log_format);
    let result = match cli.command {
        #[cfg(feature = "lab")]
        Command::Lab(args) => lab_cmd::run(args),
        Command::Agent(args) => agent_cmd::run(*args),
        Command::Proxy(args) => proxy_cmd::run(*args),
        Command::Routes(args) => routes_cmd::run(args),
        Command::Dns(args) => dns_cmd::run(args),
        Command::Policy(args) => policy_cmd::run(args),
        Command::Doctor(args) => doctor_cmd::run(args),
        Command::Trace(args) => trace_cmd::run(args),
        Command::Version(args) => version_cmd::run(args),
        Command::Completions(args) => generate_cmd::completions(args),
        Command::Man(args) => generate_cmd::man(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("weir: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand and every flag of every subcommand says what it is for.
    #[test]
    fn every_subcommand_and_flag_has_help() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut missing = Vec::new();
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && !arg.is_hide_set() && arg.get_help().is_none() {
                    missing.push(format!("{path} --{}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" || sub.is_hide_set() {
                    continue;
                }
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        walk(&cli, "weir", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }
}
