//! [`ManifestDir`]: a directory of manifests, read defensively (only regular files, bounded
//! sizes and depths, never blocking) and re-parsed only where something changed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use weir_model::{Object, ObjectKey};

use crate::last_good::LastGood;
use crate::manifest::{parse_manifest_with, ManifestError, ParseOptions, DEFAULT_MAX_NESTING};

/// Bounds on what a scan reads. Exceeding one is a named error for the file (or
/// subdirectory) concerned, whose previous objects stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest file read.
    pub max_file_bytes: u64,
    /// Largest total of all manifest files; files past it (in path order) are not read.
    pub max_total_bytes: u64,
    /// Subdirectory levels below the root that are read.
    pub max_dir_depth: usize,
    /// See [`crate::parse_manifest_limited`].
    pub max_nesting: usize,
    /// Debounce: a changed file is parsed once the same stamp (size, times, inode) was seen
    /// by two consecutive scans, or once its mtime is at least this old — so a file that is
    /// still being written is not programmed half-way. Zero parses every change at once.
    pub settle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 4 << 20,
            max_total_bytes: 64 << 20,
            max_dir_depth: 8,
            max_nesting: DEFAULT_MAX_NESTING,
            settle: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            ino: m.ino(),
        }
    }
}

#[derive(Debug)]
struct FileEntry {
    stamp: Stamp,
    /// What the file last produced successfully (per object).
    objects: BTreeMap<ObjectKey, Object>,
    errors: Vec<ManifestError>,
}

/// What a [`ManifestDir::scan`] found.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// The union of objects differs from before the scan.
    pub changed: bool,
    /// Errors of the files (re)parsed in this scan, and listing errors.
    pub errors: Vec<ManifestError>,
    /// The root directory could not be read: nothing was changed, the previous view stands.
    pub failed: Option<ManifestError>,
    /// Changed files waiting to settle (see [`Limits::settle`]); their previous version stands.
    pub pending: usize,
}

impl ScanReport {
    /// Every file that exists was read (or failed on its own): the view is whole.
    pub fn complete(&self) -> bool {
        self.failed.is_none() && self.pending == 0
    }
}

/// A directory of manifests (`*.yaml`, `*.yml`, `*.json`, recursively; dot-files and
/// dot-directories skipped).
///
/// What is read: regular files, and symlinks to regular files (a Kubernetes ConfigMap volume
/// is `name.yaml -> ..data/name.yaml` with `..data` a symlink to a timestamped directory).
/// Symlinks to directories are never followed (no loops); real subdirectories are read to
/// [`Limits::max_dir_depth`]; FIFOs, sockets and devices are reported, never opened for a
/// blocking read.
#[derive(Debug)]
pub struct ManifestDir {
    root: PathBuf,
    limits: Limits,
    files: BTreeMap<PathBuf, FileEntry>,
    /// Changed files seen once, with the stamp they had (debounce).
    pending: BTreeMap<PathBuf, Stamp>,
    /// Listing errors of the last scan (they stand until a scan no longer sees them).
    listing_errors: Vec<ManifestError>,
    /// Objects defined by more than one file (the lexically first file wins).
    duplicates: Vec<ManifestError>,
    last_good: Option<LastGood>,
    /// Objects served from the last-known-good state (objects whose file is invalid now).
    from_last_good: BTreeMap<ObjectKey, PathBuf>,
    /// A complete view was produced at least once (last-known-good pruning waits for it).
    seen_complete: bool,
    /// Read NetworkPolicy's objects ([`ParseOptions::policy`]).
    policy: bool,
}

/// One file found by [`ManifestDir::list`], with its (symlink-followed) metadata.
struct Listing {
    files: Vec<(PathBuf, fs::Metadata)>,
    /// Paths (files or directories) whose previous objects stay although not listed now.
    keep: Vec<PathBuf>,
    errors: Vec<ManifestError>,
    root_error: Option<ManifestError>,
}

fn error(path: &Path, object: &str, message: impl Into<String>) -> ManifestError {
    ManifestError {
        file: path.to_path_buf(),
        object: object.into(),
        field: None,
        message: message.into(),
    }
}

fn is_manifest_name(name: &str) -> bool {
    [".yaml", ".yml", ".json"].iter().any(|s| name.ends_with(s))
}

fn file_type_name(m: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Reads a regular file of at most `max` bytes without ever blocking: opened non-blocking
/// (a FIFO swapped in after the listing cannot hang the open), then checked with fstat.
fn read_regular(path: &Path, max: u64) -> Result<String, String> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot read: {e}"))?;
    let m = f.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !m.is_file() {
        return Err(format!("{}, not read", file_type_name(&m)));
    }
    if m.len() > max {
        return Err(too_large(m.len(), max));
    }
    let mut buf = Vec::with_capacity(m.len() as usize);
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read: {e}"))?;
    if buf.len() as u64 > max {
        return Err(too_large(buf.len() as u64, max));
    }
    String::from_utf8(buf).map_err(|e| format!("not UTF-8: {e}"))
}

fn too_large(len: u64, max: u64) -> String {
    format!("file too large: {len} bytes (limit {max}), not read")
}

impl ManifestDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_limits(root, Limits::default())
    }

    pub fn with_limits(root: impl Into<PathBuf>, limits: Limits) -> Self {
        ManifestDir {
            root: root.into(),
            limits,
            files: BTreeMap::new(),
            pending: BTreeMap::new(),
            listing_errors: Vec::new(),
            duplicates: Vec::new(),
            last_good: None,
            from_last_good: BTreeMap::new(),
            seen_complete: false,
            policy: false,
        }
    }

    /// Also reads Namespaces and NetworkPolicies, and keeps Pods with what NetworkPolicy
    /// needs ([`ParseOptions::policy`]): `weir policy`'s directory.
    pub fn with_policy_objects(mut self) -> Self {
        self.policy = true;
        self
    }

    fn parse_options(&self) -> ParseOptions {
        ParseOptions {
            max_nesting: self.limits.max_nesting,
            policy: self.policy,
        }
    }

    /// Keeps a last-known-good copy of each file's objects under `state_dir`, and serves an
    /// object from it when, after a restart, its file exists but that object (or the whole
    /// file) is invalid. Files deleted on purpose are not resurrected: their copies are
    /// deleted with them.
    pub fn with_last_good(mut self, state_dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        self.last_good = Some(LastGood::open(state_dir.into())?);
        Ok(self)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn list(&self) -> Listing {
        let mut l = Listing {
            files: Vec::new(),
            keep: Vec::new(),
            errors: Vec::new(),
            root_error: None,
        };
        let mut stack = vec![(self.root.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if dir == self.root => {
                    l.root_error = Some(error(&dir, "directory", format!("cannot read: {e}")));
                    return l;
                }
                Err(e) => {
                    l.errors
                        .push(error(&dir, "directory", format!("cannot read: {e}")));
                    l.keep.push(dir);
                    continue;
                }
            };
            for ent in rd {
                let ent = match ent {
                    Ok(ent) => ent,
                    Err(e) => {
                        l.errors
                            .push(error(&dir, "directory", format!("cannot list: {e}")));
                        l.keep.push(dir.clone());
                        continue;
                    }
                };
                let path = ent.path();
                let name = ent.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                // The entry itself, not what a symlink points to.
                let Ok(ft) = ent.file_type() else { continue };
                if ft.is_dir() {
                    if depth < self.limits.max_dir_depth {
                        stack.push((path, depth + 1));
                    } else {
                        let msg = format!(
                            "more than {} directory levels below the root, not read",
                            self.limits.max_dir_depth
                        );
                        l.errors.push(error(&path, "directory", msg));
                        l.keep.push(path);
                    }
                    continue;
                }
                if !is_manifest_name(&name) {
                    continue;
                }
                match fs::metadata(&path) {
                    Ok(m) if m.is_file() => l.files.push((path, m)),
                    // A symlinked directory with a manifest-like name: never followed.
                    Ok(m) if m.is_dir() => {}
                    Ok(m) => {
                        let msg = format!("{}, not read", file_type_name(&m));
                        l.errors.push(error(&path, "file", msg));
                        l.keep.push(path);
                    }
                    // Dangling symlink, or a symlink loop (ELOOP).
                    Err(e) => {
                        l.errors
                            .push(error(&path, "file", format!("cannot read: {e}")));
                        l.keep.push(path);
                    }
                }
            }
        }
        l.files.sort_by(|a, b| a.0.cmp(&b.0));
        l
    }

    /// Re-reads what changed. A file that vanished drops its objects; a file that became
    /// unreadable, too big or invalid YAML keeps the objects it last produced; an invalid
    /// object keeps its previous version from the same file (if any) and is otherwise
    /// skipped. An unreadable root directory changes nothing (see [`ScanReport::failed`]).
    pub fn scan(&mut self) -> ScanReport {
        // The view before this scan, taken only when a file is about to be dropped or read:
        // an unchanged poll (every 250 ms) must not copy every object, which at 10,000
        // services cost 8 % of a core and stalled the DNS server sharing it.
        let mut before: Option<Vec<Object>> = None;
        let mut report = ScanReport::default();
        let mut listing = self.list();
        if let Some(e) = listing.root_error.take() {
            // The directory vanished or became unreadable: that is not "every object was
            // deleted". Keep the last view; the caller reports the source as failing.
            self.listing_errors = vec![e.clone()];
            report.errors.push(e.clone());
            report.failed = Some(e);
            return report;
        }
        let listed: BTreeSet<PathBuf> = listing.files.iter().map(|(p, _)| p.clone()).collect();
        let keep = &listing.keep;
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !listed.contains(*p) && !keep.iter().any(|k| p.starts_with(k)))
            .cloned()
            .collect();
        for p in gone {
            before.get_or_insert_with(|| self.objects());
            self.files.remove(&p);
            if let Some(lg) = &self.last_good {
                lg.remove(&p);
            }
        }
        self.pending.retain(|p, _| listed.contains(p));

        let mut total = 0u64;
        let now = SystemTime::now();
        for (path, meta) in listing.files {
            total += meta.len();
            if total > self.limits.max_total_bytes {
                let msg = format!(
                    "the manifest files exceed {} bytes in total: this one and later ones are not read",
                    self.limits.max_total_bytes
                );
                listing.errors.push(error(&path, "file", msg));
                continue;
            }
            let st = Stamp::of(&meta);
            if self.files.get(&path).is_some_and(|e| e.stamp == st) {
                self.pending.remove(&path);
                continue;
            }
            let old_enough = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age >= self.limits.settle);
            if !(old_enough || self.pending.get(&path) == Some(&st)) {
                self.pending.insert(path, st);
                report.pending += 1;
                continue;
            }
            self.pending.remove(&path);
            before.get_or_insert_with(|| self.objects());
            let entry = self.read_file(&path, st);
            report.errors.extend(entry.errors.iter().cloned());
            self.files.insert(path, entry);
        }
        report.errors.extend(listing.errors.iter().cloned());
        self.listing_errors = listing.errors;
        if report.complete() && !self.seen_complete {
            self.seen_complete = true;
            if let Some(lg) = &self.last_good {
                // Copies of files deleted while weir was not running.
                lg.prune(&self.root, &|p| self.files.contains_key(p));
            }
        }
        if let Some(before) = before {
            self.duplicates = self.find_duplicates();
            report.changed = self.objects() != before;
        }
        report
    }

    /// Parses one changed file; falls back to what it produced before (this run), or to its
    /// last-known-good copy (an earlier run) for whatever is invalid now.
    fn read_file(&mut self, path: &Path, stamp: Stamp) -> FileEntry {
        let prev = self.files.remove(path).map(|e| e.objects);
        let first_read = prev.is_none();
        let prev = prev.unwrap_or_default();
        let (mut objects, errors, failed, invalid) =
            match read_regular(path, self.limits.max_file_bytes) {
                Err(message) => (prev, vec![error(path, "file", message)], true, Vec::new()),
                Ok(text) => {
                    let parsed = parse_manifest_with(path, &text, &self.parse_options());
                    if parsed.file_failed {
                        (prev, parsed.errors, true, Vec::new())
                    } else {
                        let mut objs: BTreeMap<ObjectKey, Object> = BTreeMap::new();
                        for o in parsed.objects {
                            objs.insert(o.key(), o);
                        }
                        for k in &parsed.invalid_keys {
                            if let (false, Some(old)) = (objs.contains_key(k), prev.get(k)) {
                                objs.insert(k.clone(), old.clone());
                            }
                        }
                        (objs, parsed.errors, false, parsed.invalid_keys)
                    }
                }
            };
        self.from_last_good.retain(|_, f| f != path);
        if let Some(lg) = &self.last_good {
            if first_read && (failed || !invalid.is_empty()) {
                // After a restart: what is invalid now is served from the copy kept when
                // it was last valid, so a restart of a healthy node changes nothing.
                for o in lg.load(path, &self.parse_options()) {
                    let k = o.key();
                    let wanted = if failed {
                        !objects.contains_key(&k)
                    } else {
                        invalid.contains(&k) && !objects.contains_key(&k)
                    };
                    if wanted {
                        tracing::warn!(
                            object = %k,
                            file = %path.display(),
                            "served from its last-known-good copy: the file is invalid now"
                        );
                        self.from_last_good.insert(k.clone(), path.to_path_buf());
                        objects.insert(k, o);
                    }
                }
            }
            if !objects.is_empty() || !failed {
                if let Err(e) = lg.save(path, &objects) {
                    tracing::warn!(file = %path.display(), "cannot save the last-known-good copy: {e}");
                }
            }
        }
        FileEntry {
            stamp,
            objects,
            errors,
        }
    }

    /// Objects defined by more than one file, as errors naming both files.
    fn find_duplicates(&self) -> Vec<ManifestError> {
        let mut first: BTreeMap<&ObjectKey, &Path> = BTreeMap::new();
        let mut out = Vec::new();
        for (path, e) in &self.files {
            for k in e.objects.keys() {
                match first.get(k) {
                    None => {
                        first.insert(k, path);
                    }
                    Some(winner) => out.push(ManifestError {
                        file: path.clone(),
                        object: k.to_string(),
                        field: None,
                        message: format!(
                            "also defined in {}, whose version is used (the lexically first file wins); this one is ignored",
                            winner.display()
                        ),
                    }),
                }
            }
        }
        out
    }

    /// The union of all files' objects; an object defined by several files comes from the
    /// lexically first path (see [`ManifestDir::errors`] for the duplicates).
    pub fn objects(&self) -> Vec<Object> {
        let mut all: BTreeMap<ObjectKey, Object> = BTreeMap::new();
        for e in self.files.values() {
            for (k, o) in &e.objects {
                all.entry(k.clone()).or_insert_with(|| o.clone());
            }
        }
        all.into_values().collect()
    }

    /// Errors currently standing: each file's latest parse, listing problems (including an
    /// unreadable root) and duplicate objects.
    pub fn errors(&self) -> Vec<ManifestError> {
        self.listing_errors
            .iter()
            .chain(self.files.values().flat_map(|e| e.errors.iter()))
            .chain(self.duplicates.iter())
            .cloned()
            .collect()
    }

    /// Objects currently served from their last-known-good copy, with the file that is
    /// invalid now.
    pub fn served_from_last_good(&self) -> &BTreeMap<ObjectKey, PathBuf> {
        &self.from_last_good
    }
}
