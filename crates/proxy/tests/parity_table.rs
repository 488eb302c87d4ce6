//! docs/proxy.md's mode-parity table cannot rot: every test it names exists, every cell
//! names a test or says "not supported" / "not tested", and every mode and required feature
//! has its column and row. (No root needed: this reads files.)

use std::path::{Path, PathBuf};

const MODES: [&str; 4] = ["nftables", "iptables", "ipvs", "userspace"];

/// Rows the table must keep (a prefix of the row's feature cell).
const FEATURES: &[&str] = &[
    "ClusterIP",
    "UDP",
    "NodePort",
    "LoadBalancer IP",
    "externalIPs",
    "externalTrafficPolicy Local",
    "internalTrafficPolicy Local",
    "sessionAffinity",
    "hairpin",
    "no endpoints",
    "terminating endpoints",
    "topology hints",
    "healthCheckNodePort",
    "a restart keeps established connections",
    "outside flush repaired",
    "IPv6",
    "SCTP",
    "a failed dial retries the next endpoint",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The table's rows (cells split on `|`), header first, from the "## Mode parity" section.
fn table(doc: &str) -> Vec<Vec<String>> {
    let section = doc
        .split("\n## Mode parity\n")
        .nth(1)
        .expect("docs/proxy.md has a \"## Mode parity\" section");
    let section = section.split("\n#").next().unwrap();
    section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The `crate::path::test` names in a cell (backticked, two `::` at least).
fn test_names(cell: &str) -> Vec<&str> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            t.matches("::").count() >= 2
                && t.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')
        })
        .collect()
}

/// Where `crate::path::test` must be defined: crates/<crate>/tests/<path>.rs (an
/// integration test binary) or crates/<crate>/src/<path>.rs / <path>/mod.rs (a unit test).
fn defined(name: &str) -> Result<(), String> {
    let parts: Vec<&str> = name.split("::").collect();
    let (krate, test) = (parts[0], parts[parts.len() - 1]);
    let path = parts[1..parts.len() - 1].join("/");
    let root = workspace().join("crates").join(krate);
    let candidates = [
        root.join("tests").join(format!("{path}.rs")),
        root.join("src").join(format!("{path}.rs")),
        root.join("src").join(&path).join("mod.rs"),
    ];
    let Some(file) = candidates.iter().find(|f| f.is_file()) else {
        return Err(format!("{name}: none of {candidates:?} exists"));
    };
    let text = std::fs::read_to_string(file).unwrap();
    // The test attribute within the few lines before the function (doc comments between).
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| {
            let l = l.trim_start();
            l.starts_with(&format!("fn {test}()")) || l.starts_with(&format!("async fn {test}()"))
        })
        .ok_or_else(|| format!("{name}: no `fn {test}()` in {}", file.display()))?;
    let is_test = lines[at.saturating_sub(30)..at]
        .iter()
        .rev()
        .take_while(|l| {
            let l = l.trim_start();
            l.starts_with("///") || l.starts_with("#[") || l.starts_with("//")
        })
        // #[test], or an async runtime's test attribute (#[tokio::test(...)]).
        .any(|l| l.trim_start().starts_with("#[test]") || l.contains("::test"));
    if is_test {
        Ok(())
    } else {
        Err(format!(
            "{name}: `fn {test}()` in {} is not a #[test]",
            file.display()
        ))
    }
}

#[test]
fn every_named_test_exists_and_every_cell_says_something() {
    let doc = std::fs::read_to_string(workspace().join("docs/proxy.md")).unwrap();
    let rows = table(&doc);
    assert_eq!(rows[0][0], "feature");
    assert_eq!(rows[0][1..], MODES, "the columns are the modes");
    let mut problems = Vec::new();
    let mut named = 0;
    for row in &rows[1..] {
        if row.len() != MODES.len() + 1 {
            problems.push(format!("{}: {} cells", row[0], row.len()));
            continue;
        }
        for (mode, cell) in MODES.iter().zip(&row[1..]) {
            let names = test_names(cell);
            let honest = cell.starts_with("not supported") || cell.starts_with("not tested");
            if names.is_empty() && !honest {
                problems.push(format!(
                    "{} × {mode}: neither a test nor \"not supported\" / \"not tested\": {cell:?}",
                    row[0]
                ));
            }
            for n in names {
                named += 1;
                if let Err(e) = defined(n) {
                    problems.push(format!("{} × {mode}: {e}", row[0]));
                }
            }
        }
    }
    for f in FEATURES {
        if !rows[1..].iter().any(|r| r[0].starts_with(f)) {
            problems.push(format!("no row for {f}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(named > 50, "only {named} test names: did the parser break?");
}

/// The checker itself: a name that does not exist, and a cell that says nothing, are caught.
#[test]
fn the_checker_catches_a_missing_test_and_an_empty_cell() {
    assert!(
        defined("proxy::parity_table::every_named_test_exists_and_every_cell_says_something")
            .is_ok()
    );
    assert!(
        defined("proxy::userspace::balance::round_robin_visits_every_endpoint_in_turn").is_ok()
    );
    assert!(defined("proxy::userspace::relay::copied_bytes_arrive_intact").is_ok());
    assert!(defined("proxy::parity_table::no_such_test").is_err());
    assert!(defined("proxy::no_such_file::a_test").is_err());
    // A helper, not a test.
    assert!(defined("proxy::parity_table::workspace").is_err());
    let rows = table("x\n## Mode parity\n\n| feature | a |\n|---|---|\n| f | `proxy::a::b` |\n## next\n| g | h |\n");
    assert_eq!(rows, [vec!["feature", "a"], vec!["f", "`proxy::a::b`"]]);
    assert_eq!(test_names(rows[1][1].as_str()), ["proxy::a::b"]);
    assert!(test_names("`weir proxy` and `inet weir_userspace`").is_empty());
}
