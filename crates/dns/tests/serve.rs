//! The serving loops over real sockets on 127.0.0.1 (no root needed): UDP answers and
//! errors, TCP pipelining, and the TCP bounds (trickle, idle, per-connection queries,
//! connection cap) that keep a misbehaving client from holding the server.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use weir_dns::server::{serve_tcp, serve_udp};
use weir_dns::{Handler, ServerConfig, Zone, ZoneConfig, ZoneHandle};

fn handler() -> Handler {
    let yaml = include_str!("fixtures/cluster.yaml");
    let parsed = weir_source::parse_manifest(Path::new("cluster.yaml"), yaml);
    let snapshot = weir_model::Snapshot::from_objects(&parsed.objects);
    let zone = Zone::build(&snapshot, &ZoneConfig::new("cluster.local").unwrap());
    Handler::new(ZoneHandle::new(zone), None)
}

fn config() -> ServerConfig {
    ServerConfig {
        max_tcp_connections: 2,
        tcp_idle_timeout: Duration::from_millis(500),
        tcp_message_timeout: Duration::from_millis(200),
        tcp_queries_per_connection: 3,
        tcp_in_flight_per_connection: 4,
        udp_workers: 1,
    }
}

/// A UDP serving thread on 127.0.0.1 (forwarded queries run on the test's runtime).
fn spawn_udp(handler: Handler) -> SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let rt = tokio::runtime::Handle::current();
    std::thread::spawn(move || serve_udp(sock, handler, rt));
    addr
}

async fn tcp_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve_tcp(l, handler(), config()));
    addr
}

fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

fn framed(msg: &[u8]) -> Vec<u8> {
    let mut v = (msg.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(msg);
    v
}

async fn read_answer(s: &mut TcpStream) -> Option<Message> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let mut buf = vec![0u8; u16::from_be_bytes(len).into()];
    s.read_exact(&mut buf).await.ok()?;
    Some(Message::from_vec(&buf).unwrap())
}

/// Waits (bounded) for the server to close the connection.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn udp_answers_and_rejects() {
    let addr = spawn_udp(handler());
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(addr).await.unwrap();
    let mut buf = vec![0u8; 2048];

    client
        .send(&query("web.shop.svc.cluster.local.", RecordType::A))
        .await
        .unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(m.answers.len(), 1);
    assert!(m.metadata.authoritative);

    // Outside the zone without a forwarder: REFUSED.
    client
        .send(&query("example.com.", RecordType::A))
        .await
        .unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    assert_eq!(
        Message::from_vec(&buf[..n]).unwrap().metadata.response_code,
        ResponseCode::Refused
    );

    // A broken question: FORMERR, and the server keeps serving.
    let mut bad = query("web.shop.svc.cluster.local.", RecordType::A);
    bad.truncate(20);
    client.send(&bad).await.unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    assert_eq!(
        Message::from_vec(&buf[..n]).unwrap().metadata.response_code,
        ResponseCode::FormErr
    );
    client
        .send(&query("db.shop.svc.cluster.local.", RecordType::A))
        .await
        .unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    assert_eq!(Message::from_vec(&buf[..n]).unwrap().answers.len(), 2);
}

#[tokio::test]
async fn tcp_pipelined_queries_then_the_per_connection_cap() {
    let addr = tcp_server().await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // Four queries in one write; the connection serves three, then closes.
    let mut all = Vec::new();
    for name in ["web", "db", "peers", "empty"] {
        all.extend(framed(&query(
            &format!("{name}.shop.svc.cluster.local."),
            RecordType::A,
        )));
    }
    s.write_all(&all).await.unwrap();
    let mut ids = 0;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(2), read_answer(&mut s))
        .await
        .unwrap()
    {
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        ids += 1;
    }
    assert_eq!(ids, 3);
}

#[tokio::test]
async fn tcp_trickle_and_idle_connections_are_cut() {
    let addr = tcp_server().await;
    // Half a length prefix, then nothing: cut after the message timeout (200 ms).
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    s.write_all(&[0]).await.unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(2)).await);
    assert!(started.elapsed() < Duration::from_millis(1500));

    // A message trickled a byte at a time slower than the timeout allows.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let msg = framed(&query("web.shop.svc.cluster.local.", RecordType::A));
    let mut cut = false;
    for b in msg {
        if s.write_all(&[b]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(cut || closed_within(&mut s, Duration::from_secs(2)).await);

    // Idle: closed after the idle timeout (500 ms).
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn tcp_connections_beyond_the_cap_are_closed_at_once_when_none_is_idle() {
    let addr = tcp_server().await;
    // Two connections each in the middle of a message (one byte of its length sent): busy.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&[0]).await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_millis(150)).await);
    // A slot frees when a connection ends (the busy ones are cut at the message timeout).
    drop(held);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&framed(&query("db.shop.svc.cluster.local.", RecordType::A)))
        .await
        .unwrap();
    assert_eq!(read_answer(&mut s).await.unwrap().answers.len(), 2);
}

/// Every slot held by idle clients: a new client is served at once, in the slot of the one
/// idle longest, which is closed (it used to wait up to the idle timeout).
#[tokio::test]
async fn a_new_tcp_client_takes_the_slot_of_the_connection_idle_longest() {
    let addr = tcp_server().await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&framed(&query(
            "web.shop.svc.cluster.local.",
            RecordType::A,
        )))
        .await
        .unwrap();
        assert!(read_answer(&mut s).await.is_some());
        held.push(s);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let mut third = TcpStream::connect(addr).await.unwrap();
    third
        .write_all(&framed(&query("db.shop.svc.cluster.local.", RecordType::A)))
        .await
        .unwrap();
    let answer = read_answer(&mut third)
        .await
        .expect("the new client is served");
    assert_eq!(answer.answers.len(), 2);
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "served in {:?}, not after the idle timeout",
        started.elapsed()
    );
    assert!(
        closed_within(&mut held[0], Duration::from_millis(100)).await,
        "the oldest idle connection gave its slot up"
    );
    // The younger one still answers.
    held[1]
        .write_all(&framed(&query(
            "web.shop.svc.cluster.local.",
            RecordType::A,
        )))
        .await
        .unwrap();
    assert!(read_answer(&mut held[1]).await.is_some());
}

async fn udp_ask(handler: Handler, names: &[&str]) -> Vec<Message> {
    let addr = spawn_udp(handler);
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(addr).await.unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 2048];
    for name in names {
        client.send(&query(name, RecordType::A)).await.unwrap();
        let n = client.recv(&mut buf).await.unwrap();
        out.push(Message::from_vec(&buf[..n]).unwrap());
    }
    out
}

#[tokio::test]
async fn autopath_answers_the_first_search_expansion() {
    let names = [
        // A pod in `shop` looking up `web.shop` (the svc.ns form): its first query.
        "web.shop.shop.svc.cluster.local.",
        // No candidate has records; an unknown namespace is not rewritten.
        "nothing.shop.svc.cluster.local.",
        "web.shop.nons.svc.cluster.local.",
    ];
    let on = udp_ask(handler().with_autopath(true), &names).await;
    let data: Vec<String> = on[0].answers.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        data,
        vec![
            "web.shop.shop.svc.cluster.local. 5 IN CNAME web.shop.svc.cluster.local.",
            "web.shop.svc.cluster.local. 5 IN A 10.96.0.20",
        ]
    );
    assert_eq!(on[0].metadata.response_code, ResponseCode::NoError);
    for m in &on[1..] {
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }
    // Off (the default): the first expansion is just NXDOMAIN.
    let off = udp_ask(handler(), &names[..1]).await;
    assert_eq!(off[0].metadata.response_code, ResponseCode::NXDomain);
}

/// The value of the sample `series` in an OpenMetrics text.
use weir_dns::metrics::sample;

/// Beyond the cap on upstream queries in flight, a forwarded query is REFUSED at once (the
/// client moves to its next server instead of waiting), and the metrics count it: the
/// refusal, the query in flight, both cache misses, and then the silent upstream's failure.
#[tokio::test]
async fn queries_beyond_the_upstream_cap_are_refused_and_counted() {
    // An upstream that never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut cfg = weir_dns::ForwarderConfig::new(vec![silent.local_addr().unwrap()]);
    cfg.max_in_flight = 1;
    cfg.attempt_timeout = Duration::from_millis(800);
    cfg.probe_interval = None;
    let forwarder = weir_dns::Forwarder::new(cfg);
    let metrics = forwarder.metrics().clone();
    let yaml = include_str!("fixtures/cluster.yaml");
    let parsed = weir_source::parse_manifest(Path::new("cluster.yaml"), yaml);
    let zone = Zone::build(
        &weir_model::Snapshot::from_objects(&parsed.objects),
        &ZoneConfig::new("cluster.local").unwrap(),
    );
    let addr = spawn_udp(Handler::new(ZoneHandle::new(zone), Some(forwarder)));

    let first = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    first.connect(addr).await.unwrap();
    first
        .send(&query("slow.example.", RecordType::A))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&metrics.encode(), "weir_dns_upstream_in_flight") != Some(1.0) {
        assert!(Instant::now() < deadline, "{}", metrics.encode());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    second.connect(addr).await.unwrap();
    let asked = Instant::now();
    second
        .send(&query("other.example.", RecordType::A))
        .await
        .unwrap();
    let mut buf = vec![0u8; 2048];
    let n = second.recv(&mut buf).await.unwrap();
    assert_eq!(
        Message::from_vec(&buf[..n]).unwrap().metadata.response_code,
        ResponseCode::Refused
    );
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    let text = metrics.encode();
    for (series, want) in [
        (
            "coredns_forward_max_concurrent_rejects_total{server=\"dns://:53\"}",
            1.0,
        ),
        ("weir_dns_upstream_in_flight", 1.0),
        ("coredns_cache_misses_total{server=\"dns://:53\"}", 2.0),
        ("coredns_cache_hits_total{server=\"dns://:53\"}", 0.0),
        (
            "coredns_dns_responses_total{server=\"dns://:53\",zone=\".\",proto=\"udp\",rcode=\"REFUSED\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }

    // The first query ends in SERVFAIL when its one upstream times out.
    let n = first.recv(&mut buf).await.unwrap();
    assert_eq!(
        Message::from_vec(&buf[..n]).unwrap().metadata.response_code,
        ResponseCode::ServFail
    );
    let text = metrics.encode();
    let upstream = format!(
        "weir_dns_upstream_failures_total{{upstream=\"{}\"}}",
        silent.local_addr().unwrap()
    );
    for (series, want) in [
        (upstream.as_str(), 1.0),
        ("weir_dns_upstream_in_flight", 0.0),
        (
            "coredns_dns_responses_total{server=\"dns://:53\",zone=\".\",proto=\"udp\",rcode=\"SERVFAIL\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
}

fn with_cookie(name: &str, cookie: Vec<u8>) -> Vec<u8> {
    let mut m = Message::query();
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let mut e = Edns::new();
    e.set_max_payload(1232);
    e.options_mut().insert(EdnsOption::Unknown(10, cookie));
    m.set_edns(e);
    m.to_vec().unwrap()
}

fn cookie_of(m: &Message) -> Option<Vec<u8>> {
    match m.edns.as_ref()?.options().get(EdnsCode::Cookie)? {
        EdnsOption::Unknown(10, data) => Some(data.clone()),
        _ => None,
    }
}

/// RFC 7873: a client cookie is answered with itself and a server cookie (RFC 9018's layout),
/// over UDP (zone answers and forwarded ones take the general path) and TCP; the client's
/// next query carrying the server cookie is answered too; a malformed option is FORMERR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_cookies_are_answered_with_a_server_cookie() {
    let addr = spawn_udp(handler());
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let ask = |bytes: Vec<u8>| {
        let sock = &sock;
        async move {
            sock.send_to(&bytes, addr).await.unwrap();
            let mut buf = vec![0u8; 1500];
            let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            Message::from_vec(&buf[..n]).unwrap()
        }
    };
    let client = vec![1, 2, 3, 4, 5, 6, 7, 8];
    let r = ask(with_cookie("web.shop.svc.cluster.local.", client.clone())).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(r.answers.len(), 1, "answered as usual");
    let cookie = cookie_of(&r).expect("a COOKIE option in the reply");
    assert_eq!(cookie.len(), 24, "client cookie + 16-byte server cookie");
    assert_eq!(cookie[..8], client[..]);
    assert_eq!(cookie[8], 1, "RFC 9018 version 1");
    // The next query returns the server cookie: still answered, with a cookie.
    let r = ask(with_cookie("web.shop.svc.cluster.local.", cookie.clone())).await;
    assert_eq!(r.answers.len(), 1);
    assert_eq!(cookie_of(&r).unwrap()[..8], client[..]);
    // Malformed: 5 bytes.
    let r = ask(with_cookie("web.shop.svc.cluster.local.", vec![9; 5])).await;
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
    // Without a cookie, none comes back (the fast path's reply).
    let r = ask(query_edns("web.shop.svc.cluster.local.")).await;
    assert!(r.edns.is_some() && cookie_of(&r).is_none());

    // TCP.
    let tcp = tcp_server().await;
    let mut s = TcpStream::connect(tcp).await.unwrap();
    s.write_all(&framed(&with_cookie(
        "db.shop.svc.cluster.local.",
        client.clone(),
    )))
    .await
    .unwrap();
    let r = read_answer(&mut s).await.unwrap();
    assert_eq!(r.answers.len(), 2);
    assert_eq!(cookie_of(&r).unwrap()[..8], client[..]);
}

fn query_edns(name: &str) -> Vec<u8> {
    let mut m = Message::query();
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let mut e = Edns::new();
    e.set_max_payload(1232);
    m.set_edns(e);
    m.to_vec().unwrap()
}
