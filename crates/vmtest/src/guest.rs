//! What runs inside the VM: a busybox initramfs whose `/init` mounts this machine's `/` (read-only
//! 9p, with a tmpfs overlay on top so the guest may write anywhere without touching the host),
//! loads the modules tests need, and then serves as the *guest agent*.
//!
//! The agent protocol, on the virtio-serial port named [`PORT_NAME`], one line per message:
//! - guest → host, once: `READY <uname -r> <modules that did not load, comma-separated, or ->`
//! - host → guest: `RUN <id> <timeout secs>`; the script is the file `<id>.sh` in the shared
//!   I/O directory (mounted at [`GUEST_IO_DIR`]), run by `/bin/sh` in the host's root, with its
//!   stdout and stderr written to `<id>.out` and `<id>.err` there
//! - guest → host: `GOT <id>` as soon as the request is read (so a host that hears nothing can
//!   tell a request the guest never saw from a script that did not finish)
//! - guest → host: `DONE <id> <exit status>` once those files are complete.
//!
//! Why a serial port for the messages and a shared directory for the data: the port is an
//! ordinary byte stream, so the agent blocks in `read` and the host learns of completion the
//! moment it happens (no polling of an inbox on either side), while scripts and their output, which
//! may hold any bytes and be large, travel as plain files and need no framing or escaping in a
//! busybox shell. Each request runs in the background, so several tests of one binary can use the
//! VM at the same time. When the host closes its end (the test process exited), `read` returns
//! end-of-file and the agent powers the VM off.

use std::path::{Path, PathBuf};

use crate::cpio::Entry;

/// The virtio-serial port the agent talks on.
pub const PORT_NAME: &str = "weir.agent";
/// The 9p mount tags of the host's root and of the I/O directory.
pub const ROOT_TAG: &str = "hostroot";
pub const IO_TAG: &str = "weirio";
/// Where the I/O directory appears inside the guest (the host's path differs per VM).
pub const GUEST_IO_DIR: &str = "/run/weir-vm/io";

/// Loaded at boot (the rest load on demand: the guest's kernel asks an initramfs `modprobe` shim
/// that runs the host's `modprobe` against the cached module tree). The list makes the loaded set
/// the same on every boot: IPVS and every scheduler kube-proxy offers, the link types the host
/// kernel lacks, and the netfilter pieces iptables-nft, nft and ipset use. (`xt_MARK` and
/// `xt_CONNMARK` are aliases of `xt_mark` and `xt_connmark`: no module of their own.)
pub const MODULES: &[&str] = &[
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "ip_vs_dh",
    "ip_vs_sed",
    "ip_vs_nq",
    "ip_vs_mh",
    "dummy",
    "ipvlan",
    "macvlan",
    "veth",
    "bridge",
    "br_netfilter",
    "vxlan",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_nat",
    "nf_tables",
    "nft_compat",
    "nft_chain_nat",
    "nft_ct",
    "nft_masq",
    "nft_redir",
    "nft_reject_inet",
    "xt_MASQUERADE",
    "xt_nat",
    "xt_mark",
    "xt_connmark",
    "xt_comment",
    "xt_set",
    "xt_statistic",
    "xt_conntrack",
    "xt_addrtype",
    "xt_multiport",
    "xt_tcpudp",
    "xt_REDIRECT",
    "ip_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
];

/// The modules the initramfs itself needs before the host's root is mounted (with their
/// dependencies, resolved by the host's `modprobe --show-depends`).
pub const EARLY_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_console",
    "9pnet_virtio",
    "9p",
    "overlay",
];

/// The module files `modprobe --show-depends` would `insmod`, in order, each once; modules built
/// into the kernel (`builtin ...` lines) need no file.
pub fn parse_show_depends(output: &str) -> Vec<String> {
    let mut files: Vec<String> = Vec::new();
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("insmod ") {
            let file = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            if !file.is_empty() && !files.contains(&file) {
                files.push(file);
            }
        }
    }
    files
}

/// Whether an ELF executable runs without a dynamic loader (it has no `PT_INTERP` segment): the
/// initramfs has no libraries, so its busybox must be the static build (`busybox-static`).
pub fn is_static_elf(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    // 64-bit little-endian ELF only: that is what x86_64 busybox is.
    if !bytes.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..phnum as usize).all(|i| {
        let at = phoff as usize + i * phentsize as usize;
        u32_at(at).is_some_and(|kind| kind != PT_INTERP)
    })
}

/// Directories the guest's fresh tmpfs mounts hide from the host's root.
const HIDDEN_IN_GUEST: &[&str] = &["/tmp", "/run", "/var/tmp"];

/// Of `host_dirs` (e.g. the checkout and its target directory), those the guest would not see
/// because they live under a directory it mounts a fresh tmpfs on; [`init_script`] binds them
/// back from the host's view, read-only.
pub fn hidden_dirs(host_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut hidden: Vec<PathBuf> = host_dirs
        .iter()
        .filter(|d| HIDDEN_IN_GUEST.iter().any(|h| d.starts_with(h)))
        .cloned()
        .collect();
    hidden.sort();
    hidden.dedup();
    // A directory inside another one already bound needs no bind of its own.
    let all = hidden.clone();
    hidden.retain(|d| !all.iter().any(|o| o != d && d.starts_with(o)));
    hidden
}

/// The `/init` script. `kernel_root` is the cached package tree, which the guest sees at the same
/// path through the host's root; the host's `modprobe` runs against it. `rebind`: host
/// directories under /tmp, /run or /var/tmp (see [`hidden_dirs`]) the guest must still see — the
/// build tree when the checkout lives there.
pub fn init_script(kernel_root: &Path, early_modules: &[String], rebind: &[PathBuf]) -> String {
    let kdir = kernel_root.display();
    let rebind: String = rebind
        .iter()
        .map(|d| {
            let d = d.display();
            format!("mkdir -p /mnt{d} && mount -o bind,ro /host{d} /mnt{d} || fail \"bind {d}\"\n")
        })
        .collect();
    let early = early_modules.join(" ");
    let modules = MODULES.join(" ");
    format!(
        r#"#!/bin/busybox sh
# weir VM guest init and agent, generated by weir-vmtest (crates/vmtest/src/guest.rs).
/bin/busybox --install -s /bin
export PATH=/bin
fail() {{ echo "weir-vm: $*" >&2; poweroff -f; }}
# Progress on the serial console (console.log on the host), with the guest's uptime.
stamp() {{ read up idle < /proc/uptime; echo "weir-vm: $up $*"; }}
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
stamp init
for m in {early}; do insmod /lib/modules/$m || fail "insmod $m"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose {ROOT_TAG} /host || fail "mount the host's root"
# The host's root, read-only, under a tmpfs upper layer: the guest may write anywhere (/etc,
# /var/lib, /opt/cni) and the host never sees it.
mount -t tmpfs -o mode=755 rw /rw && mkdir /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /mnt || fail "overlay"
mount -t proc proc /mnt/proc; mount -t sysfs sys /mnt/sys; mount -t devtmpfs dev /mnt/dev
mkdir -p /mnt/dev/pts /mnt/dev/shm; mount -t devpts devpts /mnt/dev/pts; mount -t tmpfs shm /mnt/dev/shm
mount -t tmpfs -o mode=1777 tmp /mnt/tmp; mount -t tmpfs -o mode=755 run /mnt/run
mount -t tmpfs -o mode=1777 vartmp /mnt/var/tmp
{rebind}mkdir -p /mnt{GUEST_IO_DIR}
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none {IO_TAG} /mnt{GUEST_IO_DIR} || fail "mount the I/O directory"
hostname weir-vm; ip link set lo up
stamp mounted
# The cached module tree where the guest's own modprobe looks for it, so tools that load modules
# themselves (ipvsadm, modprobe in a script) work; and modules the kernel asks for later (a new
# link type, an IPVS scheduler) come through the same modprobe. Bound from /host, not linked to
# its path under /mnt: a cache under /tmp or /run is hidden there by the fresh tmpfs.
mkdir -p /mnt/lib/modules/$(uname -r)
mount -o bind,ro /host{kdir}/lib/modules/$(uname -r) /mnt/lib/modules/$(uname -r) || fail "bind the module tree"
printf '#!/bin/sh\nexec chroot /mnt /sbin/modprobe "$@"\n' > /bin/weir-modprobe
chmod +x /bin/weir-modprobe; echo /bin/weir-modprobe > /proc/sys/kernel/modprobe
chroot /mnt /sbin/modprobe -a {modules} 2>/mnt/run/weir-vm/modprobe.log
stamp modules loaded
missing=""
for m in {modules}; do [ -d /sys/module/$m ] || missing="$missing,$m"; done
missing=${{missing#,}}
port=""
for p in /sys/class/virtio-ports/*; do [ "$(cat $p/name)" = {PORT_NAME} ] && port=/dev/${{p##*/}}; done
[ -n "$port" ] || fail "no virtio port {PORT_NAME}"
exec 3<>"$port"
echo "READY $(uname -r) ${{missing:--}}" >&3
io=/mnt{GUEST_IO_DIR}
# Output collects in the initramfs's own memory and moves to the I/O directory in one copy at the
# end: written straight to 9p, every small write() would be a round trip to the host.
mkdir -p /spool
# Two loops: the first only reads the port and has no children; the second starts the scripts.
# Why: ash's `read` takes a line byte by byte, and when a signal (SIGCHLD from a finished script)
# interrupts it mid-line it starts over, dropping the bytes it had read. The port can deliver a
# request line in pieces, so a script ending at that moment lost the next request. The second
# loop reads the pipe, where each line arrives whole in one write: a signal can only interrupt it
# between lines, which loses nothing.
while read -r verb id secs <&3; do echo "$verb $id $secs"; done | while read -r verb id secs; do
  case "$verb" in
    RUN)
      echo "GOT $id" >&3
      # 3>&-: the script (and the servers it leaves running) must not hold the port
      (
        # The host writes the script before it sends the request, yet once (CI, under load) the
        # shell could not open it. Until that is understood: wait up to 5 s for it, and say on
        # the console when it was late.
        n=0; while [ ! -e "$io/$id.sh" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done
        [ $n -eq 0 ] || echo "weir-vm: $id.sh was not there at RUN; waited $n x 0.1 s" >/dev/console
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
          timeout -s KILL "$secs" chroot /mnt /bin/sh "{GUEST_IO_DIR}/$id.sh" \
          </dev/null >"/spool/$id.out" 2>"/spool/$id.err" 3>&-
        status=$?
        cat "/spool/$id.out" >"$io/$id.out"; cat "/spool/$id.err" >"$io/$id.err"
        rm -f "/spool/$id.out" "/spool/$id.err"
        echo "DONE $id $status" >&3
      ) &
      ;;
  esac
done
# End of file: the host went away.
poweroff -f
"#
    )
}

/// The initramfs members: busybox, the early modules (by file name, flat), `/init`, and the
/// directories and console node the init expects.
pub fn initramfs_entries(busybox: Vec<u8>, early: &[(String, Vec<u8>)], init: &str) -> Vec<Entry> {
    let mut entries: Vec<Entry> = [
        "bin",
        "dev",
        "proc",
        "sys",
        "host",
        "rw",
        "mnt",
        "lib",
        "lib/modules",
    ]
    .iter()
    .map(|d| Entry::Dir {
        path: d.to_string(),
    })
    .collect();
    // The kernel opens /dev/console for init's stdio before devtmpfs is mounted.
    entries.push(Entry::CharDev {
        path: "dev/console".into(),
        mode: 0o600,
        major: 5,
        minor: 1,
    });
    entries.push(Entry::File {
        path: "bin/busybox".into(),
        mode: 0o755,
        data: busybox,
    });
    for (name, data) in early {
        entries.push(Entry::File {
            path: format!("lib/modules/{name}"),
            mode: 0o644,
            data: data.clone(),
        });
    }
    entries.push(Entry::File {
        path: "init".into(),
        mode: 0o755,
        data: init.as_bytes().to_vec(),
    });
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_depends_gives_each_module_file_once_in_load_order() {
        let out = "insmod /k/virtio_ring.ko \ninsmod /k/virtio.ko \ninsmod /k/virtio_pci.ko \n\
                   insmod /k/virtio_ring.ko \nbuiltin crc32c\ninsmod /k/9p.ko opt=1\n";
        assert_eq!(
            parse_show_depends(out),
            [
                "/k/virtio_ring.ko",
                "/k/virtio.ko",
                "/k/virtio_pci.ko",
                "/k/9p.ko"
            ]
        );
    }

    #[test]
    fn only_an_elf_without_an_interpreter_is_static() {
        // A minimal ELF64 header with one program header at 0x40 of the given type.
        let elf = |kind: u32| {
            let mut b = vec![0u8; 0x40 + 0x38];
            b[..6].copy_from_slice(b"\x7fELF\x02\x01");
            b[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
            b[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
            b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
            b[0x40..0x44].copy_from_slice(&kind.to_le_bytes());
            b
        };
        assert!(is_static_elf(&elf(1)), "PT_LOAD only");
        assert!(!is_static_elf(&elf(3)), "PT_INTERP");
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        assert!(!is_static_elf(&elf(1)[..0x30]), "truncated");
    }

    #[test]
    fn the_init_loads_the_early_modules_and_names_the_cached_module_tree() {
        let init = init_script(Path::new("/c/k_1"), &["a.ko".into(), "b.ko".into()], &[]);
        assert!(init.starts_with("#!/bin/busybox sh\n"));
        assert!(init.contains("for m in a.ko b.ko; do insmod"));
        // From the host's view (/host): the guest's /tmp and /run hide a cache kept there.
        assert!(init.contains(
            "mount -o bind,ro /host/c/k_1/lib/modules/$(uname -r) /mnt/lib/modules/$(uname -r)"
        ));
        assert!(init.contains("chroot /mnt /sbin/modprobe -a ip_vs ip_vs_rr"));
        assert!(init.contains("echo \"READY $(uname -r) ${missing:--}\" >&3"));
        assert!(init.contains("mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none weirio /mnt/run/weir-vm/io"));
    }

    #[test]
    fn a_build_tree_under_tmp_is_bound_back_into_the_guest() {
        let dirs = [
            PathBuf::from("/tmp/ci/checkout"),
            PathBuf::from("/tmp/ci/checkout/target"),
            PathBuf::from("/work/main"),
        ];
        let hidden = hidden_dirs(&dirs);
        assert_eq!(hidden, [PathBuf::from("/tmp/ci/checkout")]);
        let init = init_script(Path::new("/c/k_1"), &[], &hidden);
        let bind = init
            .find("mount -o bind,ro /host/tmp/ci/checkout /mnt/tmp/ci/checkout")
            .expect("the checkout is bound back");
        // after the guest's own tmpfs on /tmp, or the tmpfs would hide the bind again
        assert!(
            bind > init
                .find("mount -t tmpfs -o mode=1777 tmp /mnt/tmp")
                .unwrap()
        );
    }
}
