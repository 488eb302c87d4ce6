//! What weir keeps of a Pod: only what the cluster DNS's verified pod records need (which
//! namespace holds which IP). The proxy never watches Pods.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::compact::intern;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `status.podIPs` (else `status.podIP`) that parse as IPs, each once.
    pub ips: Box<[IpAddr]>,
    /// `status.phase` is `Succeeded` or `Failed`: the pod's IPs are released and may already
    /// belong to another pod.
    pub terminated: bool,
}

impl PodInfo {
    /// Whether the pod holds `ip` now.
    pub fn has_ip(&self, ip: IpAddr) -> bool {
        !self.terminated && self.ips.contains(&ip)
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
        }
    }
}

/// Back to a Pod holding exactly what was kept (the manifest source's last-known-good copy).
impl From<&PodInfo> for Pod {
    fn from(o: &PodInfo) -> Self {
        use k8s_openapi::api::core::v1 as core;
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(o.namespace.to_string()),
                name: Some(o.name.to_string()),
                ..Default::default()
            },
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
            ..Default::default()
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
}
