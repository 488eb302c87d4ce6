use std::path::Path;

use std::time::{Duration, Instant};

use weir_source::{parse_manifest, Kind, Limits, ManifestDir, ObjectKey};

/// A directory read without the debounce (every change parsed by the next scan).
fn undebounced(root: &Path) -> ManifestDir {
    ManifestDir::with_limits(root, no_settle())
}

fn no_settle() -> Limits {
    Limits {
        settle: Duration::ZERO,
        ..Limits::default()
    }
}

fn fixture(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(p)
}

fn keys(objs: &[weir_source::Object]) -> Vec<String> {
    objs.iter().map(|o| o.key().to_string()).collect()
}

#[test]
fn loads_multi_document_and_lists_ignoring_unknown_kinds() {
    let mut dir = undebounced(&fixture("good"));
    let r = dir.scan();
    assert!(r.changed);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        keys(&dir.objects()),
        [
            "Service/default/dns",
            "Service/shop/web",
            "EndpointSlice/shop/web-abc12",
            "Node/node-a"
        ]
    );
    // Nothing changed: a second scan reports no change.
    assert!(!dir.scan().changed);
}

#[test]
fn malformed_objects_are_reported_with_file_object_field_and_skipped() {
    let file = fixture("bad/mixed.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let p = parse_manifest(&file, &text);
    assert!(!p.file_failed);
    assert_eq!(keys(&p.objects), ["Service/default/good"]);
    let msgs: Vec<String> = p.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(msgs.len(), 4, "{msgs:#?}");
    let find = |needle: &str| {
        p.errors
            .iter()
            .find(|e| e.object.contains(needle))
            .unwrap_or_else(|| panic!("no error for {needle}: {msgs:#?}"))
    };
    let typo = find("Service/default/typo");
    assert_eq!(typo.file, file);
    assert_eq!(typo.field.as_deref(), Some("spec.ports[0].port"));
    assert!(typo.object.contains("document 2"));
    assert!(msgs.iter().any(|m| m.contains("mixed.yaml")
        && m.contains("Service/default/typo")
        && m.contains("spec.ports[0].port")));
    assert_eq!(
        find("Service/default/badip").field.as_deref(),
        Some("spec.clusterIP")
    );
    // No name: identified by document index.
    let noname = find("document 4");
    assert_eq!(noname.field.as_deref(), Some("metadata.name"));
    let cond = find("EndpointSlice/default/good-1");
    assert_eq!(cond.field.as_deref(), Some("endpoints[0].conditions.ready"));
    assert_eq!(
        p.invalid_keys,
        [
            ObjectKey::new(Kind::Service, "default", "typo"),
            ObjectKey::new(Kind::Service, "default", "badip"),
            ObjectKey::new(Kind::EndpointSlice, "default", "good-1"),
        ]
    );
}

#[test]
fn invalid_yaml_fails_the_file_only() {
    let p = parse_manifest(Path::new("x.yaml"), "kind: Service\n  bad: [indent\n");
    assert!(p.file_failed);
    assert!(p.objects.is_empty());
    assert_eq!(p.errors.len(), 1);
    assert!(
        p.errors[0]
            .to_string()
            .starts_with("x.yaml: document 1: invalid YAML"),
        "{}",
        p.errors[0]
    );
}

const SVC_A: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
const SVC_B: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n";

fn port_of(dir: &ManifestDir, name: &str) -> i32 {
    dir.objects()
        .iter()
        .find_map(|o| match o {
            weir_source::Object::Service(s) if &*s.name == name => {
                Some(s.spec.as_ref().unwrap().ports[0].port)
            }
            _ => None,
        })
        .unwrap()
}

#[test]
fn broken_file_keeps_its_previous_objects_and_other_files() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a.yaml"), SVC_A).unwrap();
    std::fs::write(tmp.path().join("b.yaml"), SVC_B).unwrap();
    let mut dir = undebounced(tmp.path());
    assert!(dir.scan().changed);
    assert_eq!(
        keys(&dir.objects()),
        ["Service/default/a", "Service/default/b"]
    );

    // a.yaml becomes invalid YAML (different size, so the stamp changes).
    std::fs::write(
        tmp.path().join("a.yaml"),
        "apiVersion: v1\nkind: [Service\n",
    )
    .unwrap();
    let r = dir.scan();
    assert!(!r.changed);
    assert_eq!(r.errors.len(), 1);
    assert!(r.errors[0].to_string().contains("a.yaml"));
    assert_eq!(
        keys(&dir.objects()),
        ["Service/default/a", "Service/default/b"]
    );
    assert_eq!(dir.errors().len(), 1);

    // Fixed again: error gone, object updated.
    std::fs::write(
        tmp.path().join("a.yaml"),
        SVC_A.replace("port: 80", "port: 81"),
    )
    .unwrap();
    let r = dir.scan();
    assert!(r.changed && r.errors.is_empty());
    assert_eq!(port_of(&dir, "a"), 81);
    assert!(dir.errors().is_empty());

    // A per-object error keeps the object's previous good version, others update.
    let both = format!(
        "{}---\n{}",
        SVC_A.replace("port: 80", "port: 99999"),
        SVC_B.replace("name: b", "name: c")
    );
    std::fs::write(tmp.path().join("a.yaml"), both).unwrap();
    let r = dir.scan();
    assert!(r.changed);
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].field.as_deref(), Some("spec.ports[0].port"));
    assert_eq!(
        keys(&dir.objects()),
        [
            "Service/default/a",
            "Service/default/b",
            "Service/default/c"
        ]
    );
    assert_eq!(port_of(&dir, "a"), 81);

    // Deleting a file deletes its objects.
    std::fs::remove_file(tmp.path().join("b.yaml")).unwrap();
    assert!(dir.scan().changed);
    assert_eq!(
        keys(&dir.objects()),
        ["Service/default/a", "Service/default/c"]
    );
}

#[test]
fn unreadable_directory_keeps_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("m");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.yaml"), SVC_A).unwrap();
    let mut dir = undebounced(&root);
    dir.scan();
    std::fs::rename(&root, tmp.path().join("gone")).unwrap();
    let r = dir.scan();
    assert!(!r.changed && !r.complete());
    assert!(r.failed.is_some());
    assert_eq!(r.errors.len(), 1);
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
    // The failure stands (for health and logs) until the directory is back.
    assert_eq!(dir.errors().len(), 1);
    std::fs::rename(tmp.path().join("gone"), &root).unwrap();
    assert!(dir.scan().complete());
    assert!(dir.errors().is_empty());
}

#[test]
fn same_object_in_two_files_first_path_wins_with_an_error_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a.yaml"), SVC_A).unwrap();
    std::fs::create_dir(tmp.path().join("sub")).unwrap();
    std::fs::write(
        tmp.path().join("sub/b.yml"),
        SVC_A.replace("port: 80", "port: 82"),
    )
    .unwrap();
    std::fs::write(tmp.path().join(".hidden.yaml"), SVC_B).unwrap();
    std::fs::write(tmp.path().join("notes.txt"), SVC_B).unwrap();
    let mut dir = undebounced(tmp.path());
    dir.scan();
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
    // Lexically first path: a.yaml < sub/b.yml.
    assert_eq!(port_of(&dir, "a"), 80);
    let errors: Vec<String> = dir.errors().iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("sub/b.yml")
            && errors[0].contains("a.yaml")
            && errors[0].contains("Service/default/a"),
        "{errors:?}"
    );
    // The winner goes away: the other definition takes over, and the warning is gone.
    std::fs::remove_file(tmp.path().join("a.yaml")).unwrap();
    assert!(dir.scan().changed);
    assert_eq!(port_of(&dir, "a"), 82);
    assert!(dir.errors().is_empty());
}

/// Runs `dir.scan()` on another thread, failing the test if it does not return in time
/// (a blocked open() must fail the test, not hang it).
fn scan_within(mut dir: ManifestDir, limit: Duration) -> (ManifestDir, weir_source::ScanReport) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = dir.scan();
        let _ = tx.send((dir, r));
    });
    rx.recv_timeout(limit)
        .expect("the scan did not finish: it is stuck")
}

fn sh(dir: &Path, script: &str) {
    let ok = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "{script}");
}

#[test]
fn fifos_symlink_loops_and_deep_trees_neither_block_nor_spin() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::write(root.join("good.yaml"), SVC_A).unwrap();
    // A FIFO named like a manifest: open() would block forever without a writer.
    sh(root, "mkfifo pipe.yaml");
    // Directory loops (the reproduction spun at 100 % CPU) and a file symlink loop.
    sh(
        root,
        "ln -s . a && ln -s . b && ln -s loop2.yaml loop1.yaml && ln -s loop1.yaml loop2.yaml",
    );
    // A tree deeper than the limit: its files are not read, and say so.
    sh(
        root,
        "mkdir -p d1/d2/d3/d4 && cp good.yaml d1/d2/d3/d4/deep.yaml",
    );
    let limits = Limits {
        max_dir_depth: 2,
        ..no_settle()
    };
    let started = Instant::now();
    let (dir, r) = scan_within(
        ManifestDir::with_limits(root, limits),
        Duration::from_secs(10),
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
    let errors: Vec<String> = r.errors.iter().map(ToString::to_string).collect();
    let has = |file: &str, what: &str| {
        assert!(
            errors.iter().any(|e| e.contains(file) && e.contains(what)),
            "no `{what}` error for {file}: {errors:#?}"
        )
    };
    has("pipe.yaml", "FIFO");
    has("loop1.yaml", "symbolic links");
    has("d3", "directory levels");
    assert_eq!(errors.len(), 4, "{errors:#?}");
}

#[test]
fn configmap_volume_layout_is_read_through_its_symlinks_and_swaps() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // What the kubelet writes for a ConfigMap volume.
    std::fs::create_dir(root.join("..2026_11_22_10_00_00.1")).unwrap();
    std::fs::write(root.join("..2026_11_22_10_00_00.1/svc.yaml"), SVC_A).unwrap();
    sh(
        root,
        "ln -s ..2026_11_22_10_00_00.1 ..data && ln -s ..data/svc.yaml svc.yaml",
    );
    let mut dir = undebounced(root);
    assert!(dir.scan().complete());
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
    assert_eq!(port_of(&dir, "a"), 80);
    // An update: a new timestamped directory, then `..data` swapped atomically.
    std::fs::create_dir(root.join("..2026_11_22_10_05_00.2")).unwrap();
    std::fs::write(
        root.join("..2026_11_22_10_05_00.2/svc.yaml"),
        SVC_A.replace("port: 80", "port: 81"),
    )
    .unwrap();
    sh(root, "ln -s ..2026_11_22_10_05_00.2 ..data_tmp && mv -T ..data_tmp ..data && rm -r ..2026_11_22_10_00_00.1");
    assert!(dir.scan().changed);
    assert_eq!(port_of(&dir, "a"), 81);
    assert!(dir.errors().is_empty(), "{:?}", dir.errors());
}

#[test]
fn oversized_deeply_nested_and_over_budget_files_are_refused_by_name_and_keep_their_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::write(root.join("a.yaml"), SVC_A).unwrap();
    std::fs::write(root.join("b.yaml"), SVC_B).unwrap();
    let limits = Limits {
        max_file_bytes: 4096,
        ..no_settle()
    };
    let mut dir = ManifestDir::with_limits(root, limits);
    dir.scan();
    // 200k levels of nesting in 400 KB: the parser took 91 s on this; refused at once.
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    std::fs::write(root.join("a.yaml"), &deep).unwrap();
    let mut small = Limits {
        max_file_bytes: 1 << 20,
        ..no_settle()
    };
    let mut d2 = ManifestDir::with_limits(root, small.clone());
    let started = Instant::now();
    let r = d2.scan();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        r.errors
            .iter()
            .any(|e| e.to_string().contains("a.yaml")
                && e.message.contains("nested deeper than 100")),
        "{:?}",
        r.errors
    );
    // The 4 KiB limit: the same file is refused as too large; its old object stays.
    let r = dir.scan();
    assert!(!r.changed);
    assert!(
        r.errors[0]
            .message
            .contains("file too large: 400000 bytes (limit 4096)"),
        "{:?}",
        r.errors
    );
    assert_eq!(
        keys(&dir.objects()),
        ["Service/default/a", "Service/default/b"]
    );

    // The directory's total budget: files past it (in path order) are not read.
    std::fs::write(root.join("a.yaml"), SVC_A).unwrap();
    small.max_total_bytes = (SVC_A.len() + 10) as u64;
    let mut d3 = ManifestDir::with_limits(root, small);
    let r = d3.scan();
    assert_eq!(keys(&d3.objects()), ["Service/default/a"]);
    assert!(
        r.errors
            .iter()
            .any(|e| e.file.ends_with("b.yaml") && e.message.contains("in total")),
        "{:?}",
        r.errors
    );
}

#[test]
fn a_missing_root_is_a_failed_scan_not_an_empty_view() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("not-yet");
    let mut dir = undebounced(&root);
    let r = dir.scan();
    assert!(!r.complete() && !r.changed);
    assert!(r.failed.unwrap().to_string().contains("not-yet"));
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("a.yaml"), SVC_A).unwrap();
    let r = dir.scan();
    assert!(r.complete() && r.changed);
}

#[test]
fn a_changed_file_is_parsed_only_once_it_settles() {
    let tmp = tempfile::tempdir().unwrap();
    let limits = Limits {
        settle: Duration::from_secs(3600),
        ..Limits::default()
    };
    let mut dir = ManifestDir::with_limits(tmp.path(), limits);
    // Half of a file, as a writer that is not done yet leaves it.
    std::fs::write(tmp.path().join("a.yaml"), &SVC_A[..40]).unwrap();
    let r = dir.scan();
    assert_eq!(r.pending, 1);
    assert!(!r.complete() && dir.objects().is_empty() && r.errors.is_empty());
    // The writer finishes before the next poll: still settling, the half was never parsed.
    std::fs::write(tmp.path().join("a.yaml"), SVC_A).unwrap();
    assert_eq!(dir.scan().pending, 1);
    assert!(dir.objects().is_empty());
    // Unchanged across two scans: parsed.
    let r = dir.scan();
    assert!(r.complete() && r.changed && r.errors.is_empty());
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
}

#[test]
fn last_known_good_copies_serve_invalid_files_after_a_restart_but_never_deleted_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, state) = (tmp.path().join("m"), tmp.path().join("state"));
    std::fs::create_dir(&root).unwrap();
    let svc_c = SVC_B
        .replace("name: b", "name: c")
        .replace("10.96.0.2", "10.96.0.3");
    std::fs::write(root.join("a.yaml"), SVC_A).unwrap();
    std::fs::write(
        root.join("bc.yaml"),
        format!(
            "{SVC_B}---
{svc_c}"
        ),
    )
    .unwrap();
    let d = SVC_B
        .replace("name: b", "name: d")
        .replace("10.96.0.2", "10.96.0.4");
    std::fs::write(root.join("d.yaml"), &d).unwrap();
    let open = || {
        ManifestDir::with_limits(&root, no_settle())
            .with_last_good(&state)
            .unwrap()
    };
    let mut dir = open();
    assert!(dir.scan().complete());
    assert_eq!(dir.objects().len(), 4);
    drop(dir);

    // While weir is down: a.yaml becomes invalid YAML, c gets a typo, d.yaml is deleted.
    std::fs::write(
        root.join("a.yaml"),
        "apiVersion: v1
kind: [Service
",
    )
    .unwrap();
    std::fs::write(
        root.join("bc.yaml"),
        format!(
            "{SVC_B}---
{}",
            svc_c.replace("port: 80", "port: banana")
        ),
    )
    .unwrap();
    std::fs::remove_file(root.join("d.yaml")).unwrap();
    let mut dir = open();
    let r = dir.scan();
    assert!(r.complete());
    assert_eq!(
        keys(&dir.objects()),
        [
            "Service/default/a",
            "Service/default/b",
            "Service/default/c"
        ],
        "a and c from their last good copies, d not resurrected"
    );
    assert_eq!(port_of(&dir, "c"), 80);
    let served: Vec<String> = dir
        .served_from_last_good()
        .iter()
        .map(|(k, f)| format!("{k} {}", f.file_name().unwrap().to_string_lossy()))
        .collect();
    assert_eq!(
        served,
        ["Service/default/a a.yaml", "Service/default/c bc.yaml"]
    );
    // Errors still say what is wrong with the files.
    assert_eq!(dir.errors().len(), 2, "{:?}", dir.errors());
    drop(dir);

    // Deleting the invalid file on purpose: its copy goes too, even across restarts.
    std::fs::remove_file(root.join("a.yaml")).unwrap();
    let mut dir = open();
    dir.scan();
    assert_eq!(
        keys(&dir.objects()),
        ["Service/default/b", "Service/default/c"]
    );
    drop(dir);
    std::fs::write(
        root.join("a.yaml"),
        "apiVersion: v1
kind: [Service
",
    )
    .unwrap();
    let mut dir = open();
    dir.scan();
    assert_eq!(
        keys(&dir.objects()),
        ["Service/default/b", "Service/default/c"]
    );
}

/// serde-saphyr's default budget stops a document at 250,000 nodes; `kubectl get svc -A -o
/// yaml` of a big cluster is one List document of that size, and must still parse whole.
#[test]
fn a_list_of_tens_of_thousands_of_objects_parses_whole() {
    let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 0..12_000 {
        text.push_str(&format!(
            "- {{apiVersion: v1, kind: Service, metadata: {{name: s{i}, namespace: big, labels: {{app: a}}}}, spec: {{clusterIP: 10.96.{}.{}, ports: [{{port: 80}}]}}}}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    let parsed = parse_manifest(Path::new("big.yaml"), &text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors.first());
    assert_eq!(parsed.objects.len(), 12_000);
    assert_eq!(
        parsed.objects[11_999].key(),
        ObjectKey::new(Kind::Service, "big", "s11999")
    );
}

const POLICY_OBJECTS: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: a}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: shop}
spec: {podSelector: 5}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: odd, namespace: shop}
spec: {podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop, labels: {app: web}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {podIP: 10.244.1.5}
";

/// `weir policy`'s directory reads Namespaces and NetworkPolicies and keeps Pods with their
/// policy part; every other agent's ignores the first two and keeps Pods lean. A policy that
/// does not deserialize is reported by field and skipped; one weir cannot enforce as
/// written is kept with its warning.
#[test]
fn policy_objects_only_when_asked() {
    let opts = weir_source::ParseOptions {
        policy: true,
        ..Default::default()
    };
    let p = weir_source::parse_manifest_with(Path::new("p.yaml"), POLICY_OBJECTS, &opts);
    assert_eq!(
        keys(&p.objects),
        [
            "Namespace/shop",
            "NetworkPolicy/default/deny",
            "NetworkPolicy/shop/odd",
            "Pod/shop/web-0"
        ]
    );
    assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
    assert_eq!(p.errors[0].field.as_deref(), Some("spec.podSelector"));
    assert!(p.errors[0].object.contains("NetworkPolicy/shop/broken"));
    assert_eq!(
        p.invalid_keys,
        [ObjectKey::new(Kind::NetworkPolicy, "shop", "broken")]
    );
    let weir_source::Object::NetworkPolicy(odd) = &p.objects[2] else {
        panic!()
    };
    assert_eq!(odd.warnings.len(), 1);
    assert_eq!(odd.warnings[0].field, "spec.ingress[0].ports[0].protocol");
    let weir_source::Object::Pod(pod) = &p.objects[3] else {
        panic!()
    };
    assert_eq!(
        pod.policy.as_ref().unwrap().value.node.as_deref(),
        Some("n1")
    );

    let lean = parse_manifest(Path::new("p.yaml"), POLICY_OBJECTS);
    assert_eq!(keys(&lean.objects), ["Pod/shop/web-0"]);
    assert!(lean.errors.is_empty());
    let weir_source::Object::Pod(pod) = &lean.objects[0] else {
        panic!()
    };
    assert!(pod.policy.is_none());

    // The directory reader, asked for them.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), POLICY_OBJECTS).unwrap();
    let mut m = undebounced(dir.path()).with_policy_objects();
    let report = m.scan();
    assert!(report.complete());
    assert_eq!(m.objects().len(), 4);
}
