//! Everything a boot needs, made once and cached: the kernel (see [`crate::kernel`]) and the
//! initramfs, rebuilt only when one of its inputs changes (its file name is a hash of them).
//! An exclusive lock on `<cache>/.lock` makes parallel test binaries wait for one preparation
//! instead of each downloading the kernel.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::kernel::{self, Kernel};
use crate::{cpio, guest};

/// Where the busybox-static package puts its binary.
const BUSYBOX: &str = "/bin/busybox";

/// A kernel and an initramfs ready to boot.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub kernel: Kernel,
    pub initramfs: PathBuf,
}

/// `$WEIR_VM_CACHE`, else `/var/cache/weir/vm`, made absolute (the guest reads the module tree
/// through the host's root at the same path).
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::var_os("WEIR_VM_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/weir/vm"));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    dir.canonicalize()
        .context("canonicalize the cache directory")
}

/// Prepares under the cache lock.
pub fn prepare() -> anyhow::Result<Prepared> {
    let cache = cache_dir()?;
    let lock = fs::File::create(cache.join(".lock"))?;
    // flock(LOCK_EX), blocking: one preparation at a time across test processes.
    lock.lock().context("lock the VM cache")?;
    let kernel = kernel::prepare(&cache)?;
    let initramfs = initramfs(&kernel)?;
    Ok(Prepared { kernel, initramfs })
}

/// `<kernel root>/initrd-<hash>.cpio`, built if absent. The hash covers every byte that goes in,
/// so a new busybox, a changed init script or a different kernel each give a new file.
fn initramfs(kernel: &Kernel) -> anyhow::Result<PathBuf> {
    let busybox = fs::read(BUSYBOX)
        .with_context(|| format!("read {BUSYBOX} (Debian package busybox-static)"))?;
    if !guest::is_static_elf(&busybox) {
        bail!("{BUSYBOX} is dynamically linked; install busybox-static");
    }
    let files = early_module_files(kernel)?;
    let names: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
    let init = guest::init_script(&kernel.root, &names, &guest::hidden_dirs(&build_tree()));
    let entries = guest::initramfs_entries(busybox, &files, &init);
    let bytes = cpio::archive(&entries);
    let hash = Sha256::digest(&bytes);
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = kernel.root.join(format!("initrd-{hex}.cpio"));
    if !path.exists() {
        let partial = path.with_extension("partial");
        fs::write(&partial, &bytes)?;
        fs::rename(&partial, &path)?;
    }
    Ok(path)
}

/// Where the binaries under test live: this checkout and the running executable's profile
/// directory (`target/debug`, or a `CARGO_TARGET_DIR` elsewhere). Guest scripts run them by
/// their host paths.
fn build_tree() -> Vec<PathBuf> {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")];
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let profile = if dir.ends_with("deps") {
                dir.parent()
            } else {
                Some(dir)
            };
            dirs.extend(profile.map(Path::to_path_buf));
        }
    }
    dirs.into_iter()
        .filter_map(|d| d.canonicalize().ok())
        .collect()
}

/// The early modules' files (and their dependencies'), named by file name.
fn early_module_files(kernel: &Kernel) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let out = kernel::output(
        Command::new("modprobe")
            .arg("-d")
            .arg(&kernel.root)
            .args(["-S", &kernel.release, "--show-depends", "-a"])
            .args(guest::EARLY_MODULES),
    )
    .context("resolve the initramfs modules (Debian package kmod)")?;
    guest::parse_show_depends(&out)
        .into_iter()
        .map(|file| {
            let path = Path::new(&file);
            let name = path
                .file_name()
                .context("module without a file name")?
                .to_string_lossy()
                .into_owned();
            Ok((
                name,
                fs::read(path).with_context(|| format!("read {file}"))?,
            ))
        })
        .collect()
}
