//! What an API server serves, and how weir copes with older ones.
//!
//! Two differences matter to weir's watches, both found against a real kube-apiserver 1.20:
//!
//! * **EndpointSlice versions.** `discovery.k8s.io/v1` came in 1.21; 1.17–1.20 serve only
//!   `v1beta1`, whose endpoints carry `topology: {kubernetes.io/hostname, topology.kubernetes.io/zone}`
//!   instead of `nodeName` and `zone`, and no `hints`. [`discover_slice_version`] asks the
//!   server's discovery documents (as kube-proxy did before 1.21, which chose by the server's
//!   version) and [`EndpointSliceV1beta1`] reads a v1beta1 slice into the v1 type everything
//!   else uses.
//! * **Field selectors.** Before 1.22 a Service list accepts only `metadata.name` and
//!   `metadata.namespace` field selectors: `spec.clusterIP!=None` (kube-proxy's, from 1.22 on)
//!   is refused with 400. [`FieldFilter`] keeps the selector and its client-side equivalent,
//!   so the watch can drop the selector and filter itself.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use weir_model::Object;

/// The EndpointSlice API version a server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceVersion {
    V1,
    V1beta1,
}

impl SliceVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            SliceVersion::V1 => "discovery.k8s.io/v1",
            SliceVersion::V1beta1 => "discovery.k8s.io/v1beta1",
        }
    }
}

/// Whether a discovery answer for a group version lists `endpointslices`; `Ok(None)` for a
/// group version the server does not serve (404).
async fn serves_slices(client: &Client, group_version: &str) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "endpointslices")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The newest EndpointSlice version the server serves: `v1`, else `v1beta1`. An error when
/// the server cannot be asked, or serves neither (before 1.17: no EndpointSlices at all).
pub async fn discover_slice_version(client: &Client) -> Result<SliceVersion, String> {
    for v in [SliceVersion::V1, SliceVersion::V1beta1] {
        match serves_slices(client, v.as_str()).await {
            Ok(true) => return Ok(v),
            Ok(false) => {}
            Err(e) => return Err(format!("API discovery of {}: {e}", v.as_str())),
        }
    }
    Err("the API server serves no EndpointSlices (neither discovery.k8s.io/v1 nor v1beta1)".into())
}

/// Rewrites a `discovery.k8s.io/v1beta1` EndpointSlice (JSON) into its `v1` form, as the
/// API server's own conversion does: each endpoint's `topology` gives `nodeName`
/// (`kubernetes.io/hostname`) and `zone` (`topology.kubernetes.io/zone`); the rest of the map
/// stays as `deprecatedTopology`. `hints` are kept where a later v1beta1 has them.
pub fn v1beta1_slice_to_v1(slice: &mut Value) {
    if let Some(o) = slice.as_object_mut() {
        if o.contains_key("apiVersion") {
            o.insert("apiVersion".into(), SliceVersion::V1.as_str().into());
        }
    }
    let Some(endpoints) = slice.get_mut("endpoints").and_then(Value::as_array_mut) else {
        return;
    };
    for e in endpoints.iter_mut().filter_map(Value::as_object_mut) {
        let Some(Value::Object(mut topology)) = e.remove("topology") else {
            continue;
        };
        if let Some(node) = topology.remove("kubernetes.io/hostname") {
            e.entry("nodeName").or_insert(node);
        }
        if let Some(zone) = topology.remove("topology.kubernetes.io/zone") {
            e.entry("zone").or_insert(zone);
        }
        if !topology.is_empty() {
            e.insert("deprecatedTopology".into(), Value::Object(topology));
        }
    }
}

/// An EndpointSlice read from `discovery.k8s.io/v1beta1`, held in the v1 type.
#[derive(Debug, Clone)]
pub struct EndpointSliceV1beta1(pub EndpointSlice);

impl<'de> Deserialize<'de> for EndpointSliceV1beta1 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut v = Value::deserialize(d)?;
        v1beta1_slice_to_v1(&mut v);
        serde_json::from_value(v)
            .map(EndpointSliceV1beta1)
            .map_err(serde::de::Error::custom)
    }
}

impl kube::Resource for EndpointSliceV1beta1 {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "EndpointSlice".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "discovery.k8s.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1beta1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "endpointslices".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl From<EndpointSliceV1beta1> for Object {
    fn from(o: EndpointSliceV1beta1) -> Self {
        Object::from(o.0)
    }
}

/// A field selector weir asks the server for, and the same test on the client's side for a
/// server that refuses the selector.
/// kube-proxy's field selector for Services: not headless.
pub const SERVICE_FIELD_SELECTOR: &str = "spec.clusterIP!=None";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldFilter {
    /// `spec.clusterIP!=None`: not headless (kube-proxy's Service selector).
    NotHeadless,
}

impl FieldFilter {
    pub fn selector(&self) -> &'static str {
        match self {
            FieldFilter::NotHeadless => SERVICE_FIELD_SELECTOR,
        }
    }

    /// Whether a Service passes, as the server would decide.
    pub fn passes(&self, s: &Service) -> bool {
        match self {
            FieldFilter::NotHeadless => {
                s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) != Some("None")
            }
        }
    }
}

/// Whether an API error is the server refusing a field selector (400, as 1.20 answers
/// `"spec.clusterIP" is not a known field selector: only "metadata.name", "metadata.namespace"`).
pub fn refuses_field_selector(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 400 && s.message.contains("field selector"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A slice as kube-apiserver 1.20 serves it (captured shape: `kubectl get
    /// endpointslices.v1beta1.discovery.k8s.io -o json`).
    fn beta_slice() -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1beta1",
            "kind": "EndpointSlice",
            "metadata": {"name": "web-x7k2p", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-1"},
                 "topology": {"kubernetes.io/hostname": "node-a",
                              "topology.kubernetes.io/zone": "zone-1",
                              "topology.kubernetes.io/region": "r1"}},
                {"addresses": ["10.244.2.7"], "conditions": {"ready": false}}
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        })
    }

    #[test]
    fn a_v1beta1_slice_reads_as_v1_with_node_and_zone_from_its_topology() {
        let s: EndpointSliceV1beta1 = serde_json::from_value(beta_slice()).unwrap();
        let e = s.0.endpoints.as_deref().unwrap();
        assert_eq!(e[0].node_name.as_deref(), Some("node-a"));
        assert_eq!(e[0].zone.as_deref(), Some("zone-1"));
        assert_eq!(
            e[0].deprecated_topology.as_ref().unwrap()["topology.kubernetes.io/region"],
            "r1"
        );
        assert_eq!(e[1].node_name, None);
        assert_eq!(e[1].conditions.as_ref().unwrap().ready, Some(false));
        assert_eq!(s.0.metadata.name.as_deref(), Some("web-x7k2p"));
        // The planner's view: the node name reaches the compact form.
        let Object::EndpointSlice(info) = Object::from(s) else {
            panic!("not a slice")
        };
        assert_eq!(info.endpoints[0].node_name().map(|n| &**n), Some("node-a"));
        assert_eq!(info.endpoints[0].zone().map(|z| &**z), Some("zone-1"));
    }

    #[test]
    fn a_list_item_without_api_version_converts_too() {
        // Lists carry items without apiVersion/kind.
        let mut v = beta_slice();
        v.as_object_mut().unwrap().remove("apiVersion");
        v.as_object_mut().unwrap().remove("kind");
        let s: EndpointSliceV1beta1 = serde_json::from_value(v).unwrap();
        assert_eq!(
            s.0.endpoints.as_deref().unwrap()[0].node_name.as_deref(),
            Some("node-a")
        );
    }

    #[test]
    fn the_not_headless_filter_matches_the_servers_selector() {
        let svc = |ip: Option<&str>| Service {
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: ip.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let f = FieldFilter::NotHeadless;
        assert!(f.passes(&svc(Some("10.96.0.10"))));
        assert!(f.passes(&svc(None)), "no clusterIP yet is not headless");
        assert!(!f.passes(&svc(Some("None"))));
        assert_eq!(f.selector(), "spec.clusterIP!=None");
    }
}
