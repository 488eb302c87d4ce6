use std::fmt;
use std::path::{Path, PathBuf};

use crate::yaml::Value;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde::de::DeserializeOwned;
use weir_model::{Kind, Object, ObjectKey, PodForPolicy};

/// A problem in a manifest: which file, which object, which field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub file: PathBuf,
    /// `Service default/web (document 2)`, or `document 3` when the object cannot be named.
    pub object: String,
    /// Path of the offending field (`spec.ports[0].port`), when known.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.object)?;
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

/// Result of parsing one file.
#[derive(Debug, Default)]
pub struct Parsed {
    pub objects: Vec<Object>,
    /// Per-object errors (the object was skipped) and file-level errors.
    pub errors: Vec<ManifestError>,
    /// Keys of objects that were named but invalid (a caller may keep their previous version).
    pub invalid_keys: Vec<ObjectKey>,
    /// The file as a whole could not be read or is not valid YAML: nothing in `objects`
    /// can be trusted to be complete; callers keep what the file produced before.
    pub file_failed: bool,
}

/// Parses the text of one manifest file (`file` only labels errors).
pub fn parse_manifest(file: &Path, text: &str) -> Parsed {
    parse_manifest_limited(file, text, DEFAULT_MAX_NESTING)
}

/// Nesting (flow brackets plus compact block indicators) a manifest may have; Kubernetes
/// objects need about ten levels. Deeper text is refused before the YAML parser sees it:
/// its cost grows about quadratically with depth (200k levels took 91 s).
pub const DEFAULT_MAX_NESTING: usize = 100;

/// How a manifest is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// See [`parse_manifest_limited`].
    pub max_nesting: usize,
    /// Read what NetworkPolicy enforcement needs (`weir policy`): Namespaces and
    /// NetworkPolicies, and Pods with their labels, node and named ports
    /// ([`weir_model::PodInfo::with_policy`]). Off, those two kinds are ignored and Pods keep
    /// only what DNS reads.
    pub policy: bool,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            max_nesting: DEFAULT_MAX_NESTING,
            policy: false,
        }
    }
}

/// [`parse_manifest`] with a nesting limit: a file nested deeper fails as a whole with a
/// "nested deeper than" error, without being parsed.
pub fn parse_manifest_limited(file: &Path, text: &str, max_nesting: usize) -> Parsed {
    let opts = ParseOptions {
        max_nesting,
        ..ParseOptions::default()
    };
    parse_manifest_with(file, text, &opts)
}

/// [`parse_manifest`] with every option.
pub fn parse_manifest_with(file: &Path, text: &str, opts: &ParseOptions) -> Parsed {
    let max_nesting = opts.max_nesting;
    let mut p = Parsed::default();
    let file_error = |p: &mut Parsed, object: String, message: String| {
        p.errors.push(ManifestError {
            file: file.to_path_buf(),
            object,
            field: None,
            message,
        });
        p.file_failed = true;
        p.objects.clear();
        p.invalid_keys.clear();
    };
    if let Some(line) = crate::nesting::exceeds(text, max_nesting) {
        file_error(
            &mut p,
            format!("line {line}"),
            format!("nested deeper than {max_nesting} levels (not parsed)"),
        );
        return p;
    }
    // One document at a time: its untyped tree is dropped as soon as its objects are typed
    // (holding every document's `Value` first cost ~40 bytes of memory per byte of YAML).
    let mut reader = text.as_bytes();
    for (i, doc) in crate::yaml::documents(&mut reader).enumerate() {
        let loc = format!("document {}", i + 1);
        match doc {
            Ok(doc) => handle_value(file, doc, &loc, true, opts, &mut p),
            Err(e) => {
                file_error(&mut p, loc, format!("invalid YAML: {e}"));
                return p;
            }
        }
    }
    p
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for k in path {
        cur = cur.get(*k)?;
    }
    cur.as_str()
}

fn handle_value(
    file: &Path,
    v: Value,
    loc: &str,
    allow_list: bool,
    opts: &ParseOptions,
    p: &mut Parsed,
) {
    let err = |object: String, field: Option<&str>, message: String| ManifestError {
        file: file.to_path_buf(),
        object,
        field: field.map(str::to_string),
        message,
    };
    if v.is_null() {
        return; // empty document (e.g. a trailing `---`)
    }
    if !v.is_object() {
        p.errors
            .push(err(loc.to_string(), None, "not a mapping".into()));
        return;
    }
    let api_version = str_at(&v, &["apiVersion"]).unwrap_or("").to_string();
    let Some(kind) = str_at(&v, &["kind"]).map(str::to_string) else {
        p.errors.push(err(
            loc.to_string(),
            Some("kind"),
            "missing or not a string".into(),
        ));
        return;
    };
    if allow_list && kind.ends_with("List") && v.get("items").is_some() {
        let mut v = v;
        // Taken, not cloned: a big List is not held twice.
        let items = v.get_mut("items").map(std::mem::take);
        match items {
            Some(Value::Array(items)) => {
                for (j, item) in items.into_iter().enumerate() {
                    handle_value(file, item, &format!("{loc}, item {j}"), false, opts, p);
                }
            }
            _ => p
                .errors
                .push(err(loc.to_string(), Some("items"), "not a sequence".into())),
        }
        return;
    }
    let k = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => Kind::Service,
        ("discovery.k8s.io/v1", "EndpointSlice") => Kind::EndpointSlice,
        ("v1", "Node") => Kind::Node,
        ("v1", "Pod") => Kind::Pod,
        ("v1", "Namespace") if opts.policy => Kind::Namespace,
        ("networking.k8s.io/v1", "NetworkPolicy") if opts.policy => Kind::NetworkPolicy,
        _ => {
            tracing::debug!(file = %file.display(), object = loc, %api_version, %kind, "ignoring kind");
            return;
        }
    };
    let name = str_at(&v, &["metadata", "name"]).unwrap_or("").to_string();
    if name.is_empty() {
        p.errors.push(err(
            format!("{kind} ({loc})"),
            Some("metadata.name"),
            "missing".into(),
        ));
        return;
    }
    let namespace = if matches!(k, Kind::Node | Kind::Namespace) {
        String::new()
    } else {
        str_at(&v, &["metadata", "namespace"])
            .unwrap_or("default")
            .to_string()
    };
    let key = ObjectKey::new(k, namespace, name);
    let label = format!("{key} ({loc})");
    // The namespace is settled (defaulted) before the object is converted to weir's form.
    let typed: Result<Object, (Option<String>, String)> = match k {
        Kind::Service => typed::<Service>(v).and_then(|mut s| {
            validate_service(&s)?;
            set_ns(&mut s.metadata, &key);
            Ok(s.into())
        }),
        Kind::EndpointSlice => typed::<EndpointSlice>(v).and_then(|mut s| {
            validate_slice(&s)?;
            set_ns(&mut s.metadata, &key);
            Ok(s.into())
        }),
        Kind::Node => typed::<Node>(v).map(Object::from),
        Kind::Pod => typed::<Pod>(v).map(|mut p| {
            set_ns(&mut p.metadata, &key);
            if opts.policy {
                PodForPolicy(p).into()
            } else {
                p.into()
            }
        }),
        Kind::Namespace => typed::<Namespace>(v).map(Object::from),
        // A policy that does not even deserialize is skipped (reported, its previous version
        // from this file kept); one that does but says something weir cannot enforce as
        // written is kept with warnings and a safe reading (weir_policy::warning).
        Kind::NetworkPolicy => typed::<NetworkPolicy>(v).map(|mut n| {
            set_ns(&mut n.metadata, &key);
            n.into()
        }),
    };
    match typed {
        Ok(o) => p.objects.push(o),
        Err((field, message)) => {
            p.errors.push(err(label, field.as_deref(), message));
            p.invalid_keys.push(key);
        }
    }
}

fn set_ns(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &ObjectKey) {
    if meta.namespace.is_none() {
        meta.namespace = Some(key.namespace.clone());
    }
}

fn typed<T: DeserializeOwned>(v: Value) -> Result<T, (Option<String>, String)> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != "." && !path.is_empty()).then_some(path);
        (field, e.into_inner().to_string())
    })
}

type Invalid = (Option<String>, String);

fn bad(field: String, message: impl Into<String>) -> Result<(), Invalid> {
    Err((Some(field), message.into()))
}

fn ip_ok(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

fn validate_service(s: &Service) -> Result<(), Invalid> {
    let Some(spec) = &s.spec else { return Ok(()) };
    if let Some(ip) = &spec.cluster_ip {
        if !(ip.is_empty() || ip == "None" || ip_ok(ip)) {
            return bad(
                "spec.clusterIP".into(),
                format!("not an IP address: {ip:?}"),
            );
        }
    }
    for (i, ip) in spec.cluster_ips.iter().flatten().enumerate() {
        if !(ip == "None" || ip_ok(ip)) {
            return bad(
                format!("spec.clusterIPs[{i}]"),
                format!("not an IP address: {ip:?}"),
            );
        }
    }
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        if !ip_ok(ip) {
            return bad(
                format!("spec.externalIPs[{i}]"),
                format!("not an IP address: {ip:?}"),
            );
        }
    }
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.port) {
            return bad(
                format!("spec.ports[{i}].port"),
                format!("out of range: {}", port.port),
            );
        }
        if let Some(np) = port.node_port {
            if !(0..=65535).contains(&np) {
                return bad(
                    format!("spec.ports[{i}].nodePort"),
                    format!("out of range: {np}"),
                );
            }
        }
        if let Some(proto) = &port.protocol {
            if !matches!(proto.as_str(), "TCP" | "UDP" | "SCTP") {
                return bad(
                    format!("spec.ports[{i}].protocol"),
                    format!("unsupported: {proto:?}"),
                );
            }
        }
    }
    for (i, r) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        if r.trim().parse::<ipnet::IpNet>().is_err() {
            return bad(
                format!("spec.loadBalancerSourceRanges[{i}]"),
                format!("not a CIDR: {r:?}"),
            );
        }
    }
    Ok(())
}

fn validate_slice(s: &EndpointSlice) -> Result<(), Invalid> {
    let want_v6 = match s.address_type.as_str() {
        "IPv4" => false,
        "IPv6" => true,
        "FQDN" => return Ok(()),
        other => return bad("addressType".into(), format!("unsupported: {other:?}")),
    };
    for (i, e) in s.endpoints.iter().flatten().enumerate() {
        for (j, a) in e.addresses.iter().enumerate() {
            match a.parse::<std::net::IpAddr>() {
                Ok(ip) if ip.is_ipv6() == want_v6 => {}
                Ok(_) => {
                    return bad(
                        format!("endpoints[{i}].addresses[{j}]"),
                        format!("{a} does not match addressType"),
                    )
                }
                Err(_) => {
                    return bad(
                        format!("endpoints[{i}].addresses[{j}]"),
                        format!("not an IP address: {a:?}"),
                    )
                }
            }
        }
    }
    for (i, p) in s.ports.iter().flatten().enumerate() {
        if let Some(n) = p.port {
            if !(0..=65535).contains(&n) {
                return bad(format!("ports[{i}].port"), format!("out of range: {n}"));
            }
        }
    }
    Ok(())
}
