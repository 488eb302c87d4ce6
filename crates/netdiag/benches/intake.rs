//! Reading a 10 MB paste (the ticket body of `tests/data/pasted-mixed` over and over: ~40,000
//! outputs of twelve kinds): splitting and classifying alone, then the whole node state.
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
