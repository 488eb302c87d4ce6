//! `weir trace`: walks a packet through a node's state (live, a lab node's namespace, or a
//! collected directory) and explains where it goes or why it is dropped; `weir trace collect DIR`
//! saves a node's state as the outputs operators paste, with a manifest.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use weir_netdiag::live::{self, Target};
use weir_netdiag::state::NodeState;
use weir_netdiag::trace::{self, Packet, Proto, Verdict};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: Option<TraceCommand>,
    #[command(flatten)]
    walk: WalkArgs,
}

#[derive(Args)]
struct WalkArgs {
    /// The packet's source address (default with --pod: the pod's address).
    #[arg(long)]
    from: Option<IpAddr>,
    /// The packet's destination address (IPv4 or IPv6; --from of the same family).
    #[arg(long, required = true)]
    to: Option<IpAddr>,
    /// The packet's protocol: the first packet of a TCP or UDP connection, or an ICMP echo
    /// request (ping; ICMPv6's with an IPv6 destination).
    #[arg(long, value_enum, default_value = "tcp")]
    proto: ProtoArg,
    /// Destination port (tcp and udp).
    #[arg(long)]
    dport: Option<u16>,
    /// Source port (tcp and udp; for icmp the echo identifier).
    #[arg(long, default_value_t = 40000)]
    sport: u16,
    /// The interface the packet arrives on.
    #[arg(long, conflicts_with = "pod")]
    iif: Option<String>,
    /// The node sends the packet itself (the OUTPUT path), from --from or, without it, from
    /// the source address routing picks. Also taken without this flag when --from is one of
    /// the node's own addresses and neither --iif nor --pod is given.
    #[arg(long, conflicts_with_all = ["pod", "iif"])]
    from_host: bool,
    /// The packet comes from this pod (its network namespace: a name under /run/netns or a
    /// path); its host-side veth is the input interface. `--pod-netns` as in `weir doctor`.
    #[arg(long, visible_alias = "pod-netns")]
    pod: Option<String>,
    /// What to read: a directory of saved outputs (`weir trace collect`, or files saved by
    /// hand), one file holding one output or many (a ticket body: split at prompts and
    /// headers, each part read by its content), or `-` for standard input.
    #[arg(value_name = "DIR|FILE|-")]
    input: Option<PathBuf>,
    /// Walk the live state of this network namespace instead.
    #[arg(long, conflicts_with = "input")]
    netns: Option<String>,
    /// Print JSON instead of the hop list.
    #[arg(long)]
    json: bool,
    /// Also draw the path as an SVG picture into this file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Follow the connection a pasted `conntrack -L` entry records (same source, destination
    /// and port): the endpoint it went to and the source it left with decide which walk, and
    /// whose reply, is shown.
    #[arg(long)]
    reply: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProtoArg {
    Tcp,
    Udp,
    Icmp,
}

impl ProtoArg {
    fn proto(self) -> Proto {
        match self {
            ProtoArg::Tcp => Proto::Tcp,
            ProtoArg::Udp => Proto::Udp,
            ProtoArg::Icmp => Proto::Icmp,
        }
    }
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Save iptables-save, ip6tables-save, nft -j list ruleset, ipset list, ip rule, route,
    /// link, addr and neigh, ip -6 rule and route, ipvsadm -Ln, the relevant sysctls and
    /// conntrack counters into DIR.
    Collect {
        /// A new or empty directory (existing files are never overwritten).
        dir: PathBuf,
        /// Collect from this network namespace (a name under /run/netns, or a path).
        #[arg(long)]
        netns: Option<String>,
        /// Also save this pod's side (its network namespace: a name or a path): its `ip addr`
        /// and resolv.conf, so `weir trace DIR` can start from the pod without --iif.
        #[arg(long)]
        pod: Option<String>,
    },
}

pub fn run(args: TraceArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(TraceCommand::Collect { dir, netns, pod }) => collect(dir, netns, pod),
        None => walk(args.walk),
    }
}

fn collect(dir: PathBuf, netns: Option<String>, pod: Option<String>) -> anyhow::Result<ExitCode> {
    let target = Target { netns };
    let mut runs = target.collect();
    if let Some(pod) = pod {
        runs.extend(Target { netns: Some(pod) }.collect_pod());
    }
    let manifest = live::write_collection(&dir, &target, &runs)
        .with_context(|| format!("cannot collect into {}", dir.display()))?;
    for e in &manifest.entries {
        match (&e.file, &e.error) {
            (Some(f), _) => outln!("{:<22} {:>8} bytes  {}", f, e.bytes, e.command),
            (None, Some(err)) => outln!("{:<22} {:>8}        {}: {err}", "-", "", e.command),
            (None, None) => {}
        }
    }
    outln!("manifest: {}", dir.join(live::MANIFEST_FILE).display());
    Ok(ExitCode::SUCCESS)
}

fn walk(a: WalkArgs) -> anyhow::Result<ExitCode> {
    let proto = a.proto.proto();
    let Some(to) = a.to else {
        bail!("--to is required");
    };
    let dport = match (a.dport, proto.has_ports()) {
        (Some(port), true) => port,
        (None, false) => 0,
        (None, true) => bail!("--dport is required with --proto tcp or udp"),
        (Some(_), false) => bail!("--dport: an ICMP echo request has no ports"),
    };
    let v6 = to.is_ipv6();
    let mut notes = Vec::new();
    let st = match &a.input {
        Some(input) => {
            let (st, read_notes) = crate::diag_input::read(input)?;
            if st.nothing_read() {
                bail!("{}", weir_netdiag::state::what_to_collect(input));
            }
            notes.extend(read_notes);
            st
        }
        None => {
            let target = Target {
                netns: a.netns.clone(),
            };
            let mut outputs = Vec::new();
            for r in target.collect() {
                match r.result {
                    Ok(t) => outputs.push((r.output, t)),
                    Err(e) => notes.push(format!("{}: {e}", r.command)),
                }
            }
            NodeState::from_outputs(outputs)
        }
    };
    let (from, iif) = packet_source(&a, &st, v6)?;
    same_family(from, to)?;
    let packet = Packet {
        src: from,
        dst: to,
        proto,
        sport: a.sport,
        dport,
        iif,
    };
    let mut t = trace::trace(&st, &packet);
    if a.reply {
        let Some(entry) = trace::pasted_entry(&st, &packet) else {
            bail!(
                "--reply: no conntrack entry of this connection in the input (`conntrack -L` or \
                 /proc/net/nf_conntrack, with {} → {})",
                packet.src,
                packet.dst
            );
        };
        notes.push(format!(
            "conntrack (line {}): {}",
            entry.line,
            entry.text.trim()
        ));
        let (narrowed, note) = trace::along_entry(t, entry);
        t = narrowed;
        notes.push(note);
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, trace::svg(&t))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    // An unreadable output is left out as if not collected: said first, as the reason.
    let unreadable = st
        .unreadable
        .iter()
        .map(|u| format!("{u}: left out; cannot tell"));
    notes.splice(0..0, unreadable);
    let mut out = std::io::stdout();
    if a.json {
        let doc = serde_json::json!({
            "read": st.sections,
            "trace": t,
            "notes": notes,
            "input_assumptions": st.assumptions,
            "unreadable": st.unreadable,
        });
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        // What was read comes first: a paste's parts, and what nothing reads.
        let mut text = if a.input.is_some() {
            weir_netdiag::intake::render(&st.sections)
        } else {
            String::new()
        };
        text.push_str(&trace::render(&t));
        for n in notes.iter().chain(&st.assumptions) {
            text.push_str(&format!("note: {n}\n"));
        }
        let _ = write!(out, "{text}");
    }
    // A conditional verdict fails when one of its branches does: the connection may fail.
    Ok(match t.verdict {
        Verdict::Delivered => ExitCode::SUCCESS,
        Verdict::Dropped | Verdict::Rejected | Verdict::Unknown => ExitCode::FAILURE,
        Verdict::Conditional => {
            if t.branches.iter().all(|b| b.verdict == Verdict::Delivered) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    })
}

/// Where the packet comes from: a pod (its address and host veth), an interface, or the node
/// itself (`--from-host`, or a `--from` that is one of the node's addresses; from 0.0.0.0,
/// the walk takes the source routing picks).
fn packet_source(a: &WalkArgs, st: &NodeState, v6: bool) -> anyhow::Result<(IpAddr, String)> {
    let unspecified = if v6 {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    };
    if a.from_host {
        return Ok((a.from.unwrap_or(unspecified), trace::LOCAL.to_string()));
    }
    match (&a.pod, &a.iif) {
        (Some(pod), _) => {
            let (ip, iif) = pod_side(pod, st, v6)?;
            Ok((a.from.unwrap_or(ip), iif))
        }
        (None, Some(iif)) => Ok((
            a.from.context("--from is required without --pod")?,
            iif.clone(),
        )),
        (None, None) => {
            if let Some(from) = a.from.filter(|ip| st.is_local_address(*ip)) {
                return Ok((from, trace::LOCAL.to_string()));
            }
            // A dump with the pod's own `ip addr` (pod-ip-addr.txt) names the pod's address
            // and, through its eth0@ifN peer index (or the node's route to it), the host veth.
            match st
                .pod
                .as_ref()
                .and_then(|p| Some((p.addr, p.host_iface.clone()?)))
            {
                Some((ip, iif)) if a.input.is_some() => Ok((a.from.unwrap_or(IpAddr::V4(ip)), iif)),
                _ => bail!(
                    "say where the packet comes from: --iif IFACE, --pod NETNS, --from-host (or a \
                     --from that is one of the node's addresses; with a directory, the pod's \
                     `ip addr` saved as pod-ip-addr.txt)"
                ),
            }
        }
    }
}

/// A packet's addresses are of one family (an IPv4-mapped or NAT64 address is not walked).
fn same_family(from: IpAddr, to: IpAddr) -> anyhow::Result<()> {
    if from.is_ipv6() != to.is_ipv6() {
        bail!(
            "--from {from} and --to {to} are of different IP families: give a source of the \
             destination's family (with --pod, or a pod-ip-addr.txt, the pod's address of that \
             family: --from)"
        );
    }
    Ok(())
}

/// A pod's address and its host-side veth: the pod's `eth0` names its peer's ifindex
/// (`link_index`), which is the host interface with that index.
fn pod_side(pod: &str, st: &NodeState, v6: bool) -> anyhow::Result<(IpAddr, String)> {
    let target = Target {
        netns: Some(pod.to_string()),
    };
    let link = target
        .run(&["ip", "-j", "link", "show", "eth0"])
        .map_err(anyhow::Error::msg)?;
    let v: serde_json::Value = serde_json::from_str(&link)?;
    let peer = v[0]["link_index"]
        .as_u64()
        .context("the pod's eth0 has no peer (not a veth?)")?;
    let family = if v6 { "-6" } else { "-4" };
    let addr = target
        .run(&[
            "ip", "-j", family, "addr", "show", "eth0", "scope", "global",
        ])
        .map_err(anyhow::Error::msg)?;
    let v: serde_json::Value = serde_json::from_str(&addr)?;
    let ip: IpAddr = v[0]["addr_info"][0]["local"]
        .as_str()
        .with_context(|| {
            format!(
                "the pod's eth0 has no global {} address",
                if v6 { "IPv6" } else { "IPv4" }
            )
        })?
        .parse()?;
    let iif = st
        .links
        .iter()
        .flatten()
        .find(|l| l.index as u64 == peer)
        .map(|l| l.name.clone())
        .context(
            "no host interface with the pod's peer index (is the node's ip link output there?)",
        )?;
    Ok((ip, iif))
}
