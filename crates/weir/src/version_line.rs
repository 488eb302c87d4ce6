// What `weir --version` says: the crate version, and the git commit when the build has one
// to name. Shared by build.rs (`include!`) and tests/version_logs.rs; not a module of the
// binary, which reads the result from the `WEIR_VERSION_LINE` variable build.rs sets.

/// The version line, and the files whose change means another commit (HEAD, the branch's ref,
/// packed-refs: cargo re-runs the build script when one changes, and only then).
///
/// The commit is `env_commit` (`WEIR_GIT_COMMIT`, set by image builds whose context has no
/// `.git`) if not empty, else `git`'s when `dir` is in a checkout; a build from a tarball
/// without either names the version alone.
pub fn version_line(
    version: &str,
    env_commit: Option<&str>,
    dir: &std::path::Path,
) -> (String, Vec<String>) {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let mut watched = Vec::new();
    let commit = match env_commit.map(str::trim).filter(|c| !c.is_empty()) {
        Some(c) => Some(c.to_string()),
        None => git(&["rev-parse", "--short=12", "HEAD"]).inspect(|_| {
            let mut names = vec!["HEAD".to_string(), "packed-refs".to_string()];
            names.extend(git(&["symbolic-ref", "-q", "HEAD"]));
            for name in names {
                let path = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]);
                // A path that does not exist would make cargo re-run the script every build.
                watched.extend(path.filter(|p| std::path::Path::new(p).exists()));
            }
        }),
    };
    let line = match commit {
        Some(c) => format!("{version} (commit {c})"),
        None => version.to_string(),
    };
    (line, watched)
}
