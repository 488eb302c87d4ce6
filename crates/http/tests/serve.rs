//! weir-http over real sockets, with a plain HTTP/1.1 client written here: what the listeners
//! answer, that binding names the address it could not take, that closing a listener frees its
//! port and ends its connections, and (root and `ip`) that a listener stays in the network
//! namespace of the thread that bound it while the runtime's thread sits in another.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_http::{bind, respond, serve, Handler, HttpRuntime, MetricsServer, PathServer};

/// Any free port on loopback.
fn any_port() -> SocketAddr {
    (Ipv4Addr::LOCALHOST, 0).into()
}

/// A reply: status, headers by lowercased name, body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// One `GET` on its own connection (`Connection: close`); the reply read to the end.
fn get(addr: SocketAddr, path: &str) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    // A guard against a hang, not a timed assertion: every reply here is immediate.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nX-Probe: weir\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {line:?}"));
    let mut headers = BTreeMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').expect("a header line");
        headers.insert(n.to_ascii_lowercase(), v.trim().to_string());
    }
    let mut body = String::new();
    r.read_to_string(&mut body).unwrap();
    Reply {
        status,
        headers,
        body,
    }
}

#[test]
fn a_path_server_answers_its_routes_and_404_for_the_rest() {
    let rt = HttpRuntime::new().unwrap();
    let server = PathServer::start(&rt, any_port(), |path| match path {
        "/healthz" => Some((200, "application/json", "{\"ok\":true}".into())),
        "/livez" => Some((503, "text/plain", "stuck\n".into())),
        _ => None,
    })
    .unwrap();
    let addr = server.addr();
    assert_ne!(addr.port(), 0, "the bound port, not the one asked for");

    let ok = get(addr, "/healthz");
    assert_eq!(ok.status, 200);
    assert_eq!(ok.headers["content-type"], "application/json");
    assert_eq!(ok.body, "{\"ok\":true}");

    let down = get(addr, "/livez?verbose=1");
    assert_eq!(down.status, 503, "routed by path, the query left out");
    assert_eq!(down.body, "stuck\n");

    let missing = get(addr, "/nothing");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body, "404 page not found\n");
}

#[test]
fn a_metrics_server_answers_the_current_body_on_metrics_only() {
    let rt = HttpRuntime::new().unwrap();
    let count = Arc::new(Mutex::new(0));
    let c = count.clone();
    let server = MetricsServer::start(&rt, any_port(), move || {
        let mut n = c.lock().unwrap();
        *n += 1;
        format!("weir_test_scrapes_total {n}\n")
    })
    .unwrap();
    let first = get(server.addr(), "/metrics");
    assert_eq!(first.status, 200);
    assert_eq!(
        first.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert_eq!(first.body, "weir_test_scrapes_total 1\n");
    assert_eq!(
        get(server.addr(), "/metrics").body,
        "weir_test_scrapes_total 2\n",
        "the body is made per request"
    );
    let other = get(server.addr(), "/healthz");
    assert_eq!(other.status, 404);
    assert_eq!(*count.lock().unwrap(), 2, "a 404 does not build the body");
}

#[test]
fn a_handler_sees_the_request_and_sets_status_and_headers() {
    let rt = HttpRuntime::new().unwrap();
    let handler: Handler = Arc::new(|req| {
        let probe = req
            .headers()
            .get("x-probe")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        let body = format!("{} {} {probe}", req.method(), req.uri().path());
        respond(
            207,
            &[("X-One", "1".into()), ("Cache-Control", "no-cache".into())],
            body,
        )
    });
    let served = serve(&rt, bind(any_port()).unwrap(), handler).unwrap();
    let r = get(served.addr(), "/some/path");
    assert_eq!(r.status, 207);
    assert_eq!(r.headers["x-one"], "1");
    assert_eq!(r.headers["cache-control"], "no-cache");
    assert_eq!(r.body, "GET /some/path weir");
}

#[test]
fn binding_a_taken_address_names_it() {
    let taken = std::net::TcpListener::bind(any_port()).unwrap();
    let addr = taken.local_addr().unwrap();
    let e = bind(addr).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    assert!(
        e.to_string()
            .starts_with(&format!("cannot listen on {addr}: ")),
        "{e}"
    );
}

#[test]
fn closing_a_listener_frees_its_port_and_ends_its_connections() {
    let rt = HttpRuntime::new().unwrap();
    let server =
        PathServer::start(&rt, any_port(), |_| Some((200, "text/plain", "x".into()))).unwrap();
    let addr = server.addr();
    assert_eq!(get(addr, "/").status, 200);
    // An idle keep-alive connection: served, open, waiting for its next request.
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(idle, "GET / HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    drop(server);
    // Free when drop returns: the same address binds again at once.
    let again = bind(addr).expect("the port is free after drop");
    drop(again);
    // And the open connection is closed by the server (end of file after the first reply).
    let mut rest = Vec::new();
    idle.read_to_end(&mut rest).expect("closed, not timed out");
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.ends_with("\r\n\r\nx"),
        "only the first reply: {text:?}"
    );
}

#[test]
fn a_listener_dropped_inside_an_async_context_does_not_block_or_panic() {
    let rt = HttpRuntime::new().unwrap();
    let server = PathServer::start(&rt, any_port(), |_| None).unwrap();
    let addr = server.addr();
    assert_eq!(get(addr, "/").status, 404);
    // An agent may drop its servers from async code: the listener is aborted instead of
    // waited for, and is closed once the runtime has run the abort.
    let other = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    other.block_on(async move { drop(server) });
    // Polled until closed; the bound only keeps a broken build from hanging the run.
    let mut attempts = 0;
    let refused = loop {
        match TcpStream::connect(addr) {
            Err(e) => break e,
            Ok(_) if attempts < 3000 => std::thread::sleep(Duration::from_millis(10)),
            Ok(_) => panic!("{addr} still accepts connections after its listener was dropped"),
        }
        attempts += 1;
    };
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[test]
fn a_listener_lives_in_the_namespace_of_the_thread_that_bound_it() {
    if !weir_testkit::can_run(weir_testkit::missing(true, &["ip"])) {
        return;
    }
    let ns = weir_testkit::Netns::create(format!("wh{}-bind", std::process::id())).unwrap();
    let netns = weir_kernel::NetNs::named(&ns.name).unwrap();
    // The runtime (its worker thread) starts here, in the test's own namespace.
    let rt = HttpRuntime::new().unwrap();
    let (addr, reply, server) = netns
        .run(|| {
            let server =
                PathServer::start(&rt, any_port(), |_| Some((200, "text/plain", "in".into())))
                    .unwrap();
            let addr = server.addr();
            // A client in the same namespace reaches it.
            (addr, get(addr, "/"), server)
        })
        .unwrap();
    assert_eq!(reply.body, "in");
    // From the test's namespace the port is not there: nothing listens on it here.
    let e = TcpStream::connect(addr).expect_err("the listener is not in this namespace");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    drop(server);
}
