//! ADD and DEL latency of weir-cni against Debian's reference plugins, measured side by side in
//! one run: same machine, same kind of namespaces, rounds interleaved so that noise hits both
//! alike. Two comparisons, each with the closest reference shape:
//! - bridge mode vs `bridge` + `host-local` (same bridge configuration, `ipMasq` on and off);
//! - eni-shared mode vs `ptp` + `host-local` (a veth, a /32, a host route), on a node namespace
//!   whose "ENI" is one end of a veth pair.
//!
//! Run as root: `cargo bench -p weir-cni --bench add_del`. Environment: ROUNDS (default 3), SEQ
//! (pods per sequential round, default 20), PAR (concurrency, default 20), BENCH (`bridge`, `eni`
//! or both, the default).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{run_plugin, TestNs};

const REFERENCE_BRIDGE: &str = "/usr/lib/cni/bridge";
const REFERENCE_PTP: &str = "/usr/lib/cni/ptp";

#[derive(Clone, Copy, PartialEq)]
enum Plugin {
    WeirBridge,
    ReferenceBridge,
    WeirEni,
    ReferencePtp,
}

/// The ENI's addresses in the eni-shared configuration: its own (.10) and enough for every pod.
const ENI_ADDRESSES: std::ops::Range<u8> = 10..100;

impl Plugin {
    fn name(self) -> &'static str {
        match self {
            Plugin::WeirBridge => "weir-cni bridge",
            Plugin::ReferenceBridge => "reference bridge+host-local",
            Plugin::WeirEni => "weir-cni eni-shared",
            Plugin::ReferencePtp => "reference ptp+host-local",
        }
    }
    fn is_weir(self) -> bool {
        matches!(self, Plugin::WeirBridge | Plugin::WeirEni)
    }
    fn binary(self) -> PathBuf {
        match self {
            Plugin::WeirBridge | Plugin::WeirEni => PathBuf::from(env!("CARGO_BIN_EXE_weir-cni")),
            Plugin::ReferenceBridge => PathBuf::from(REFERENCE_BRIDGE),
            Plugin::ReferencePtp => PathBuf::from(REFERENCE_PTP),
        }
    }
    /// What the node namespace needs before the first ADD (the eni-shared network's ENI).
    fn prepare(self, node: &TestNs) {
        if self == Plugin::WeirEni {
            let out = std::process::Command::new("sh")
                .args([
                    "-ec",
                    &format!(
                    "ip -n {n} link add eth1 type veth peer name vpc1; ip -n {n} link set vpc1 up",
                    n = node.name
                ),
                ])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    fn config(self, data: &Path, masq: bool) -> String {
        let data = data.display();
        match self {
            Plugin::WeirBridge | Plugin::ReferenceBridge => {
                let (kind, ipam) = if self == Plugin::WeirBridge {
                    ("weir-cni", "weir-ipam")
                } else {
                    ("bridge", "host-local")
                };
                format!(
                    r#"{{"cniVersion":"1.0.0","name":"bench","type":"{kind}","bridge":"cni0","mtu":1500,
                        "isGateway":true,"hairpinMode":true,"ipMasq":{masq},
                        "ipam":{{"type":"{ipam}","ranges":[[{{"subnet":"10.97.0.0/16"}}]],"dataDir":"{data}",
                                "routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#
                )
            }
            Plugin::WeirEni => {
                let addrs: Vec<String> =
                    ENI_ADDRESSES.map(|i| format!("\"10.98.0.{i}\"")).collect();
                format!(
                    r#"{{"cniVersion":"1.0.0","name":"bench","type":"weir-cni","mode":"eni-shared",
                        "eniName":"eth1","eniGateway":"10.98.0.1","routeTable":1003,"mtu":1500,
                        "eniAddresses":[{}],"dataDir":"{data}"}}"#,
                    addrs.join(",")
                )
            }
            // ipMasq off: eni-shared masquerades nothing either.
            Plugin::ReferencePtp => format!(
                r#"{{"cniVersion":"1.0.0","name":"bench","type":"ptp","mtu":1500,"ipMasq":false,
                    "ipam":{{"type":"host-local","ranges":[[{{"subnet":"10.98.0.0/24"}}]],
                            "dataDir":"{data}","routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#
            ),
        }
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
        if plugin.is_weir() { "w" } else { "r" },
        round
    );
    let node = TestNs::new(&format!("{tag}-node"));
    plugin.prepare(&node);
    let data = tempfile::tempdir().unwrap();
    let conf = plugin.config(data.path(), masq);
    let pods: Vec<TestNs> = (0..seq.max(par))
        .map(|i| TestNs::new(&format!("{tag}-{i}")))
        .collect();
    // Warm-up: the first ADD creates the bridge (or the ENI's node state) and tables; not what a
    // steady node does per pod.
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

/// One side-by-side comparison: rounds interleaved, then the table of medians.
fn compare(weir_p: Plugin, reference_p: Plugin, masq: bool, rounds: usize, seq: usize, par: usize) {
    let mut weir = Samples::default();
    let mut reference = Samples::default();
    for r in 0..rounds {
        eprintln!("  {} ipMasq={masq} round {}/{rounds}", weir_p.name(), r + 1);
        // Alternate which goes first so that drift in machine load favours neither.
        if r % 2 == 0 {
            round(weir_p, r, seq, par, masq, &mut weir);
            round(reference_p, r, seq, par, masq, &mut reference);
        } else {
            round(reference_p, r, seq, par, masq, &mut reference);
            round(weir_p, r, seq, par, masq, &mut weir);
        }
    }
    println!(
        "\n{} vs {}, ipMasq={masq}: median latency per call (ms)",
        weir_p.name(),
        reference_p.name()
    );
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

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would pass nothing useful: only run when benched.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for reference in [REFERENCE_BRIDGE, REFERENCE_PTP] {
        assert!(
            Path::new(reference).exists(),
            "{reference} is missing: install containernetworking-plugins"
        );
    }
    let (rounds, seq, par) = (
        env_usize("ROUNDS", 3),
        env_usize("SEQ", 20),
        env_usize("PAR", 20),
    );
    assert!(
        seq.max(par) + 2 <= ENI_ADDRESSES.len(),
        "SEQ and PAR must leave room in the ENI's {} addresses",
        ENI_ADDRESSES.len()
    );
    let which = std::env::var("BENCH").unwrap_or_default();
    println!("weir-cni vs reference: {rounds} rounds, {seq} sequential pods and {par} concurrent pods per round");
    if which.is_empty() || which == "bridge" {
        for masq in [true, false] {
            compare(
                Plugin::WeirBridge,
                Plugin::ReferenceBridge,
                masq,
                rounds,
                seq,
                par,
            );
        }
    }
    if which.is_empty() || which == "eni" {
        compare(
            Plugin::WeirEni,
            Plugin::ReferencePtp,
            false,
            rounds,
            seq,
            par,
        );
    }
}
