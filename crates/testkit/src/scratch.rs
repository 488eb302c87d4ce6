//! What benches and tests make and must not leave behind, even when they panic: processes,
//! directories and network namespaces, each removed by `Drop`; `sh`, running one command
//! with its failure said in full; and `output_with_input`, one command fed on its stdin.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// Runs `cmd args…`; `Err` names the command line and carries its stderr.
pub fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `cmd` run with `input` on its standard input, its output and status collected (as
/// `Command::output`, which cannot feed stdin).
pub fn output_with_input(cmd: &mut Command, input: &[u8]) -> std::io::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped stdin").write_all(input)?;
    child.wait_with_output()
}

/// A process killed (and reaped) when this is dropped, however the test ends.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `$TMPDIR/<name>-<pid>`, made empty on creation and removed with everything in it on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Result<TempDir, String> {
        let p = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(TempDir(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A named network namespace (`ip netns add`) with `lo` up, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: String) -> Result<Netns, String> {
        sh("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n <name> args…`.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// `ip netns exec <name> args…`.
    pub fn exec(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(args);
        sh("ip", &all)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh("ip", &["netns", "del", &self.name]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sh_says_the_command_line_and_its_stderr() {
        assert_eq!(sh("true", &[]), Ok(()));
        let e = sh("sh", &["-c", "echo 'no such thing' >&2; exit 3"]).unwrap_err();
        assert_eq!(e, "sh -c echo 'no such thing' >&2; exit 3: no such thing");
        let e = sh("/nonexistent/weir-no-such-tool", &[]).unwrap_err();
        assert!(e.starts_with("/nonexistent/weir-no-such-tool: "), "{e}");
    }

    #[test]
    fn a_temp_dir_starts_empty_and_goes_with_its_contents() {
        let stale = std::env::temp_dir().join(format!("weir-testkit-td-{}", std::process::id()));
        std::fs::create_dir_all(stale.join("left-over")).unwrap();
        let dir = TempDir::new("weir-testkit-td").unwrap();
        assert_eq!(dir.path(), stale);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        std::fs::write(dir.path().join("f"), "x").unwrap();
        drop(dir);
        assert!(!stale.exists());
    }

    #[test]
    fn a_dropped_child_is_killed_and_reaped() {
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        let pid = child.id();
        drop(KillOnDrop(child));
        // Reaped: the pid is no longer this process's child (a zombie would still be).
        // SAFETY: waitpid on a pid with WNOHANG only asks.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ECHILD)
        );
    }

    #[test]
    fn a_netns_has_lo_up_and_is_deleted_on_drop() {
        if !crate::can_run(crate::missing(true, &["ip"])) {
            return;
        }
        let name = format!("wtk{}-ns", std::process::id());
        let ns = Netns::create(name.clone()).unwrap();
        ns.exec(&["sh", "-c", "ip -o link show lo | grep -q '<LOOPBACK,UP'"])
            .unwrap();
        assert!(Path::new("/run/netns").join(&name).exists());
        drop(ns);
        assert!(!Path::new("/run/netns").join(&name).exists());
    }
}
