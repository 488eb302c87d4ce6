//! weir-testkit: no test passes without doing what it is named for.
//!
//! A test that needs something this machine may lack (root, a command, the VM) asks
//! [`can_run`] (or [`skip_unless`]) with what is missing, if anything:
//!
//! ```no_run
//! #[test]
//! fn rules_apply_in_a_netns() {
//!     if !weir_testkit::can_run(weir_testkit::missing(true, &["nft", "ip"])) {
//!         return;
//!     }
//!     // ...
//! }
//! ```
//!
//! Under `CI=true` (CI runs as root with every tool `bash scripts/dev.sh test` installs) a
//! missing need panics, naming it: the test fails. Elsewhere the test is skipped: it prints
//! `SKIPPED <test>: missing <what>` and appends that line to the skips file
//! (`$CARGO_TARGET_DIR/test-skips.txt`, else the workspace's `target/test-skips.txt`), which
//! `scripts/dev.sh test` empties before the run and summarises after it.
//!
//! Benches and tests also share what cleans up after them ([`KillOnDrop`], [`TempDir`],
//! [`Netns`]) and [`sh`].

mod scratch;

pub use scratch::{output_with_input, sh, KillOnDrop, Netns, TempDir};

use std::io::Write;
use std::path::{Path, PathBuf};

/// True when the test can go on; false when it must return (skipped, printed and recorded).
/// Panics under `CI=true` when `missing` is `Some`. The test is named by its thread (libtest
/// names each test's thread after it) and its binary.
pub fn can_run(missing: Option<String>) -> bool {
    skip_unless(&current_test(), missing)
}

/// [`can_run`] with the test's name given.
pub fn skip_unless(test: &str, missing: Option<String>) -> bool {
    // Straight to stderr, not through eprintln!: libtest captures that for a passing test, and
    // a skip must show in the run's output.
    decide(
        test,
        missing,
        in_ci(),
        &skips_file(),
        &mut std::io::stderr(),
    )
}

/// The decision, with the environment's parts as arguments (unit-tested below).
fn decide(
    test: &str,
    missing: Option<String>,
    ci: bool,
    skips: &Path,
    out: &mut dyn Write,
) -> bool {
    let Some(what) = missing else {
        return true;
    };
    if ci {
        panic!("{test}: cannot run under CI=true, missing {what}");
    }
    let line = format!("SKIPPED {test}: missing {}", what.replace('\n', " "));
    let _ = writeln!(out, "{line}");
    if let Err(e) = record(skips, &line) {
        let _ = writeln!(
            out,
            "(could not record the skip in {}: {e})",
            skips.display()
        );
    }
    false
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// One line appended (O_APPEND: whole lines from concurrent test processes), its directory
/// created if needed.
fn record(skips: &Path, line: &str) -> std::io::Result<()> {
    if let Some(dir) = skips.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skips)?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// `$CARGO_TARGET_DIR/test-skips.txt`, else `<workspace>/target/test-skips.txt`. A relative
/// `CARGO_TARGET_DIR` is the workspace's (scripts/dev.sh runs cargo there; tests run in their
/// crate's directory).
pub fn skips_file() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| workspace.join(d))
        .unwrap_or_else(|| workspace.join("target"));
    target.join("test-skips.txt")
}

/// `<binary>::<test>`: the test binary's name without cargo's hash, and the thread's name.
pub fn current_test() -> String {
    let bin = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => s,
        })
        .unwrap_or_else(|| "?".into());
    let thread = std::thread::current();
    format!("{bin}::{}", thread.name().unwrap_or("?"))
}

/// `Some("root")` unless this process's effective uid is 0.
pub fn root() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    (euid != 0).then(|| format!("root (running as uid {euid})"))
}

/// The commands of `names` found nowhere on `$PATH`, if any: `Some("the commands `a`, `b`")`.
pub fn commands(names: &[&str]) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let absent: Vec<String> = names
        .iter()
        .filter(|n| !on_path(n, &path))
        .map(|n| format!("`{n}`"))
        .collect();
    match absent.len() {
        0 => None,
        1 => Some(format!("the command {} (not found)", absent[0])),
        _ => Some(format!("the commands {} (not found)", absent.join(", "))),
    }
}

fn on_path(name: &str, path: &std::ffi::OsStr) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        return executable(Path::new(name));
    }
    std::env::split_paths(path).any(|d| executable(&d.join(name)))
}

/// Root when `needs_root`, and the commands of `tools`: everything missing, joined.
pub fn missing(needs_root: bool, tools: &[&str]) -> Option<String> {
    all([needs_root.then(root).flatten(), commands(tools)])
}

/// Every `Some` of `parts`, joined with " and "; `None` when all are `None`.
pub fn all(parts: impl IntoIterator<Item = Option<String>>) -> Option<String> {
    let parts: Vec<String> = parts.into_iter().flatten().collect();
    (!parts.is_empty()).then(|| parts.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_skips(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-testkit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // a directory that does not exist yet: the first skip creates it
        dir.join("sub").join("test-skips.txt")
    }

    #[test]
    fn nothing_missing_runs_and_records_nothing_in_or_out_of_ci() {
        let f = tmp_skips("none");
        let mut out = Vec::new();
        assert!(decide("t", None, false, &f, &mut out));
        assert!(decide("t", None, true, &f, &mut out));
        assert!(!f.exists());
        assert!(out.is_empty());
    }

    #[test]
    fn outside_ci_a_missing_need_skips_and_appends_one_line_each() {
        let f = tmp_skips("skip");
        let mut out = Vec::new();
        let first = Some("the command `nft`".into());
        assert!(!decide("bin::first", first, false, &f, &mut out));
        let second = Some("root\n(uid 1000)".into());
        assert!(!decide("bin::second", second, false, &f, &mut out));
        let text = std::fs::read_to_string(&f).unwrap();
        let expected = "SKIPPED bin::first: missing the command `nft`\n\
                        SKIPPED bin::second: missing root (uid 1000)\n";
        assert_eq!(text, expected);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            expected,
            "printed as recorded"
        );
        std::fs::remove_dir_all(f.parent().unwrap().parent().unwrap()).unwrap();
    }

    #[test]
    fn under_ci_a_missing_need_fails_naming_the_test_and_what_is_missing() {
        let f = tmp_skips("ci");
        let err = std::panic::catch_unwind(|| {
            decide(
                "bin::needs_nft",
                Some("the command `nft`".into()),
                true,
                &f,
                &mut Vec::new(),
            )
        })
        .expect_err("must panic under CI");
        let msg = err.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.contains("bin::needs_nft"), "{msg}");
        assert!(msg.contains("missing the command `nft`"), "{msg}");
        assert!(!f.exists(), "a failure is not a skip");
    }

    #[test]
    fn commands_name_exactly_the_absent_ones() {
        assert_eq!(commands(&["sh"]), None);
        assert_eq!(
            commands(&["sh", "weir-no-such-tool"]),
            Some("the command `weir-no-such-tool` (not found)".into())
        );
        assert_eq!(
            commands(&["weir-no-such-a", "weir-no-such-b"]),
            Some("the commands `weir-no-such-a`, `weir-no-such-b` (not found)".into())
        );
        assert!(commands(&["/nonexistent/bin/x"]).is_some());
    }

    #[test]
    fn missing_joins_root_and_commands() {
        let root_missing = root().is_some();
        let m = missing(true, &["weir-no-such-tool"]).unwrap();
        assert!(m.contains("`weir-no-such-tool`"), "{m}");
        assert_eq!(m.contains("root (running as uid"), root_missing, "{m}");
        assert_eq!(missing(false, &["sh"]), None);
        assert_eq!(all([None, None]), None);
        assert_eq!(
            all([Some("a".into()), None, Some("b".into())]),
            Some("a and b".into())
        );
    }

    #[test]
    fn the_current_test_is_named_by_binary_and_thread() {
        let name = current_test();
        assert!(
            name.ends_with("::tests::the_current_test_is_named_by_binary_and_thread"),
            "{name}"
        );
        assert!(name.starts_with("weir_testkit::"), "{name}");
    }

    #[test]
    fn the_skips_file_is_under_the_target_dir() {
        let f = skips_file();
        assert_eq!(f.file_name().unwrap(), "test-skips.txt");
        match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
            Some(d) if Path::new(&d).is_absolute() => {
                assert_eq!(f.parent().unwrap(), Path::new(&d))
            }
            Some(d) => assert!(f.parent().unwrap().ends_with(&d), "{}", f.display()),
            None => assert!(
                f.parent().unwrap().ends_with("../../target"),
                "{}",
                f.display()
            ),
        }
    }
}
