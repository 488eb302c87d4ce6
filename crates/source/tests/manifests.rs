use std::path::Path;

use weir_source::{parse_manifest, Kind, ManifestDir, ObjectKey};

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
    let mut dir = ManifestDir::new(fixture("good"));
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
            weir_source::Object::Service(s) if s.metadata.name.as_deref() == Some(name) => {
                Some(s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port)
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
    let mut dir = ManifestDir::new(tmp.path());
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
    let mut dir = ManifestDir::new(&root);
    dir.scan();
    std::fs::rename(&root, tmp.path().join("gone")).unwrap();
    let r = dir.scan();
    assert!(!r.changed);
    assert_eq!(r.errors.len(), 1);
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
}

#[test]
fn same_object_in_two_files_later_path_wins() {
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
    let mut dir = ManifestDir::new(tmp.path());
    dir.scan();
    assert_eq!(keys(&dir.objects()), ["Service/default/a"]);
    assert_eq!(port_of(&dir, "a"), 82);
}
