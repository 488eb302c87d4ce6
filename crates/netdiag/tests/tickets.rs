//! A corpus of real tickets (`tests/data/tickets/<name>/`): the outputs reporters pasted into
//! public Kubernetes, CNI-plugin and cloud-CNI issues whose threads found the cause, each with a
//! `case.json` naming the issue, the packet, the cause and a word the verdict must contain to name
//! it. Every case is run through `weir trace` (or `weir doctor`) as a library on its directory.
//!
//! The cases the tools cannot explain yet are listed in [`UNEXPLAINED`] with the reason, and the
//! list is asserted exactly: a listed case that starts to pass fails the test as much as an
//! unlisted case that does not, so the list (and the score in the corpus README) stays the truth.

use std::path::{Path, PathBuf};

use serde_json::Value;
use weir_netdiag::doctor::{self, Status};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto, Verdict};

/// How a verdict stands against the cause the ticket's thread found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A definite verdict names the cause: `weir trace` drops or rejects the packet with it, or
    /// a `weir doctor` check fails with it.
    Explained,
    /// A conditional verdict whose failing branch names the cause: a trace branch, or a doctor
    /// warning (doctor warns where what it read points at the cause but the paste leaves a
    /// condition open, and says which).
    Conditional,
    /// No verdict: trace is unknown and names the output that would settle it, or the doctor
    /// check the cause belongs to skips naming the output it needs, and nothing else fails.
    Unknown,
    /// The verdict contradicts the thread: delivered (or a branch delivered) where the thread
    /// shows a drop, a definite drop or failure blaming something else, or the check the cause
    /// belongs to passing.
    Wrong,
}

/// Every case, its class and why. The test asserts each case's class exactly: a class that
/// changes fails it until this table (and the score in the corpus README) is updated.
const CASES: &[(&str, Class, &str)] = &[];

fn tickets_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tickets")
}

fn case_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(tickets_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn name_of(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

fn field<'a>(case: &'a Value, key: &str, name: &str) -> &'a str {
    case[key]
        .as_str()
        .unwrap_or_else(|| panic!("{name}/case.json: `{key}` is not a string"))
}

/// What the tool said about the case, and its class.
struct Outcome {
    class: Class,
    said: String,
}

fn names(text: &str, expect: &str) -> bool {
    text.to_lowercase().contains(&expect.to_lowercase())
}

fn packet_of(case: &Value, name: &str) -> Packet {
    let p = &case["packet"];
    let addr = |k: &str| {
        p[k].as_str()
            .unwrap_or_else(|| panic!("{name}: packet.{k}"))
            .parse()
            .unwrap_or_else(|e| panic!("{name}: packet.{k}: {e}"))
    };
    let proto = match p["proto"].as_str().unwrap_or("tcp") {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        other => panic!("{name}: packet.proto {other}"),
    };
    let iif = p["iif"]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: packet.iif (a directory has no pod netns to follow)"));
    Packet {
        src: addr("from"),
        dst: addr("to"),
        proto,
        sport: 40000,
        dport: p["dport"]
            .as_u64()
            .and_then(|d| u16::try_from(d).ok())
            .unwrap_or_else(|| panic!("{name}: packet.dport")),
        iif: iif.into(),
    }
}

fn run_trace(st: &NodeState, case: &Value, name: &str, expect: &str) -> Outcome {
    let t = trace::trace(st, &packet_of(case, name));
    let cause = t.cause.clone().unwrap_or_default();
    let failing = |v: &Verdict| matches!(v, Verdict::Dropped | Verdict::Rejected);
    let branch_names = t
        .branches
        .iter()
        .any(|b| failing(&b.verdict) && b.cause.as_deref().is_some_and(|c| names(c, expect)));
    let settles =
        t.unknowns.iter().any(|u| !u.settle.is_empty()) || cause.contains("settle it with");
    let class = match t.verdict {
        Verdict::Dropped | Verdict::Rejected if names(&cause, expect) => Class::Explained,
        Verdict::Conditional if branch_names || names(&cause, expect) => Class::Conditional,
        Verdict::Unknown if settles => Class::Unknown,
        _ => Class::Wrong,
    };
    let mut said = format!("{:?}: {}", t.verdict, cause);
    for b in &t.branches {
        said.push_str(&format!(
            "\n    when {}: {:?}: {}",
            b.when_text,
            b.verdict,
            b.cause.as_deref().unwrap_or("")
        ));
    }
    for u in &t.unknowns {
        said.push_str(&format!("\n    unknown: {} ({})", u.why, u.settle));
    }
    Outcome { class, said }
}

/// Doctor's class: a failing check naming the cause explains it, a warning naming it is
/// conditional; otherwise any failing check blames something else (wrong), and the check the
/// cause belongs to (`check` in case.json) decides: skipped is unknown, passing is wrong.
fn run_doctor(st: &NodeState, case: &Value, name: &str, expect: &str) -> Outcome {
    let pod = doctor::PodDns::from_saved(st);
    let checks = doctor::run_all(st, pod.as_ref());
    let text = |c: &doctor::Check| {
        format!(
            "{} {} {} {}",
            c.id,
            c.title,
            c.evidence.join(" "),
            c.fix.as_deref().unwrap_or("")
        )
    };
    let naming = |s: Status| {
        checks
            .iter()
            .any(|c| c.status == s && names(&text(c), expect))
    };
    let owner = field(case, "check", name);
    let own = checks
        .iter()
        .find(|c| c.id == owner)
        .unwrap_or_else(|| panic!("{name}: no doctor check {owner}"));
    let class = if naming(Status::Fail) {
        Class::Explained
    } else if naming(Status::Warn) {
        Class::Conditional
    } else if checks.iter().any(|c| c.status == Status::Fail) {
        Class::Wrong
    } else if own.status == Status::Skip && !own.evidence.is_empty() {
        Class::Unknown
    } else {
        Class::Wrong
    };
    let summary: Vec<String> = checks
        .iter()
        .filter(|c| c.status != Status::Skip || c.id == owner)
        .map(|c| format!("{} {}", c.status.label(), c.id))
        .collect();
    Outcome {
        class,
        said: format!(
            "{} (others skip); {owner}: {}",
            summary.join(", "),
            own.evidence.join(" | ")
        ),
    }
}

fn run_case(dir: &Path) -> (String, Outcome) {
    let name = name_of(dir);
    let text = std::fs::read_to_string(dir.join("case.json"))
        .unwrap_or_else(|e| panic!("{name}/case.json: {e}"));
    let case: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}/case.json: {e}"));
    let url = field(&case, "url", &name);
    assert!(url.starts_with("https://github.com/"), "{name}: url {url}");
    assert!(!field(&case, "cause", &name).is_empty(), "{name}: no cause");
    let expect = field(&case, "expect", &name);
    assert!(!expect.is_empty(), "{name}: empty expect");
    let (st, ignored) = NodeState::from_dir(dir).unwrap();
    let outcome = match field(&case, "tool", &name) {
        "trace" => run_trace(&st, &case, &name, expect),
        "doctor" => run_doctor(&st, &case, &name, expect),
        other => panic!("{name}: tool {other}"),
    };
    println!(
        "{name}: {:?} — {url}\n  read {:?}, not read {:?}, skipped {} line(s)\n  {}",
        outcome.class,
        st.present,
        ignored,
        st.skipped.len(),
        outcome.said
    );
    if std::env::var("TICKETS_DEBUG").is_ok() {
        println!(
            "  assumptions {:?}\n  skipped {:?}",
            st.assumptions, st.skipped
        );
    }
    (name, outcome)
}

/// The score line the corpus README states.
fn score(classes: &[Class]) -> String {
    let n = |k: Class| classes.iter().filter(|c| **c == k).count();
    format!(
        "{} explained, {} conditional naming the cause, {} honest unknown, {} wrong, of {}",
        n(Class::Explained),
        n(Class::Conditional),
        n(Class::Unknown),
        n(Class::Wrong),
        classes.len()
    )
}

#[test]
fn tickets_corpus_classes_match_the_table() {
    let dirs = case_dirs();
    assert!(dirs.len() >= 30, "only {} cases", dirs.len());
    let names: Vec<String> = dirs.iter().map(|d| name_of(d)).collect();
    for (listed, _, why) in CASES {
        assert!(
            names.iter().any(|n| n == listed),
            "CASES names {listed}, which is not a case"
        );
        assert!(!why.is_empty(), "{listed}: no reason given");
    }

    let mut classes = Vec::new();
    let mut mismatches = Vec::new();
    for dir in &dirs {
        let (name, outcome) = run_case(dir);
        classes.push(outcome.class);
        match CASES.iter().find(|(n, _, _)| *n == name) {
            None => mismatches.push(format!(
                "{name} is not in CASES (it is {:?})",
                outcome.class
            )),
            Some((_, listed, _)) if *listed != outcome.class => mismatches.push(format!(
                "{name} is {:?}, CASES says {listed:?}: update the table and the README",
                outcome.class
            )),
            Some(_) => {}
        }
    }
    let score = score(&classes);
    println!("{score}");

    let readme = std::fs::read_to_string(tickets_dir().join("README.md")).unwrap();
    for name in &names {
        assert!(
            readme.contains(name.as_str()),
            "README.md does not list {name}"
        );
    }
    assert!(
        mismatches.is_empty(),
        "{score}; mismatches:\n{}",
        mismatches.join("\n")
    );
    assert!(
        readme.contains(&score),
        "README.md does not state the score `{score}`"
    );
}
