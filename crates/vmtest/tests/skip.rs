//! Where qemu cannot run, the harness reports a reason to skip with instead of failing, records
//! the skip for dev.sh's summary, and fails instead under CI=true. A test binary of its own: it
//! changes the process environment.

use std::path::PathBuf;

use weir_vmtest::Vm;

#[test]
fn no_qemu_and_no_boot_are_reasons_to_skip_not_failures() {
    // SAFETY (edition 2021: set_var is safe, but racy with threads reading the environment):
    // this binary has one test, so nothing else reads it concurrently.
    // What is checked here is the skip itself, whatever the machine and CI say; the record goes to
    // a target dir of its own (weir_testkit honours CARGO_TARGET_DIR), not into the run's summary.
    let saved = ["WEIR_VM_REQUIRED", "CI", "CARGO_TARGET_DIR"].map(|k| (k, std::env::var_os(k)));
    std::env::remove_var("WEIR_VM_REQUIRED");
    std::env::remove_var("CI");
    let target = std::env::temp_dir().join(format!("weir-vmtest-skip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    std::env::set_var("CARGO_TARGET_DIR", &target);
    let skips: PathBuf = target.join("test-skips.txt");
    assert_eq!(weir_testkit::skips_file(), skips);

    std::env::set_var("WEIR_VM_QEMU", "/nonexistent/qemu-system-x86_64");
    let skip = Vm::boot().err().expect("no qemu must be a skip");
    assert!(
        skip.0.contains("/nonexistent/qemu-system-x86_64 not found"),
        "{skip}"
    );
    // (This prints its SKIPPED line on the run's stderr, as every skip does: expected here.)
    assert!(weir_vmtest::shared_or_skip().is_none());
    let recorded = std::fs::read_to_string(&skips).expect("the skip is recorded");
    assert_eq!(
        recorded,
        "SKIPPED skip::no_qemu_and_no_boot_are_reasons_to_skip_not_failures: missing the test VM \
         (/nonexistent/qemu-system-x86_64 not found (Debian package qemu-system-x86))\n"
    );
    // Under CI=true the same reason fails the test, naming it (and records nothing more).
    std::env::set_var("CI", "true");
    let failure = std::panic::catch_unwind(weir_vmtest::shared_or_skip)
        .err()
        .expect("under CI=true no VM is a failure");
    let message = failure.downcast_ref::<String>().expect("a formatted panic");
    assert!(
        message.contains("missing the test VM (/nonexistent/qemu-system-x86_64 not found"),
        "{message}"
    );
    assert_eq!(std::fs::read_to_string(&skips).unwrap(), recorded);
    std::fs::remove_dir_all(&target).unwrap();
    for (k, v) in saved {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }

    // qemu that starts but whose guest cannot answer in time: a boot timeout, also a skip.
    // (`true` exits at once, standing in for a qemu that cannot run the guest.)
    std::env::set_var("WEIR_VM_QEMU", "true");
    let skip = Vm::boot().err().expect("`true` cannot be a VM");
    if skip.0.starts_with("cannot prepare") {
        // No kernel to be had on this machine (no apt, no registry): also a skip, but it stops
        // before qemu would start, so the boot-failure path is not exercised here: recorded as
        // a skip of this test (a failure under CI=true, where the kernel can be had).
        weir_testkit::can_run(Some(format!(
            "a VM kernel, for the boot-failure path ({skip})"
        )));
    } else {
        assert!(
            skip.0.contains("did not boot") && skip.0.contains("qemu exited"),
            "{skip}"
        );
    }
}
