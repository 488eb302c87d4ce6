//! Requests in, responses out: the pure part of the wire handling (hickory-proto does the
//! encoding). No I/O here, so every rule is testable without sockets.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Record};

/// The UDP payload size this server accepts and advertises: 1232 bytes, the DNS Flag Day
/// 2020 value that fits an IPv6 minimum MTU without IP fragmentation.
pub const SERVER_UDP_PAYLOAD: u16 = 1232;

/// The largest UDP message a client without EDNS0 accepts (RFC 1035).
pub const CLASSIC_UDP_PAYLOAD: u16 = 512;

/// What to do with the bytes of a request.
#[derive(Debug)]
pub enum Request {
    /// A well-formed standard query with exactly one question.
    Query(Message),
    /// Answer with these bytes at once (FORMERR, NOTIMP, REFUSED).
    Reply(Vec<u8>),
    /// Not worth an answer (too short to carry an ID, or itself a response: answering a
    /// response could loop between two servers).
    Drop,
}

/// Classifies raw request bytes.
pub fn parse_request(bytes: &[u8]) -> Request {
    let msg = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => return formerr_from_header(bytes),
    };
    if msg.metadata.message_type == MessageType::Response {
        return Request::Drop;
    }
    let reject = |code| Request::Reply(encode_header_only(&msg, code));
    if msg.edns.as_ref().is_some_and(|e| e.version() > 0) {
        // RFC 6891 6.1.3: a version this server does not implement is answered BADVERS
        // (extended RCODE 16), with this server's OPT (version 0) and no answer; the client
        // falls back to version 0.
        return reject(ResponseCode::BADVERS);
    }
    if msg.metadata.op_code != OpCode::Query {
        return reject(ResponseCode::NotImp);
    }
    if msg.queries.len() != 1 {
        return reject(ResponseCode::FormErr);
    }
    let q = &msg.queries[0];
    if q.query_class() != DNSClass::IN && q.query_class() != DNSClass::ANY {
        return reject(ResponseCode::Refused);
    }
    if matches!(
        q.query_type(),
        hickory_proto::rr::RecordType::AXFR | hickory_proto::rr::RecordType::IXFR
    ) {
        // Zone transfers would hand the whole cluster's service list to anyone.
        return reject(ResponseCode::Refused);
    }
    Request::Query(msg)
}

/// A request hickory-proto could not decode: FORMERR echoing the ID, if the 12-byte header
/// is there and says "query".
fn formerr_from_header(bytes: &[u8]) -> Request {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return Request::Drop;
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let op_code = OpCode::from_u8((bytes[2] >> 3) & 0x0f);
    let msg = Message::error_msg(id, op_code, ResponseCode::FormErr);
    Request::Reply(msg.to_vec().unwrap_or_default())
}

/// FORMERR for a well-formed message with a malformed part (a bad COOKIE option).
pub fn formerr(req: &Message) -> Vec<u8> {
    encode_header_only(req, ResponseCode::FormErr)
}

fn encode_header_only(req: &Message, code: ResponseCode) -> Vec<u8> {
    let mut msg = Message::error_msg(req.metadata.id, req.metadata.op_code, code);
    msg.metadata.recursion_desired = req.metadata.recursion_desired;
    msg.add_queries(req.queries.iter().cloned());
    if req.edns.is_some() {
        msg.set_edns(server_edns());
    }
    msg.to_vec().unwrap_or_default()
}

fn server_edns() -> Edns {
    let mut e = Edns::new();
    e.set_max_payload(SERVER_UDP_PAYLOAD);
    e
}

/// The response to `req`. `authoritative`: answered from the cluster zone (AA set).
pub fn response(
    req: &Message,
    rcode: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    authority: Vec<Record>,
) -> Message {
    let mut msg = Message::response(req.metadata.id, req.metadata.op_code);
    msg.metadata.response_code = rcode;
    msg.metadata.authoritative = authoritative;
    msg.metadata.recursion_desired = req.metadata.recursion_desired;
    msg.metadata.checking_disabled = req.metadata.checking_disabled;
    // This server recurses (forwards) for every name outside the zone.
    msg.metadata.recursion_available = true;
    msg.add_queries(req.queries.iter().cloned());
    msg.insert_answers(answers);
    msg.insert_authorities(authority);
    if req.edns.is_some() {
        msg.set_edns(server_edns());
    }
    msg
}

/// The largest response `req`'s sender accepts over UDP: its EDNS0 size within
/// [512, [`SERVER_UDP_PAYLOAD`]], or 512 without EDNS0.
pub fn udp_limit(req: &Message) -> usize {
    let size = match &req.edns {
        Some(e) => e
            .max_payload()
            .clamp(CLASSIC_UDP_PAYLOAD, SERVER_UDP_PAYLOAD),
        None => CLASSIC_UDP_PAYLOAD,
    };
    usize::from(size)
}

/// Encodes `msg`; above `limit` bytes, the question alone with the TC bit (the client retries
/// over TCP). A message that cannot be encoded becomes SERVFAIL.
pub fn encode(msg: &Message, limit: usize) -> Vec<u8> {
    match msg.to_vec() {
        Ok(bytes) if bytes.len() <= limit => bytes,
        Ok(_) => msg.truncate().to_vec().unwrap_or_default(),
        Err(_) => {
            let mut fail = Message::error_msg(
                msg.metadata.id,
                msg.metadata.op_code,
                ResponseCode::ServFail,
            );
            fail.add_queries(msg.queries.iter().cloned());
            fail.to_vec().unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::{Name, RData, RecordType};
    use proptest::prelude::*;

    fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Message {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m
    }

    fn reply_code(r: Request) -> (u16, ResponseCode) {
        let Request::Reply(bytes) = r else {
            panic!("expected a reply, got {r:?}")
        };
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.metadata.message_type, MessageType::Response);
        (m.metadata.id, m.metadata.response_code)
    }

    #[test]
    fn malformed_and_unsupported_requests() {
        // Garbage after a valid query header: FORMERR with the request's ID.
        let mut bytes = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(&[0x3f, b'a']);
        assert_eq!(
            reply_code(parse_request(&bytes)),
            (0x1234, ResponseCode::FormErr)
        );
        // Shorter than a header, or a response: no answer at all.
        assert!(matches!(parse_request(&[1, 2, 3]), Request::Drop));
        let mut resp = query("a.", RecordType::A, None);
        resp.metadata.message_type = MessageType::Response;
        assert!(matches!(
            parse_request(&resp.to_vec().unwrap()),
            Request::Drop
        ));
        // Two questions: FORMERR; NOTIFY: NOTIMP; AXFR and class CHAOS: REFUSED.
        let mut two = query("a.", RecordType::A, None);
        two.add_query(Query::query(Name::from_ascii("b.").unwrap(), RecordType::A));
        assert_eq!(
            reply_code(parse_request(&two.to_vec().unwrap())).1,
            ResponseCode::FormErr
        );
        let mut notify = query("a.", RecordType::SOA, None);
        notify.metadata.op_code = OpCode::Notify;
        assert_eq!(
            reply_code(parse_request(&notify.to_vec().unwrap())).1,
            ResponseCode::NotImp
        );
        let axfr = query("cluster.local.", RecordType::AXFR, None);
        assert_eq!(
            reply_code(parse_request(&axfr.to_vec().unwrap())).1,
            ResponseCode::Refused
        );
        let mut chaos = query("version.bind.", RecordType::TXT, None);
        chaos.queries[0].set_query_class(DNSClass::CH);
        assert_eq!(
            reply_code(parse_request(&chaos.to_vec().unwrap())).1,
            ResponseCode::Refused
        );
        let ok = query("a.", RecordType::A, Some(4096));
        assert!(matches!(
            parse_request(&ok.to_vec().unwrap()),
            Request::Query(_)
        ));
    }

    #[test]
    fn udp_limit_follows_edns0_within_bounds() {
        assert_eq!(udp_limit(&query("a.", RecordType::A, None)), 512);
        assert_eq!(udp_limit(&query("a.", RecordType::A, Some(4096))), 1232);
        assert_eq!(udp_limit(&query("a.", RecordType::A, Some(100))), 512);
        assert_eq!(udp_limit(&query("a.", RecordType::A, Some(900))), 900);
    }

    #[test]
    fn oversized_answers_are_truncated_with_tc() {
        let req = query("big.svc.cluster.local.", RecordType::A, None);
        let answers: Vec<Record> = (0..100u8)
            .map(|i| {
                Record::from_rdata(
                    Name::from_ascii("big.svc.cluster.local.").unwrap(),
                    5,
                    RData::A(std::net::Ipv4Addr::new(10, 0, 0, i).into()),
                )
            })
            .collect();
        let resp = response(&req, ResponseCode::NoError, true, answers, vec![]);
        let full = encode(&resp, 65535);
        assert!(full.len() > 512);
        let m = Message::from_vec(&full).unwrap();
        assert_eq!((m.answers.len(), m.metadata.truncation), (100, false));
        let cut = encode(&resp, udp_limit(&req));
        assert!(cut.len() <= 512);
        let m = Message::from_vec(&cut).unwrap();
        assert!(m.metadata.truncation);
        assert!(m.answers.is_empty());
        assert_eq!(m.metadata.id, req.metadata.id);
        assert_eq!(m.queries, req.queries);
    }

    #[test]
    fn response_echoes_id_question_rd_and_edns() {
        let req = query("x.example.", RecordType::AAAA, Some(1400));
        let resp = response(&req, ResponseCode::NXDomain, true, vec![], vec![]);
        let m = Message::from_vec(&encode(&resp, 1232)).unwrap();
        assert_eq!(m.metadata.id, req.metadata.id);
        assert!(m.metadata.recursion_desired && m.metadata.recursion_available);
        assert!(m.metadata.authoritative);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(1232));
    }

    proptest! {
        /// Random bytes, and valid queries with random corruption, never panic, and any
        /// reply is a decodable response.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Request::Reply(r) = parse_request(&bytes) {
                let m = Message::from_vec(&r).unwrap();
                prop_assert_eq!(m.metadata.message_type, MessageType::Response);
            }
        }

        #[test]
        fn corrupted_queries_never_panic(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = query("web.shop.svc.cluster.local.", RecordType::SRV, Some(1232))
                .to_vec()
                .unwrap();
            for (at, v) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= v;
            }
            let len = cut.index(bytes.len() + 1);
            bytes.truncate(len);
            if let Request::Reply(r) = parse_request(&bytes) {
                prop_assert!(Message::from_vec(&r).is_ok());
            }
        }
    }

    #[test]
    fn an_edns_version_above_0_gets_badvers_with_our_version_0_opt() {
        let mut q = query("web.shop.svc.cluster.local.", RecordType::A, Some(1232));
        q.edns.as_mut().unwrap().set_version(1);
        let Request::Reply(bytes) = parse_request(&q.to_vec().unwrap()) else {
            panic!("EDNS version 1 must be answered at once")
        };
        let m = Message::from_vec(&bytes).unwrap();
        // hickory names the decoded 16 BADSIG (the same number in TSIG's space): check the value.
        assert_eq!(u16::from(m.metadata.response_code), 16, "BADVERS");
        assert_eq!(m.metadata.id, q.metadata.id);
        let opt = m.edns.as_ref().expect("an OPT record in the reply");
        assert_eq!(opt.version(), 0);
        assert_eq!(
            opt.rcode_high(),
            1,
            "BADVERS is 16: extended RCODE 1, header RCODE 0"
        );
        assert_eq!(bytes[3] & 0x0f, 0);
        assert!(m.answers.is_empty());
        // Version 0 is served as before.
        let q0 = query("web.shop.svc.cluster.local.", RecordType::A, Some(1232));
        assert!(matches!(
            parse_request(&q0.to_vec().unwrap()),
            Request::Query(_)
        ));
    }
}
