//! weir-vmtest: run test scripts under Debian's generic kernel in a qemu VM, for what this
//! machine's kernel lacks (IPVS, dummy, ipvlan).
//!
//! The VM's root filesystem is this machine's own `/` (shared read-only over virtio-9p, with a
//! tmpfs overlay so the guest can write), so a script runs the host's `ip`, `iptables`, `ipset`,
//! `ipvsadm` and the freshly built binaries under `target/` at their usual paths. One VM boots per
//! test binary ([`Vm::shared`]); every test sends it scripts ([`Vm::run`]).
//!
//! Where qemu cannot run (not installed, no kernel to fetch, no boot within the timeout) the
//! tests skip instead of failing: write them with [`vm_or_skip!`]. A skip is printed and recorded
//! (weir_testkit: `SKIPPED <test>: missing the test VM (<reason>)`, summarised by `bash
//! scripts/dev.sh test`). Under `CI=true`, or with `WEIR_VM_REQUIRED=1` (which dev.sh sets under
//! CI), a skip is a failure instead. See docs/vm.md.
//!
//! ```no_run
//! #[test]
//! fn ipvs_is_there() {
//!     let vm = weir_vmtest::vm_or_skip!();
//!     let out = vm.run_ok("ipvsadm -Ln");
//!     assert!(out.contains("IP Virtual Server"));
//! }
//! ```

mod agent;
mod cpio;
mod guest;
mod kernel;
mod prepare;
mod qemu;
mod vm;

pub use agent::{Agent, Output};
pub use guest::{GUEST_IO_DIR, MODULES};
pub use qemu::Accel;
pub use vm::{BootTimes, Skip, Vm};

/// The shared VM, or `None` after the skip is printed and recorded (`weir_testkit::can_run`; call
/// it on the test's thread, which names the test). A panic instead when `WEIR_VM_REQUIRED` is set
/// or under `CI=true`. Use [`vm_or_skip!`] in tests.
pub fn shared_or_skip() -> Option<&'static Vm> {
    match Vm::shared() {
        Ok(vm) => Some(vm),
        Err(skip) if required() => panic!("WEIR_VM_REQUIRED is set but the VM cannot run: {skip}"),
        Err(skip) => {
            weir_testkit::can_run(Some(format!("the test VM ({skip})")));
            None
        }
    }
}

fn required() -> bool {
    std::env::var("WEIR_VM_REQUIRED").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The shared VM, or returns from the calling test (after recording the skip; see
/// [`shared_or_skip`]).
#[macro_export]
macro_rules! vm_or_skip {
    () => {
        match $crate::shared_or_skip() {
            Some(vm) => vm,
            None => return,
        }
    };
}
