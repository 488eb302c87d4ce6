//! The on-disk store, in the reference `host-local` plugin's layout so a node can migrate both ways:
//!
//! ```text
//! <dataDir>/<network>/
//!     lock                   flock(LOCK_EX) around every operation (host-local locks the same file)
//!     <ip>                   one file per allocated address, named by the address's string form,
//!                            holding "<containerID>\r\n<ifname>" (older host-local: just "<containerID>")
//!     last_reserved_ip.<i>   the address last handed out from range set i (round-robin cursor)
//!     weir-boot-id           the boot id weir last ran in (weir only; host-local ignores it)
//!     .weir-tmp.*            temporary files, only ever present while the lock is held (or after a crash)
//! ```
//!
//! **Reboots.** Containers do not survive a reboot, so the first operation in a new boot (the stamp
//! in `weir-boot-id` differs from the kernel's boot id) releases the allocations of earlier boots —
//! but only those it can prove are stale: address files last modified well before the current boot
//! started (`btime` in /proc/stat), never those written since (host-local may have run before weir
//! in this boot), and never an attachment the caller lists as valid (GC's valid attachments). When
//! the clock cannot be trusted (the old stamp itself looks written after this boot began) nothing is
//! released; GC reclaims whatever is left.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use super::allocator::candidates;
use super::config::{describe_range_set, IpamConf, Resolved};
use super::requested::assign_requested;
use super::{Allocation, IpamError};

pub const LOCK_FILE: &str = "lock";
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
pub const BOOT_ID_FILE: &str = "weir-boot-id";
/// host-local's separator between container ID and ifname.
pub const LINE_BREAK: &str = "\r\n";
const TMP_PREFIX: &str = ".weir-tmp.";
const SYSTEM_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// How much older than the boot an address file must be to count as stale: `btime` is whole seconds
/// and moves when the clock is slewed, and an allocation made in the last minute before a reboot is
/// cheap to keep until GC. Erring towards keeping is what prevents duplicate addresses.
pub const BOOT_STALE_MARGIN: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
enum BootId {
    System,
    Fixed(String),
    Disabled,
}

/// One network's address store, `<dataDir>/<network>/`. Cheap to open: the directory is touched only
/// by the operations, each of which holds the directory's lock for its whole duration.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    boot_id: BootId,
    /// Attachments known to be alive (GC's valid list): the reboot reconciliation never releases them.
    keep: Vec<(String, String)>,
}

/// An address file as found on disk.
#[derive(Debug, Clone)]
struct Entry {
    ip: IpAddr,
    /// the file's name (the address as whoever wrote it spelled it)
    name: String,
    id: String,
    /// empty for files written by old host-local versions (container ID only)
    ifname: String,
    /// when the file was last written (None if the file system cannot say)
    mtime: Option<SystemTime>,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> IpamError + '_ {
    move |source| IpamError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Splits an address file's content into (container ID, ifname); ifname is empty for the legacy form.
fn parse_owner(content: &str) -> (String, String) {
    let t = content.trim();
    match t.split_once(LINE_BREAK).or_else(|| t.split_once('\n')) {
        Some((id, ifname)) => (id.trim().to_string(), ifname.trim().to_string()),
        None => (t.to_string(), String::new()),
    }
}

fn owner_content(container_id: &str, ifname: &str) -> String {
    format!("{}{LINE_BREAK}{ifname}", container_id.trim())
}

/// A unique temporary file name in the store directory.
fn tmp_path(dir: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    dir.join(format!(
        "{TMP_PREFIX}{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Writes `content` to a new temporary file and returns its path.
fn write_tmp(dir: &Path, content: &str) -> Result<PathBuf, IpamError> {
    let tmp = tmp_path(dir);
    let res = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| f.write_all(content.as_bytes()));
    match res {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(io_err(&tmp)(e))
        }
    }
}

/// Replaces `dir/name` atomically (temporary file + rename).
fn write_atomic(dir: &Path, name: &str, content: &str) -> Result<(), IpamError> {
    let tmp = write_tmp(dir, content)?;
    let target = dir.join(name);
    fs::rename(&tmp, &target).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(&target)(e)
    })
}

/// Creates `path` with `content` only if it does not exist yet (O_EXCL semantics): the complete file
/// appears atomically via link(2), so neither a second allocator nor a crash can leave a half-written
/// or doubly-owned address file. Ok(false) if the address is taken.
fn create_exclusive(dir: &Path, path: &Path, content: &str) -> Result<bool, IpamError> {
    let tmp = write_tmp(dir, content)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        // file systems without hard links: plain O_CREAT|O_EXCL
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EOPNOTSUPP | libc::EMLINK)
            ) =>
        {
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(path)
            {
                Ok(mut f) => match f.write_all(content.as_bytes()) {
                    Ok(()) => Ok(true),
                    Err(e) => {
                        let _ = fs::remove_file(path);
                        Err(io_err(path)(e))
                    }
                },
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(io_err(path)(e)),
            }
        }
        Err(e) => Err(io_err(path)(e)),
    }
}

fn remove_if_exists(path: &Path) -> Result<(), IpamError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io_err(path)(e)),
        _ => Ok(()),
    }
}

/// Holds the store's flock until dropped.
struct Locked<'a> {
    dir: &'a Path,
    _lock: File,
}

impl Locked<'_> {
    /// Every address file, sorted by address.
    fn entries(&self) -> Result<Vec<Entry>, IpamError> {
        let mut out = Vec::new();
        for dent in fs::read_dir(self.dir).map_err(io_err(self.dir))? {
            let dent = dent.map_err(io_err(self.dir))?;
            let Some(name) = dent.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let Ok(ip) = name.parse::<IpAddr>() else {
                continue;
            };
            let path = dent.path();
            if !dent.file_type().map_err(io_err(&path))?.is_file() {
                continue;
            }
            let mtime = dent.metadata().ok().and_then(|m| m.modified().ok());
            let content = match fs::read(&path) {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&path)(e)),
            };
            let (id, ifname) = parse_owner(&String::from_utf8_lossy(&content));
            out.push(Entry {
                ip,
                name,
                id,
                ifname,
                mtime,
            });
        }
        out.sort_by_key(|e| e.ip);
        Ok(out)
    }

    fn remove(&self, entry: &Entry) -> Result<(), IpamError> {
        remove_if_exists(&self.dir.join(&entry.name))
    }

    fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        fs::read_to_string(self.dir.join(format!("{LAST_RESERVED_PREFIX}{set}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Temporary files are only written under the lock, so any found now were left by a crash.
    fn clean_tmp(&self) {
        let Ok(rd) = fs::read_dir(self.dir) else {
            return;
        };
        for dent in rd.flatten() {
            if dent
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TMP_PREFIX))
            {
                let _ = fs::remove_file(dent.path());
            }
        }
    }

    /// The first operation of a new boot releases what earlier boots provably left (module docs).
    /// `keep`: attachments known to be alive, never released here.
    fn reconcile_boot(
        &self,
        current: Option<String>,
        keep: &[(String, String)],
    ) -> Result<(), IpamError> {
        let Some(current) = current else {
            return Ok(());
        };
        let path = self.dir.join(BOOT_ID_FILE);
        match fs::read_to_string(&path) {
            Ok(stored) if stored.trim() == current => Ok(()),
            Ok(_) => {
                let stamp_mtime = fs::metadata(&path).and_then(|m| m.modified()).ok();
                if let Some(cutoff) = stale_cutoff(system_boot_time(), stamp_mtime) {
                    for e in self.entries()? {
                        let kept = keep.iter().any(|(id, ifname)| owned_by(&e, id, ifname));
                        if !kept && e.mtime.is_some_and(|t| t < cutoff) {
                            self.remove(&e)?;
                        }
                    }
                }
                write_atomic(self.dir, BOOT_ID_FILE, &current)
            }
            // a fresh store, or one taken over from host-local: just start recording
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let _ = write_atomic(self.dir, BOOT_ID_FILE, &current);
                Ok(())
            }
            Err(e) => Err(io_err(&path)(e)),
        }
    }
}

/// Address files modified before the returned instant are from an earlier boot. None when that
/// cannot be known: no boot time, or a stamp from the "previous" boot that looks written after
/// this boot began (the clock was stepped, so no file time can be compared with the boot time).
pub(crate) fn stale_cutoff(
    boot: Option<SystemTime>,
    stamp_mtime: Option<SystemTime>,
) -> Option<SystemTime> {
    let cutoff = boot?.checked_sub(BOOT_STALE_MARGIN)?;
    match stamp_mtime {
        Some(stamp) if stamp >= cutoff => None,
        _ => Some(cutoff),
    }
}

/// When the running kernel booted, by the wall clock: `btime` in /proc/stat.
pub(crate) fn system_boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// `(id, ifname)` owns `e`: an exact match, or a legacy file holding only the container ID.
fn owned_by(e: &Entry, container_id: &str, ifname: &str) -> bool {
    e.id == container_id.trim() && (e.ifname == ifname || e.ifname.is_empty())
}

impl Store {
    /// The store of `network` under `conf`'s data directory. Validates `conf` and that `network` is a
    /// single path component; touches nothing on disk.
    pub fn open(conf: &IpamConf, network: &str) -> Result<Store, IpamError> {
        conf.validate().map_err(IpamError::Config)?;
        Store::open_in(&conf.data_dir(), network)
    }

    /// Attachments the runtime says are alive (GC's `cni.dev/valid-attachments`): whichever
    /// operation of this handle comes first after a reboot, it never releases them.
    pub fn keeping(mut self, alive: &[(String, String)]) -> Store {
        self.keep = alive.to_vec();
        self
    }

    /// Replaces the boot id source (default: /proc/sys/kernel/random/boot_id); `None` turns the
    /// reboot reconciliation off.
    pub fn with_boot_id(mut self, boot_id: Option<&str>) -> Store {
        self.boot_id = match boot_id {
            Some(id) => BootId::Fixed(id.trim().to_string()),
            None => BootId::Disabled,
        };
        self
    }

    /// The store's directory, `<dataDir>/<network>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn current_boot_id(&self) -> Option<String> {
        match &self.boot_id {
            BootId::System => fs::read_to_string(SYSTEM_BOOT_ID)
                .ok()
                .map(|s| s.trim().to_string()),
            BootId::Fixed(s) => Some(s.clone()),
            BootId::Disabled => None,
        }
    }

    /// Runs `f` under the exclusive lock. With `create` false and no directory, returns None
    /// without creating anything (nothing has ever been allocated).
    fn locked<T>(
        &self,
        create: bool,
        f: impl FnOnce(&Locked) -> Result<T, IpamError>,
    ) -> Result<Option<T>, IpamError> {
        self.locked_keeping(create, &self.keep, f)
    }

    /// [`Self::locked`], with attachments the reboot reconciliation must keep whatever their age.
    fn locked_keeping<T>(
        &self,
        create: bool,
        keep: &[(String, String)],
        f: impl FnOnce(&Locked) -> Result<T, IpamError>,
    ) -> Result<Option<T>, IpamError> {
        if create {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&self.dir)
                .map_err(io_err(&self.dir))?;
        } else if !self.dir.is_dir() {
            return Ok(None);
        }
        let lock_path = self.dir.join(LOCK_FILE);
        // O_CREAT|O_RDONLY like host-local's go-filemutex: an existing lock file opens on a read-only fs
        let lock = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CREAT)
            .mode(0o644)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        // std's File::lock is flock(LOCK_EX), blocking, as host-local's; EINTR is retried here.
        loop {
            match lock.lock() {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(&lock_path)(e)),
            }
        }
        let guard = Locked {
            dir: &self.dir,
            _lock: lock,
        };
        guard.clean_tmp();
        guard.reconcile_boot(self.current_boot_id(), keep)?;
        f(&guard).map(Some)
    }

    /// One address per range set for `(container_id, ifname)`, in host-local's round-robin order,
    /// skipping each range's gateway and `reserved`. Idempotent: an address this attachment already
    /// holds in a range set is returned again. All-or-nothing: on error, addresses taken by this call
    /// are released.
    pub fn allocate(
        &self,
        conf: &IpamConf,
        container_id: &str,
        ifname: &str,
    ) -> Result<Vec<Allocation>, IpamError> {
        self.allocate_requested(conf, container_id, ifname, &[])
    }

    /// [`Self::allocate`], giving each range set the address `requested` names for it (at most one
    /// per range set, as host-local): an error if a requested address lies in no range, is a gateway
    /// or reserved ([`IpamError::Requested`]), or is held by another attachment
    /// ([`IpamError::Taken`]). Range sets no requested address falls in allocate as usual.
    pub fn allocate_requested(
        &self,
        conf: &IpamConf,
        container_id: &str,
        ifname: &str,
        requested: &[IpAddr],
    ) -> Result<Vec<Allocation>, IpamError> {
        let sets = conf.resolved().map_err(IpamError::Config)?;
        let wanted = assign_requested(&sets, &conf.reserved, requested)?;
        let content = owner_content(container_id, ifname);
        let res = self.locked(true, |l| {
            let entries = l.entries()?;
            let mut held: HashSet<IpAddr> = entries.iter().map(|e| e.ip).collect();
            let mut created: Vec<PathBuf> = Vec::new();
            let mut out = Vec::with_capacity(sets.len());
            let result = (|| {
                for (i, set) in sets.iter().enumerate() {
                    let mine = entries
                        .iter()
                        .filter(|e| owned_by(e, container_id, ifname))
                        .find_map(|e| set.iter().find(|r| r.contains(e.ip)).map(|r| (e.ip, r)));
                    if let Some((ip, r)) = mine {
                        if let Some(want) = wanted[i].filter(|w| *w != ip) {
                            return Err(IpamError::Taken(format!(
                                "requested address {want}: this attachment already holds {ip} in range set {i}"
                            )));
                        }
                        out.push(allocation(ip, r, i));
                        continue;
                    }
                    let got = match wanted[i] {
                        Some(want) => {
                            let r = set
                                .iter()
                                .position(|r| r.contains(want))
                                .expect("assign_requested placed it in this set");
                            let path = l.dir.join(want.to_string());
                            if held.contains(&want) || !create_exclusive(l.dir, &path, &content)? {
                                let owner = entries
                                    .iter()
                                    .find(|e| e.ip == want)
                                    .map(|e| format!(" (held by container {:?}, interface {:?})", e.id, e.ifname))
                                    .unwrap_or_default();
                                return Err(IpamError::Taken(format!(
                                    "requested address {want} is already allocated{owner}"
                                )));
                            }
                            created.push(path);
                            Some((want, r))
                        }
                        None => {
                            let mut got = None;
                            for (ip, r) in candidates(set, l.last_reserved(i), &conf.reserved) {
                                if held.contains(&ip) {
                                    continue;
                                }
                                let path = l.dir.join(ip.to_string());
                                if create_exclusive(l.dir, &path, &content)? {
                                    created.push(path);
                                    got = Some((ip, r));
                                    break;
                                }
                                held.insert(ip);
                            }
                            got
                        }
                    };
                    let Some((ip, r)) = got else {
                        return Err(IpamError::Exhausted {
                            range_set: i,
                            detail: describe_range_set(set),
                        });
                    };
                    held.insert(ip);
                    // like host-local, a requested address moves the round-robin cursor too
                    write_atomic(
                        l.dir,
                        &format!("{LAST_RESERVED_PREFIX}{i}"),
                        &ip.to_string(),
                    )?;
                    out.push(allocation(ip, &set[r], i));
                }
                Ok(())
            })();
            if let Err(e) = result {
                for path in &created {
                    let _ = fs::remove_file(path);
                }
                return Err(e);
            }
            Ok(out)
        })?;
        Ok(res.unwrap_or_default())
    }

    /// Releases the addresses of `(container_id, ifname)` (like host-local: the exact owner's files,
    /// or if there are none, legacy files holding only the container ID). Nothing allocated is success.
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, IpamError> {
        let res = self.locked(false, |l| {
            let entries = l.entries()?;
            let exact: Vec<&Entry> = entries
                .iter()
                .filter(|e| e.id == container_id.trim() && e.ifname == ifname)
                .collect();
            let victims = if exact.is_empty() {
                entries
                    .iter()
                    .filter(|e| e.id == container_id.trim() && e.ifname.is_empty())
                    .collect()
            } else {
                exact
            };
            for e in &victims {
                l.remove(e)?;
            }
            Ok(victims.iter().map(|e| e.ip).collect())
        })?;
        Ok(res.unwrap_or_default())
    }

    /// The addresses held by `(container_id, ifname)` (including legacy container-ID-only files).
    pub fn lookup(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, IpamError> {
        let res = self.locked(false, |l| {
            Ok(l.entries()?
                .into_iter()
                .filter(|e| owned_by(e, container_id, ifname))
                .map(|e| e.ip)
                .collect())
        })?;
        Ok(res.unwrap_or_default())
    }

    /// Releases every allocation whose `(container ID, ifname)` is not in `valid` (a legacy file is kept
    /// if its container ID appears in `valid`). Returns the released addresses.
    pub fn gc(&self, valid: &[(String, String)]) -> Result<Vec<IpAddr>, IpamError> {
        let keep: Vec<(String, String)> = self.keep.iter().chain(valid).cloned().collect();
        let res = self.locked_keeping(false, &keep, |l| {
            let mut released = Vec::new();
            for e in l.entries()? {
                let keep = valid.iter().any(|(id, ifname)| {
                    id.trim() == e.id && (*ifname == e.ifname || e.ifname.is_empty())
                });
                if !keep {
                    l.remove(&e)?;
                    released.push(e.ip);
                }
            }
            Ok(released)
        })?;
        Ok(res.unwrap_or_default())
    }

    /// For the plugin's STATUS: creates the directory if needed, then writes, renames and removes a
    /// probe file under the lock. Err if the store cannot be written.
    pub fn check_writable(&self) -> Result<(), IpamError> {
        self.locked(true, |l| {
            let probe = write_tmp(l.dir, "probe")?;
            let renamed = tmp_path(l.dir);
            fs::rename(&probe, &renamed).map_err(|e| {
                let _ = fs::remove_file(&probe);
                io_err(&renamed)(e)
            })?;
            fs::remove_file(&renamed).map_err(io_err(&renamed))
        })?;
        Ok(())
    }

    /// Every allocation as (address, container ID, ifname), sorted by address; ifname is empty for
    /// legacy files that hold only the container ID.
    pub fn allocations(&self) -> Result<Vec<(IpAddr, String, String)>, IpamError> {
        let res = self.locked(false, |l| {
            Ok(l.entries()?
                .into_iter()
                .map(|e| (e.ip, e.id, e.ifname))
                .collect())
        })?;
        Ok(res.unwrap_or_default())
    }
}

fn allocation(ip: IpAddr, r: &Resolved, range_set: usize) -> Allocation {
    Allocation {
        address: IpNet::new(ip, r.prefix_len).expect("prefix length of a parsed subnet"),
        gateway: Some(r.gateway),
        range_set,
    }
}

// ---- eni-shared mode: allocation from an explicit address list (see crates/cni/src/eni/) ----

impl Store {
    /// The store of `network` under `data_dir`, for modes whose addresses do not come from an
    /// `ipam` section (eni-shared). Same layout, lock and reboot handling as [`Store::open`].
    pub fn open_in(data_dir: &Path, network: &str) -> Result<Store, IpamError> {
        let bad = network.is_empty()
            || network == "."
            || network == ".."
            || network.len() > 255
            || network.contains(['/', '\0']);
        if bad {
            return Err(IpamError::Config(format!(
                "network name {network:?} cannot name the IPAM store directory (it must be a single path component)"
            )));
        }
        Ok(Store {
            dir: data_dir.join(network),
            boot_id: BootId::System,
            keep: Vec::new(),
        })
    }

    /// One address from `pool` for `(container_id, ifname)`, round-robin after the last one handed
    /// out (range-set cursor 0), written as the same address file [`Store::allocate`] writes, so
    /// release, lookup, GC and crash recovery are shared. Idempotent: an address the attachment
    /// already holds (listed in `pool` or not) is returned again.
    pub fn allocate_from_list(
        &self,
        pool: &[IpAddr],
        container_id: &str,
        ifname: &str,
    ) -> Result<IpAddr, IpamError> {
        let content = owner_content(container_id, ifname);
        let res = self.locked(true, |l| {
            let entries = l.entries()?;
            if let Some(mine) = entries.iter().find(|e| owned_by(e, container_id, ifname)) {
                return Ok(mine.ip);
            }
            let held: HashSet<IpAddr> = entries.iter().map(|e| e.ip).collect();
            let start = l
                .last_reserved(0)
                .and_then(|last| pool.iter().position(|ip| *ip == last))
                .map_or(0, |i| i + 1);
            for ip in pool[start..].iter().chain(&pool[..start]) {
                if held.contains(ip) {
                    continue;
                }
                if create_exclusive(l.dir, &l.dir.join(ip.to_string()), &content)? {
                    write_atomic(l.dir, &format!("{LAST_RESERVED_PREFIX}0"), &ip.to_string())?;
                    return Ok(*ip);
                }
            }
            Err(IpamError::Exhausted {
                range_set: 0,
                detail: format!("all {} addresses of the list are in use", pool.len()),
            })
        })?;
        Ok(res.expect("locked(create = true) always runs"))
    }
}

#[cfg(test)]
mod lock_tests {
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;

    use super::*;

    /// Another process's flock on `<store>/lock` (host-local takes the same one): while it
    /// holds even a shared lock, an allocation waits (the store's lock is exclusive and
    /// blocking); it proceeds once the lock is released.
    #[test]
    fn operations_wait_for_another_holder_of_the_lock_file() {
        let tmp = tempfile::tempdir().unwrap();
        let mut conf: IpamConf =
            serde_json::from_str(r#"{"type":"weir-ipam","ranges":[[{"subnet":"10.9.0.0/24"}]]}"#)
                .unwrap();
        conf.data_dir = Some(tmp.path().to_path_buf());
        let store = Store::open(&conf, "locknet").unwrap().with_boot_id(None);
        // The directory and lock file exist after a first operation.
        store.allocate(&conf, "first", "eth0").unwrap();
        let held = File::open(tmp.path().join("locknet").join(LOCK_FILE)).unwrap();
        // SAFETY: flock on a file descriptor this test owns.
        let rc = unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());

        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let r = store.allocate(&conf, "second", "eth0").map(|a| a.len());
            tx.send(r).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "allocated while another holder had the lock"
        );
        drop(held);
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("still waiting after release");
        assert_eq!(r.unwrap(), 1);
        waiter.join().unwrap();
    }
}
