//! Where qemu cannot run, the harness reports a reason to skip with instead of failing. A test
//! binary of its own: it changes the process environment.

use weir_vmtest::Vm;

#[test]
fn no_qemu_and_no_boot_are_reasons_to_skip_not_failures() {
    if std::env::var_os("WEIR_VM_REQUIRED").is_some() {
        eprintln!("SKIP: WEIR_VM_REQUIRED turns skips into failures; this test checks skips");
        return;
    }
    // SAFETY (edition 2021: set_var is safe, but racy with threads reading the environment):
    // this binary has one test, so nothing else reads it concurrently.
    std::env::set_var("WEIR_VM_QEMU", "/nonexistent/qemu-system-x86_64");
    let skip = Vm::boot().err().expect("no qemu must be a skip");
    assert!(
        skip.0.contains("/nonexistent/qemu-system-x86_64 not found"),
        "{skip}"
    );
    assert!(weir_vmtest::shared_or_skip().is_none());

    // qemu that starts but whose guest cannot answer in time: a boot timeout, also a skip.
    // (`true` exits at once, standing in for a qemu that cannot run the guest.)
    std::env::set_var("WEIR_VM_QEMU", "true");
    let skip = Vm::boot().err().expect("`true` cannot be a VM");
    if skip.0.starts_with("cannot prepare") {
        // No kernel to be had on this machine (no apt, no registry): also a skip, but it stops
        // before qemu would start, so the boot-failure path is not exercised here.
        eprintln!("note: {skip}");
    } else {
        assert!(
            skip.0.contains("did not boot") && skip.0.contains("qemu exited"),
            "{skip}"
        );
    }
}
