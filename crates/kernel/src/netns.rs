//! Network namespaces as file handles, entered per thread.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};

/// An open handle on a network namespace (a `/run/netns/<name>` bind mount, `/proc/<pid>/ns/net`, …).
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the namespace at `path`. `NotFound` means the namespace does not exist.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path)?;
        Ok(Self { file, path })
    }

    /// The namespace of the calling thread.
    pub fn current() -> io::Result<Self> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// A named namespace as created by `ip netns add <name>`.
    pub fn named(name: &str) -> io::Result<Self> {
        Self::open(Path::new("/run/netns").join(name))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Moves the calling thread into this namespace until the guard is dropped.
    pub fn enter(&self) -> io::Result<NetNsGuard> {
        let previous = NetNs::current()?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        Ok(NetNsGuard { previous })
    }

    /// Runs `f` with the calling thread inside this namespace.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        let _guard = self.enter()?;
        Ok(f())
    }

    /// Makes `cmd` start inside this namespace (setns between fork and exec), the way a container
    /// runtime runs a CNI plugin in the host namespace. The handle must outlive the spawn.
    pub fn spawn_inside(&self, cmd: &mut std::process::Command) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = self.file.as_raw_fd();
        // SAFETY: setns(2) is async-signal-safe and touches nothing but the child's own state.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// True when both handles name the same namespace (same inode).
    pub fn same_as(&self, other: &NetNs) -> io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (self.file.metadata()?, other.file.metadata()?);
        Ok(a.ino() == b.ino() && a.dev() == b.dev())
    }
}

/// Returns the thread to the namespace it was in before [`NetNs::enter`].
pub struct NetNsGuard {
    previous: NetNs,
}

impl Drop for NetNsGuard {
    fn drop(&mut self) {
        // Failing to return would leave the thread working in the wrong namespace: that must not
        // go unnoticed.
        if let Err(e) = setns(self.previous.file.as_fd(), CloneFlags::CLONE_NEWNET) {
            panic!(
                "cannot return to network namespace {:?}: {e}",
                self.previous.path
            );
        }
    }
}
