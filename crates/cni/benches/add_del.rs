//! ADD and DEL latency of weir-cni against Debian's reference bridge + host-local, measured side by
//! side in one run: same machine, same kind of namespaces, same configuration, rounds interleaved so
//! that noise hits both alike. Run as root: `cargo bench -p weir-cni --bench add_del`.
//! Environment: ROUNDS (default 3), SEQ (pods per sequential round, default 20), PAR (concurrency,
//! default 20).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{run_plugin, TestNs};

const REFERENCE: &str = "/usr/lib/cni/bridge";

#[derive(Clone, Copy, PartialEq)]
enum Plugin {
    Weir,
    Reference,
}

impl Plugin {
    fn name(self) -> &'static str {
        match self {
            Plugin::Weir => "weir-cni",
            Plugin::Reference => "reference bridge+host-local",
        }
    }
    fn binary(self) -> PathBuf {
        match self {
            Plugin::Weir => PathBuf::from(env!("CARGO_BIN_EXE_weir-cni")),
            Plugin::Reference => PathBuf::from(REFERENCE),
        }
    }
    fn config(self, data: &Path, masq: bool) -> String {
        let (kind, ipam) = match self {
            Plugin::Weir => ("weir-cni", "weir-ipam"),
            Plugin::Reference => ("bridge", "host-local"),
        };
        format!(
            r#"{{"cniVersion":"1.0.0","name":"bench","type":"{kind}","bridge":"cni0","mtu":1500,
                "isGateway":true,"hairpinMode":true,"ipMasq":{masq},
                "ipam":{{"type":"{ipam}","ranges":[[{{"subnet":"10.97.0.0/16"}}]],"dataDir":"{}",
                        "routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#,
            data.display()
        )
    }
}

#[derive(Default)]
struct Samples {
    add_seq: Vec<Duration>,
    del_seq: Vec<Duration>,
    add_par: Vec<Duration>,
    del_par: Vec<Duration>,
}

fn timed(plugin: Plugin, node: &TestNs, cmd: &str, id: &str, pod: &TestNs, conf: &str) -> Duration {
    let start = Instant::now();
    let run = run_plugin(
        &plugin.binary(),
        node,
        cmd,
        id,
        Some(&pod.path()),
        "eth0",
        conf,
    );
    let took = start.elapsed();
    assert_eq!(
        run.code,
        Some(0),
        "{} {cmd} failed: {}{}",
        plugin.name(),
        run.stdout,
        run.stderr
    );
    took
}

fn round(plugin: Plugin, round: usize, seq: usize, par: usize, masq: bool, s: &mut Samples) {
    let tag = format!(
        "wb{}{}{}",
        std::process::id() % 10000,
        if plugin == Plugin::Weir { "w" } else { "r" },
        round
    );
    let node = TestNs::new(&format!("{tag}-node"));
    let data = tempfile::tempdir().unwrap();
    let conf = plugin.config(data.path(), masq);
    let pods: Vec<TestNs> = (0..seq.max(par))
        .map(|i| TestNs::new(&format!("{tag}-{i}")))
        .collect();
    // Warm-up: the first ADD creates the bridge and tables; not what a steady node does per pod.
    let warm = TestNs::new(&format!("{tag}-warm"));
    timed(plugin, &node, "ADD", "warm", &warm, &conf);

    for (i, pod) in pods.iter().take(seq).enumerate() {
        s.add_seq
            .push(timed(plugin, &node, "ADD", &format!("s{i}"), pod, &conf));
    }
    for (i, pod) in pods.iter().take(seq).enumerate() {
        s.del_seq
            .push(timed(plugin, &node, "DEL", &format!("s{i}"), pod, &conf));
    }
    for cmd in ["ADD", "DEL"] {
        let took: Vec<Duration> = std::thread::scope(|sc| {
            let handles: Vec<_> = pods
                .iter()
                .take(par)
                .enumerate()
                .map(|(i, pod)| {
                    let (node, conf) = (&node, &conf);
                    sc.spawn(move || timed(plugin, node, cmd, &format!("p{i}"), pod, conf))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        if cmd == "ADD" {
            s.add_par.extend(took)
        } else {
            s.del_par.extend(took)
        }
    }
}

fn median_ms(v: &[Duration]) -> f64 {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if ms.is_empty() {
        return f64::NAN;
    }
    let n = ms.len();
    if n % 2 == 1 {
        ms[n / 2]
    } else {
        (ms[n / 2 - 1] + ms[n / 2]) / 2.0
    }
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would pass nothing useful: only run when benched.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    assert!(
        Path::new(REFERENCE).exists(),
        "install containernetworking-plugins for the reference plugin"
    );
    let (rounds, seq, par) = (
        env_usize("ROUNDS", 3),
        env_usize("SEQ", 20),
        env_usize("PAR", 20),
    );
    println!("weir-cni vs reference: {rounds} rounds, {seq} sequential pods and {par} concurrent pods per round");
    for masq in [true, false] {
        let mut weir = Samples::default();
        let mut reference = Samples::default();
        for r in 0..rounds {
            eprintln!("  ipMasq={masq} round {}/{rounds}", r + 1);
            // Alternate which goes first so that drift in machine load favours neither.
            if r % 2 == 0 {
                round(Plugin::Weir, r, seq, par, masq, &mut weir);
                round(Plugin::Reference, r, seq, par, masq, &mut reference);
            } else {
                round(Plugin::Reference, r, seq, par, masq, &mut reference);
                round(Plugin::Weir, r, seq, par, masq, &mut weir);
            }
        }
        println!("\nipMasq={masq}: median latency per call (ms)");
        println!("| operation | weir-cni | reference | weir / reference |");
        println!("|---|---:|---:|---:|");
        for (label, w, r) in [
            ("ADD sequential", &weir.add_seq, &reference.add_seq),
            ("DEL sequential", &weir.del_seq, &reference.del_seq),
            (
                &*format!("ADD {par}-way concurrent"),
                &weir.add_par,
                &reference.add_par,
            ),
            (
                &*format!("DEL {par}-way concurrent"),
                &weir.del_par,
                &reference.del_par,
            ),
        ] {
            let (wm, rm) = (median_ms(w), median_ms(r));
            println!(
                "| {label} (n={}) | {wm:.1} | {rm:.1} | {:.2} |",
                w.len(),
                wm / rm
            );
        }
    }
}
