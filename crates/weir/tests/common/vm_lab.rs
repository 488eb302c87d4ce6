//! A whole `weir lab` inside the qemu VM (weir-vmtest: Debian's kernel, with IPVS and `dummy`),
//! with this build's `weir` and `weir-cni`: up, `check --json`, down, in one script. Shared by
//! the VM tests that run the lab (`lab_eni_vm`, `proxy_ipvs_vm`).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{runnable, weir_cni, WEIR};

/// One lab (or other VM test) at a time in the VM: under TCG it has one emulated CPU, and two
/// labs probing at once made the lab's 1 s reject/no-answer windows miss (seen once at load ~17).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The shared VM and this test's turn in it; `None` (a recorded skip; a failure under CI=true)
/// when not root or when the VM cannot run here (docs/vm.md).
pub fn vm_turn() -> Option<(&'static weir_vmtest::Vm, MutexGuard<'static, ()>)> {
    if !runnable() {
        return None;
    }
    let vm = weir_vmtest::shared_or_skip()?;
    let turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    Some((vm, turn))
}

/// `WEIR_LAB_TIMEOUT_SCALE` of the VM's labs: their startup waits, and their probes'
/// refusal and answer windows, are this many times the host's (software emulation).
pub const TIMEOUT_SCALE: u32 = 8;

/// What a lab run in the VM left: check's exit status and JSON, and the script's stderr (`lab
/// up`'s progress with its timings, check's table, whatever `after` printed).
pub struct LabRun {
    pub check_ok: bool,
    pub json: Value,
    pub log: String,
}

/// `weir lab up <topology> --proxy-mode <proxy>` in the VM, `weir lab check --json`, then the
/// shell lines `after` (which may use `$LAB`; their output to stderr lands in the log), then
/// `weir lab down` (also when something fails). `topology` starts with its `name: ` line.
pub fn run(vm: &weir_vmtest::Vm, name: &str, topology: &str, proxy: &str, after: &str) -> LabRun {
    run_checks(vm, name, topology, proxy, after, false)
}

/// [`run`], but a failed `weir lab check` is run once more and the second one is returned (the
/// first's JSON goes to the log, after "## first check failed"). For labs whose every probe
/// must pass: under software emulation on a loaded machine one probe's answer once took longer
/// than its (scaled) 16 s. A lab that is wrong fails both checks.
pub fn run_rechecked(
    vm: &weir_vmtest::Vm,
    name: &str,
    topology: &str,
    proxy: &str,
    after: &str,
) -> LabRun {
    run_checks(vm, name, topology, proxy, after, true)
}

fn run_checks(
    vm: &weir_vmtest::Vm,
    name: &str,
    topology: &str,
    proxy: &str,
    after: &str,
    recheck: bool,
) -> LabRun {
    let cni = weir_cni();
    let recheck = if recheck { "1" } else { "" };
    let script = format!(
        "set -e
LAB={name}
export WEIR_LAB_STATE=/tmp/wl-state-{name} WEIR_CNI={cni} WEIR_LAB_TIMEOUT_SCALE={TIMEOUT_SCALE}
mkdir -p $WEIR_LAB_STATE
trap '{WEIR} lab down {name} >/dev/null 2>&1 || true' EXIT
cat > $WEIR_LAB_STATE/topology-input.yaml <<'TOPOLOGY'
{topology}TOPOLOGY
{WEIR} lab up $WEIR_LAB_STATE/topology-input.yaml --proxy-mode {proxy} >&2
set +e
{WEIR} lab check {name} --json > $WEIR_LAB_STATE/check.json
st=$?
if [ $st != 0 ] && [ -n \"{recheck}\" ]; then
  echo \"## first check failed (status $st):\" >&2
  cat $WEIR_LAB_STATE/check.json >&2
  {WEIR} lab check {name} --json > $WEIR_LAB_STATE/check.json
  st=$?
fi
cat $WEIR_LAB_STATE/check.json
echo \"check status $st\" >&2
{after}
exit 0
",
        cni = cni.display()
    );
    let started = Instant::now();
    let out = vm
        .run_timeout(&script, Duration::from_secs(600))
        .expect("the VM answers");
    eprintln!(
        "timing: lab {name} ({proxy}): up + check + down in the VM {:?}",
        started.elapsed()
    );
    let (stdout, stderr) = (out.stdout, out.stderr);
    assert_eq!(out.status, 0, "script failed:\n{stderr}\n{stdout}");
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("check --json: {e}\nstdout:\n{stdout}\nstderr:\n{stderr}"));
    // shown with --nocapture, and in the callers' assertion messages
    eprintln!("{name}:\n{stderr}");
    LabRun {
        check_ok: stderr.contains("check status 0"),
        json,
        log: stderr,
    }
}
