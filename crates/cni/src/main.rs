//! The `weir-cni` executable: the container runtime's side of the CNI protocol.

use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    // An operator's `weir-cni --version`; runtimes never pass arguments (CNI passes everything
    // in the environment and stdin), and the CNI VERSION command stays as the spec has it.
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--version" || a == "-V")
    {
        let _ = writeln!(std::io::stdout(), "{}", weir_cni::plugin::version_text());
        return ExitCode::SUCCESS;
    }
    let mut stdin = Vec::new();
    // VERSION may come with an empty stdin; a read error leaves it empty and config parsing reports it.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let reply = weir_cni::plugin::run(|k| std::env::var(k).ok(), &stdin);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(reply.stdout.as_bytes());
    if !reply.stdout.is_empty() && !reply.stdout.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    if reply.success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
