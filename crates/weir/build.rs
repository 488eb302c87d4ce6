//! Puts the git commit into `weir --version` (src/version_line.rs says where it comes from).

include!("src/version_line.rs");

fn main() {
    println!("cargo:rerun-if-env-changed=WEIR_GIT_COMMIT");
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let env_commit = std::env::var("WEIR_GIT_COMMIT").ok();
    let (line, watched) = version_line(&version, env_commit.as_deref(), dir.as_ref());
    for path in watched {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rustc-env=WEIR_VERSION_LINE={line}");
}
