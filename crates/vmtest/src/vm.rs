//! Booting and owning one VM.

use std::fmt;
use std::fs;
use std::io::{BufReader, ErrorKind};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::agent::{self, Agent, Message, Output};
use crate::prepare::{self, Prepared};
use crate::qemu::{self, Accel, Spec};

/// Why no VM is available: the tests that need one skip with this reason.
#[derive(Debug, Clone)]
pub struct Skip(pub String);

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How long getting a VM took.
#[derive(Debug, Clone, Copy)]
pub struct BootTimes {
    /// Kernel download and unpack, initramfs build (near zero once cached).
    pub prepare: Duration,
    /// From starting qemu to the agent's `READY`.
    pub boot: Duration,
    pub accel: Accel,
}

/// A running VM with its agent connected. Dropping it stops qemu and removes its files.
pub struct Vm {
    agent: Agent,
    release: String,
    missing_modules: Vec<String>,
    times: BootTimes,
    qemu_pid: u32,
    run_dir: PathBuf,
}

/// Per-command timeout unless the caller gives one.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

impl Vm {
    /// The one VM of this test binary, booted by the first caller; every later caller (from any
    /// thread) gets the same VM, or the same [`Skip`].
    pub fn shared() -> Result<&'static Vm, Skip> {
        static SHARED: OnceLock<Result<Vm, Skip>> = OnceLock::new();
        SHARED.get_or_init(Vm::boot).as_ref().map_err(Clone::clone)
    }

    /// Boots a VM of its own (prefer [`Vm::shared`]: a boot costs seconds).
    pub fn boot() -> Result<Vm, Skip> {
        let qemu = std::env::var("WEIR_VM_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into());
        if !on_path(&qemu) {
            return Err(Skip(format!(
                "{qemu} not found (Debian package qemu-system-x86)"
            )));
        }
        let started = Instant::now();
        let prepared = prepare::prepare()
            .map_err(|e| Skip(format!("cannot prepare the VM kernel and initramfs: {e:#}")))?;
        let prepare_time = started.elapsed();
        let run_dir =
            new_run_dir().map_err(|e| Skip(format!("cannot make a run directory: {e}")))?;
        let result = launch(&qemu, &prepared, &run_dir, prepare_time);
        if result.is_err() {
            let _ = fs::remove_dir_all(&run_dir);
        }
        result
    }

    /// Runs `script` with `/bin/sh` as root in the VM (the host's root filesystem, a clean
    /// `/tmp` and `/run`, no network but `lo`), with the default 60 s timeout. `Err` means the
    /// VM did not answer or the script timed out; a script that fails is an `Ok` with its status.
    pub fn run(&self, script: &str) -> anyhow::Result<Output> {
        self.run_timeout(script, RUN_TIMEOUT)
    }

    pub fn run_timeout(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        self.agent.run(script, timeout)
    }

    /// The guest agent's host side, for the harness's own tests of its protocol.
    #[doc(hidden)]
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// Runs `script` and returns its stdout; panics (failing the test) with everything it printed
    /// if it exits non-zero or the VM does not answer.
    pub fn run_ok(&self, script: &str) -> String {
        match self.run(script) {
            Ok(out) if out.success() => out.stdout,
            Ok(out) => panic!(
                "VM script failed with status {}:\n--- script\n{script}\n--- stdout\n{}--- stderr\n{}--- console\n{}",
                out.status,
                out.stdout,
                out.stderr,
                self.console_tail()
            ),
            Err(e) => panic!(
                "VM script did not complete: {e:#}\n--- script\n{script}\n--- console\n{}",
                self.console_tail()
            ),
        }
    }

    /// Writes a file into the shared I/O directory and returns its path inside the guest: the way
    /// to hand the guest files made on the host after it booted (the guest caches the host's root).
    pub fn put(&self, name: &str, contents: &[u8]) -> anyhow::Result<String> {
        anyhow::ensure!(
            !name.is_empty() && !name.contains('/') && !name.starts_with('.'),
            "put: {name:?} must be a plain file name"
        );
        fs::write(self.run_dir.join("io").join(name), contents)?;
        Ok(format!("{}/{name}", crate::GUEST_IO_DIR))
    }

    /// The guest kernel's `uname -r`.
    pub fn kernel_release(&self) -> &str {
        &self.release
    }

    /// Modules of [`crate::MODULES`] that did not load at boot (empty when all did).
    pub fn missing_modules(&self) -> &[String] {
        &self.missing_modules
    }

    pub fn boot_times(&self) -> BootTimes {
        self.times
    }

    /// The last lines of the guest's serial console (kernel messages, init errors).
    pub fn console_tail(&self) -> String {
        console_tail(&self.run_dir.join("console.log"))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        stop(self.qemu_pid, &self.run_dir);
    }
}

fn stop(pid: u32, run_dir: &Path) {
    kill(pid);
    let _ = fs::remove_dir_all(run_dir);
}

fn kill(pid: u32) {
    // SAFETY: kill(2) on the pid of the qemu this process started (it is a zombie at worst,
    // as its keeper thread reaps it, so the pid cannot have been reused).
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

fn launch(
    qemu: &str,
    prepared: &Prepared,
    run_dir: &Path,
    prepare_time: Duration,
) -> Result<Vm, Skip> {
    let io_dir = run_dir.join("io");
    let socket = run_dir.join("agent.sock");
    let console_log = run_dir.join("console.log");
    let setup = |e: std::io::Error| Skip(format!("cannot set up {}: {e}", run_dir.display()));
    fs::create_dir_all(&io_dir).map_err(setup)?;
    let listener = UnixListener::bind(&socket).map_err(setup)?;
    listener.set_nonblocking(true).map_err(setup)?;

    let accel = qemu::choose_accel(
        std::env::var("WEIR_VM_ACCEL").ok().as_deref(),
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok(),
        &fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
    );
    let spec = Spec {
        accel,
        memory_mib: env_number("WEIR_VM_MEMORY_MIB", 1536),
        // Under emulation one virtual CPU boots and runs the tests faster than two on a busy
        // 2-core host (measured: 11 s vs 17 s boot, 33 s vs 50 s for tests/vm.rs).
        cpus: env_number("WEIR_VM_CPUS", if accel == Accel::Kvm { 2 } else { 1 }),
        kernel: prepared.kernel.image.clone(),
        initramfs: prepared.initramfs.clone(),
        io_dir: io_dir.clone(),
        agent_socket: socket,
        console_log: console_log.clone(),
    };
    let boot_timeout = Duration::from_secs(env_number("WEIR_VM_BOOT_TIMEOUT", 90).into());
    let started = Instant::now();
    let (pid, exited) = spawn_qemu(qemu, &qemu::args(&spec), &run_dir.join("qemu.log"))
        .map_err(|e| Skip(format!("cannot start {qemu}: {e}")))?;
    let not_booted = |why: String| {
        kill(pid);
        Skip(format!(
            "the VM did not boot ({accel:?}): {why}\n--- qemu\n{}--- console\n{}",
            fs::read_to_string(run_dir.join("qemu.log")).unwrap_or_default(),
            console_tail(&console_log)
        ))
    };
    let deadline = started + boot_timeout;
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(not_booted(format!("accept: {e}"))),
        }
        if let Some(status) = *exited.lock().unwrap() {
            return Err(not_booted(format!("qemu exited ({status})")));
        }
        if Instant::now() > deadline {
            return Err(not_booted("qemu did not connect".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (release, missing) = wait_ready(&stream, deadline, &exited).map_err(&not_booted)?;
    let boot_time = started.elapsed();
    let reader_stream = stream.try_clone().map_err(|e| not_booted(e.to_string()))?;
    let reader = BufReader::new(reader_stream);
    // `wait_ready` read through its own buffer up to the end of the READY line only.
    let agent = Agent::start(stream, reader, io_dir);
    register_cleanup(pid, run_dir);
    Ok(Vm {
        agent,
        release,
        missing_modules: missing,
        times: BootTimes {
            prepare: prepare_time,
            boot: boot_time,
            accel,
        },
        qemu_pid: pid,
        run_dir: run_dir.to_path_buf(),
    })
}

/// Reads the `READY` line byte by byte (so nothing after it is consumed from the socket), giving
/// up at `deadline` or when qemu exits.
fn wait_ready(
    stream: &UnixStream,
    deadline: Instant,
    exited: &Mutex<Option<ExitStatus>>,
) -> Result<(String, Vec<String>), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(
                "no READY from the guest agent within the boot timeout (WEIR_VM_BOOT_TIMEOUT)"
                    .into(),
            );
        }
        stream
            .set_read_timeout(Some(left.min(Duration::from_millis(500))))
            .map_err(|e| e.to_string())?;
        match std::io::Read::read(&mut &*stream, &mut byte) {
            Ok(0) => return Err("the guest closed the agent port before READY".into()),
            Ok(_) if byte[0] == b'\n' => {
                let text = String::from_utf8_lossy(&line).into_owned();
                match agent::parse_message(&text) {
                    Some(Message::Ready { release, missing }) => {
                        stream.set_read_timeout(None).map_err(|e| e.to_string())?;
                        return Ok((release, missing));
                    }
                    _ => line.clear(),
                }
            }
            Ok(_) => line.push(byte[0]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if let Some(status) = *exited.lock().unwrap() {
                    return Err(format!("qemu exited ({status})"));
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Starts qemu from a thread that lives as long as qemu does and reaps it. qemu gets SIGKILL when
/// that thread ends (`PR_SET_PDEATHSIG` follows the spawning *thread*), i.e. when this process
/// exits: a test binary never leaves a VM behind, even when killed.
fn spawn_qemu(
    qemu: &str,
    args: &[String],
    log: &Path,
) -> std::io::Result<(u32, Arc<Mutex<Option<ExitStatus>>>)> {
    let log = fs::File::create(log)?;
    let mut cmd = Command::new(qemu);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let exited = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let record = exited.clone();
    std::thread::spawn(move || match cmd.spawn() {
        Ok(mut child) => {
            let _ = tx.send(Ok(child.id()));
            if let Ok(status) = child.wait() {
                *record.lock().unwrap() = Some(status);
            }
        }
        Err(e) => {
            let _ = tx.send(Err(e));
        }
    });
    let pid = rx
        .recv()
        .map_err(|_| std::io::Error::other("the qemu keeper thread died"))??;
    Ok((pid, exited))
}

/// The shared VM lives in a `static`, which is never dropped: its run directory is removed at
/// process exit instead (qemu itself dies with the process, see [`spawn_qemu`]).
fn register_cleanup(pid: u32, run_dir: &Path) {
    static VMS: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());
    static REGISTERED: OnceLock<()> = OnceLock::new();
    extern "C" fn at_exit() {
        if let Ok(vms) = VMS.lock() {
            for (pid, dir) in vms.iter() {
                stop(*pid, dir);
            }
        }
    }
    VMS.lock().unwrap().push((pid, run_dir.to_path_buf()));
    REGISTERED.get_or_init(|| {
        // SAFETY: registering a plain extern "C" function.
        unsafe {
            libc::atexit(at_exit);
        }
    });
}

/// `<tmp>/weir-vm-<pid>-<n>`, after removing those of processes that no longer exist.
fn new_run_dir() -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let tmp = std::env::temp_dir();
    if let Ok(entries) = fs::read_dir(&tmp) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let owner = name
                .strip_prefix("weir-vm-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if let Some(pid) = owner {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = tmp.join(format!("weir-vm-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn console_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(30);
    lines[start..].iter().map(|l| format!("{l}\n")).collect()
}

fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn on_path(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}
