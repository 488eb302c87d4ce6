//! Debian's generic kernel, fetched once with `apt-get download` and unpacked into the cache.
//!
//! Why Debian's `linux-image-<abi>-amd64` and not the `-cloud` flavour: the generic one builds IPVS
//! (every scheduler), dummy, ipvlan and 9p as modules; the cloud one lacks 9p. The cache entry is
//! keyed by package name *and* version, so a kernel security update gives a fresh entry instead
//! of silently testing against a half-replaced tree.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

/// The meta-package whose dependency names the current kernel ABI package.
const META_PACKAGE: &str = "linux-image-amd64";
/// Written last into a cache entry: without it the entry is a leftover of an interrupted run.
const COMPLETE: &str = ".complete";

/// An unpacked kernel in the cache.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `<cache>/<package>_<version>`: the package's files (`boot/`, `lib/modules/<release>/`).
    pub root: PathBuf,
    /// The module directory name, e.g. `6.1.0-56-amd64`.
    pub release: String,
    /// What qemu boots: the uncompressed `vmlinux` if it could be extracted (qemu starts it
    /// directly through its PVH entry point, ~10 s faster under software emulation than letting
    /// the compressed image decompress itself), else the package's `vmlinuz`.
    pub image: PathBuf,
}

/// A cache entry name: `<package>_<version>`, with the epoch's colon made path-safe.
pub fn cache_key(package: &str, version: &str) -> String {
    format!("{package}_{}", version.replace(':', "%3a"))
}

/// The ABI package `linux-image-amd64` depends on, from `apt-cache depends` output.
pub fn parse_meta_depends(apt_cache_depends: &str) -> Option<String> {
    apt_cache_depends.lines().find_map(|line| {
        let name = line.trim().strip_prefix("Depends:")?.trim();
        let abi = name.strip_prefix("linux-image-")?;
        abi.starts_with(|c: char| c.is_ascii_digit())
            .then(|| name.to_string())
    })
}

/// The `Version:` field of `apt-cache show --no-all-versions` output.
pub fn parse_version(apt_cache_show: &str) -> Option<String> {
    apt_cache_show
        .lines()
        .find_map(|l| l.strip_prefix("Version:").map(|v| v.trim().to_string()))
        .filter(|v| !v.is_empty())
}

/// Where the xz stream starts inside a bzImage (its compressed payload), if it is xz.
pub fn xz_payload_offset(bzimage: &[u8]) -> Option<usize> {
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    bzimage.windows(XZ_MAGIC.len()).position(|w| w == XZ_MAGIC)
}

/// The kernel package to use: `$WEIR_VM_KERNEL_PKG`, else what `linux-image-amd64` depends on.
fn resolve_package() -> anyhow::Result<(String, String)> {
    let package = match std::env::var("WEIR_VM_KERNEL_PKG") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            let out = output(Command::new("apt-cache").args(["depends", META_PACKAGE]))?;
            parse_meta_depends(&out)
                .with_context(|| format!("apt-cache names no kernel package for {META_PACKAGE}"))?
        }
    };
    let show = output(Command::new("apt-cache").args(["show", "--no-all-versions", &package]))?;
    let version =
        parse_version(&show).with_context(|| format!("apt-cache has no version of {package}"))?;
    Ok((package, version))
}

/// The kernel for this run, fetching and unpacking it into `cache` first if needed. The caller
/// holds the cache lock. Without apt (or its lists) a kernel already in the cache is used.
pub fn prepare(cache: &Path) -> anyhow::Result<Kernel> {
    let key = match resolve_key(cache) {
        Ok(key) => key,
        Err(e) => newest_cached(cache)
            .with_context(|| format!("no kernel in {} either", cache.display()))
            .context(format!("cannot resolve the kernel package: {e:#}"))?,
    };
    let root = cache.join(&key);
    if !root.join(COMPLETE).exists() {
        unpack(cache, &key, &root)?;
    }
    load(root)
}

/// The cache key of the kernel to use. apt's answer depends only on its package lists, so it is
/// remembered per fingerprint of those lists: the usual run skips two `apt-cache` calls (seconds
/// each on a busy machine).
fn resolve_key(cache: &Path) -> anyhow::Result<String> {
    let remembered = cache.join("resolved");
    let fingerprint = std::env::var("WEIR_VM_KERNEL_PKG")
        .is_err()
        .then(apt_lists_fingerprint)
        .flatten();
    if let (Some(fp), Ok(text)) = (&fingerprint, fs::read_to_string(&remembered)) {
        if let Some((seen, key)) = text.trim().split_once(' ') {
            if seen == fp && cache.join(key).join(COMPLETE).exists() {
                return Ok(key.to_string());
            }
        }
    }
    let (package, version) = resolve_package()?;
    let key = cache_key(&package, &version);
    if let Some(fp) = fingerprint {
        let _ = fs::write(&remembered, format!("{fp} {key}\n"));
    }
    Ok(key)
}

/// Names, sizes and mtimes of apt's package lists: they change whenever `apt-get update` does.
fn apt_lists_fingerprint() -> Option<String> {
    let mut lists: Vec<String> = fs::read_dir("/var/lib/apt/lists")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            let mtime = meta
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?;
            Some(format!(
                "{:?}:{}:{}",
                e.file_name(),
                meta.len(),
                mtime.as_nanos()
            ))
        })
        .collect();
    lists.sort();
    let digest = Sha256::digest(lists.join("\n").as_bytes());
    Some(digest[..12].iter().map(|b| format!("{b:02x}")).collect())
}

fn newest_cached(cache: &Path) -> anyhow::Result<String> {
    let mut complete: Vec<(std::time::SystemTime, String)> = fs::read_dir(cache)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let mtime = fs::metadata(e.path().join(COMPLETE))
                .ok()?
                .modified()
                .ok()?;
            Some((mtime, e.file_name().to_string_lossy().into_owned()))
        })
        .collect();
    complete.sort();
    complete
        .pop()
        .map(|(_, k)| k)
        .context("no complete kernel entry")
}

/// Download, unpack, index the modules and extract `vmlinux`, in a scratch directory renamed into
/// place at the end, so an interrupted run leaves nothing that looks usable.
fn unpack(cache: &Path, key: &str, root: &Path) -> anyhow::Result<()> {
    let package = key.split('_').next().unwrap_or(key);
    let scratch = cache.join(format!(".{key}.partial"));
    let _ = fs::remove_dir_all(&scratch);
    let _ = fs::remove_dir_all(root);
    fs::create_dir_all(&scratch)?;
    // Root's downloads cannot be sandboxed as _apt into a root-owned directory; say so up front
    // instead of letting apt warn.
    output(
        Command::new("apt-get")
            .args(["-q", "-o", "APT::Sandbox::User=root", "download", package])
            .current_dir(&scratch),
    )
    .with_context(|| format!("apt-get download {package}"))?;
    let deb = fs::read_dir(&scratch)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let tree = scratch.join("tree");
    output(Command::new("dpkg").arg("-x").arg(&deb).arg(&tree)).context("dpkg -x")?;
    fs::remove_file(&deb)?;
    let release = module_release(&tree)?;
    output(Command::new("depmod").arg("-b").arg(&tree).arg(&release)).context("depmod")?;
    if let Err(e) = extract_vmlinux(&tree, &release) {
        // Not fatal: the compressed image boots too, only slower.
        eprintln!("weir-vmtest: booting the compressed kernel image ({e:#})");
    }
    fs::write(tree.join(COMPLETE), format!("{key}\n"))?;
    fs::rename(&tree, root)?;
    fs::remove_dir_all(&scratch)?;
    Ok(())
}

fn load(root: PathBuf) -> anyhow::Result<Kernel> {
    let release = module_release(&root)?;
    let vmlinux = root.join("boot/vmlinux");
    let image = if vmlinux.exists() {
        vmlinux
    } else {
        root.join(format!("boot/vmlinuz-{release}"))
    };
    if !image.exists() {
        bail!("{} has no kernel image", root.display());
    }
    Ok(Kernel {
        root,
        release,
        image,
    })
}

fn module_release(tree: &Path) -> anyhow::Result<String> {
    let dir = tree.join("lib/modules");
    let mut releases: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    releases.sort();
    match releases.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!(
            "expected one module tree in {}, found {other:?}",
            dir.display()
        ),
    }
}

/// `boot/vmlinux` from the xz payload of `boot/vmlinuz-<release>` (`xz --single-stream` stops at
/// the end of the stream and ignores the bzImage's trailing bytes).
fn extract_vmlinux(tree: &Path, release: &str) -> anyhow::Result<()> {
    let bzimage = fs::read(tree.join(format!("boot/vmlinuz-{release}")))?;
    let offset = xz_payload_offset(&bzimage).context("the kernel image is not xz-compressed")?;
    let target = tree.join("boot/vmlinux");
    let out = fs::File::create(&target)?;
    let mut xz = Command::new("xz")
        .args(["-dc", "--single-stream", "-q"])
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("run xz")?;
    let mut stdin = xz.stdin.take().context("xz stdin")?;
    let payload = bzimage[offset..].to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &payload));
    let result = xz.wait_with_output()?;
    // xz stops reading after the stream, so a broken pipe here is expected.
    let _ = writer.join();
    if !result.status.success() || !fs::read(&target)?.starts_with(b"\x7fELF") {
        let _ = fs::remove_file(&target);
        bail!("xz: {}", String::from_utf8_lossy(&result.stderr).trim());
    }
    Ok(())
}

/// Runs a command, returning its stdout; its stderr becomes the error.
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let name = format!("{:?}", cmd.get_program());
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {name}"))?;
    if !out.status.success() {
        bail!(
            "{name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_package_is_the_first_numbered_linux_image_dependency() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n  Depends: foo\n";
        assert_eq!(
            parse_meta_depends(out).as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        assert_eq!(
            parse_meta_depends("x\n  Depends: linux-image-amd64-signed\n"),
            None
        );
        assert_eq!(parse_meta_depends(""), None);
    }

    #[test]
    fn the_version_comes_from_its_field_and_the_key_is_path_safe() {
        let show = "Package: linux-image-6.1.0-56-amd64\nVersion: 6.1.192-2\nSize: 1\n";
        assert_eq!(parse_version(show).as_deref(), Some("6.1.192-2"));
        assert_eq!(parse_version("Package: x\n"), None);
        assert_eq!(cache_key("k", "1:2.0-1"), "k_1%3a2.0-1");
    }

    #[test]
    fn the_xz_payload_is_found_after_the_setup_code() {
        let mut image = vec![0u8; 100];
        image.extend_from_slice(b"\xfd7zXZ\x00rest");
        assert_eq!(xz_payload_offset(&image), Some(100));
        assert_eq!(xz_payload_offset(b"gzip \x1f\x8b"), None);
    }
}
