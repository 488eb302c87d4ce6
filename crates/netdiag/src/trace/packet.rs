//! The packet the walk follows, and what it reports: hops, verdicts, and the facts a
//! conditional verdict depends on (looked up in [`super::facts`]).

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    /// An ICMP echo request (ICMPv6's for an IPv6 packet): no ports; its identifier is the
    /// packet's `sport`, as conntrack keys it, and `dport` is 0.
    Icmp,
}

impl Proto {
    /// The protocol's name in rules: `icmp` for both families (nft's and iptables' own
    /// ICMPv6 spellings are matched where the rules are read).
    pub(super) fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
        }
    }
    /// The IP protocol number (`ip protocol`, `ip6 nexthdr`, `meta l4proto`).
    pub(super) fn number(self, v6: bool) -> u64 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Icmp if v6 => 58,
            Proto::Icmp => 1,
        }
    }
    pub fn has_ports(self) -> bool {
        self != Proto::Icmp
    }
}

/// The packet to trace: the first packet of a connection arriving on `iif` (from outside or
/// from a pod's veth).
#[derive(Debug, Clone, Serialize)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Proto,
    pub sport: u16,
    pub dport: u16,
    /// The interface it arrives on; `local` (or empty) for a packet this node sends itself
    /// (the OUTPUT path), from `src` or, when `src` is 0.0.0.0, from the source routing picks.
    pub iif: String,
}

impl Packet {
    /// An IPv6 packet (by its destination; a source of the other family is refused by
    /// [`super::trace`]).
    pub fn is_v6(&self) -> bool {
        self.dst.is_ipv6()
    }

    /// Whether the packet is sent by this node rather than received.
    pub fn originates_here(&self) -> bool {
        self.iif.is_empty() || self.iif == LOCAL
    }
}

impl Pkt {
    pub(super) fn v6(&self) -> bool {
        self.dst.is_ipv6()
    }

    /// An ICMP packet's type as rules name it: the walked request, or its reply.
    pub(super) fn icmp_type(&self) -> &'static str {
        if self.ct_state == "new" {
            "echo-request"
        } else {
            "echo-reply"
        }
    }
}

/// The `iif` of a packet the node sends itself.
pub const LOCAL: &str = "local";

/// The packet as the walk changes it.
#[derive(Debug, Clone)]
pub(super) struct Pkt {
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) proto: Proto,
    pub(super) iif: String,
    pub(super) oif: Option<String>,
    pub(super) mark: u32,
    pub(super) ct_mark: u32,
    /// `new` for the first packet, `established` for the reply.
    pub(super) ct_state: &'static str,
    /// The connection was DNATed (conntrack's `DNAT` status).
    pub(super) dnat: bool,
    /// A nat chain of the current hook set up a binding: the kernel's nat core runs no further
    /// nat chains on that hook (nf_nat_inet_fn).
    pub(super) nat_bound: bool,
    /// The connection's nat bindings are already set up (a packet IPVS sends on, or one
    /// looped back over `lo`): no nat chain runs on this hook.
    pub(super) skip_nat: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Hop {
    /// `PREROUTING`, `routing`, `FORWARD`, `POSTROUTING`, `reply routing`, …
    pub stage: String,
    /// `iptables nat KUBE-SERVICES`, `nft ip kube-proxy nat-prerouting`, `table 1003`, …
    pub place: String,
    /// The rule or route that decided, as written in the dump.
    pub rule: Option<String>,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The connection works as far as this node can tell.
    Delivered,
    /// Dropped on this node (request or reply).
    Dropped,
    /// Refused on this node by a reject rule (TCP reset or ICMP unreachable): the client
    /// learns at once, unlike a drop.
    Rejected,
    /// The outcome depends on facts the dump lacks: see [`Trace::branches`].
    Conditional,
    /// The walk reached something the dump cannot tell (a route table it lacks).
    Unknown,
}

/// The request as it leaves this node (or is handed to a local socket): after DNAT and
/// masquerade, so a walk can be continued on the next node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Egress {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    /// The interface it leaves by (`None` when delivered locally).
    pub oif: Option<String>,
    /// Delivered to a socket on this node.
    pub local: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub packet: Packet,
    pub hops: Vec<Hop>,
    pub verdict: Verdict,
    /// Where and why it was dropped.
    pub cause: Option<String>,
    /// Candidate fixes, cheapest first.
    pub fixes: Vec<String>,
    /// Random choices among endpoints ("one of …"); every alternative is walked (see
    /// [`Trace::endpoint_outcomes`]).
    pub choices: Vec<String>,
    /// The destinations (`ip:port`) DNAT may pick for this packet: every alternative of a
    /// random choice, or the one DNAT target; empty without DNAT.
    pub endpoints: Vec<String>,
    /// The request as it left (`None` when dropped before).
    pub egress: Option<Egress>,
    pub assumptions: Vec<String>,
    /// With a [`Verdict::Conditional`] verdict: each outcome and the facts' values that lead
    /// to it. Empty otherwise.
    pub branches: Vec<Branch>,
    /// The facts the dump lacks that the verdict depends on, and what settles each.
    pub unknowns: Vec<Unknown>,
    /// Where the rules choose among endpoints (a statistic cascade, a numgen map or vmap, IPVS
    /// real servers): the outcome of the walk to each one, in the rules' order. Empty when
    /// there is no choice (one endpoint, or none). The verdict is `delivered` only when every
    /// endpoint's is; otherwise the cause counts them and names the failing ones, and the hops
    /// shown are the first failing endpoint's path.
    pub endpoint_outcomes: Vec<EndpointOutcome>,
    /// What weir's NetworkPolicy table (`table inet weir-policy`) decided on the way, in
    /// the order the walk met it: the source pod's egress, then the destination's ingress.
    /// Empty on a node without that table.
    pub policy: Vec<PolicyDecision>,
}

/// One decision of weir's NetworkPolicy table for the packet: at one pod, in one direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyDecision {
    /// `ingress` (at the destination pod) or `egress` (at the source pod).
    pub direction: String,
    /// The address the table looked up: the destination for ingress, the source for egress.
    pub address: IpAddr,
    /// The pod (`namespace/name`) whose chain decided, as the chain's drop comment names it;
    /// `None` when the address is no isolated pod's.
    pub pod: Option<String>,
    pub verdict: PolicyVerdict,
    /// The policy whose rule allowed the packet (`shop/web-from-lb`).
    pub allowed_by: Option<String>,
    /// The policies isolating the pod in this direction, as the drop comment names them.
    pub isolated_by: Vec<String>,
    /// How many more isolate it than the comment could name (nft's 128-byte limit).
    pub isolated_by_more: usize,
    /// The rule that decided, as the dump writes it.
    pub rule: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyVerdict {
    /// A rule of a policy selecting the pod allows it (`allowed_by`).
    Allowed,
    /// The pod's own address ("a pod cannot block access to itself").
    Itself,
    /// The pod is isolated in this direction and no rule allows the packet.
    Dropped,
    /// No policy isolates the address in this direction on this node: not policed here.
    NotIsolated,
}

/// The walk to one endpoint of a choice.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointOutcome {
    /// The endpoint (`ip:port`, as the DNAT rule or real server names it; the chain's name when
    /// its DNAT target cannot be read); choices in a row are joined with ` then `.
    pub endpoint: String,
    /// Its verdict; `conditional` when it depends on facts the dump lacks (see `branches`).
    pub verdict: Verdict,
    pub cause: Option<String>,
    pub fixes: Vec<String>,
    /// With a conditional verdict: this endpoint's outcomes and the facts that lead to each.
    pub branches: Vec<Branch>,
    /// The request as it left towards this endpoint.
    pub egress: Option<Egress>,
    /// The hops of the walk to this endpoint (with a conditional verdict: a failing branch's).
    pub hops: Vec<Hop>,
    /// What weir's NetworkPolicy table decided on the walk to this endpoint.
    pub policy: Vec<PolicyDecision>,
}

impl EndpointOutcome {
    /// Whether the connection works whatever the dump does not say.
    pub fn delivered(&self) -> bool {
        match self.verdict {
            Verdict::Delivered => true,
            Verdict::Conditional => self
                .branches
                .iter()
                .all(|b| b.verdict == Verdict::Delivered),
            _ => false,
        }
    }
}

/// How a chain (or a whole hook) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Flow {
    Accept,
    Drop(String),
    Return,
    /// Rules the paste does not show decide it: an unknown outcome, with its cause.
    Unknown(String),
}

/// A fact the walk needed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "on")]
pub enum Fact {
    /// The effective `rp_filter` on an interface: max(conf/all, conf/IFACE); 0, 1 or 2.
    RpFilter(String),
    /// `src_valid_mark` on an interface (conf/all OR conf/IFACE); 0 or 1.
    SrcValidMark(String),
    /// `net.ipv4.ip_forward`; 0 or 1.
    IpForward,
    /// `net.ipv6.conf.all.forwarding` (IPv6's switch); 0 or 1.
    Ip6Forward,
    /// `net.bridge.bridge-nf-call-iptables` (0 also when br_netfilter is not loaded); 0 or 1.
    BrNetfilter,
    /// `net.bridge.bridge-nf-call-ip6tables`, the same for IPv6; 0 or 1.
    BrNetfilter6,
    /// Whether a route table a rule names holds routes the dump does not show (the routes are
    /// `ip route list`, main only); 0 (empty) or 1 (holds routes, where they lead unknown).
    Table(String),
    /// What a chain does that a shown rule jumps to but the paste does not hold: an iptables
    /// chain (`filter cali-FORWARD`) or an nft one (`nft ip filter cali-FORWARD`); 0 returns
    /// without a verdict, 1 accepts.
    Chain(String),
    /// Rules a cut paste does not show: a built-in chain of a grep-cut iptables dump (`iptables
    /// filter FORWARD`), or the rest of an nft chain the paste ends inside (`nft ip filter
    /// FORWARD`); 0 none of them is for the packet, 1 one is (what it does is unknown).
    Unseen(String),
    /// Where a destination goes when no routes were pasted: 0 this node, 1 forwarded.
    Route(String),
}

impl Fact {
    /// The forwarding switch of a family.
    pub fn forwarding(v6: bool) -> Fact {
        if v6 {
            Fact::Ip6Forward
        } else {
            Fact::IpForward
        }
    }

    /// What the fact is, without a value.
    pub fn name(&self) -> String {
        match self {
            Fact::RpFilter(i) => format!("rp_filter on {i} (max of conf/all and conf/{i})"),
            Fact::SrcValidMark(i) => format!("src_valid_mark on {i}"),
            Fact::IpForward => "net.ipv4.ip_forward".into(),
            Fact::Ip6Forward => "net.ipv6.conf.all.forwarding".into(),
            Fact::BrNetfilter => "br_netfilter (net.bridge.bridge-nf-call-iptables)".into(),
            Fact::BrNetfilter6 => "br_netfilter (net.bridge.bridge-nf-call-ip6tables)".into(),
            Fact::Table(t) => format!("route table {t}"),
            Fact::Chain(c) => match c.strip_prefix("nft ") {
                Some(nft) => format!("nft chain {nft}"),
                None => format!("iptables chain {c}"),
            },
            Fact::Route(d) => format!("the route to {d}"),
            Fact::Unseen(c) => format!("the rules of {c} the paste does not show"),
        }
    }

    /// The fact with a value, as a condition people read.
    pub fn describe(&self, values: &BTreeSet<i64>) -> String {
        let v: Vec<i64> = values.iter().copied().collect();
        let or = |names: Vec<String>| names.join(" or ");
        match self {
            Fact::RpFilter(i) => format!(
                "rp_filter on {i} is {}",
                or(v.iter()
                    .map(|x| match x {
                        0 => "0 (off)".to_string(),
                        1 => "1 (strict)".to_string(),
                        2 => "2 (loose)".to_string(),
                        o => o.to_string(),
                    })
                    .collect())
            ),
            Fact::SrcValidMark(i) => format!(
                "src_valid_mark on {i} is {}",
                or(v.iter().map(|x| x.to_string()).collect())
            ),
            Fact::IpForward | Fact::Ip6Forward => format!(
                "{} is {}",
                self.name(),
                or(v.iter().map(|x| x.to_string()).collect())
            ),
            Fact::BrNetfilter => match v.as_slice() {
                [0] => "bridge-nf-call-iptables is 0 (or br_netfilter not loaded)".into(),
                [1] => "bridge-nf-call-iptables is 1".into(),
                _ => "bridge-nf-call-iptables is 0 or 1".into(),
            },
            Fact::BrNetfilter6 => match v.as_slice() {
                [0] => "bridge-nf-call-ip6tables is 0 (or br_netfilter not loaded)".into(),
                [1] => "bridge-nf-call-ip6tables is 1".into(),
                _ => "bridge-nf-call-ip6tables is 0 or 1".into(),
            },
            Fact::Table(t) => match v.as_slice() {
                [0] => format!("table {t} is empty"),
                [1] => format!("table {t} holds routes"),
                _ => format!("table {t} is empty or holds routes"),
            },
            Fact::Unseen(c) => match v.as_slice() {
                [0] => format!("{c} has no rule for it where the paste was cut"),
                [1] => format!("{c} has a rule for it where the paste was cut"),
                _ => format!("{c} has a rule for it or not where the paste was cut"),
            },
            Fact::Chain(c) => match v.as_slice() {
                [0] => format!("{c} (not in the paste) returns it"),
                [1] => format!("{c} (not in the paste) accepts it"),
                _ => format!("{c} (not in the paste) returns or accepts it"),
            },
            Fact::Route(d) => match v.as_slice() {
                [0] => format!("{d} is this node's"),
                [1] => format!("{d} is forwarded"),
                _ => format!("{d} is this node's or forwarded"),
            },
        }
    }

    /// What settles it.
    pub fn settle(&self) -> String {
        match self {
            Fact::RpFilter(i) => format!(
                "`sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.{}.rp_filter` (sysctl.txt; `weir trace collect` saves it)",
                i.replace('.', "/")
            ),
            Fact::SrcValidMark(i) => format!(
                "`sysctl net.ipv4.conf.all.src_valid_mark net.ipv4.conf.{}.src_valid_mark` (sysctl.txt)",
                i.replace('.', "/")
            ),
            Fact::IpForward => "`sysctl net.ipv4.ip_forward` (sysctl.txt)".into(),
            Fact::Ip6Forward => "`sysctl net.ipv6.conf.all.forwarding` (sysctl.txt)".into(),
            Fact::BrNetfilter => "`sysctl net.bridge.bridge-nf-call-iptables` (sysctl.txt; no such key: br_netfilter is not loaded)".into(),
            Fact::BrNetfilter6 => "`sysctl net.bridge.bridge-nf-call-ip6tables` (sysctl.txt; no such key: br_netfilter is not loaded)".into(),
            Fact::Table(t) => format!(
                "`ip route show table all` (or `ip route show table {t}`) as ip-route.txt"
            ),
            Fact::Route(d) => format!(
                "`ip route show table all` (ip-route.txt) and `ip addr` (ip-addr.txt), or `ip route get {d}`"
            ),
            Fact::Unseen(c) => match c.strip_prefix("nft ") {
                Some(_) => "the whole `nft list ruleset`".to_string(),
                None => {
                    let mut w = c.split(' ');
                    let tool = w.next().unwrap_or("iptables");
                    let table = w.next().unwrap_or("filter");
                    format!("`{tool}-save -t {table}` (the whole table, not a grep of it)")
                }
            },
            Fact::Chain(c) if c.starts_with("nft ") => {
                let chain = c.rsplit(' ').next().unwrap_or(c);
                format!("`nft list ruleset` (the rules of chain {chain}, and every other table's)")
            }
            Fact::Chain(c) => {
                let (table, chain) = c.split_once(' ').unwrap_or(("filter", c));
                format!("`iptables-save -t {table}` (the rules of {chain}; or `iptables -t {table} -v -n -L {chain}`)")
            }
        }
    }
}

/// One outcome of a conditional verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Branch {
    /// The conditions that lead here: any of these conjunctions, each a list of facts with the
    /// values they must have.
    pub when: Vec<Vec<Condition>>,
    /// The same, as text: "rp_filter on eth0 is 1 (strict)".
    pub when_text: String,
    pub verdict: Verdict,
    pub cause: Option<String>,
    pub fixes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Condition {
    pub fact: Fact,
    pub values: Vec<i64>,
}

/// A fact the dump lacks and the verdict depends on.
#[derive(Debug, Clone, Serialize)]
pub struct Unknown {
    pub fact: Fact,
    /// "sysctl.txt is missing", "no net.ipv4.conf.eth0.rp_filter in sysctl.txt" …
    pub why: String,
    /// The command (and file) that settles it.
    pub settle: String,
}

/// `ip:port`, `[ip6]:port` for IPv6.
pub(super) fn sa(ip: IpAddr, port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip, port)
}

/// The packet's destination as people write it: `10.0.0.1:80`, `[fd00::1]:53`, or for
/// ICMP only the address.
pub(super) fn destination(ip: IpAddr, port: u16, proto: Proto) -> String {
    if proto.has_ports() {
        sa(ip, port).to_string()
    } else {
        ip.to_string()
    }
}
