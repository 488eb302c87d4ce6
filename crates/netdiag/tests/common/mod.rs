//! What the trace tests share: the fixture directories, one TCP packet's walk (printed, so a
//! failing case shows the whole path) and a hop lookup.
#![allow(dead_code)] // each test binary uses its own subset

pub mod ns;
pub mod scratch;

use std::path::PathBuf;

use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto, Trace};

/// `tests/data/<name>`.
pub fn data_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A TCP packet from `src:40000` to `dst:dport` arriving on `iif`, walked through `st`.
pub fn walk(st: &NodeState, src: &str, dst: &str, dport: u16, iif: &str) -> Trace {
    let t = trace::trace(
        st,
        &Packet {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto: Proto::Tcp,
            sport: 40000,
            dport,
            iif: iif.into(),
        },
    );
    eprintln!("{}", trace::render(&t));
    t
}

/// An ICMP echo request from `src` to `dst` arriving on `iif` (`local`: sent by the node).
pub fn walk_icmp(st: &NodeState, src: &str, dst: &str, iif: &str) -> Trace {
    let t = trace::trace(
        st,
        &Packet {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto: Proto::Icmp,
            sport: 1,
            dport: 0,
            iif: iif.into(),
        },
    );
    eprintln!("{}", trace::render(&t));
    t
}

/// Whether a hop of `stage` quotes a rule containing `rule_part` and says `note_part`.
pub fn has_hop(t: &Trace, stage: &str, rule_part: &str, note_part: &str) -> bool {
    t.hops.iter().any(|h| {
        h.stage == stage
            && h.rule.as_deref().unwrap_or("").contains(rule_part)
            && h.note.contains(note_part)
    })
}
