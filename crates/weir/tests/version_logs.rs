//! `weir --version` names the commit it was built from (when there is one), and
//! `--log-format json` writes one JSON object per line with the logged fields as fields.

use std::path::Path;
use std::process::Command;

#[path = "../src/version_line.rs"]
mod version_line;

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

fn git_head(dir: &Path) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn version_names_the_crate_version_and_the_checkout_commit() {
    let out = Command::new(WEIR).arg("--version").output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let version = env!("CARGO_PKG_VERSION");
    // CI may run from a tarball: then there is no commit to name.
    let expected = match git_head(Path::new(env!("CARGO_MANIFEST_DIR"))) {
        Some(commit) => format!("weir {version} (commit {commit})"),
        None => format!("weir {version}"),
    };
    assert_eq!(line, expected);
}

#[test]
fn a_build_without_git_names_the_version_alone_or_the_given_commit() {
    // Outside any checkout (a tarball's sources): no git commit, nothing for cargo to watch.
    let tarball = tempfile::tempdir().unwrap();
    assert!(
        git_head(tarball.path()).is_none(),
        "{} is inside a git checkout",
        tarball.path().display()
    );
    let (line, watched) = version_line::version_line("1.2.3", None, tarball.path());
    assert_eq!((line.as_str(), watched.len()), ("1.2.3", 0));
    // An image build passes the commit in WEIR_GIT_COMMIT; blank means unset.
    let (line, _) = version_line::version_line("1.2.3", Some("abc123\n"), tarball.path());
    assert_eq!(line, "1.2.3 (commit abc123)");
    let (line, _) = version_line::version_line("1.2.3", Some(" "), tarball.path());
    assert_eq!(line, "1.2.3");
    // In this checkout: HEAD is among the files that make cargo re-run the build script.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(commit) = git_head(here) {
        let (line, watched) = version_line::version_line("1.2.3", None, here);
        assert_eq!(line, format!("1.2.3 (commit {commit})"));
        assert!(watched.iter().any(|p| p.ends_with("HEAD")), "{watched:?}");
    }
}

/// Runs `weir dns` with an upstream list holding only its own address: it logs a warning
/// with the upstream as a field, then exits with an error (no usable upstream), before it
/// opens any socket or reads any manifest.
fn dns_with_only_itself_upstream(format: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 127.0.0.53\n").unwrap();
    let mut cmd = Command::new(WEIR);
    if let Some(f) = format {
        cmd.args(["--log-format", f]);
    }
    let out = cmd
        .args(["dns", "--listen", "127.0.0.53:53", "--upstream-resolv-conf"])
        .arg(&resolv)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn json_logs_are_one_object_per_line_with_fields() {
    let err = dns_with_only_itself_upstream(Some("json"));
    let mut lines = err.lines();
    let first = lines.next().expect("a log line");
    let v: serde_json::Value =
        serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {first:?}"));
    assert_eq!(v["level"], "WARN", "{v}");
    assert_eq!(v["fields"]["upstream"], "127.0.0.53:53", "{v}");
    assert_eq!(
        v["fields"]["message"],
        "upstream is this server's own address: ignored"
    );
    assert!(v["timestamp"].is_string() && v["target"].is_string(), "{v}");
    // The command's own error is not a log line: it stays plain on the last line.
    assert!(
        err.trim_end().lines().last().unwrap().starts_with("weir: "),
        "{err}"
    );
    // The flag is global: accepted after the subcommand too.
    let out = Command::new(WEIR)
        .args(["dns", "--log-format", "json", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
}

#[test]
fn text_logs_are_the_default_and_a_bad_format_is_refused() {
    let err = dns_with_only_itself_upstream(None);
    let first = err.lines().next().unwrap();
    assert!(serde_json::from_str::<serde_json::Value>(first).is_err());
    assert!(
        first.contains("WARN") && first.contains("upstream=127.0.0.53:53"),
        "{first}"
    );
    let out = Command::new(WEIR)
        .args(["--log-format", "xml", "dns"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xml") && err.contains("json"), "{err}");
}
