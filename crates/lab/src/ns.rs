//! Named network namespaces (`/run/netns/<name>`): create, delete, list, and find the processes
//! living in one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub const NETNS_DIR: &str = "/run/netns";

pub fn path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `ip netns add <name>`.
pub fn add(name: &str) -> anyhow::Result<()> {
    ip(&["netns", "add", name])
}

/// `ip netns del <name>`; absence is success.
pub fn del(name: &str) -> anyhow::Result<()> {
    if !path(name).exists() {
        return Ok(());
    }
    ip(&["netns", "del", name])
}

/// Namespace names under /run/netns that start with `prefix`, sorted.
pub fn list(prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Pids of the processes whose network namespace is `name` (what `ip netns pids` prints).
pub fn pids(name: &str) -> Vec<u32> {
    let Ok(target) = std::fs::metadata(path(name)) else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in rd.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(m) = std::fs::metadata(entry.path().join("ns/net")) {
            if m.ino() == target.ino() && m.dev() == target.dev() {
                pids.push(pid);
            }
        }
    }
    pids
}

/// True when `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// SIGKILLs `pids` and waits (up to 3 s) until they are gone.
pub fn kill_all(pids: &[u32]) {
    for &pid in pids {
        // SAFETY: plain kill(2).
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes `cmd` start in a session of its own, so that it outlives the `weir lab` command that
/// started it and no terminal signal reaches it; `weir lab down` finds it by namespace.
pub fn detach(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid(2) is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
