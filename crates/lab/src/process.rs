//! Processes the lab starts inside its namespaces: spawned detached with their output in a log,
//! the log's tail for error messages, stopped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use weir_kernel::NetNs;

use crate::ns;

/// Starts `weir <args>` inside the namespace `netns`, detached (own session), its stdout and
/// stderr appended to `log` after a line with the command. Returns its pid.
pub fn spawn_detached(
    weir: &Path,
    args: &[String],
    netns: &str,
    log: &Path,
) -> anyhow::Result<u32> {
    let command_line = format!(
        "ip netns exec {netns} {} {}",
        weir.display(),
        args.join(" ")
    );
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    writeln!(
        out,
        "--- weir lab: starting {command_line} (unix time {now})"
    )?;
    let err = out.try_clone()?;
    let ns = NetNs::named(netns).with_context(|| format!("open netns {netns}"))?;
    let mut cmd = Command::new(weir);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    crate::ns::detach(&mut cmd);
    ns.spawn_inside(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {command_line}"))?;
    let pid = child.id();
    // The child stays ours until we exit; a reaper thread avoids zombies meanwhile.
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// Starts `program` with `args` inside `netns`, detached, its output appended to `log`
/// (without [`spawn_detached`]'s header line).
pub fn spawn_in(netns: &str, program: &Path, args: &[String], log: &Path) -> anyhow::Result<u32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let err = out.try_clone()?;
    let ns = NetNs::named(netns).with_context(|| format!("open netns {netns}"))?;
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    crate::ns::detach(&mut cmd);
    ns.spawn_inside(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {} in {netns}", program.display()))?;
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// The last `lines` lines of a file (for error messages).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Stops a process the lab started: SIGTERM (or SIGKILL when `hard`), then SIGKILL if it is still there after
/// 3 s. Returns once it is gone.
pub fn stop(pid: u32, hard: bool) {
    let sig = if hard { libc::SIGKILL } else { libc::SIGTERM };
    // SAFETY: plain kill(2).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while ns::alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if ns::alive(pid) {
        ns::kill_all(&[pid]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_takes_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        std::fs::write(&p, "1\n2\n3\n4\n").unwrap();
        assert_eq!(log_tail(&p, 2), "3\n4");
        assert_eq!(log_tail(&p, 10), "1\n2\n3\n4");
        assert_eq!(log_tail(&dir.path().join("none"), 3), "");
    }
}
