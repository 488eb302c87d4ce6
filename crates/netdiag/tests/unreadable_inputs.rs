//! An output nothing of which could be read is reported (file, line, what was expected) and
//! left out as if not collected: the checks and walks that need it cannot tell, never `ok`
//! (issue 32: `{not json` as nft-ruleset.json gave `ok forward-policy` with no evidence; `xx`
//! as ip-route.json made trace say "only other tables were pasted").

mod common;

use weir_netdiag::check::Status;
use weir_netdiag::doctor;
use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::trace::Verdict;

use common::walk;

fn state(outputs: &[(Output, &str)]) -> NodeState {
    NodeState::from_outputs(outputs.iter().map(|(o, t)| (*o, t.to_string())))
}

fn check<'a>(checks: &'a [weir_netdiag::check::Check], id: &str) -> &'a weir_netdiag::check::Check {
    checks.iter().find(|c| c.id == id).unwrap()
}

#[test]
fn an_nft_ruleset_that_is_not_json_is_reported_and_forward_policy_cannot_tell() {
    let st = state(&[(Output::NftRuleset, "{not json\n")]);
    assert!(st.nft.is_none());
    assert_eq!(st.unreadable.len(), 1);
    let u = &st.unreadable[0];
    assert_eq!(u.file, "nft-ruleset.json");
    assert!(u.reason.contains("not JSON"), "{u}");
    assert!(!st.present.contains(&Output::NftRuleset));
    let checks = doctor::run_all(&st, None);
    let c = check(&checks, "forward-policy");
    assert_eq!(c.status, Status::Skip, "{c:?}");
    assert!(
        c.evidence
            .iter()
            .any(|e| e == "cannot tell: nft-ruleset.json unreadable"),
        "{c:?}"
    );
    // Checks that do not read it are left alone.
    assert!(!check(&checks, "mtu")
        .evidence
        .iter()
        .any(|e| e.contains("cannot tell")));
}

#[test]
fn a_check_that_passes_on_one_output_cannot_tell_when_its_other_is_unreadable() {
    let save =
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
    let readable = state(&[(Output::IptablesSave, save)]);
    let c = doctor::forward_policy(&readable);
    assert_eq!(c.status, Status::Ok, "{c:?}");
    // The nft ruleset could hold a drop-policy forward chain: not a pass.
    let st = state(&[
        (Output::IptablesSave, save),
        (Output::NftRuleset, "nftables: ["),
    ]);
    let checks = doctor::run_all(&st, None);
    let c = check(&checks, "forward-policy");
    assert_eq!(c.status, Status::Skip, "{c:?}");
    assert!(
        c.evidence.iter().any(|e| e.contains("cannot tell")),
        "{c:?}"
    );
}

#[test]
fn an_empty_but_well_formed_output_is_not_unreadable() {
    let st = state(&[
        (
            Output::NftRuleset,
            r#"{"nftables": [{"metainfo": {"json_schema_version": 1}}]}"#,
        ),
        (Output::IpRoute, "[]"),
        (Output::Sysctl, ""),
    ]);
    assert!(st.unreadable.is_empty(), "{:?}", st.unreadable);
    assert!(st.nft.is_some() && st.routes.is_some());
}

#[test]
fn an_ip_route_file_of_garbage_is_reported_with_its_line_and_trace_does_not_blame_tables() {
    let st = state(&[(Output::IpRoute, "xx\n")]);
    assert!(st.routes.is_none());
    let u = &st.unreadable[0];
    assert_eq!((u.file.as_str(), u.line), ("ip-route.json", Some(1)));
    assert!(
        u.to_string()
            .starts_with("ip-route.json: unreadable (line 1: "),
        "{u}"
    );
    // Without readable routes nothing is delivered: unknown, or dropped only in the branch
    // where ip_forward (also not pasted) is 0.
    let t = walk(&st, "10.1.0.5", "10.0.0.1", 80, "eth0");
    assert!(
        matches!(t.verdict, Verdict::Unknown | Verdict::Conditional),
        "{:?}",
        t.verdict
    );
    assert!(t.branches.iter().all(|b| b.verdict != Verdict::Delivered
        && (b.verdict != Verdict::Dropped || b.when_text.contains("ip_forward is 0"))));
    let said = format!("{t:?}");
    assert!(!said.contains("only other tables were pasted"), "{said}");
}
