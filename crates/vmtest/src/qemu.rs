//! The qemu command line, built as data so it can be read (and tested) apart from the spawning.

use std::path::{Path, PathBuf};

use crate::guest;

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization: seconds faster, when the host really offers it.
    Kvm,
    /// Software emulation: slower, works everywhere.
    Tcg,
}

/// `$WEIR_VM_ACCEL` (`kvm` or `tcg`) if set; else KVM only when `/dev/kvm` opens *and* the CPU
/// advertises VT-x/AMD-V. The second check matters: inside some VMs `/dev/kvm` exists and opens
/// but a guest started on it never runs (seen on this project's build machines), which would turn
/// every VM test into a boot timeout instead of a slower pass.
pub fn choose_accel(env: Option<&str>, kvm_opens: bool, cpuinfo: &str) -> Accel {
    match env {
        Some("kvm") => return Accel::Kvm,
        Some("tcg") => return Accel::Tcg,
        _ => {}
    }
    let virt_flags = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if kvm_opens && virt_flags {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// The host side of one VM.
#[derive(Debug, Clone)]
pub struct Spec {
    pub accel: Accel,
    pub memory_mib: u32,
    pub cpus: u32,
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    /// The shared I/O directory (read-write for the guest).
    pub io_dir: PathBuf,
    /// The Unix socket the host listens on; qemu connects the agent port to it.
    pub agent_socket: PathBuf,
    /// Where the guest's serial console (kernel messages, init errors) is written.
    pub console_log: PathBuf,
}

pub fn args(spec: &Spec) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let (accel, cpu) = match spec.accel {
        Accel::Kvm => ("kvm", "host"),
        Accel::Tcg => ("tcg", "max"),
    };
    vec![
        "-accel".into(),
        accel.into(),
        "-cpu".into(),
        cpu.into(),
        "-m".into(),
        spec.memory_mib.to_string(),
        "-smp".into(),
        spec.cpus.to_string(),
        // No default devices (VGA, NIC, floppy...): less to emulate, nothing the tests use.
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", path(&spec.console_log)),
        "-kernel".into(),
        path(&spec.kernel),
        "-initrd".into(),
        path(&spec.initramfs),
        "-append".into(),
        // panic=-1 with -no-reboot: a kernel panic ends qemu at once instead of hanging.
        "console=ttyS0 quiet panic=-1 mitigations=off".into(),
        "-fsdev".into(),
        "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap".into(),
        "-device".into(),
        format!("virtio-9p-pci,fsdev=root,mount_tag={}", guest::ROOT_TAG),
        "-fsdev".into(),
        format!(
            "local,id=io,path={},security_model=none",
            path(&spec.io_dir)
        ),
        "-device".into(),
        format!("virtio-9p-pci,fsdev=io,mount_tag={}", guest::IO_TAG),
        "-device".into(),
        "virtio-serial-pci".into(),
        "-chardev".into(),
        format!("socket,id=agent,path={}", path(&spec.agent_socket)),
        "-device".into(),
        format!("virtserialport,chardev=agent,name={}", guest::PORT_NAME),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_needs_both_the_device_and_the_cpu_flag_unless_forced() {
        let vmx = "processor\t: 0\nflags\t\t: fpu vme vmx sse\n";
        let none = "processor\t: 0\nflags\t\t: fpu vme sse\n";
        assert_eq!(choose_accel(None, true, vmx), Accel::Kvm);
        assert_eq!(choose_accel(None, true, none), Accel::Tcg);
        assert_eq!(choose_accel(None, false, vmx), Accel::Tcg);
        assert_eq!(choose_accel(Some("kvm"), false, none), Accel::Kvm);
        assert_eq!(choose_accel(Some("tcg"), true, vmx), Accel::Tcg);
    }

    #[test]
    fn the_command_line_shares_root_read_only_and_io_read_write() {
        let spec = Spec {
            accel: Accel::Tcg,
            memory_mib: 1024,
            cpus: 2,
            kernel: "/c/boot/vmlinux".into(),
            initramfs: "/c/initrd-1.cpio".into(),
            io_dir: "/tmp/r/io".into(),
            agent_socket: "/tmp/r/agent.sock".into(),
            console_log: "/tmp/r/console.log".into(),
        };
        let a = args(&spec).join(" ");
        assert!(a.contains("-accel tcg -cpu max -m 1024 -smp 2"));
        assert!(a.contains("path=/,security_model=none,readonly=on"));
        assert!(a.contains("local,id=io,path=/tmp/r/io,security_model=none -device"));
        assert!(a.contains("socket,id=agent,path=/tmp/r/agent.sock"));
        assert!(a.contains("virtserialport,chardev=agent,name=weir.agent"));
    }
}
