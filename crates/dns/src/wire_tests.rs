//! The fast path against the general path: whenever [`WireZone::answer`] answers, its reply
//! must decode to exactly what the general path (decode, [`Zone::lookup`], encode) sends —
//! for generated queries over every kind of name in the fixture zone, in random case, with
//! and without EDNS0 options, and with random corruption and truncation on top.

use std::sync::Arc;

use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_proto::rr::{Name, RecordType};
use proptest::prelude::*;

use super::WireZone;
use crate::server::{Handler, ZoneHandle};
use crate::zone::{PodRecords, Zone, ZoneConfig};
use crate::zone_tests::{snapshot, OBJECTS};

fn zone(pods: PodRecords) -> Zone {
    let mut config = ZoneConfig::new("cluster.local").unwrap();
    config.pods = pods;
    config.ns_addresses = vec!["10.96.0.10".parse().unwrap()];
    Zone::build(&snapshot(OBJECTS), &config)
}

/// Every kind of name: services, headless hosts, SRV owners, empty non-terminals, the apex,
/// ExternalName, NXDOMAIN in the zone, pod names, reverse names, and names outside.
const NAMES: &[&str] = &[
    "web.shop.svc.cluster.local.",
    "db.shop.svc.cluster.local.",
    "db-0.db.shop.svc.cluster.local.",
    "10-244-2-6.db.shop.svc.cluster.local.",
    "_http._tcp.web.shop.svc.cluster.local.",
    "_pg._tcp.db.shop.svc.cluster.local.",
    "peers.shop.svc.cluster.local.",
    "empty.shop.svc.cluster.local.",
    "ext.shop.svc.cluster.local.",
    "shop.svc.cluster.local.",
    "svc.cluster.local.",
    "cluster.local.",
    "ns.dns.cluster.local.",
    "dns-version.cluster.local.",
    "nothing.shop.svc.cluster.local.",
    "example.com.shop.svc.cluster.local.",
    "10-1-2-3.shop.pod.cluster.local.",
    "pod.cluster.local.",
    "20.0.96.10.in-addr.arpa.",
    "5.1.244.10.in-addr.arpa.",
    "9.1.1.1.in-addr.arpa.",
    "example.com.",
    "xcluster.local.",
    ".",
];

const TYPES: &[RecordType] = &[
    RecordType::A,
    RecordType::AAAA,
    RecordType::SRV,
    RecordType::PTR,
    RecordType::TXT,
    RecordType::SOA,
    RecordType::NS,
    RecordType::CNAME,
    RecordType::MX,
    RecordType::HTTPS,
    RecordType::ANY,
    RecordType::OPT,
    RecordType::Unknown(1234),
];

fn random_case(name: &str, bits: u64) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if bits >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Req {
    name: usize,
    qtype: usize,
    case: u64,
    id: u16,
    rd: bool,
    cd: bool,
    /// None: no EDNS; Some((payload, option kind)).
    edns: Option<(u16, u8)>,
}

fn req_strategy() -> impl Strategy<Value = Req> {
    (
        0..NAMES.len(),
        0..TYPES.len(),
        any::<u64>(),
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of((any::<u16>(), 0u8..4)),
    )
        .prop_map(|(name, qtype, case, id, rd, cd, edns)| Req {
            name,
            qtype,
            case,
            id,
            rd,
            cd,
            edns,
        })
}

fn encode_req(r: &Req) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = r.id;
    m.metadata.recursion_desired = r.rd;
    m.metadata.checking_disabled = r.cd;
    let name = Name::from_ascii(random_case(NAMES[r.name], r.case)).unwrap();
    m.add_query(Query::query(name, TYPES[r.qtype]));
    if let Some((payload, opt)) = r.edns {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        match opt {
            1 => e.options_mut().insert(EdnsOption::Unknown(
                u16::from(EdnsCode::Cookie),
                vec![1, 2, 3, 4, 5, 6, 7, 8],
            )),
            2 => e.options_mut().insert(EdnsOption::Subnet(ClientSubnet::new(
                "192.0.2.0".parse().unwrap(),
                24,
                0,
            ))),
            3 => e.options_mut().insert(EdnsOption::Unknown(
                u16::from(EdnsCode::Padding),
                vec![0; 40],
            )),
            _ => {}
        }
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

struct Paths {
    wire: WireZone,
    handler: Handler,
    autopath: bool,
    rt: tokio::runtime::Runtime,
}

impl Paths {
    fn new(pods: PodRecords, autopath: bool) -> Self {
        let z = zone(pods);
        Paths {
            wire: WireZone::build(&z),
            handler: Handler::new(ZoneHandle::new(z), None).with_autopath(autopath),
            autopath,
            rt: tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
        }
    }

    /// The fast reply, if the fast path takes it, and the general path's.
    fn both(&self, bytes: &[u8], udp: bool) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        let mut out = Vec::new();
        let fast = self
            .wire
            .answer(bytes, udp, !self.autopath, &mut out)
            .then_some(out);
        let general = self
            .rt
            .block_on(self.handler.handle_general(bytes, udp, None));
        (fast, general)
    }
}

fn same(fast: &[u8], general: &[u8]) -> Result<(), TestCaseError> {
    let f = Message::from_vec(fast).map_err(|e| TestCaseError::fail(format!("fast: {e}")))?;
    let g = Message::from_vec(general).unwrap();
    prop_assert_eq!(format!("{f:?}"), format!("{g:?}"));
    Ok(())
}

fn all_paths() -> Vec<Arc<Paths>> {
    vec![
        Arc::new(Paths::new(PodRecords::Disabled, false)),
        Arc::new(Paths::new(PodRecords::Insecure, false)),
        Arc::new(Paths::new(PodRecords::Disabled, true)),
    ]
}

thread_local! {
    static PATHS: Vec<Arc<Paths>> = all_paths();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn fast_replies_equal_general_replies(r in req_strategy(), which in 0usize..3, udp in any::<bool>()) {
        let bytes = encode_req(&r);
        let paths = PATHS.with(|p| p[which].clone());
        let (fast, general) = paths.both(&bytes, udp);
        if let Some(fast) = fast {
            let general = general.expect("the general path answers what the fast path answers");
            same(&fast, &general)?;
        }
    }

    #[test]
    fn corrupted_requests_never_make_the_paths_differ(
        r in req_strategy(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        udp in any::<bool>(),
    ) {
        let mut bytes = encode_req(&r);
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= v;
        }
        bytes.truncate(cut.index(bytes.len() + 1).max(bytes.len().saturating_sub(8)));
        let paths = PATHS.with(|p| p[0].clone());
        let (fast, general) = paths.both(&bytes, udp);
        if let Some(fast) = fast {
            let general = general.expect("the general path answers what the fast path answers");
            same(&fast, &general)?;
        }
    }
}

proptest! {
    /// The whole request path (fast, then general) on arbitrary bytes, and on valid queries
    /// cut short: never a panic, and any reply is a decodable response carrying the ID.
    #[test]
    fn the_request_path_survives_arbitrary_and_truncated_packets(
        junk in proptest::collection::vec(any::<u8>(), 0..300),
        r in req_strategy(),
        cut in any::<prop::sample::Index>(),
        which in 0usize..3,
    ) {
        let mut valid = encode_req(&r);
        valid.truncate(cut.index(valid.len() + 1));
        let paths = PATHS.with(|p| p[which].clone());
        for bytes in [junk, valid] {
            for udp in [true, false] {
                let reply = paths.rt.block_on(paths.handler.handle(&bytes, udp, None));
                if let Some(reply) = reply {
                    let m = Message::from_vec(&reply).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(m.metadata.message_type, hickory_proto::op::MessageType::Response);
                    prop_assert_eq!(&reply[..2], &bytes[..2]);
                    if udp {
                        prop_assert!(reply.len() <= 1232);
                    }
                }
            }
        }
    }
}

/// The fast path really takes the common queries (else the property above is vacuous).
#[test]
fn the_fast_path_takes_the_common_queries() {
    let p = Paths::new(PodRecords::Disabled, false);
    let take = |name: &str, t: RecordType, edns: Option<(u16, u8)>| {
        let r = Req {
            name: NAMES.iter().position(|n| *n == name).unwrap(),
            qtype: TYPES.iter().position(|x| *x == t).unwrap(),
            case: 0x5555,
            id: 7,
            rd: true,
            cd: false,
            edns,
        };
        p.both(&encode_req(&r), true).0.is_some()
    };
    assert!(take("web.shop.svc.cluster.local.", RecordType::A, None));
    assert!(take(
        "web.shop.svc.cluster.local.",
        RecordType::AAAA,
        Some((1232, 3))
    ));
    assert!(take(
        "_pg._tcp.db.shop.svc.cluster.local.",
        RecordType::SRV,
        None
    ));
    assert!(take("nothing.shop.svc.cluster.local.", RecordType::A, None));
    assert!(take("empty.shop.svc.cluster.local.", RecordType::A, None));
    assert!(take("20.0.96.10.in-addr.arpa.", RecordType::PTR, None));
    // Left to the general path: ExternalName, ANY, names outside, Client Subnet, a COOKIE
    // (its reply carries a server cookie).
    assert!(!take(
        "web.shop.svc.cluster.local.",
        RecordType::A,
        Some((1232, 1))
    ));
    assert!(!take("ext.shop.svc.cluster.local.", RecordType::A, None));
    assert!(!take("web.shop.svc.cluster.local.", RecordType::ANY, None));
    assert!(!take("example.com.", RecordType::A, None));
    assert!(!take(
        "web.shop.svc.cluster.local.",
        RecordType::A,
        Some((1232, 2))
    ));
}
