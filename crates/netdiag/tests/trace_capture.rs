//! A pasted tcpdump as evidence (issue 30): each leg of the walk on an interface the capture
//! covers is shown seen or not seen. Two real captures of one NodePort connection on a node
//! that DNATs and masquerades (`tests/data/tcpdump-answered/README.md`): answered, the four legs
//! are seen; with the backend dropping the SYN, the request is seen leaving and no reply is.

mod common;

use common::{data_dir, has_hop, walk};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::Verdict;

fn node(dir: &str) -> NodeState {
    let (st, _) = NodeState::from_dir(&data_dir(dir)).unwrap();
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    st
}

#[test]
fn an_answered_connection_is_seen_on_every_leg() {
    let t = walk(
        &node("tcpdump-answered"),
        "10.50.0.2",
        "10.50.0.1",
        30080,
        "eth0",
    );
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    for (iface, what, line) in [
        (
            "eth0",
            "the request as it arrived (10.50.0.2 → 10.50.0.1): seen",
            "eth0  In  IP 10.50.0.2.",
        ),
        (
            "eth1",
            "the request as it left (10.60.0.1 → 10.60.0.2): seen",
            "eth1  Out IP 10.60.0.1.",
        ),
        (
            "eth1",
            "its reply as it came back (10.60.0.2 → 10.60.0.1): seen",
            "Flags [S.]",
        ),
        (
            "eth0",
            "its reply as it left for the client (10.50.0.1 → 10.50.0.2): seen",
            "eth0  Out IP 10.50.0.1.30080",
        ),
    ] {
        assert!(
            t.hops.iter().any(|h| h.stage == "capture"
                && h.place == format!("tcpdump on {iface}")
                && h.note.starts_with(what)
                && h.rule.as_deref().unwrap_or("").contains(line)),
            "{what}: {:#?}",
            t.hops
        );
    }
}

#[test]
fn an_unanswered_connection_shows_the_syn_leave_and_no_reply() {
    let t = walk(
        &node("tcpdump-unanswered"),
        "10.50.0.2",
        "10.50.0.1",
        30080,
        "eth0",
    );
    // The node passes it: the capture says the failure is past it.
    assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
    assert!(has_hop(
        &t,
        "capture",
        "eth1  Out IP 10.60.0.1",
        "the request as it left (10.60.0.1 → 10.60.0.2): seen, 2 packets"
    ));
    assert!(t.hops.iter().any(|h| h.stage == "capture"
        && h.note == "its reply as it came back (10.60.0.2 → 10.60.0.1): not seen: the capture on eth1 holds no such packet"
        && h.rule.is_none()));
}

/// A walk that takes another way than the capture shows: the leg is said seen elsewhere.
#[test]
fn a_packet_seen_on_another_interface_than_the_walks_is_said() {
    let mut st = node("tcpdump-answered");
    // Routes that send the backend's network out eth0: the capture has it on eth1.
    st.routes = Some(
        weir_netdiag::iproute::parse_routes(
            "10.50.0.0/24 dev eth0 proto kernel scope link src 10.50.0.1\n10.60.0.0/24 via 10.50.0.9 dev eth0\n",
        )
        .value,
    );
    let t = walk(&st, "10.50.0.2", "10.50.0.1", 30080, "eth0");
    assert!(
        t.hops.iter().any(|h| h.place == "tcpdump on eth0"
            && h.note.contains("the request as it left")
            && h.note.contains("not seen on eth0, but on eth1")),
        "{:#?}",
        t.hops
    );
}
