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
    /// Opens the namespace at `path`. `NotFound` means the namespace does not exist;
    /// `InvalidInput` that `path` is something else (a FIFO, a regular file, another namespace
    /// type). Never blocks: a FIFO in place of a namespace must not hang the caller.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.as_ref().to_path_buf();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(&path)?;
        if !is_network_namespace(&file) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a network namespace", path.display()),
            ));
        }
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

/// The file is a namespace (nsfs) and that namespace is a network namespace.
fn is_network_namespace(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    const NSFS_MAGIC: i64 = 0x6e73_6673;
    // _IO(0xb7, 0x3): which namespace type an nsfs file refers to.
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on an open descriptor into a zeroed struct we own.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 || fs.f_type as i64 != NSFS_MAGIC {
        return false;
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the CLONE_NEW* flag.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
    kind == libc::CLONE_NEWNET
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_accepts_only_network_namespaces_and_never_blocks() {
        assert!(NetNs::open("/proc/self/ns/net").is_ok());
        let kind = |p: &Path| NetNs::open(p).unwrap_err().kind();
        assert_eq!(
            kind(Path::new("/proc/self/ns/mnt")),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(Path::new("/etc/hostname")),
            io::ErrorKind::InvalidInput
        );
        let dir = std::env::temp_dir().join(format!("weir-netns-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        nix::unistd::mkfifo(&dir, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Without O_NONBLOCK this open would wait forever for a writer.
        let err = kind(&dir);
        let _ = std::fs::remove_file(&dir);
        assert_eq!(err, io::ErrorKind::InvalidInput);
        assert_eq!(
            kind(Path::new("/nonexistent/weir")),
            io::ErrorKind::NotFound
        );
    }
}
