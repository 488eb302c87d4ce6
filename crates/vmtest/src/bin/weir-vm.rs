//! `weir-vm '<shell command>'`: boots the test VM (Debian's kernel, this machine's root
//! filesystem), runs the command as root in it, prints its output and exits with its status.
//! `bash scripts/dev.sh vm -- '<command>'` runs this.

use std::io::Write;
use std::process::ExitCode;

use weir_vmtest::Vm;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "-h" || args[0] == "--help" {
        eprintln!(
            "usage: weir-vm '<shell command>'   (run as root inside a VM with Debian's kernel)"
        );
        return ExitCode::from(2);
    }
    let script = args.join(" ");
    let vm = match Vm::boot() {
        Ok(vm) => vm,
        Err(skip) => {
            eprintln!("weir-vm: no VM: {skip}");
            return ExitCode::from(3);
        }
    };
    let t = vm.boot_times();
    eprintln!(
        "weir-vm: kernel {}, prepared in {:.1} s, booted in {:.1} s ({:?}){}",
        vm.kernel_release(),
        t.prepare.as_secs_f64(),
        t.boot.as_secs_f64(),
        t.accel,
        match vm.missing_modules() {
            [] => String::new(),
            m => format!("; modules that did not load: {}", m.join(",")),
        }
    );
    // Interactive use: no per-command limit worth hitting.
    match vm.run_timeout(&script, std::time::Duration::from_secs(3600)) {
        Ok(out) => {
            print!("{}", out.stdout);
            eprint!("{}", out.stderr);
            let _ = std::io::stdout().flush();
            eprintln!(
                "weir-vm: exit {} after {:.2} s",
                out.status,
                out.elapsed.as_secs_f64()
            );
            ExitCode::from(u8::try_from(out.status).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("weir-vm: {e:#}\n--- console\n{}", vm.console_tail());
            ExitCode::from(1)
        }
    }
}
