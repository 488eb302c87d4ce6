//! Standard output that survives a reader going away. `println!` panics when stdout is a
//! closed pipe (`weir proxy --validate | head -1`); [`outln!`] and [`out!`] end the process
//! instead, quietly, with the status a C tool killed by SIGPIPE has (141). SIGPIPE itself
//! stays ignored (Rust's default): the agents write to pipes of their own (`nft -f -`), where a
//! dead reader must be an error, not the end of the process.

use std::fmt;
use std::io::Write;

/// The exit status of a process whose stdout reader went away (128 + SIGPIPE).
pub const CLOSED_PIPE_EXIT: i32 = 141;

/// Writes `args` to stdout and flushes; on a closed pipe the process ends (see the module).
pub fn write(args: fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        gone(&e)
    }
}

/// Writes raw bytes to stdout and flushes; on a closed pipe the process ends.
pub fn write_stdout(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        gone(&e)
    }
}

/// What a failed write to stdout does: a closed pipe ends the process quietly; another error
/// (a full disk) is said on stderr.
fn gone(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(CLOSED_PIPE_EXIT);
    }
    eprintln!("weir: cannot write to stdout: {e}");
    std::process::exit(1)
}
