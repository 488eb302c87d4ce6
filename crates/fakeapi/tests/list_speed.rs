//! How fast the fake serves a large initial list over HTTP: 10,000 Services and 10,000
//! EndpointSlices by pages of 500, as kube-rs's watcher asks for them. A measurement, not a
//! pass/fail figure, so it is ignored by default:
//!
//! ```sh
//! cargo test --release -p weir-fakeapi --test list_speed -- --ignored --nocapture
//! ```
//!
//! `WEIR_LIST_SPEED_N` (default 10000) sets the object count, `WEIR_LIST_SPEED_RUNS` (default 3)
//! the repetitions whose median is printed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde_json::{json, Value};
use weir_fakeapi::FakeApi;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The same shapes as the agent bench's objects: a Service with one port and its slice of
/// ten ready endpoints.
fn objects(i: usize) -> [Value; 2] {
    let name = format!("svc-{i:06}");
    let eps: Vec<Value> = (0..10)
        .map(|e| {
            let ip = 0x0a80_0001u32 + (i * 10 + e) as u32;
            json!({"addresses": [std::net::Ipv4Addr::from(ip).to_string()],
                   "conditions": {"ready": true}, "nodeName": "node-1"})
        })
        .collect();
    [
        json!({"kind": "Service", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": "bench"},
               "spec": {"type": "ClusterIP",
                        "clusterIP": std::net::Ipv4Addr::from(0x0a60_0001u32 + i as u32).to_string(),
                        "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}}),
        json!({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
               "metadata": {"name": format!("{name}-1"), "namespace": "bench",
                            "labels": {"kubernetes.io/service-name": name}},
               "addressType": "IPv4",
               "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
               "endpoints": eps}),
    ]
}

/// One GET on a fresh connection; the body.
fn get(addr: std::net::SocketAddr, path: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: fake\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("headers end");
    let head = String::from_utf8_lossy(&raw[..split]);
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    raw.split_off(split + 4)
}

/// Lists a collection by pages of `limit`; the number of items.
fn list_all(addr: std::net::SocketAddr, collection: &str, limit: usize) -> usize {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "continue")]
        cont: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: Meta,
        items: Vec<serde::de::IgnoredAny>,
    }
    let mut count = 0;
    let mut token: Option<String> = None;
    loop {
        let mut path = format!("{collection}?limit={limit}");
        if let Some(t) = &token {
            path.push_str("&continue=");
            path.push_str(t);
        }
        let page: Page = serde_json::from_slice(&get(addr, &path)).expect("a list page");
        count += page.items.len();
        match page.metadata.cont.filter(|c| !c.is_empty()) {
            Some(t) => token = Some(t),
            None => return count,
        }
    }
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture, in a release build"]
fn list_10k_services_and_slices_by_pages_of_500() {
    let n = env_num("WEIR_LIST_SPEED_N", 10_000);
    let runs = env_num("WEIR_LIST_SPEED_RUNS", 3);
    let api = FakeApi::start(None, "127.0.0.1:0".parse().unwrap()).expect("start");
    for i in 0..n {
        for o in objects(i) {
            api.apply_yaml(&serde_json::to_string(&o).unwrap())
                .expect("apply");
        }
    }
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let services = list_all(api.addr(), "/api/v1/services", 500);
        let slices = list_all(api.addr(), "/apis/discovery.k8s.io/v1/endpointslices", 500);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!((services, slices), (n, n));
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "list {n} Services + {n} EndpointSlices by pages of 500: median {:.1} ms (runs: {})",
        sorted[sorted.len() / 2],
        times
            .iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
