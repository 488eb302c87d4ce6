//! deploy/ and the Containerfile, checked against what they name: the Kubernetes OpenAPI
//! schemas (offline, kubernetes-validate), the real `weir` binary's parser and configuration
//! loader, the real CNI install step and plugin, and the repository the image is built from.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deploy_dir() -> PathBuf {
    repo().join("deploy")
}

/// The full stack's objects, which deploy/ applies and deploy/proxy-only/ patches.
fn base_dir() -> PathBuf {
    deploy_dir().join("base")
}

/// The manifests an operator applies (kustomization.yaml is kustomize's, not the API's).
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(base_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    files
}

/// Every object of every manifest, by (kind, name).
fn objects() -> BTreeMap<(String, String), Value> {
    objects_of(&manifest_files())
}

/// Every object of `files`, by (kind, name).
fn objects_of(files: &[PathBuf]) -> BTreeMap<(String, String), Value> {
    let mut all = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut reader = text.as_bytes();
        for doc in serde_saphyr::read::<_, Value>(&mut reader) {
            let v = doc.unwrap();
            let key = (
                v["kind"].as_str().unwrap().to_string(),
                v["metadata"]["name"].as_str().unwrap().to_string(),
            );
            assert!(all.insert(key.clone(), v).is_none(), "{key:?} twice");
        }
    }
    all
}

/// An object of deploy/ or of its DNS directories (names are unique across them).
fn object(kind: &str, name: &str) -> Value {
    let mut files = manifest_files();
    for dir in dns_dirs() {
        files.extend(yaml_files(&dir));
    }
    objects_of(&files)
        .remove(&(kind.to_string(), name.to_string()))
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"))
}

fn daemonset() -> Value {
    object("DaemonSet", "weir")
}

fn pod_spec() -> Value {
    daemonset()["spec"]["template"]["spec"].clone()
}

fn containers() -> Vec<Value> {
    let spec = pod_spec();
    let mut all = spec["initContainers"].as_array().unwrap().clone();
    all.extend(spec["containers"].as_array().unwrap().iter().cloned());
    all
}

fn container(name: &str) -> Value {
    containers()
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// ---- the Kubernetes OpenAPI schemas -------------------------------------------------------

/// kubernetes-validate, installed by scripts/dev.sh's install step.
fn kubernetes_validate() -> PathBuf {
    let tools = std::env::var("WEIR_TOOLS").unwrap_or_else(|_| "/opt/weir-tools".into());
    let venv = Path::new(&tools).join("venv/bin/kubernetes-validate");
    if venv.exists() {
        return venv;
    }
    let on_path = Command::new("kubernetes-validate")
        .arg("--version")
        .output();
    assert!(
        on_path.is_ok_and(|o| o.status.success()),
        "kubernetes-validate is missing ({} nor on PATH): run `bash scripts/dev.sh test` \
         (its install step puts it there)",
        venv.display()
    );
    PathBuf::from("kubernetes-validate")
}

/// The oldest Kubernetes release weir targets and the newest the schemas know.
const KUBERNETES: [&str; 2] = ["1.30.0", "1.37.0"];

/// Strict validation (unknown fields are errors) against each of `versions`.
fn validate(files: &[PathBuf], versions: &[&str]) -> Vec<Output> {
    let tool = kubernetes_validate();
    versions
        .iter()
        .map(|version| {
            Command::new(&tool)
                .args(["--strict", "--no-warn", "-k", version])
                .args(files)
                .output()
                .expect("run kubernetes-validate")
        })
        .collect()
}

#[test]
fn every_manifest_matches_the_kubernetes_openapi_schemas() {
    let files = manifest_files();
    for out in validate(&files, &KUBERNETES) {
        assert!(out.status.success(), "{}", text(&out));
        // One "passed" line per object: an empty or skipped document would not count.
        let passed = String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .filter(|l| l.contains(" passed for resource "))
            .count();
        assert_eq!(passed, objects().len(), "{}", text(&out));
    }
}

#[test]
fn the_schema_check_rejects_a_wrong_field_and_a_wrong_type() {
    let original = std::fs::read_to_string(base_dir().join("daemonset.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("hostNetwork: true", "hostNetwrk: true", "hostNetwrk"),
        (
            "containerPort: 10256",
            "containerPort: \"healthz\"",
            "containerPort",
        ),
        (
            "terminationGracePeriodSeconds: 10",
            "terminationGracePeriodSeconds: ten",
            "terminationGracePeriodSeconds",
        ),
    ];
    for (from, to, named) in cases {
        assert!(original.contains(from), "{from}");
        let broken = dir.path().join("daemonset.yaml");
        std::fs::write(&broken, original.replacen(from, to, 1)).unwrap();
        for out in validate(&[broken], &KUBERNETES[1..]) {
            assert!(!out.status.success(), "{to}: accepted\n{}", text(&out));
            assert!(text(&out).contains(named), "{to}: {}", text(&out));
        }
    }
}

/// The kustomization.yaml of `dir`.
fn kustomization(dir: &Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
        .unwrap()
}

#[test]
fn kustomization_lists_every_manifest_and_names_the_image_once() {
    let base = kustomization(&base_dir());
    let resources: BTreeSet<String> = strings(&base["resources"]).into_iter().collect();
    let files: BTreeSet<String> = manifest_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(resources, files);
    // The base names no image: deploy/ and deploy/proxy-only/ set it.
    assert!(base["images"].is_null(), "{base:?}");
    let k = kustomization(&deploy_dir());
    assert_eq!(strings(&k["resources"]), ["base"]);
    let images = k["images"].as_array().unwrap();
    assert_eq!(images.len(), 1);
    let image = images[0]["name"].as_str().unwrap();
    for c in containers() {
        assert_eq!(c["image"], image, "container {:?}", c["name"]);
    }
    // The proxy-only install names the same release.
    assert_eq!(kustomization(&proxy_only_dir())["images"], k["images"]);
}

// ---- the DaemonSet against the real binary ------------------------------------------------

/// The downward API values a node would give.
const NODE: &str = "node-1";

/// `$(VAR)` references in args resolved as kubelet does from the container's env.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = arg.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    assert!(!out.contains("$("), "unresolved reference in {arg:?}");
    out
}

fn container_env(c: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let key_ref = &e["valueFrom"]["configMapKeyRef"];
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("spec.nodeName") => NODE.to_string(),
            Some(other) => panic!("fieldRef {other} not simulated"),
            None if key_ref.is_object() => {
                let cm = object("ConfigMap", key_ref["name"].as_str().unwrap());
                let key = key_ref["key"].as_str().unwrap();
                cm["data"][key]
                    .as_str()
                    .unwrap_or_else(|| panic!("ConfigMap {:?} has no key {key}", key_ref["name"]))
                    .to_string()
            }
            None => e["value"].as_str().unwrap().to_string(),
        };
        env.insert(e["name"].as_str().unwrap().to_string(), value);
    }
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let cm = object("ConfigMap", from["configMapRef"]["name"].as_str().unwrap());
        for (k, v) in cm["data"].as_object().unwrap() {
            env.insert(k.to_string(), v.as_str().unwrap().to_string());
        }
    }
    env
}

/// The container's ConfigMap volumes written to a temporary directory, and the args with
/// their mount paths pointing there: what the process would read in the pod.
fn mounted_config(c: &Value, root: &Path) -> Vec<(String, PathBuf)> {
    mounted_config_in(&pod_spec(), c, root)
}

/// [`mounted_config`] for a container of the pod `spec`.
fn mounted_config_in(spec: &Value, c: &Value, root: &Path) -> Vec<(String, PathBuf)> {
    let mut mounts = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap();
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("volumeMount {name} has no volume"));
        let Some(cm) = volume["configMap"]["name"].as_str() else {
            continue;
        };
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let data = object("ConfigMap", cm)["data"].clone();
        match volume["configMap"]["items"].as_array() {
            // Only the listed keys, at their paths.
            Some(items) => {
                for item in items {
                    let key = item["key"].as_str().unwrap();
                    let value = data[key].as_str().unwrap_or_else(|| panic!("no key {key}"));
                    std::fs::write(dir.join(item["path"].as_str().unwrap()), value).unwrap();
                }
            }
            None => {
                for (k, v) in data.as_object().unwrap() {
                    std::fs::write(dir.join(k), v.as_str().unwrap()).unwrap();
                }
            }
        }
        mounts.push((m["mountPath"].as_str().unwrap().to_string(), dir));
    }
    mounts
}

/// The container's args as the process would get them, config paths moved to `root`.
fn args_in(c: &Value, root: &Path) -> Vec<String> {
    args_in_pod(&pod_spec(), c, root)
}

/// [`args_in`] for a container of the pod `spec`.
fn args_in_pod(spec: &Value, c: &Value, root: &Path) -> Vec<String> {
    let env = container_env(c);
    let mounts = mounted_config_in(spec, c, root);
    strings(&c["args"])
        .iter()
        .map(|a| {
            let mut a = expand(a, &env);
            for (path, dir) in &mounts {
                a = a.replace(path.as_str(), dir.to_str().unwrap());
            }
            a
        })
        .collect()
}

#[test]
fn the_agent_containers_flags_and_configuration_are_accepted_by_weir() {
    let proxy = container("agent");
    assert_eq!(strings(&proxy["command"]), ["weir"]);
    let root = tempfile::tempdir().unwrap();
    let args = args_in(&proxy, root.path());
    assert_eq!(args[0], "agent");
    // The config file the args name is one of the ConfigMap's keys, mounted.
    let config = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config");
    assert!(Path::new(config).starts_with(root.path()), "{config}");
    assert!(
        Path::new(config).is_file(),
        "{config} is not in the ConfigMap"
    );

    // In the pod's environment (KUBERNETES_SERVICE_HOST from the weir-apiserver ConfigMap).
    let out = Command::new(common::WEIR)
        .args(&args)
        .arg("--validate")
        .envs(container_env(&proxy))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // Only fields weir applies as kube-proxy does: no notice.
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("notice:"),
        "{}",
        text(&out)
    );
    let settings = String::from_utf8_lossy(&out.stdout);
    // The pod's environment selects the API source (in-cluster), not the manifest directory.
    for expected in [
        "parts: proxy,routes,policy",
        "  source               API, in-cluster service account\n",
        "  node name            node-1\n",
        "  mode                 nftables\n",
        "  cluster cidrs        10.244.0.0/16\n",
        "  healthz              0.0.0.0:10256\n",
        "  metrics              0.0.0.0:10249\n",
        "valid (0 notice(s))",
    ] {
        assert!(settings.contains(expected), "{expected}: {settings}");
    }
    // The probes and the scrape annotation use the ports the configuration binds.
    assert_eq!(proxy["livenessProbe"]["httpGet"]["port"], 10256);
    assert_eq!(proxy["readinessProbe"]["httpGet"]["port"], 10256);
    assert_eq!(proxy["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/healthz");
    let annotations = &daemonset()["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], "10249");
    assert_eq!(annotations["prometheus.io/scrape"], "true");
}

#[test]
fn validate_fails_on_a_configuration_weir_cannot_load() {
    // The same check with one wrong value: --validate is the loader, not a formality.
    let root = tempfile::tempdir().unwrap();
    let args = args_in(&container("agent"), root.path());
    let config = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .unwrap();
    let original = std::fs::read_to_string(config).unwrap();
    assert!(original.contains("clusterCIDR: 10.244.0.0/16"));
    std::fs::write(
        config,
        original.replace("clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.244.0.0/33"),
    )
    .unwrap();
    let out = Command::new(common::WEIR)
        .args(&args)
        .arg("--validate")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("clusterCIDR"), "{}", text(&out));
    // A field weir takes differently from kube-proxy is named in a notice.
    std::fs::write(config, format!("{original}clientConnection:\n  qps: 20\n")).unwrap();
    let out = Command::new(common::WEIR)
        .args(&args)
        .arg("--validate")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("notice: ")
            && stdout.contains("clientConnection.qps=20: accepted; no effect"),
        "{}",
        text(&out)
    );
    // One that is not kube-proxy's (a typo) is an error, with its line and what was meant.
    std::fs::write(config, format!("{original}conntraks: {{}}\n")).unwrap();
    let out = Command::new(common::WEIR)
        .args(&args)
        .arg("--validate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let line = original.lines().count() + 1;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!(
            "problem: {config}: line {line}: unknown field conntraks (did you mean conntrack?)"
        )),
        "{}",
        text(&out)
    );
    // One weir refuses stops it with exit code 2, naming the field and why.
    std::fs::write(config, format!("{original}detectLocalMode: NodeCIDR\n")).unwrap();
    let out = Command::new(common::WEIR)
        .args(&args)
        .arg("--validate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            "detectLocalMode=NodeCIDR: refused: weir tells pod traffic by --cluster-cidr only"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn every_weir_container_parses_its_args_and_every_reference_resolves() {
    let spec = pod_spec();
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    let sa = spec["serviceAccountName"].as_str().unwrap();
    object("ServiceAccount", sa);
    let binding = object("ClusterRoleBinding", "weir");
    assert_eq!(binding["subjects"][0]["name"], sa);
    object("ClusterRole", binding["roleRef"]["name"].as_str().unwrap());
    let root = tempfile::tempdir().unwrap();
    let mut weir_containers = 0;
    for c in containers() {
        // Every mount names a volume and every envFrom a ConfigMap (container_env panics).
        let _ = container_env(&c);
        let _ = mounted_config(&c, &root.path().join(c["name"].as_str().unwrap()));
        if strings(&c["command"]) != ["weir"] {
            continue;
        }
        weir_containers += 1;
        // clap checks every flag and value before it acts on --help: an unknown flag or a
        // bad value fails here (the proxy's configuration is loaded by the test above).
        let args = args_in(&c, &root.path().join(c["name"].as_str().unwrap()));
        let out = Command::new(common::WEIR)
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            args.iter().any(|a| a.ends_with(NODE)),
            "{args:?} does not pass the node name"
        );
    }
    // One node agent: the proxy, routes and NetworkPolicy in one container.
    assert_eq!(weir_containers, 1);
    // The same trick refuses a wrong flag (so the loop above can fail).
    let out = Command::new(common::WEIR)
        .args(["routes", "--backend=hostgw", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

// ---- the service proxy alone, beside another CNI (deploy/proxy-only) ----------------------

fn proxy_only_dir() -> PathBuf {
    deploy_dir().join("proxy-only")
}

/// kubectl of the Kubernetes build (kustomize is built into it), else one on PATH; `None`
/// when there is none (the test is skipped, or fails under CI=true).
fn kubectl() -> Option<PathBuf> {
    let built = common::cluster::kube_build().join("bin/kubectl");
    if built.exists() {
        return Some(built);
    }
    let missing = weir_testkit::commands(&["kubectl"])
        .map(|m| format!("{} (scripts/cluster/kube/build.sh) or {m}", built.display()));
    weir_testkit::can_run(missing).then(|| PathBuf::from("kubectl"))
}

/// What `kubectl apply -k DIR` would send (`kubectl kustomize DIR`, offline): a file holding
/// it, and its objects by (kind, name).
fn kustomized(
    kubectl: &Path,
    dir: &Path,
) -> (tempfile::NamedTempFile, BTreeMap<(String, String), Value>) {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {}", dir.display(), text(&out));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &out.stdout).unwrap();
    let objects = objects_of(&[file.path().to_path_buf()]);
    (file, objects)
}

fn key(kind: &str, name: &str) -> (String, String) {
    (kind.to_string(), name.to_string())
}

/// The full stack's DaemonSet with what the proxy-only patch removes taken out: the CNI
/// install step, its three volumes, the routes part's status volume; the args are set from
/// `args` (checked on their own).
fn full_daemonset_without_cni(full: &Value, args: &Value) -> Value {
    let mut ds = full.clone();
    let spec = &mut ds["spec"]["template"]["spec"];
    spec["initContainers"] = Value::Array(vec![]);
    let gone = ["cni-bin", "cni-net", "cni-config", "routes-run"];
    let volumes = spec["volumes"].as_array_mut().unwrap();
    volumes.retain(|v| !gone.contains(&v["name"].as_str().unwrap()));
    let agent = &mut spec["containers"][0];
    assert_eq!(agent["name"], "agent");
    agent["args"] = args.clone();
    let mounts = agent["volumeMounts"].as_array_mut().unwrap();
    mounts.retain(|m| m["mountPath"] != "/run/weir");
    ds
}

/// deploy/proxy-only/ as kustomize renders it: valid for the API, and deploy/'s objects with
/// only the CNI's taken out (the install step, its ConfigMap and host directories, the
/// routes part's volume), the ClusterRole narrowed to the proxy's kinds, the args changed.
#[test]
fn the_proxy_only_overlay_is_the_full_stack_without_the_cni_and_valid() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let (file, proxy_only) = kustomized(&kubectl, &proxy_only_dir());
    let (_, full) = kustomized(&kubectl, &deploy_dir());
    let yaml = std::fs::read_to_string(file.path()).unwrap();
    for out in validate(&[file.path().to_path_buf()], &KUBERNETES) {
        assert!(out.status.success(), "{}", text(&out));
        let passed = String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .filter(|l| l.contains(" passed for resource "))
            .count();
        assert_eq!(passed, proxy_only.len(), "{}", text(&out));
    }
    let mut expected_keys: BTreeSet<_> = full.keys().cloned().collect();
    assert!(expected_keys.remove(&key("ConfigMap", "weir-cni-config")));
    assert_eq!(
        proxy_only.keys().cloned().collect::<BTreeSet<_>>(),
        expected_keys
    );
    let changed = [key("DaemonSet", "weir"), key("ClusterRole", "weir")];
    for (k, v) in proxy_only.iter().filter(|(k, _)| !changed.contains(k)) {
        assert_eq!(v, &full[k], "{k:?} differs from deploy/'s");
    }

    let ds = &proxy_only[&key("DaemonSet", "weir")];
    let args = &ds["spec"]["template"]["spec"]["containers"][0]["args"];
    let full_ds = &full[&key("DaemonSet", "weir")];
    assert_eq!(ds, &full_daemonset_without_cni(full_ds, args));
    // Nothing of the CNI left: no init container, no CNI directory of the host.
    assert!(
        !yaml.contains("/opt/cni") && !yaml.contains("/etc/cni"),
        "{yaml}"
    );
    assert!(
        !yaml.contains("install-cni") && !yaml.contains("weir-cni"),
        "{yaml}"
    );

    // list and watch on the proxy's kinds (Services, EndpointSlices, Nodes) and nothing else.
    let granted = |role: &Value| -> BTreeSet<(String, String, String)> {
        let mut all = BTreeSet::new();
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        all.insert((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
        all
    };
    let role = granted(&proxy_only[&key("ClusterRole", "weir")]);
    let mut expected = BTreeSet::new();
    for (group, resource) in [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
    ] {
        for verb in ["list", "watch"] {
            expected.insert((group.to_string(), resource.to_string(), verb.to_string()));
        }
    }
    assert_eq!(role, expected);
    assert!(role.is_subset(&granted(&full[&key("ClusterRole", "weir")])));
}

/// The overlay's agent, in the pod's environment and with its mounted configuration, is
/// `weir agent` running the proxy part alone, from the API with the in-cluster account.
#[test]
fn the_proxy_only_agent_runs_the_proxy_part_alone() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let (_, proxy_only) = kustomized(&kubectl, &proxy_only_dir());
    let spec = proxy_only[&key("DaemonSet", "weir")]["spec"]["template"]["spec"].clone();
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let agent = &containers[0];
    assert_eq!(strings(&agent["command"]), ["weir"]);
    let root = tempfile::tempdir().unwrap();
    let args = args_in_pod(&spec, agent, root.path());
    assert_eq!(args[..2], ["agent", "--parts=proxy"]);
    let out = Command::new(common::WEIR)
        .args(&args)
        .arg("--validate")
        .envs(container_env(agent))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let settings = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "parts: proxy\n",
        "  source               API, in-cluster service account\n",
        "  node name            node-1\n",
        "  healthz              0.0.0.0:10256\n",
        "valid (0 notice(s))",
    ] {
        assert!(settings.contains(expected), "{expected}: {settings}");
    }
    // No routes part: its options are not printed.
    assert!(!settings.contains("routes:"), "{settings}");
}

// ---- the cluster DNS (deploy/dns) and the node-local cache (deploy/dns-node-local) ---------

fn dns_dirs() -> [PathBuf; 2] {
    [
        deploy_dir().join("dns"),
        deploy_dir().join("dns-node-local"),
    ]
}

/// The manifests of `dir` (not its kustomization.yaml).
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
}

/// (pod spec, its one container) of the workload `kind`/`name`.
fn dns_pod(kind: &str, name: &str) -> (Value, Value) {
    let spec = object(kind, name)["spec"]["template"]["spec"].clone();
    let containers = spec["containers"].as_array().unwrap().clone();
    assert_eq!(containers.len(), 1, "{kind} {name}");
    (spec, containers[0].clone())
}

/// The value of `--flag=value` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}="))?.into())
        .unwrap_or_else(|| panic!("no --{name}= in {args:?}"))
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn dns_manifests_match_the_kubernetes_openapi_schemas() {
    for dir in dns_dirs() {
        let files = yaml_files(&dir);
        assert!(!files.is_empty(), "{}", dir.display());
        let count = objects_of(&files).len();
        for out in validate(&files, &KUBERNETES) {
            assert!(out.status.success(), "{}", text(&out));
            let passed = String::from_utf8_lossy(&out.stdout)
                .lines()
                .chain(String::from_utf8_lossy(&out.stderr).lines())
                .filter(|l| l.contains(" passed for resource "))
                .count();
            assert_eq!(passed, count, "{}: {}", dir.display(), text(&out));
        }
    }
}

#[test]
fn dns_kustomizations_list_their_manifests_and_name_deploys_image() {
    let root_images = kustomization(&deploy_dir())["images"].clone();
    for dir in dns_dirs() {
        let k = kustomization(&dir);
        let resources: BTreeSet<String> = strings(&k["resources"]).into_iter().collect();
        let files: BTreeSet<String> = yaml_files(&dir)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(resources, files, "{}", dir.display());
        // The same image and tag as the node agent's: one release of weir in the cluster.
        assert_eq!(k["images"], root_images, "{}", dir.display());
    }
}

/// The DnsConfiguration a DNS container's args name with `--config=` (a path under the
/// test's root, where [`args_in_pod`] put the ConfigMap's keys).
fn dns_config_of(args: &[String]) -> Value {
    let path = flag(args, "config");
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}")))
        .unwrap()
}

/// The DnsConfiguration of a DNS ConfigMap, as written in it.
fn dns_config_map(name: &str) -> Value {
    let text = object("ConfigMap", name)["data"]["dns.yaml"].clone();
    serde_saphyr::from_str(text.as_str().expect("dns.yaml")).unwrap()
}

/// Both DNS workloads' args, as kubelet expands them from the ConfigMaps, are `weir dns`
/// flags naming a DnsConfiguration that `weir dns --validate` accepts whole (every field,
/// the upstream files), and the probes and the scrape annotation use the ports it binds.
#[test]
fn the_dns_containers_args_are_weir_dns_flags() {
    let root = tempfile::tempdir().unwrap();
    for (kind, name) in [
        ("Deployment", "weir-dns"),
        ("DaemonSet", "weir-dns-node-local"),
    ] {
        let (spec, c) = dns_pod(kind, name);
        assert_eq!(strings(&c["command"]), ["weir"]);
        let args = args_in_pod(&spec, &c, &root.path().join(name));
        assert_eq!(args[0], "dns", "{args:?}");
        let out = Command::new(common::WEIR)
            .args(&args)
            .arg("--validate")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let config = dns_config_of(&args);
        assert_eq!(config["kind"], "DnsConfiguration", "{name}");
        // The node's resolv.conf is the node's resolvers only with dnsPolicy Default.
        if strings(&config["upstreams"]).contains(&"/etc/resolv.conf".to_string()) {
            assert_eq!(spec["dnsPolicy"], "Default", "{name}: the node's resolvers");
        }
        // Probes and the scrape annotation on the ports the configuration binds.
        let health = port_of(config["healthzBindAddress"].as_str().unwrap());
        let metrics = port_of(config["metricsBindAddress"].as_str().unwrap());
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/healthz");
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(c[probe]["httpGet"]["port"].as_u64(), Some(health), "{name}");
        }
        let annotations = &object(kind, name)["spec"]["template"]["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/port"], metrics.to_string());
        assert_eq!(annotations["prometheus.io/scrape"], "true");
    }
    // A value weir dns does not take fails the same check (so the loop above can fail).
    let bad = root.path().join("bad.yaml");
    std::fs::write(&bad, "pods: secure\n").unwrap();
    let out = Command::new(common::WEIR)
        .args(["dns", "--validate", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// What kubelets, `kubectl`, runbooks and NodeLocal-style setups expect of the cluster DNS:
/// `kube-dns` in kube-system on 10.96.0.10, ports 53 UDP and TCP, selecting `k8s-app:
/// kube-dns`; two replicas kept apart; least privileges.
#[test]
fn the_kube_dns_service_and_deployment_are_what_clusters_expect() {
    let svc = object("Service", "kube-dns");
    assert_eq!(svc["metadata"]["namespace"], "kube-system");
    assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10");
    let selector = svc["spec"]["selector"].as_object().unwrap().clone();
    assert_eq!(
        serde_saphyr::to_string(&selector).unwrap().trim(),
        "k8s-app: kube-dns"
    );
    let ports: BTreeSet<(u64, String, String)> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["port"].as_u64().unwrap(),
                p["protocol"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for want in [(53, "UDP", "dns"), (53, "TCP", "dns-tcp")] {
        let want = (want.0, want.1.to_string(), want.2.to_string());
        assert!(ports.contains(&want), "{want:?} not in {ports:?}");
    }

    let deployment = object("Deployment", "weir-dns");
    assert_eq!(deployment["metadata"]["namespace"], "kube-system");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in &selector {
        assert_eq!(&labels[k], v, "the Service selects the Deployment's pods");
    }
    for (k, v) in deployment["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&labels[k], v);
    }
    let (spec, c) = dns_pod("Deployment", "weir-dns");
    let term = &spec["affinity"]["podAntiAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(term["labelSelector"]["matchLabels"]["k8s-app"], "kube-dns");
    // The pod serves what the Service sends: port 53 over both protocols.
    let container_ports: Vec<(u64, &str)> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["containerPort"].as_u64().unwrap(),
                p["protocol"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(container_ports.contains(&(53, "UDP")) && container_ports.contains(&(53, "TCP")));
    assert_eq!(dns_config_map("weir-dns")["listen"], "0.0.0.0:53");
    // Not root, no capability; port 53 through the namespaced unprivileged-port sysctl.
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        strings(&c["securityContext"]["capabilities"]["drop"]),
        ["ALL"]
    );
    assert!(c["securityContext"]["capabilities"]["add"].is_null());
    assert_eq!(
        spec["securityContext"]["sysctls"][0]["name"],
        "net.ipv4.ip_unprivileged_port_start"
    );

    // The account, its binding and role: Services and EndpointSlices, list and watch; Pods
    // only when a ConfigMap asks for verified pod records.
    let sa = spec["serviceAccountName"].as_str().unwrap();
    object("ServiceAccount", sa);
    let binding = object("ClusterRoleBinding", "weir-dns");
    assert_eq!(binding["subjects"][0]["name"], sa);
    assert_eq!(binding["subjects"][0]["namespace"], "kube-system");
    let role = object("ClusterRole", binding["roleRef"]["name"].as_str().unwrap());
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(strings(&rule["verbs"]), ["list", "watch"]);
        granted.extend(strings(&rule["resources"]));
    }
    let verified = ["weir-dns", "weir-dns-node-local"]
        .iter()
        .any(|cm| dns_config_map(cm)["pods"] == "verified");
    let mut wanted: BTreeSet<String> = ["services", "endpointslices"].map(String::from).into();
    if verified {
        wanted.insert("pods".into());
    }
    assert_eq!(granted, wanted);

    // The node-local cache sends its misses to this Service, over TCP, from the link-local
    // address it sets up.
    let nl = dns_config_map("weir-dns-node-local");
    assert_eq!(
        strings(&nl["upstreams"]),
        [svc["spec"]["clusterIP"].as_str().unwrap()]
    );
    assert_eq!(
        (&nl["upstreamTCP"], &nl["nodeLocal"]),
        (&true.into(), &true.into())
    );
    assert_eq!(nl["listen"], "169.254.20.10:53");
}

/// A network namespace standing for a pod, deleted on drop (even after a panic).
struct PodNetns(String);

impl PodNetns {
    fn new(tag: &str) -> PodNetns {
        let name = format!("wdp-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success());
        let ns = PodNetns(name);
        ns.sh("ip link set lo up");
        ns
    }

    fn sh(&self, script: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The Deployment's `weir dns` started in `ns` as its securityContext says (its uid and gid,
/// no capability at all), with its args and a manifest directory in place of the API.
fn spawn_as_the_pod(ns: &PodNetns, dir: &Path) -> std::process::Child {
    use std::os::unix::fs::PermissionsExt;
    let (spec, c) = dns_pod("Deployment", "weir-dns");
    let args = args_in_pod(&spec, &c, &dir.join("pod"));
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::copy(
        repo().join("crates/dns/tests/fixtures/cluster.yaml"),
        manifests.join("cluster.yaml"),
    )
    .unwrap();
    // Readable by the pod's user, as a ConfigMap volume is.
    for p in [dir, &dir.join("pod"), &manifests] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let security = &spec["securityContext"];
    let (uid, gid) = (
        security["runAsUser"].as_u64().unwrap(),
        security["runAsGroup"].as_u64().unwrap(),
    );
    let log = std::fs::File::create(dir.join("weir-dns.log")).unwrap();
    Command::new("ip")
        .args(["netns", "exec", &ns.0, "setpriv"])
        .args([format!("--reuid={uid}"), format!("--regid={gid}")])
        .args([
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ])
        .arg(common::WEIR)
        .args(&args)
        .arg("--manifests")
        .arg(&manifests)
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The cluster DNS pod run as the Deployment runs it (not root, every capability dropped, the
/// pod's `net.ipv4.ip_unprivileged_port_start` sysctl set in its own network namespace): port
/// 53 opens and `dig` gets answers, and the ports the probes and the scrape annotation name
/// serve /livez, /healthz and /metrics. Without the sysctl the same process cannot open port
/// 53: the sysctl, not a capability, is what lets it.
#[test]
fn the_cluster_dns_pod_runs_unprivileged_as_the_deployment_says() {
    if !common::runnable() {
        return;
    }
    let (spec, c) = dns_pod("Deployment", "weir-dns");
    let dir = tempfile::tempdir().unwrap();
    let ns = PodNetns::new("ok");
    for s in spec["securityContext"]["sysctls"].as_array().unwrap() {
        let (name, value) = (s["name"].as_str().unwrap(), s["value"].as_str().unwrap());
        ns.sh(&format!("sysctl -q -w {name}={value}"));
    }
    let mut child = spawn_as_the_pod(&ns, dir.path());
    let log = || std::fs::read_to_string(dir.path().join("weir-dns.log")).unwrap_or_default();
    let get = |port: u64, path: &str| -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.0, "curl", "-s", "-m", "2"])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let health = c["readinessProbe"]["httpGet"]["port"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !get(health, "/healthz").ends_with("\n200") {
        assert!(
            std::time::Instant::now() < deadline,
            "/healthz never 200: {}",
            log()
        );
        assert!(child.try_wait().unwrap().is_none(), "exited: {}", log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let answer = ns.sh("dig @127.0.0.1 +short +time=2 +tries=1 web.shop.svc.cluster.local A");
    let tcp = ns.sh("dig @127.0.0.1 +short +tcp +time=2 db-0.db.shop.svc.cluster.local A");
    let liveness = c["livenessProbe"]["httpGet"]["port"].as_u64().unwrap();
    let livez = get(liveness, "/livez");
    let annotations =
        &object("Deployment", "weir-dns")["spec"]["template"]["metadata"]["annotations"];
    let scrape: u64 = annotations["prometheus.io/port"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let metrics = get(scrape, annotations["prometheus.io/path"].as_str().unwrap());
    // Who it runs as, read back from the kernel.
    let pid = child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answer.trim(), "10.96.0.20", "{}", log());
    assert_eq!(tcp.trim(), "10.244.1.5");
    assert!(livez.ends_with("\n200"), "{livez}");
    assert!(metrics.ends_with("\n200"), "{metrics}");
    for proto in ["udp", "tcp"] {
        let series = format!(
            "coredns_dns_responses_total{{server=\"dns://0.0.0.0:53\",zone=\".\",rcode=\"NOERROR\",proto=\"{proto}\"}}"
        );
        assert_eq!(
            weir_dns::metrics::sample(&metrics, &series),
            Some(1.0),
            "{metrics}"
        );
    }
    // setpriv execs weir in place: the pid is weir's.
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(field("Uid:"), "65534 65534 65534 65534", "{status}");
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("CapBnd:"), "0000000000000000", "{status}");

    // The same without the sysctl: no port 53.
    let ns = PodNetns::new("no");
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_as_the_pod(&ns, dir.path());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("weir dns kept running without the sysctl");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(!exited.success());
    let log = std::fs::read_to_string(dir.path().join("weir-dns.log")).unwrap();
    assert!(log.contains("Permission denied"), "{log}");
}

// ---- the CNI install step -----------------------------------------------------------------

struct Install {
    dir: tempfile::TempDir,
}

impl Install {
    /// A host's /opt/cni/bin and /etc/cni/net.d, the ConfigMap's template, a service account
    /// and an API answer listing this Node with `pod_cidr`.
    fn new(pod_cidr: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for d in ["bin", "net.d", "template", "sa"] {
            std::fs::create_dir_all(p.join(d)).unwrap();
        }
        let cm = object("ConfigMap", "weir-cni-config");
        for (k, v) in cm["data"].as_object().unwrap() {
            std::fs::write(p.join("template").join(k), v.as_str().unwrap()).unwrap();
        }
        std::fs::write(p.join("sa/token"), "t0ken").unwrap();
        std::fs::write(p.join("sa/ca.crt"), "").unwrap();
        let spec = match pod_cidr {
            Some(c) => serde_json::json!({ "podCIDR": c, "podCIDRs": [c] }),
            None => serde_json::json!({}),
        };
        let list = serde_json::json!({
            "kind": "NodeList", "apiVersion": "v1",
            "items": [{ "metadata": { "name": NODE }, "spec": spec }],
        });
        std::fs::write(p.join("nodes.json"), list.to_string()).unwrap();
        Install { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Runs deploy/install-cni.sh with the init container's env, pointed at the temp dirs.
    fn run(&self) -> Output {
        let init = container("install-cni");
        let mut cmd = Command::new("sh");
        cmd.arg(deploy_dir().join("install-cni.sh"));
        cmd.envs(container_env(&init))
            .env(
                "WEIR_NODE_URL",
                format!("file://{}", self.path("nodes.json").display()),
            )
            .env("WEIR_SA_DIR", self.path("sa"))
            .env("WEIR_CNI_BINARY", common::weir_cni())
            .env("CNI_BIN_DIR", self.path("bin"))
            .env("CNI_NET_DIR", self.path("net.d"))
            .env("CNI_CONF_TEMPLATE", self.path("template/10-weir.conflist"))
            .env("WEIR_POD_CIDR_WAIT", "0");
        cmd.output().unwrap()
    }

    fn files(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

#[test]
fn install_cni_puts_the_plugin_and_a_conflist_weir_cni_accepts_in_place() {
    use std::os::unix::fs::PermissionsExt;
    let host = Install::new(Some("10.244.7.0/24"));
    let out = host.run();
    assert!(out.status.success(), "{}", text(&out));
    // Exactly the plugin and the configuration, no temporary file left behind.
    assert_eq!(host.files("bin"), ["weir-cni"]);
    assert_eq!(host.files("net.d"), ["10-weir.conflist"]);
    let installed = host.path("bin/weir-cni");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(common::weir_cni()).unwrap()
    );
    let mode = std::fs::metadata(&installed).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);

    let conflist: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(host.path("net.d/10-weir.conflist")).unwrap(),
    )
    .unwrap();
    let mut plugin = conflist["plugins"][0].clone();
    assert_eq!(plugin["type"], "weir-cni");
    assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "10.244.7.0/24");

    // The installed plugin accepts the configuration: STATUS decodes every key and checks the
    // IPAM store and nft. (STATUS is a CNI 1.1 verb: the version is raised for this check
    // only; the conflist stays at 1.0.0 for containerd 1.6's libcni.)
    let store = host.path("ipam");
    plugin["name"] = conflist["name"].clone();
    plugin["cniVersion"] = "1.1.0".into();
    plugin["ipam"]["dataDir"] = store.to_str().unwrap().into();
    let mut child = Command::new(&installed)
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", host.path("bin"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plugin.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "STATUS: {}", text(&out));
}

#[test]
fn install_cni_changes_nothing_when_it_cannot_finish() {
    let host = Install::new(Some("10.244.7.0/24"));
    std::fs::write(host.path("net.d/10-weir.conflist"), "working\n").unwrap();
    std::fs::write(host.path("bin/weir-cni"), "old plugin\n").unwrap();
    let unchanged = |host: &Install| {
        assert_eq!(host.files("net.d"), ["10-weir.conflist"]);
        assert_eq!(host.files("bin"), ["weir-cni"]);
        assert_eq!(
            std::fs::read_to_string(host.path("net.d/10-weir.conflist")).unwrap(),
            "working\n"
        );
        assert_eq!(
            std::fs::read_to_string(host.path("bin/weir-cni")).unwrap(),
            "old plugin\n"
        );
    };
    // A template that is not JSON once filled in.
    let template = host.path("template/10-weir.conflist");
    let good = std::fs::read_to_string(&template).unwrap();
    std::fs::write(&template, good.replacen('{', "", 1)).unwrap();
    let out = host.run();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("not a conflist"), "{}", text(&out));
    unchanged(&host);

    // A Node the controller manager has not given a pod CIDR yet.
    std::fs::write(&template, &good).unwrap();
    let host2 = Install::new(None);
    std::fs::write(host2.path("net.d/10-weir.conflist"), "working\n").unwrap();
    std::fs::write(host2.path("bin/weir-cni"), "old plugin\n").unwrap();
    let out = host2.run();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("has no spec.podCIDR"), "{}", text(&out));
    unchanged(&host2);

    // The ConfigMap's API address left as shipped: the message says where to set it.
    let out = Command::new("sh")
        .arg(deploy_dir().join("install-cni.sh"))
        .envs(container_env(&container("install-cni")))
        .env("WEIR_POD_CIDR_WAIT", "0")
        .env("CNI_BIN_DIR", host.path("bin"))
        .env("CNI_NET_DIR", host.path("net.d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("weir-apiserver ConfigMap"),
        "{}",
        text(&out)
    );
    unchanged(&host);
}

#[test]
fn install_cni_passes_shellcheck_as_posix_sh() {
    // The image runs it with dash: no bashisms, no quoting slips.
    let out = Command::new("shellcheck")
        .args(["--shell=sh", "--severity=info"])
        .arg(deploy_dir().join("install-cni.sh"))
        .output()
        .expect("shellcheck (scripts/dev.sh installs it)");
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn install_cni_warns_when_another_configuration_comes_first() {
    let host = Install::new(Some("10.244.7.0/24"));
    std::fs::write(host.path("net.d/05-other.conflist"), "{}").unwrap();
    std::fs::write(host.path("net.d/99-later.conf"), "{}").unwrap();
    let out = host.run();
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("05-other.conflist sorts before"), "{err}");
    assert!(!err.contains("99-later.conf"), "{err}");
}

// ---- the Containerfile against the repository ---------------------------------------------

struct Containerfile {
    /// FROM lines, in order.
    from: Vec<String>,
    /// (source, destination) of `COPY` lines from the build context.
    context_copies: Vec<(Vec<String>, String)>,
    /// (sources, destination) of `COPY --from=build` lines.
    build_copies: Vec<(Vec<String>, String)>,
    /// (sources, destination) of `COPY --from=` lines of other stages.
    stage_copies: Vec<(Vec<String>, String)>,
    /// The whole text of RUN instructions (continuations joined).
    runs: Vec<String>,
}

fn containerfile() -> Containerfile {
    let text = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut cf = Containerfile {
        from: Vec::new(),
        context_copies: Vec::new(),
        build_copies: Vec::new(),
        stage_copies: Vec::new(),
        runs: Vec::new(),
    };
    // `ARG NAME=default` before the first FROM: the base images, overridable at build time.
    let mut base_args: Vec<(String, String)> = Vec::new();
    for line in joined.lines() {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match words.first().map(String::as_str) {
            Some("ARG") if cf.from.is_empty() => {
                let (name, default) = words[1].split_once('=').expect("ARG NAME=default");
                base_args.push((format!("${{{name}}}"), default.to_string()));
            }
            Some("FROM") => {
                let mut image = words[1].clone();
                for (var, default) in &base_args {
                    image = image.replace(var, default);
                }
                cf.from.push(image);
            }
            Some("RUN") => cf.runs.push(words[1..].join(" ")),
            Some("COPY") if words[1] == "--from=build" => {
                let (dst, srcs) = words[2..].split_last().unwrap();
                cf.build_copies.push((srcs.to_vec(), dst.clone()));
            }
            Some("COPY") if words[1].starts_with("--from=") => {
                let (dst, srcs) = words[2..].split_last().unwrap();
                cf.stage_copies.push((srcs.to_vec(), dst.clone()));
            }
            Some("COPY") => {
                let (dst, srcs) = words[1..].split_last().unwrap();
                cf.context_copies.push((srcs.to_vec(), dst.clone()));
            }
            _ => {}
        }
    }
    cf
}

/// Where a COPY puts `src` (a destination ending in / is a directory).
fn copied_to(src: &str, dst: &str) -> String {
    if dst.ends_with('/') {
        format!(
            "{dst}{}",
            Path::new(src).file_name().unwrap().to_string_lossy()
        )
    } else {
        dst.to_string()
    }
}

#[test]
fn the_containerfile_builds_and_copies_what_the_repository_provides() {
    let cf = containerfile();
    // build, tools (Debian's packages gathered into /rootfs), and the image on scratch.
    assert_eq!(cf.from.len(), 3, "{:?}", cf.from);
    assert_eq!(cf.from[2], "scratch", "{:?}", cf.from);
    assert_eq!(
        cf.stage_copies,
        vec![(vec!["/rootfs".to_string()], "/".to_string())]
    );
    // The build stage's Rust is at least the workspace's rust-version.
    let rust = cf.from[0]
        .split(':')
        .nth(1)
        .and_then(|t| t.split('-').next())
        .unwrap();

    // The cargo build line's packages, and their binaries (cargo metadata: no build).
    let build = cf
        .runs
        .iter()
        .find(|r| r.starts_with("cargo build"))
        .expect("a cargo build");
    assert!(
        build.contains("--release") && build.contains("--locked"),
        "{build}"
    );
    let packages: Vec<&str> = build
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1])
        .collect();
    let meta = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(meta.status.success(), "{}", text(&meta));
    let meta: serde_json::Value = serde_json::from_slice(&meta.stdout).unwrap();
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let wanted = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("the workspace's rust-version")
        .trim_matches('"');
    let num = |v: &str| -> Vec<u32> { v.split('.').map(|x| x.parse().unwrap()).collect() };
    assert!(
        num(rust) >= num(wanted),
        "rust {rust} < rust-version {wanted}"
    );
    let mut bins = BTreeSet::new();
    for p in meta["packages"].as_array().unwrap() {
        if packages.contains(&p["name"].as_str().unwrap()) {
            for t in p["targets"].as_array().unwrap() {
                if t["kind"][0] == "bin" {
                    bins.insert(format!(
                        "/src/target/release/{}",
                        t["name"].as_str().unwrap()
                    ));
                }
            }
        }
    }
    assert_eq!(packages.len(), 2, "{build}");
    let mut installed = BTreeSet::new();
    for (srcs, dst) in &cf.build_copies {
        for src in srcs {
            assert!(
                bins.contains(src),
                "{src} is not built by `{build}` ({bins:?})"
            );
            installed.insert(copied_to(src, dst));
        }
    }

    // Context copies exist in the repository and are not excluded by .containerignore.
    let ignored: Vec<String> = std::fs::read_to_string(repo().join(".containerignore"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    for (srcs, dst) in &cf.context_copies {
        for src in srcs {
            if src == "." {
                continue;
            }
            assert!(
                repo().join(src).exists(),
                "COPY {src}: not in the repository"
            );
            let first = src.split('/').next().unwrap();
            assert!(!ignored.iter().any(|i| i == first), "COPY {src}: ignored");
            installed.insert(copied_to(src, dst));
        }
    }
    for must in ["target", ".git"] {
        assert!(
            ignored.iter().any(|i| i == must),
            "{must} not in .containerignore"
        );
    }

    // What the DaemonSet runs is in the image: `weir` on PATH (/usr/local/bin), the install
    // step and the plugin at the paths the install step uses.
    for c in containers() {
        let command = strings(&c["command"]);
        let path = if command[0].starts_with('/') {
            command[0].clone()
        } else {
            format!("/usr/local/bin/{}", command[0])
        };
        assert!(
            installed.contains(&path),
            "{path} not in the image: {installed:?}"
        );
    }
    let script = std::fs::read_to_string(deploy_dir().join("install-cni.sh")).unwrap();
    assert!(script.contains("WEIR_CNI_BINARY:=/usr/local/bin/weir-cni"));
    assert!(installed.contains("/usr/local/bin/weir-cni"));

    // The runtime's Debian packages are real package names of this Debian release, and the
    // ones the tests run these tools from (scripts/dev.sh installs them).
    let apt = cf
        .runs
        .iter()
        .find(|r| r.contains("apt-get install"))
        .expect("apt-get install");
    let debs: Vec<&str> = apt
        .split("&&")
        .find(|part| part.contains("apt-get install"))
        .unwrap()
        .split_whitespace()
        .skip_while(|w| *w != "--no-install-recommends")
        .skip(1)
        .collect();
    for needed in [
        "nftables",
        "iptables",
        "ipset",
        "conntrack",
        "curl",
        "jq",
        "busybox-static",
    ] {
        assert!(debs.contains(&needed), "{needed} missing from {debs:?}");
    }
    for deb in debs {
        let out = Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", deb])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("ok installed"),
            "{deb}: not a package installed here ({})",
            text(&out)
        );
    }
}
