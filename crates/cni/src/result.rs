//! The result of an ADD, built the same way in every mode: what prevResult lists first (when the
//! runtime chains us after another plugin), then this plugin's interfaces on the node, the pod's
//! interface, its addresses (each pointing at the pod's interface), routes and dns.

use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use serde_json::Value;
use weir_kernel::Link;

use crate::spec::{CniResult, Interface, IpConfig, Outcome, Route};

/// Appends one attachment to a result. Call in result order: host interfaces, the pod's
/// interface, then its addresses (they name its index), routes, dns; then [`Self::build`].
pub struct ResultBuilder {
    outcome: Outcome,
    /// Index of the pod's interface in `outcome.interfaces`, once added.
    pod_interface: Option<usize>,
}

impl ResultBuilder {
    /// Starts from prevResult, if the configuration has one (an invalid one is code 6), else empty.
    pub fn after(prev_result: Option<&Value>) -> CniResult<Self> {
        let outcome = match prev_result {
            Some(prev) => Outcome::from_value(prev)?,
            None => Outcome::default(),
        };
        Ok(Self {
            outcome,
            pod_interface: None,
        })
    }

    /// An interface on the node (a bridge, a veth's host end): name and MAC, no sandbox.
    pub fn host_interface(mut self, link: &Link) -> Self {
        self.outcome.interfaces.push(Interface {
            name: link.name.clone(),
            mac: link.mac_string(),
            ..Default::default()
        });
        self
    }

    /// The pod's interface `ifname`, in the namespace at `sandbox`, with its MAC and MTU.
    pub fn pod_interface(mut self, ifname: &str, link: &Link, sandbox: &Path) -> Self {
        self.pod_interface = Some(self.outcome.interfaces.len());
        self.outcome.interfaces.push(Interface {
            name: ifname.to_string(),
            mac: link.mac_string(),
            mtu: Some(link.mtu),
            sandbox: sandbox.display().to_string(),
        });
        self
    }

    /// Addresses (with their gateways) of the pod's interface.
    pub fn ips(mut self, ips: impl IntoIterator<Item = (IpNet, Option<IpAddr>)>) -> Self {
        let interface = self
            .pod_interface
            .expect("the pod's interface is added before its addresses");
        self.outcome
            .ips
            .extend(ips.into_iter().map(|(address, gateway)| IpConfig {
                address,
                gateway,
                interface: Some(interface),
            }));
        self
    }

    pub fn routes(mut self, routes: impl IntoIterator<Item = Route>) -> Self {
        self.outcome.routes.extend(routes);
        self
    }

    /// The result's `dns`; `null` (none configured) keeps what prevResult had.
    pub fn dns(mut self, dns: Value) -> Self {
        if !dns.is_null() {
            self.outcome.dns = dns;
        }
        self
    }

    pub fn build(self) -> Outcome {
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, last: u8, mtu: u32) -> Link {
        Link {
            index: u32::from(last),
            name: name.into(),
            mac: vec![0x02, 0, 0, 0, 0, last],
            mtu,
            up: true,
            controller: None,
            kind: None,
            peer_index: None,
            alias: None,
            vxlan: None,
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// The bridge-mode shape, rendered: pins the JSON both modes' results are made of.
    #[test]
    fn a_fresh_result_lists_host_interfaces_then_the_pods_and_points_ips_at_the_pods() {
        let gw: IpAddr = "10.1.0.1".parse().unwrap();
        let outcome = ResultBuilder::after(None)
            .unwrap()
            .host_interface(&link("cni0", 1, 1500))
            .host_interface(&link("weir04d0239dcdc", 2, 1500))
            .pod_interface("eth0", &link("eth0", 3, 1400), Path::new("/run/netns/p"))
            .ips([(net("10.1.0.5/24"), Some(gw)), (net("fd00::5/64"), None)])
            .routes([Route {
                dst: net("0.0.0.0/0"),
                gw: Some(gw),
            }])
            .dns(Value::Null)
            .build();
        let expected = r#"{
  "cniVersion": "1.1.0",
  "interfaces": [
    {
      "mac": "02:00:00:00:00:01",
      "name": "cni0"
    },
    {
      "mac": "02:00:00:00:00:02",
      "name": "weir04d0239dcdc"
    },
    {
      "mac": "02:00:00:00:00:03",
      "mtu": 1400,
      "name": "eth0",
      "sandbox": "/run/netns/p"
    }
  ],
  "ips": [
    {
      "address": "10.1.0.5/24",
      "gateway": "10.1.0.1",
      "interface": 2
    },
    {
      "address": "fd00::5/64",
      "interface": 2
    }
  ],
  "routes": [
    {
      "dst": "0.0.0.0/0",
      "gw": "10.1.0.1"
    }
  ]
}"#;
        assert_eq!(outcome.to_json("1.1.0"), expected);
    }

    #[test]
    fn a_chained_result_keeps_prev_results_entries_first_and_its_dns_unless_we_have_one() {
        let prev = serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "other0"}],
            "ips": [{"address": "192.0.2.9/32", "interface": 0}],
            "dns": {"nameservers": ["192.0.2.53"]},
        });
        let chained = |dns: Value| {
            ResultBuilder::after(Some(&prev))
                .unwrap()
                .host_interface(&link("weir04d0239dcdc", 2, 1500))
                .pod_interface("eth0", &link("eth0", 3, 1500), Path::new("/run/netns/p"))
                .ips([(net("10.12.192.10/32"), None)])
                .dns(dns)
                .build()
        };
        let kept = chained(Value::Null);
        assert_eq!(kept.interfaces[0].name, "other0");
        assert_eq!(kept.ips[0].interface, Some(0));
        // after prevResult's one interface and our host veth, the pod's is index 2
        assert_eq!(kept.ips[1].interface, Some(2));
        assert_eq!(kept.interfaces[2].sandbox, "/run/netns/p");
        assert_eq!(kept.dns, prev["dns"]);
        let ours = serde_json::json!({"nameservers": ["10.96.0.10"]});
        assert_eq!(chained(ours.clone()).dns, ours);
        // a prevResult that is not a result is the spec's decode error
        let bad = serde_json::json!({"ips": "nope"});
        let err = ResultBuilder::after(Some(&bad)).err().unwrap();
        assert_eq!(err.code, crate::spec::ErrorCode::Decode);
    }
}
