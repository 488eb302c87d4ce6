//! Runs the conformance suite (tests/conformance) against weir-cni and the reference plugins and
//! prints the table: case | expected per spec | weir-cni | reference. CI fails on any weir-cni case
//! that does not pass; the reference column only documents.
//!
//! Regenerate docs/cni-conformance.md:
//!     WEIR_CNI_CONFORMANCE_DOC=1 cargo test -p weir-cni --test cni_conformance -- --nocapture
//! Add a column for another bridge-like plugin (its IPAM plugin beside it, host-local by default):
//!     WEIR_CNI_CONFORMANCE_PLUGIN=/path/to/bridge [WEIR_CNI_CONFORMANCE_IPAM=host-local] cargo test ...

mod common;
mod conformance;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use conformance::cases::{self, Case};
use conformance::{Ctx, Flavor};

type Outcome = Result<(), String>;

fn flavors() -> Vec<Flavor> {
    let reference = Flavor::reference();
    assert!(
        reference.binary.exists(),
        "{} is missing: install containernetworking-plugins (scripts/dev.sh does)",
        reference.binary.display()
    );
    let mut all = vec![Flavor::weir(), reference];
    if let Ok(path) = std::env::var("WEIR_CNI_CONFORMANCE_PLUGIN") {
        let ipam = std::env::var("WEIR_CNI_CONFORMANCE_IPAM").unwrap_or("host-local".into());
        all.push(Flavor::custom(&path, Path::new(&path), &ipam));
    }
    all
}

/// Runs every case against one plugin, a few cases at a time (each in its own namespaces).
fn run_all(flavor: &Flavor, slot: usize, cases: &[Case]) -> Vec<Outcome> {
    const THREADS: usize = 3;
    let mut out: Vec<Option<Outcome>> = (0..cases.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    (t..cases.len())
                        .step_by(THREADS)
                        .map(|i| (i, run_case(flavor, slot, i, &cases[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for (i, o) in h.join().unwrap() {
                out[i] = Some(o);
            }
        }
    });
    out.into_iter().map(Option::unwrap).collect()
}

fn run_case(flavor: &Flavor, slot: usize, index: usize, case: &Case) -> Outcome {
    let tag = format!("{}-k{index}f{slot}", common::unique("cf"));
    let started = std::time::Instant::now();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let ctx = Ctx::new(flavor, tag);
        (case.check)(&ctx)
    }))
    .unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("panicked: {}", conformance::short(&msg)))
    });
    let took = started.elapsed();
    if took > std::time::Duration::from_secs(1) {
        println!("slow case ({took:?}, {}): {}", flavor.label, case.name);
    }
    outcome
}

fn cell(o: &Outcome) -> String {
    match o {
        Ok(()) => "pass".into(),
        Err(e) => format!("**FAIL**: {}", e.replace('|', "\\|")),
    }
}

fn table(cases: &[Case], flavors: &[Flavor], results: &[Vec<Outcome>]) -> String {
    let mut t = String::from("| case | expected per spec |");
    for f in flavors {
        t.push_str(&format!(" {} |", f.label));
    }
    t.push_str("\n|---|---|");
    t.push_str(&"---|".repeat(flavors.len()));
    t.push('\n');
    for (i, c) in cases.iter().enumerate() {
        t.push_str(&format!("| {} | {} |", c.name, c.expected));
        for r in results {
            t.push_str(&format!(" {} |", cell(&r[i])));
        }
        t.push('\n');
    }
    let totals: Vec<String> = flavors
        .iter()
        .zip(results)
        .map(|(f, r)| {
            format!(
                "{}: {}/{} pass",
                f.label,
                r.iter().filter(|o| o.is_ok()).count(),
                r.len()
            )
        })
        .collect();
    t.push_str(&format!("\n{}\n", totals.join(" · ")));
    t
}

const DOC_HEAD: &str = "# CNI conformance\n\n\
The project's own conformance suite (`crates/cni/tests/conformance/`, run by \
`crates/cni/tests/cni_conformance.rs`): the CNI spec's verbs × versions, the reference `bridge` + \
`host-local` configuration keys and the probes of issue 7, each case in its own network namespaces \
and IPAM directory, run against weir-cni and against Debian 12's containernetworking-plugins 1.1.1 \
(`/usr/lib/cni/bridge` + `host-local`). CI fails when a weir-cni case fails; the reference column \
documents the reference's own behaviour and never fails CI.\n\n\
Regenerate this file (as root, on Debian 12 with scripts/dev.sh's packages):\n\n\
```sh\nWEIR_CNI_CONFORMANCE_DOC=1 cargo test -p weir-cni --test cni_conformance -- --nocapture\n```\n\n\
Another bridge-compatible plugin gets a column with `WEIR_CNI_CONFORMANCE_PLUGIN=/path/to/plugin` \
(its IPAM plugin beside it; `WEIR_CNI_CONFORMANCE_IPAM`, default `host-local`).\n\n\
\"Expected\" is the spec's requirement where it states one (VERSION, CHECK/GC/STATUS by version, \
error codes 1, 6 and 50, DEL idempotence, ADD twice); for the reference's configuration keys it is \
what an operator migrating a conflist needs: the key honoured, or an error naming it.\n\n\
Reading the reference column: plugins 1.1.1 predate spec 1.1, so they reject cniVersion 1.1.0 (every \
case built on a 1.1.0 ADD fails there) and know no GC or STATUS; their VERSION reply always says \
1.0.0; bridge 1.1.1 replaces the IPAM result's DNS with the configuration's `dns` (so host-local's \
`resolvConf` is lost) and predates `disableContainerInterface`; `vlan` needs bridge VLAN filtering \
in the kernel, which the machine this table was generated on lacks.\n\n";

#[test]
fn cni_conformance() {
    let flavors = flavors();
    let cases = cases::all();
    let results: Vec<Vec<Outcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = flavors
            .iter()
            .enumerate()
            .map(|(slot, f)| {
                let cases = &cases;
                s.spawn(move || run_all(f, slot, cases))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let table = table(&cases, &flavors, &results);
    println!("{table}");
    let generated = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cni-conformance.md");
    std::fs::write(&generated, format!("{DOC_HEAD}{table}")).unwrap();
    println!("table written to {}", generated.display());
    if std::env::var_os("WEIR_CNI_CONFORMANCE_DOC").is_some() {
        let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cni-conformance.md");
        std::fs::write(&doc, format!("{DOC_HEAD}{table}")).unwrap();
        println!("and to {}", doc.display());
    }

    let weir_failures: Vec<String> = cases
        .iter()
        .zip(&results[0])
        .filter_map(|(c, o)| o.as_ref().err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    assert!(
        weir_failures.is_empty(),
        "weir-cni fails {} conformance case(s):\n{}",
        weir_failures.len(),
        weir_failures.join("\n")
    );
}
