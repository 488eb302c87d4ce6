//! Input as pasted (issue 30): a ticket body holding several outputs, files whose names
//! mislead, a whole ticket directory pasted as one blob, every corpus file read as its name
//! says, and no panic (nor a slow read) on any input.

use std::path::{Path, PathBuf};

use weir_netdiag::doctor::{self, Status as CheckStatus};
use weir_netdiag::intake::{self, Kind, Status};
use weir_netdiag::state::{NodeState, Output};
use weir_netdiag::trace::{self, Packet, Proto};

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// Every saved output of the test data whose file name names an output (`ip-route.txt`,
/// `iptables.txt`, `ipvsadm-Sn.txt`, …) is found, by its content alone, to be that output,
/// whole: the classifier agrees with every name the corpus was read by before.
#[test]
fn every_named_corpus_file_is_read_by_content_as_its_name_says() {
    let mut files = Vec::new();
    files_under(&data(), &mut files);
    files.sort();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for p in files {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.to_string_lossy().contains("pasted-mixed") {
            continue;
        }
        let Some(want) = Output::for_file_name(&name) else {
            continue;
        };
        checked += 1;
        let sections = intake::sections(&name, &read(&p));
        for s in &sections {
            let by_name_only = s
                .hint
                .as_deref()
                .is_some_and(|h| h.contains("not recognised"));
            if s.status != Status::Read || s.output != Some(want) || by_name_only {
                wrong.push(format!(
                    "{}:{}: {:?} {:?} {:?}, want {want:?}",
                    p.strip_prefix(data()).unwrap().display(),
                    s.line,
                    s.kind,
                    s.status,
                    s.output
                ));
            }
        }
        assert!(!sections.is_empty(), "{}: no section", p.display());
    }
    assert!(checked >= 80, "only {checked} named files");
    assert!(
        wrong.is_empty(),
        "{checked} files; misread:\n{}",
        wrong.join("\n")
    );
}

fn ticket_body() -> (String, NodeState) {
    let text = read(&data().join("pasted-mixed/ticket-body.md"));
    let st = NodeState::from_sources([("ticket-body.md".to_string(), text.clone())]);
    (text, st)
}

/// A GitHub ticket body: prose, code fences, prompts of four kinds, outputs one after the other
/// with and without prompts, and two outputs nothing reads yet.
#[test]
fn a_ticket_body_is_read_output_by_output() {
    let (_, st) = ticket_body();
    let got: Vec<(usize, Kind, Status)> = st
        .sections
        .iter()
        .map(|s| (s.line, s.kind, s.status))
        .collect();
    use Kind::*;
    use Status::*;
    assert_eq!(
        got,
        [
            (1, Unknown, NotRecognised),
            (8, IpRoute, Read),
            (15, Unknown, NotRecognised),
            (19, IptablesListing, Read),
            (26, Sysctl, Read),
            (30, Unknown, NotRecognised),
            (34, IpRouteGet, Read),
            (37, IpRouteGet, Read),
            (40, IpRouteGet, Read),
            (43, KernelLog, Read),
            (50, ProcConntrack, Read),
            (52, IpRule, Read),
            (54, IpvsadmConns, Read),
            (58, Tcpdump, Read),
            (68, NftText, Read),
            (87, Unknown, NotRecognised),
        ]
    );
    // Each reached its reader, as the same outputs in a directory do.
    assert_eq!(st.routes.as_ref().unwrap().len(), 5);
    let fwd = &st.iptables.as_ref().unwrap().tables["filter"].chains[0];
    assert_eq!(
        (fwd.name.as_str(), fwd.policy.as_deref()),
        ("FORWARD", Some("DROP"))
    );
    assert_eq!(fwd.rules.len(), 3);
    assert_eq!(
        st.sysctls.as_ref().unwrap().effective_rp_filter("eth0"),
        Some(2)
    );
    assert_eq!(st.route_gets.as_ref().unwrap().len(), 3);
    assert_eq!(st.martians.as_ref().unwrap().len(), 1);
    assert_eq!(st.conntrack.as_ref().unwrap().len(), 1);
    assert_eq!(st.rules.as_ref().unwrap().len(), 1);
    assert_eq!(st.ipvs_conns.as_ref().unwrap().len(), 1);
    assert!(st.skipped.is_empty(), "{:?}", st.skipped);
    // The nft ruleset pasted as text, read as its JSON would be (the paste stops inside it).
    assert!(st.unreadable.is_empty(), "{:?}", st.unreadable);
    let rs = st.nft.as_ref().unwrap();
    assert_eq!(
        (rs.tables.len(), rs.chains.len(), rs.rules.len()),
        (1, 2, 3)
    );
    assert_eq!(rs.sets[0].elements.len(), 1);
    // And doctor judges them.
    let checks = doctor::run_all(&st, None);
    for id in ["forward-policy", "rp-filter-refusals", "ipvs-vip-source"] {
        let c = checks.iter().find(|c| c.id == id).unwrap();
        assert_eq!(c.status, CheckStatus::Warn, "{id}: {c:?}");
    }
}

#[test]
fn the_what_was_read_table_names_every_section() {
    let (_, st) = ticket_body();
    let table = intake::render(&st.sections);
    println!("{table}");
    for want in [
        "ticket-body.md:8",
        "6 lines  ip route\n",
        "ticket-body.md:19",
        "iptables -L\n",
        "ip route get (by `ip route get 172.30.182.212`)",
        "/proc/net/nf_conntrack",
        "10 lines  tcpdump\n",
        "18 lines  nft list ruleset\n",
        "not recognised: \"**What happened**: pods on the second node cannot be reached through their Servi…\"",
        "not recognised: \"Anything else we need to know?: no.\"",
    ] {
        assert!(table.contains(want), "{want:?} not in\n{table}");
    }
    let json = serde_json::to_value(&st.sections).unwrap();
    assert_eq!(json[3]["kind"], "iptables-listing");
    assert_eq!(json[3]["status"], "read");
    assert_eq!(json[3]["output"], "iptables-save");
    assert_eq!(json[13]["kind"], "tcpdump");
    assert_eq!(json[13]["status"], "read");
    assert_eq!(json[0]["status"], "not-recognised");
    assert!(json[0]["first_line"]
        .as_str()
        .unwrap()
        .starts_with("**What"));
}

/// Files named like no output, or like the wrong one, are read by what they hold.
#[test]
fn files_with_misleading_names_are_read_by_their_content() {
    let (st, ignored) = NodeState::from_dir(&data().join("pasted-mixed/misnamed")).unwrap();
    assert!(ignored.is_empty(), "{ignored:?}");
    let by_source = |name: &str| {
        st.sections
            .iter()
            .find(|s| s.source == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(by_source("iptables-L-v-n").kind, Kind::IptablesListing);
    assert_eq!(
        by_source("iptables-v-L-FORWARD").kind,
        Kind::IptablesListing
    );
    // The name spells the command its lines were printed by (`-v`: interfaces shown).
    assert_eq!(
        by_source("iptables-v-L-FORWARD").command.as_deref(),
        Some("iptables -v -L FORWARD")
    );
    assert_eq!(by_source("nf_conntrack").kind, Kind::ProcConntrack);
    assert_eq!(by_source("notes.txt").kind, Kind::IpRule);
    assert_eq!(by_source("iptables.txt").kind, Kind::IpRoute);
    assert_eq!(by_source("tcpdump").status, Status::Read);
    assert_eq!(st.captures.as_ref().unwrap()[0].packets.len(), 4);
    // `ip route show table local`'s lines print no table: the file's name gives it.
    let routes = st.routes.as_ref().unwrap();
    let local = routes.iter().find(|r| r.kind == "local").unwrap();
    assert_eq!(local.table, "local");
    assert!(routes.iter().any(|r| r.table == "main"));
    assert_eq!(st.conntrack.as_ref().unwrap().len(), 1);
    assert_eq!(st.rules.as_ref().unwrap().len(), 1);
    // Two listings of FORWARD: the later one shown whole is the one read, and that is said.
    let filter = &st.iptables.as_ref().unwrap().tables["filter"];
    let fwd = filter.chains.iter().find(|c| c.name == "FORWARD").unwrap();
    assert_eq!(fwd.rules.len(), 3, "{fwd:?}");
    assert!(filter.chains.iter().any(|c| c.name == "INPUT"));
    assert!(
        st.assumptions
            .iter()
            .any(|a| a.contains("FORWARD") && a.contains("shown again")),
        "{:?}",
        st.assumptions
    );
}

/// Issue 22's ticket directory pasted as one blob, file after file: the same walk.
#[test]
fn a_ticket_directory_pasted_as_one_blob_walks_as_the_directory_does() {
    let dir = data().join("ticket-eni-ipvs-lb");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    names.sort();
    let blob: String = names.iter().map(|n| read(&dir.join(n))).collect();
    let pasted = NodeState::from_sources([("paste.txt".to_string(), blob)]);
    let (saved, _) = NodeState::from_dir(&dir).unwrap();
    let kinds: Vec<Kind> = pasted.sections.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::IpLink,
            Kind::IpRoute,
            Kind::IpRule,
            Kind::IpsetList,
            Kind::IptablesSave,
            Kind::IpvsadmLn,
            Kind::IpAddr
        ]
    );
    assert_eq!(pasted.present, saved.present);
    assert!(pasted.skipped.is_empty(), "{:?}", pasted.skipped);
    let walk = |st: &NodeState| {
        let pod = st
            .pod
            .as_ref()
            .expect("the pod, by `kubectl exec … -- ip addr`");
        trace::render(&trace::trace(
            st,
            &Packet {
                src: pod.addr.into(),
                dst: "10.12.115.101".parse().unwrap(),
                proto: Proto::Tcp,
                sport: 40000,
                dport: 443,
                iif: pod.host_iface.clone().unwrap(),
            },
        ))
    };
    let (a, b) = (walk(&pasted), walk(&saved));
    assert!(a.contains("CONDITIONAL"), "{a}");
    assert_eq!(a, b);
}

mod never_panics {
    use proptest::prelude::*;

    use super::*;

    /// Lines that start, end or confuse outputs: prompts, headers, braces, JSON openers,
    /// fences, separators, `\r`, multi-byte characters and half lines.
    const PIECES: &[&str] = &[
        "$ ip route\n",
        "# iptables-save\n",
        "[root@n ~]# ipvsadm -Ln\n",
        "root@n:~# ip rule\n",
        "ip route show table local\n",
        "# Generated by iptables-save v1.8.9\n",
        "*filter\n",
        ":FORWARD DROP [0:0]\n",
        "-A FORWARD -j ACCEPT\n",
        "COMMIT\n",
        "Chain FORWARD (policy DROP 0 packets, 0 bytes)\n",
        "target     prot opt source               destination\n",
        "ACCEPT     all  --  0.0.0.0/0            0.0.0.0/0\n",
        "table inet weir {\n",
        "\tip saddr 10.0.0.0/8 accept\n",
        "}\n",
        "{\"nftables\": [\n",
        "[\n",
        "[{\"dst\":\"default\"}]\n",
        "```\n",
        "--\n",
        "\n",
        "   \n",
        "\r\n",
        "default via 10.0.0.1 dev eth0\n",
        "local 10.0.0.5 dev eth0 proto kernel scope host src 10.0.0.5\n",
        "0:\tfrom all lookup local\n",
        "2: eth0@if3: <UP> mtu 1500\n",
        "    inet 10.0.0.5/24 scope global eth0\n",
        "IP Virtual Server version 1.2.1 (size=4096)\n",
        "TCP  10.96.0.1:443 rr\n",
        "  -> 10.0.0.5:6443 Masq 1 0 0\n",
        "Name: KUBE-X\n",
        "Type: hash:ip\n",
        "net.ipv4.ip_forward = 1\n",
        "ipv4 2 tcp 6 59 SYN_RECV src=1.2.3.4 dst=5.6.7.8 sport=1 dport=2\n",
        "12:34:56.789012 IP 1.2.3.4.5 > 6.7.8.9.80: Flags [S]\n",
        "[912228.4] IPv4: martian source 1.2.3.4 from 5.6.7.8, on dev eth0\n",
        "apiVersion: v1\nkind: Pod\n",
        "é—ü 😀\n",
        "(",
        "@",
        ":",
        "#",
        "$",
    ];

    fn paste() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(PIECES).prop_map(str::to_string),
                1 => "[ -~\\t\\r\\n{}\\[\\]:#$@]{0,40}",
                1 => any::<String>(),
            ],
            0..40,
        )
        .prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn splitting_classifying_and_reading_any_paste_never_panics(text in paste()) {
            let spans = intake::split::split(&text);
            let mut covered = 0;
            for s in &spans {
                // Spans are whole lines of the input, in order, never overlapping.
                let at = s.text.as_ptr() as usize - text.as_ptr() as usize;
                prop_assert!(at >= covered);
                covered = at + s.text.len();
                let _ = intake::classify::classify(s.text, s.command.as_deref(), "x");
            }
            let st = NodeState::from_sources([("paste.txt".to_string(), text.clone())]);
            let _ = intake::render(&st.sections);
            let _ = doctor::run_all(&st, None);
        }
    }

    /// Random bytes, read as a file is (invalid UTF-8 replaced): a bounded loop.
    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..300 {
            let len = (round * 37) % 2000;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Mostly printable, with line ends and bytes above 0x7f.
                    match x % 10 {
                        0 => b'\n',
                        1 => (x >> 8) as u8,
                        _ => b' ' + ((x >> 16) % 95) as u8,
                    }
                })
                .collect();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let st = NodeState::from_sources([("bytes".to_string(), text)]);
            let _ = intake::render(&st.sections);
        }
    }
}

/// A 10 MB paste (every ticket output over and over) is read to its end; the time is printed
/// (`cargo bench -p weir-netdiag --bench intake` times it in a release build).
#[test]
fn a_ten_megabyte_paste_is_read() {
    let (body, _) = ticket_body();
    let mut blob = String::with_capacity(11 << 20);
    while blob.len() < 10 << 20 {
        blob.push_str(&body);
    }
    let started = std::time::Instant::now();
    let st = NodeState::from_sources([("big.md".to_string(), blob)]);
    println!(
        "10 MB paste: {} sections in {:?} (debug build)",
        st.sections.len(),
        started.elapsed()
    );
    assert!(st.sections.len() > 10_000);
    assert!(st.routes.as_ref().unwrap().len() > 10_000);
}
