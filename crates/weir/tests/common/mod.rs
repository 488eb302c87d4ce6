//! What the end-to-end tests of the `weir` binary share: the binaries, and a lab under test.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod agent;
pub mod cluster;
pub mod dualstack;
pub mod services;
pub mod vm_lab;

pub const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// A process a test started, killed (and reaped) when the test ends, however it ends.
#[allow(unused_imports)] // not every test binary that includes this module starts one
pub use weir_testkit::KillOnDrop;

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Root and `ip`, or the test is skipped: printed and recorded outside CI, a failure naming
/// what is missing under CI=true (weir_testkit).
pub fn runnable() -> bool {
    weir_testkit::can_run(weir_testkit::missing(true, &["ip"]))
}

/// The weir-cni binary next to weir; asserts that it was built.
pub fn weir_cni() -> PathBuf {
    let path = weir_cni_path();
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p weir-cni` (or `cargo test --workspace`)",
        path.display()
    );
    path
}

fn weir_cni_path() -> PathBuf {
    Path::new(WEIR).with_file_name("weir-cni")
}

/// A lab under test: a unique name (a short tag and this process's pid, [a-z0-9]{1,10}), its
/// own state dir, and `weir lab down` on drop (also after a panic).
pub struct Lab {
    pub name: String,
    pub state: tempfile::TempDir,
}

impl Lab {
    pub fn new(tag: &str) -> Self {
        let name = format!("{tag}{}", std::process::id());
        assert!(name.len() <= 10, "{name}");
        Self {
            name,
            state: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn weir(&self, args: &[&str]) -> Output {
        Command::new(WEIR)
            .args(args)
            .env("WEIR_LAB_STATE", self.state.path())
            .env("WEIR_CNI", weir_cni_path())
            .output()
            .expect("run weir")
    }

    /// Runs weir and requires success.
    pub fn ok(&self, args: &[&str]) -> Output {
        let out = self.weir(args);
        assert!(
            out.status.success(),
            "weir {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub fn lab_dir(&self) -> PathBuf {
        self.state.path().join(&self.name)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.weir(&["lab", "down", &self.name]);
    }
}
