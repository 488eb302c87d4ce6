//! Issue 22's case against the kernel, in the test VM (Debian's kernel has IPVS; this machine's
//! does not): a pod on an addressless ENI `eth1`, policy-routed out of it, dials an IPVS
//! virtual server whose real server is beyond the VPC. The kernel's answer — which interface the
//! SYN leaves by, with which source, whether the connection opens, whether
//! TcpExtIPReversePathFilter rises — and trace's walk of the same namespace's outputs must agree,
//! with rp_filter 0 and 1, and with a fwmark rule ahead of the pod's. It also holds the model's
//! one non-obvious step: IPVS's own route
//! (`do_output_route4`) is by destination alone, but nf_nat's LOCAL_OUT hook routes the DNATed
//! packet again with its source and mark, so the pod's `from` rule sends it out of eth1.
//! Skips where the VM cannot run (`WEIR_VM_REQUIRED=1` makes that a failure).

use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::trace::{self, Packet, Proto, Verdict};

/// The namespaces: `node` (eth0 10.12.97.49/24 with the default route, eth1 with no address and
/// table 1003's default through it, the pod's veth `enipod`, `kube-ipvs0` with the virtual
/// server's address, kube-proxy's mark-and-masquerade rules, net.ipv4.vs.conntrack = 1), `pod`
/// (10.12.192.44), `vpc` (the subnets' gateways, counting the SYNs by the interface they come
/// from) and `be` (the real server 10.12.200.5:8443).
const SETUP: &str = r####"
set -u
for n in node pod vpc be; do ip netns add $n; ip -n $n link set lo up; done
for n in node pod vpc be; do ip netns exec $n sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0; done
N="ip netns exec node"; P="ip netns exec pod"; V="ip netns exec vpc"; B="ip netns exec be"
ip link add eth0 netns node type veth peer name vpc0 netns vpc
ip link add eth1 netns node type veth peer name vpc1 netns vpc
ip link add enipod netns node type veth peer name eth0 netns pod
ip link add vpcb netns vpc type veth peer name be0 netns be
$N ip link add kube-ipvs0 type dummy
for i in eth0 eth1 enipod kube-ipvs0; do $N ip link set $i up; done
for i in vpc0 vpc1 vpcb; do $V ip link set $i up; done
$P ip link set eth0 up; $B ip link set be0 up
$N ip addr add 10.12.97.49/24 dev eth0
$N ip addr add 10.12.115.101/32 dev kube-ipvs0
$N ip route add default via 10.12.97.1 dev eth0
$N ip route add default via 10.12.192.1 dev eth1 table 1003 onlink
$N ip route add 10.12.192.44 dev enipod scope link
$N ip rule add to 10.12.192.44 lookup main pref 512
$N ip rule add from 10.12.192.44 lookup 1003 pref 1536
$N sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.enipod.proxy_arp=1 net.ipv4.vs.conntrack=1
$P ip addr add 10.12.192.44/32 dev eth0
$P ip route add 169.254.1.1 dev eth0 scope link
$P ip route add default via 169.254.1.1 dev eth0
$V ip addr add 10.12.97.1/24 dev vpc0
$V ip addr add 10.12.192.1/24 dev vpc1
$V ip addr add 10.12.200.1/24 dev vpcb
$V sysctl -qw net.ipv4.ip_forward=1
$B ip addr add 10.12.200.5/24 dev be0
$B ip route add default via 10.12.200.1
$N ipvsadm -A -t 10.12.115.101:443 -s rr
$N ipvsadm -a -t 10.12.115.101:443 -r 10.12.200.5:8443 -m
$N iptables -t nat -A PREROUTING -d 10.12.115.101/32 -p tcp --dport 443 -j MARK --set-xmark 0x4000/0x4000
$N iptables -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
counters() {
$V nft delete table ip t 2>/dev/null
$V nft -f - <<'NFT'
table ip t {
  chain pre { type filter hook prerouting priority 0;
    iifname "vpc1" ip saddr 10.12.97.49 tcp dport 8443 counter comment "eth1_from_eth0_address"
    iifname "vpc1" tcp dport 8443 counter comment "eth1"
    iifname "vpc0" tcp dport 8443 counter comment "eth0"
  }
}
NFT
}
$B python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.12.200.5", 8443)); s.listen(8)
while True:
    c, a = s.accept(); c.close()
' >/dev/null 2>&1 &
sleep 1
# One attempt: the node's outputs first (as `weir trace collect` would save them), then the
# kernel's answer.
attempt() {
  counters
  echo "=== iptables-save"; $N iptables-save
  echo "=== ip-rule"; $N ip -j rule
  echo "=== ip-route"; $N ip -j route show table all
  echo "=== ip-link"; $N ip -j -d link
  echo "=== ip-addr"; $N ip -j addr
  echo "=== ipvsadm"; $N ipvsadm -Ln
  echo "=== sysctl"; $N sysctl -a 2>/dev/null | grep -E '^net\.ipv4\.(ip_forward|conf\.[^.]+\.(rp_filter|src_valid_mark|forwarding)|vs\.conntrack) '
  before=$($N nstat -az TcpExtIPReversePathFilter | awk '/TcpExt/ {print $2}')
  if $P timeout 3 bash -c 'echo > /dev/tcp/10.12.115.101/443' 2>/dev/null; then c=ok; else c=failed; fi
  after=$($N nstat -az TcpExtIPReversePathFilter | awk '/TcpExt/ {print $2}')
  counts=$($V nft list chain ip t pre | awk '/counter/ {for (i=1;i<=NF;i++) if ($i=="packets") p=$(i+1); gsub(/"/,"",$NF); printf "%s=%s ", $NF, p}')
  echo "=== kernel"; echo "connect=$c rpf=$((after-before)) $counts"
}
echo "### rp0"; attempt
$N sysctl -qw net.ipv4.conf.all.rp_filter=1
echo "### rp1"; attempt
# A fwmark rule ahead of the pod's: nf_nat's reroute carries the packet's mark (0x4000, from
# the nat PREROUTING rule), so main now decides and the SYN leaves eth0.
$N ip rule add fwmark 0x4000/0x4000 lookup main pref 1024
echo "### rp1-fwmark"; attempt
"####;

/// One attempt's outputs by section name.
struct Attempt {
    sections: Vec<(String, String)>,
}

impl Attempt {
    fn get(&self, name: &str) -> &str {
        self.sections
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
            .unwrap_or_else(|| panic!("no section {name}"))
    }

    /// `key=value` of the kernel line.
    fn kernel(&self, key: &str) -> String {
        self.get("kernel")
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {}", self.get("kernel")))
            .to_string()
    }

    fn state(&self, without: &[Output]) -> NodeState {
        let outputs = [
            (Output::IptablesSave, "iptables-save"),
            (Output::IpRule, "ip-rule"),
            (Output::IpRoute, "ip-route"),
            (Output::IpLink, "ip-link"),
            (Output::IpAddr, "ip-addr"),
            (Output::IpvsadmLn, "ipvsadm"),
            (Output::Sysctl, "sysctl"),
        ];
        NodeState::from_outputs(
            outputs
                .into_iter()
                .filter(|(o, _)| !without.contains(o))
                .map(|(o, n)| (o, self.get(n).to_string())),
        )
    }
}

fn attempts(out: &str) -> Vec<(String, Attempt)> {
    let mut res: Vec<(String, Attempt)> = Vec::new();
    for line in out.lines() {
        if let Some(name) = line.strip_prefix("### ") {
            res.push((name.to_string(), Attempt { sections: vec![] }));
        } else if let Some(sec) = line.strip_prefix("=== ") {
            let a = &mut res.last_mut().expect("an attempt").1;
            a.sections.push((sec.to_string(), String::new()));
        } else if let Some((_, a)) = res.last_mut() {
            if let Some((_, t)) = a.sections.last_mut() {
                t.push_str(line);
                t.push('\n');
            }
        }
    }
    res
}

fn walk(st: &NodeState) -> trace::Trace {
    let t = trace::trace(
        st,
        &Packet {
            src: "10.12.192.44".parse().unwrap(),
            dst: "10.12.115.101".parse().unwrap(),
            proto: Proto::Tcp,
            sport: 40000,
            dport: 443,
            iif: "enipod".into(),
        },
    );
    eprintln!("{}", trace::render(&t));
    t
}

#[test]
fn pod_to_ipvs_vip_from_an_addressless_eni_agrees_with_the_kernel() {
    let vm = weir_vmtest::vm_or_skip!();
    let out = vm.run_ok(&format!("bash <<'WEIR_EOF'\n{SETUP}\nWEIR_EOF\n"));
    let runs = attempts(&out);
    assert_eq!(runs.len(), 3, "{out}");
    for (name, a) in &runs {
        eprintln!("--- {name}: kernel {}", a.get("kernel").trim());
        let t = walk(&a.state(&[]));
        let egress = t.egress.as_ref().expect("the request leaves");
        assert_eq!(egress.src.to_string(), "10.12.97.49", "{name}");
        if name == "rp1-fwmark" {
            // The kernel: the SYN leaves eth0.
            assert_ne!(a.kernel("eth0"), "0", "{name}");
            assert_eq!(a.kernel("eth1"), "0", "{name}");
            assert_eq!(egress.oif.as_deref(), Some("eth0"), "{name}");
        } else {
            // The kernel: the SYN leaves eth1 with eth0's address, never eth0.
            assert_ne!(a.kernel("eth1_from_eth0_address"), "0", "{name}");
            assert_eq!(a.kernel("eth0"), "0", "{name}");
            assert_eq!(egress.oif.as_deref(), Some("eth1"), "{name}");
        }
        match name.as_str() {
            "rp0" => {
                assert_eq!(a.kernel("connect"), "ok");
                assert_eq!(a.kernel("rpf"), "0");
                assert_eq!(t.verdict, Verdict::Delivered, "{:?}", t.cause);
            }
            "rp1" => {
                assert_eq!(a.kernel("connect"), "failed");
                assert_ne!(a.kernel("rpf"), "0", "TcpExtIPReversePathFilter must rise");
                assert_eq!(t.verdict, Verdict::Dropped);
                assert!(t
                    .cause
                    .as_deref()
                    .unwrap()
                    .starts_with("reply routing: strict reverse-path filter on eth0"));
                // As the ticket pastes it (no sysctls, no ip addr): conditional, its strict
                // branch the kernel's answer.
                let t = walk(&a.state(&[Output::Sysctl, Output::IpAddr]));
                assert_eq!(t.verdict, Verdict::Conditional);
                assert!(t.branches.iter().any(|b| b.verdict == Verdict::Dropped
                    && b.when_text.contains("rp_filter on eth0 is 1 (strict)")));
            }
            "rp1-fwmark" => {
                // The reply carries no mark (nothing restores it): the reverse-path lookup
                // for the pod still takes table 1003, and strict rp_filter drops it.
                assert_eq!(a.kernel("connect"), "failed");
                assert_ne!(a.kernel("rpf"), "0");
                assert_eq!(t.verdict, Verdict::Dropped);
            }
            other => panic!("attempt {other}"),
        }
    }
}
