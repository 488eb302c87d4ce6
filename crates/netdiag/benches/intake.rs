//! Reading a 10 MB paste (the ticket body of `tests/data/pasted-mixed` over and over: ~40,000
//! outputs of twelve kinds): splitting and classifying alone, then the whole node state; and
//! one 10 MB output (`conntrack -L`, the paste that gets large).
//!
//! ```sh
//! cargo bench -p weir-netdiag --bench intake
//! ```

use std::time::Instant;

use weir_netdiag::intake;
use weir_netdiag::state::NodeState;

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/pasted-mixed");
    let body = std::fs::read_to_string(dir.join("ticket-body.md")).expect("fixture");
    let mut blob = String::with_capacity(11 << 20);
    while blob.len() < 10 << 20 {
        blob.push_str(&body);
    }
    let mb = blob.len() as f64 / (1 << 20) as f64;
    let entry = "tcp      6 86397 ESTABLISHED src=10.244.1.5 dst=10.96.0.1 sport=40000 dport=443 src=10.0.0.5 dst=10.244.1.5 sport=6443 dport=40000 [ASSURED] mark=0 use=1\n";
    let conntrack = format!("$ conntrack -L\n{}", entry.repeat((10 << 20) / entry.len()));
    let t = Instant::now();
    let st = NodeState::from_sources([("conntrack.txt".to_string(), conntrack)]);
    println!(
        "one 10 MB conntrack -L: {} entries in {:.0} ms",
        st.conntrack.as_ref().map_or(0, Vec::len),
        t.elapsed().as_secs_f64() * 1e3
    );
    for round in 0..3 {
        let t = Instant::now();
        let sections = intake::sections("big.md", &blob);
        let split = t.elapsed();
        let t = Instant::now();
        let st = NodeState::from_sources([("big.md".to_string(), blob.clone())]);
        let whole = t.elapsed();
        println!(
            "round {round}: {mb:.1} MB, {} sections: split+classify {:.0} ms, node state {:.0} ms ({} routes)",
            sections.len(),
            split.as_secs_f64() * 1e3,
            whole.as_secs_f64() * 1e3,
            st.routes.as_ref().map_or(0, Vec::len)
        );
    }
}
