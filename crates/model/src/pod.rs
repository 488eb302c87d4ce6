//! What weir keeps of a Pod: what the cluster DNS's verified pod records need (which
//! namespace holds which IP) and, only for `weir policy`, what NetworkPolicy reads (labels,
//! node, hostNetwork, named container ports: [`PodInfo::policy`]). The proxy never watches
//! Pods.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::compact::intern;

/// The policy part of a Pod: weir-policy's form, with its conversion warnings.
pub type PolicyPod = weir_policy::Converted<weir_policy::model::PodInfo>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `status.podIPs` (else `status.podIP`) that parse as IPs, each once.
    pub ips: Box<[IpAddr]>,
    /// `status.phase` is `Succeeded` or `Failed`: the pod's IPs are released and may already
    /// belong to another pod.
    pub terminated: bool,
    /// What NetworkPolicy reads, kept only when the source was asked for it
    /// ([`PodInfo::with_policy`], `weir policy`); DNS's pods carry `None` (one pointer).
    pub policy: Option<Arc<PolicyPod>>,
}

/// A Pod to be kept with its policy part ([`PodInfo::with_policy`]); what `weir policy`'s
/// sources convert.
#[derive(Debug, Clone)]
pub struct PodForPolicy(pub Pod);

impl PodInfo {
    /// Whether the pod holds `ip` now.
    pub fn has_ip(&self, ip: IpAddr) -> bool {
        !self.terminated && self.ips.contains(&ip)
    }

    /// The pod with its policy part. The part shares this pod's namespace and name strings
    /// (interned) and its node name is interned: 10,000 pods on 100 nodes hold 100 copies.
    pub fn with_policy(o: &Pod) -> PodInfo {
        let mut info = PodInfo::from(o);
        let mut warnings = Vec::new();
        let mut part = weir_policy::model::PodInfo::convert(o, &mut warnings);
        part.key = weir_policy::ObjectKey {
            namespace: info.namespace.clone(),
            name: info.name.clone(),
        };
        part.node = part.node.map(|n| intern(&n));
        info.policy = Some(Arc::new(weir_policy::Converted {
            value: Arc::new(part),
            warnings: warnings.into(),
        }));
        info
    }
}

impl From<&Pod> for PodInfo {
    fn from(o: &Pod) -> Self {
        let status = o.status.as_ref();
        // `podIPs` when set (its first entry repeats `podIP`), else the older `podIP`.
        let ips: Vec<IpAddr> = match status.and_then(|s| s.pod_ips.as_ref()) {
            Some(list) if !list.is_empty() => {
                list.iter().filter_map(|p| p.ip.parse().ok()).collect()
            }
            _ => status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
                .into_iter()
                .collect(),
        };
        let phase = status.and_then(|s| s.phase.as_deref());
        PodInfo {
            namespace: intern(o.metadata.namespace.as_deref().unwrap_or("default")),
            name: intern(o.metadata.name.as_deref().unwrap_or_default()),
            ips: ips.into(),
            terminated: matches!(phase, Some("Succeeded" | "Failed")),
            policy: None,
        }
    }
}

/// Back to a Pod holding exactly what was kept (the manifest source's last-known-good copy):
/// with the policy part, its labels, node, hostNetwork and named ports too (a name that
/// resolved to nothing, two containers disagreeing, comes back as two containers that
/// disagree).
impl From<&PodInfo> for Pod {
    fn from(o: &PodInfo) -> Self {
        use k8s_openapi::api::core::v1 as core;
        use weir_policy::model::NamedPort;
        let part = o.policy.as_ref().map(|p| &*p.value);
        let spec = part.map(|p| {
            let mut first = Vec::new();
            let mut second = Vec::new();
            for ((name, protocol), named) in &p.named_ports {
                let port = |n: i32| core::ContainerPort {
                    name: Some(name.to_string()),
                    protocol: Some(protocol.as_str().into()),
                    container_port: n,
                    ..Default::default()
                };
                match named {
                    NamedPort::Port(n) => first.push(port(i32::from(*n))),
                    NamedPort::Conflict => {
                        first.push(port(1));
                        second.push(port(2));
                    }
                }
            }
            let container = |name: &str, ports: Vec<core::ContainerPort>| core::Container {
                name: name.into(),
                ports: (!ports.is_empty()).then_some(ports),
                ..Default::default()
            };
            let mut containers = vec![container("c0", first)];
            if !second.is_empty() {
                containers.push(container("c1", second));
            }
            core::PodSpec {
                node_name: p.node.as_deref().map(String::from),
                host_network: p.host_network.then_some(true),
                containers,
                ..Default::default()
            }
        });
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(o.namespace.to_string()),
                name: Some(o.name.to_string()),
                labels: part.filter(|p| !p.labels.is_empty()).map(|p| {
                    p.labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                ..Default::default()
            },
            spec,
            status: Some(core::PodStatus {
                pod_ips: (!o.ips.is_empty()).then(|| {
                    o.ips
                        .iter()
                        .map(|ip| core::PodIP { ip: ip.to_string() })
                        .collect()
                }),
                phase: Some(if o.terminated { "Failed" } else { "Running" }.into()),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_ips_and_whether_terminated_and_round_trips() {
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: p, namespace: shop}\n\
             status: {phase: Running, podIP: 10.244.1.5, podIPs: [{ip: 10.244.1.5}, {ip: 'fd00::5'}]}",
        )
        .unwrap();
        let info = PodInfo::from(&pod);
        assert_eq!(&*info.namespace, "shop");
        let want: [IpAddr; 2] = ["10.244.1.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        assert_eq!(&*info.ips, &want);
        assert!(info.has_ip("fd00::5".parse().unwrap()));
        assert!(!info.has_ip("10.244.1.6".parse().unwrap()));
        assert_eq!(PodInfo::from(&Pod::from(&info)), info);

        let done: Pod = serde_saphyr::from_str(
            "metadata: {name: job, namespace: shop}\nstatus: {phase: Succeeded, podIP: 10.244.1.6}",
        )
        .unwrap();
        let info = PodInfo::from(&done);
        assert!(info.terminated && !info.has_ip("10.244.1.6".parse().unwrap()));
        assert_eq!(PodInfo::from(&Pod::from(&info)), info);
    }

    #[test]
    fn the_policy_part_only_when_asked_and_it_round_trips() {
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: web-0, namespace: shop, labels: {app: web, tier: front}}\n\
             spec: {nodeName: n1, containers: [{name: a, ports: [{name: http, containerPort: 8080}, {containerPort: 9}]}],\n\
                    initContainers: [{name: i, ports: [{name: dns, containerPort: 53, protocol: UDP}]}]}\n\
             status: {phase: Pending, podIP: 10.244.1.5}",
        )
        .unwrap();
        assert_eq!(PodInfo::from(&pod).policy, None, "DNS's pods stay lean");
        let info = PodInfo::with_policy(&pod);
        let part = &info.policy.as_ref().unwrap().value;
        assert!(Arc::ptr_eq(&part.key.namespace, &info.namespace));
        assert_eq!(part.node.as_deref(), Some("n1"));
        assert_eq!(part.labels.len(), 2);
        let udp = weir_policy::model::Protocol::Udp;
        assert_eq!(part.named_port("dns", udp), Some(53));
        assert!(part.is_policy_pod());
        assert_eq!(PodInfo::with_policy(&Pod::from(&info)), info);

        // Two containers disagree on "http": it resolves to nothing, before and after.
        let odd: Pod = serde_saphyr::from_str(
            "metadata: {name: odd, namespace: shop}\n\
             spec: {hostNetwork: true, containers: [{name: a, ports: [{name: http, containerPort: 80}]},\n\
                                                    {name: b, ports: [{name: http, containerPort: 81}]}]}",
        )
        .unwrap();
        let info = PodInfo::with_policy(&odd);
        let back = PodInfo::with_policy(&Pod::from(&info));
        for i in [&info, &back] {
            let part = &i.policy.as_ref().unwrap().value;
            let tcp = weir_policy::model::Protocol::Tcp;
            assert_eq!(part.named_port("http", tcp), None);
            assert!(part.host_network);
            assert_eq!(i.policy.as_ref().unwrap().warnings.len(), 1);
        }
    }
}
