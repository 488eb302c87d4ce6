//! Prometheus metrics of `weir dns`: requests by type with their duration, responses by
//! rcode, the forwarder's cache and upstreams, the in-flight cap, and the zone's size.
//!
//! Where the meaning is CoreDNS's, so is the name, so CoreDNS's dashboards and alerts work
//! unchanged: `coredns_dns_requests_total`, `coredns_dns_request_duration_seconds` (CoreDNS's
//! buckets), `coredns_dns_responses_total`, `coredns_cache_hits_total`,
//! `coredns_cache_misses_total`, `coredns_cache_entries`,
//! `coredns_forward_max_concurrent_rejects_total`; all carry `server` (`dns://<listen>`), the
//! `dns_` ones also `zone` (`.`: weir has one server block). What CoreDNS has no counterpart
//! of keeps a `weir_dns_` name.
//!
//! Every handle is an atomic shared with the registry. The UDP threads do not touch them per
//! query: they tally a batch in a plain [`Tally`] and add it once ([`DnsMetrics::add_udp`]).

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::{MetricType, TypedMetric};

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::zone::Zone;

/// Content type of [`DnsMetrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResponseLabels {
    rcode: &'static str,
    proto: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    proto: &'static str,
    family: &'static str,
    #[prometheus(flatten)]
    qtype: TypeLabel,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

/// CoreDNS's request duration buckets (`plugin.TimeBuckets`: 0.25 ms doubling to 8.192 s),
/// then +Inf.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
    2.048, 4.096, 8.192,
];
const BUCKETS: usize = DURATION_BUCKETS.len() + 1;

/// The query types CoreDNS's metrics name (its `monitorType`); every other is `other`.
const TYPES: [(u16, &str); 19] = [
    (1, "A"),
    (28, "AAAA"),
    (2, "NS"),
    (12, "PTR"),
    (33, "SRV"),
    (5, "CNAME"),
    (6, "SOA"),
    (15, "MX"),
    (16, "TXT"),
    (43, "DS"),
    (48, "DNSKEY"),
    (46, "RRSIG"),
    (47, "NSEC"),
    (50, "NSEC3"),
    (13, "HINFO"),
    (35, "NAPTR"),
    (251, "IXFR"),
    (252, "AXFR"),
    (255, "ANY"),
];
const OTHER: usize = TYPES.len();
const TYPE_SLOTS: usize = TYPES.len() + 1;

fn type_name(slot: usize) -> &'static str {
    TYPES.get(slot).map_or("other", |t| t.1)
}

/// The metrics slot of a query's type, read from its wire form: the question's type after
/// its (uncompressed) name; `other` when the request has none.
pub fn query_type_slot(query: &[u8]) -> usize {
    let mut at = 12;
    while let Some(&len) = query.get(at) {
        if len == 0 {
            let Some(t) = query.get(at + 1..at + 3) else {
                return OTHER;
            };
            let t = u16::from_be_bytes([t[0], t[1]]);
            return TYPES.iter().position(|(v, _)| *v == t).unwrap_or(OTHER);
        }
        if len & 0xc0 != 0 {
            return OTHER;
        }
        at += 1 + usize::from(len);
    }
    OTHER
}

fn bucket_of(took: Duration) -> usize {
    let secs = took.as_secs_f64();
    DURATION_BUCKETS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(DURATION_BUCKETS.len())
}

/// `coredns_dns_request_duration_seconds{type}`: per type, per-bucket counts and the sum in
/// nanoseconds, added a batch at a time (prometheus-client's histogram takes one value per
/// call, under a lock).
#[derive(Debug, Default, Clone)]
struct Durations {
    rows: Arc<[DurationRow; TYPE_SLOTS]>,
}

#[derive(Debug, Default)]
struct DurationRow {
    buckets: [AtomicU64; BUCKETS],
    nanos: AtomicU64,
}

impl TypedMetric for Durations {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Durations {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (slot, row) in self.rows.iter().enumerate() {
            let counts: Vec<u64> = row
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect();
            let count: u64 = counts.iter().sum();
            // A and AAAA always (a zero rather than nothing), the rest once seen.
            if count == 0 && slot > 1 {
                continue;
            }
            let bounds = DURATION_BUCKETS.iter().copied().chain([f64::INFINITY]);
            let buckets: Vec<(f64, u64)> = bounds.zip(counts).collect();
            let sum = row.nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let labels = TypeLabel {
                r#type: type_name(slot),
            };
            encoder
                .encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    sum, count, &buckets, None,
                )?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabel {
    upstream: String,
}

/// How a request arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// The name of a 4-bit header rcode, as dig prints it.
fn rcode_name(rcode: u8) -> &'static str {
    match rcode {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        6 => "YXDOMAIN",
        7 => "YXRRSET",
        8 => "NXRRSET",
        9 => "NOTAUTH",
        10 => "NOTZONE",
        _ => "OTHER",
    }
}

/// The header rcode of a response in wire form (None: shorter than a header).
fn wire_rcode(reply: &[u8]) -> Option<u8> {
    reply.get(3).map(|b| b & 0x0f)
}

/// Responses of one UDP batch by rcode, requests by type with their durations, and requests
/// dropped unanswered.
#[derive(Default)]
pub struct Tally {
    by_rcode: [u32; 16],
    dropped: u32,
    durations: [[u32; BUCKETS]; TYPE_SLOTS],
    nanos: [u64; TYPE_SLOTS],
}

impl Tally {
    /// Counts a request of `query`'s type answered in `took`.
    pub fn request(&mut self, query: &[u8], took: Duration) {
        let slot = query_type_slot(query);
        self.durations[slot][bucket_of(took)] += 1;
        self.nanos[slot] += took.as_nanos() as u64;
    }

    /// Counts the response `reply` (wire form).
    pub fn response(&mut self, reply: &[u8]) {
        if let Some(rc) = wire_rcode(reply) {
            self.by_rcode[usize::from(rc)] += 1;
        }
    }

    /// Counts a request that got no answer at all (not even FORMERR).
    pub fn dropped(&mut self) {
        self.dropped += 1;
    }
}

pub struct DnsMetrics {
    registry: Registry,
    /// `1` (IPv4) or `2` (IPv6): the listen address's family, CoreDNS's `family` label.
    family: &'static str,
    requests: Family<RequestLabels, Counter>,
    durations: Durations,
    responses: Family<ResponseLabels, Counter>,
    dropped: Family<TransportLabel, Counter>,
    cache_hits: Counter,
    cache_misses: Counter,
    cache_entries: Gauge,
    upstream_failures: Family<UpstreamLabel, Counter>,
    upstream_up: Family<UpstreamLabel, Gauge>,
    in_flight: Gauge,
    overload_refused: Counter,
    zone_records: Gauge,
    zone_names: Gauge,
    zone_builds: Counter,
}

impl fmt::Debug for DnsMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DnsMetrics")
    }
}

impl Default for DnsMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DnsMetrics {
    /// Metrics of a server on CoreDNS's default address (`dns://:53`).
    pub fn new() -> Self {
        Self::for_server("dns://:53", false)
    }

    /// Metrics of the server listening on `listen` (its `server` label, `dns://<listen>`).
    pub fn for_listen(listen: SocketAddr) -> Self {
        Self::for_server(&format!("dns://{listen}"), listen.is_ipv6())
    }

    fn for_server(server: &str, v6: bool) -> Self {
        let mut m = DnsMetrics {
            registry: Registry::default(),
            family: if v6 { "2" } else { "1" },
            requests: Family::default(),
            durations: Durations::default(),
            responses: Family::default(),
            dropped: Family::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            cache_entries: Gauge::default(),
            upstream_failures: Family::default(),
            upstream_up: Family::default(),
            in_flight: Gauge::default(),
            overload_refused: Counter::default(),
            zone_records: Gauge::default(),
            zone_names: Gauge::default(),
            zone_builds: Counter::default(),
        };
        let server: (Cow<'static, str>, Cow<'static, str>) =
            ("server".into(), server.to_string().into());
        let core = m.registry.sub_registry_with_label(server.clone());
        core.register(
            "coredns_cache_hits",
            "Names outside the zone answered from the cache",
            m.cache_hits.clone(),
        );
        core.register(
            "coredns_cache_misses",
            "Names outside the zone not in the cache (asked upstream)",
            m.cache_misses.clone(),
        );
        core.register(
            "coredns_cache_entries",
            "Entries in the forwarder's cache",
            m.cache_entries.clone(),
        );
        core.register(
            "coredns_forward_max_concurrent_rejects",
            "Queries answered REFUSED because the upstream in-flight cap was reached",
            m.overload_refused.clone(),
        );
        let dns = core.sub_registry_with_label(("zone".into(), ".".into()));
        // Counters are named without `_total`: the encoder appends it.
        dns.register(
            "coredns_dns_requests",
            "Requests, by transport (proto), address family and query type",
            m.requests.clone(),
        );
        dns.register(
            "coredns_dns_request_duration_seconds",
            "Time from a request's arrival to its reply, by query type",
            m.durations.clone(),
        );
        dns.register(
            "coredns_dns_responses",
            "Responses sent, by rcode and transport (proto)",
            m.responses.clone(),
        );
        let r = &mut m.registry;
        r.register(
            "weir_dns_requests_dropped",
            "Requests not answered at all (too short or garbled to carry an ID), by transport",
            m.dropped.clone(),
        );
        r.register(
            "weir_dns_upstream_failures",
            "Upstream exchanges that failed, timed out or answered other than NOERROR/NXDOMAIN",
            m.upstream_failures.clone(),
        );
        r.register(
            "weir_dns_upstream_up",
            "1 per upstream considered up, 0 while marked down",
            m.upstream_up.clone(),
        );
        r.register(
            "weir_dns_upstream_in_flight",
            "Upstream queries in flight (capped; beyond the cap clients get REFUSED)",
            m.in_flight.clone(),
        );
        r.register(
            "weir_dns_zone_records",
            "Records in the served cluster zone (pod names, computed per query, not counted)",
            m.zone_records.clone(),
        );
        r.register(
            "weir_dns_zone_names",
            "Owner names in the served cluster zone, reverse names included",
            m.zone_names.clone(),
        );
        r.register(
            "weir_dns_zone_builds",
            "Zones built and swapped in (one per object change)",
            m.zone_builds.clone(),
        );
        // The usual series exist from the start, so rates and alerts see a zero, not nothing.
        for t in [Transport::Udp, Transport::Tcp] {
            for rc in [0, 2, 3, 5] {
                let _ = m.responses.get_or_create(&labels(t, rc));
            }
            for slot in [0, 1] {
                let _ = m.requests.get_or_create(&m.request_labels(t, slot));
            }
            let _ = m.dropped.get_or_create(&TransportLabel {
                transport: t.label(),
            });
        }
        m
    }

    fn request_labels(&self, t: Transport, slot: usize) -> RequestLabels {
        RequestLabels {
            proto: t.label(),
            family: self.family,
            qtype: TypeLabel {
                r#type: type_name(slot),
            },
        }
    }

    /// Counts a request (wire form) over `t` answered in `took` (TCP, and UDP queries
    /// answered outside their batch).
    pub fn request(&self, t: Transport, query: &[u8], took: Duration) {
        let slot = query_type_slot(query);
        self.request_in(t, slot, took);
    }

    /// [`DnsMetrics::request`] for a query whose type slot is known.
    pub fn request_in(&self, t: Transport, slot: usize, took: Duration) {
        self.requests
            .get_or_create(&self.request_labels(t, slot))
            .inc();
        let row = &self.durations.rows[slot];
        row.buckets[bucket_of(took)].fetch_add(1, Ordering::Relaxed);
        row.nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Counts one response (wire form) sent over `t`.
    pub fn response(&self, t: Transport, reply: &[u8]) {
        if let Some(rc) = wire_rcode(reply) {
            self.responses.get_or_create(&labels(t, rc)).inc();
        }
    }

    /// Counts a request dropped unanswered.
    pub fn dropped(&self, t: Transport) {
        self.dropped
            .get_or_create(&TransportLabel {
                transport: t.label(),
            })
            .inc();
    }

    /// Adds one UDP batch's tally.
    pub fn add_udp(&self, tally: &Tally) {
        for (slot, counts) in tally.durations.iter().enumerate() {
            let n: u32 = counts.iter().sum();
            if n == 0 {
                continue;
            }
            let l = self.request_labels(Transport::Udp, slot);
            self.requests.get_or_create(&l).inc_by(n.into());
            let row = &self.durations.rows[slot];
            for (b, &c) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                row.buckets[b].fetch_add(c.into(), Ordering::Relaxed);
            }
            row.nanos.fetch_add(tally.nanos[slot], Ordering::Relaxed);
        }
        for (rc, &n) in tally.by_rcode.iter().enumerate() {
            if n > 0 {
                let l = labels(Transport::Udp, rc as u8);
                self.responses.get_or_create(&l).inc_by(n.into());
            }
        }
        if tally.dropped > 0 {
            let l = TransportLabel { transport: "udp" };
            self.dropped.get_or_create(&l).inc_by(tally.dropped.into());
        }
    }

    pub(crate) fn cache_lookup(&self, hit: bool) {
        if hit {
            self.cache_hits.inc();
        } else {
            self.cache_misses.inc();
        }
    }

    pub(crate) fn set_cache_entries(&self, n: usize) {
        self.cache_entries.set(n as i64);
    }

    pub(crate) fn upstream_failed(&self, upstream: SocketAddr) {
        let l = UpstreamLabel {
            upstream: upstream.to_string(),
        };
        self.upstream_failures.get_or_create(&l).inc();
    }

    /// Whether each upstream is up now (see [`crate::Forwarder::upstreams_up`]); call before
    /// encoding.
    pub fn set_upstreams_up(&self, upstreams: &[(SocketAddr, bool)]) {
        for (addr, up) in upstreams {
            let l = UpstreamLabel {
                upstream: addr.to_string(),
            };
            self.upstream_up.get_or_create(&l).set((*up).into());
        }
    }

    /// One more upstream query in flight until the guard is dropped.
    pub(crate) fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }

    pub(crate) fn overload_refused(&self) {
        self.overload_refused.inc();
    }

    /// A zone was built and is being swapped in.
    pub fn zone_built(&self, zone: &Zone) {
        self.zone_records.set(zone.record_count() as i64);
        self.zone_names.set(zone.name_count() as i64);
        self.zone_builds.inc();
    }

    /// The OpenMetrics text exposition (serve with [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

fn labels(t: Transport, rcode: u8) -> ResponseLabels {
    ResponseLabels {
        rcode: rcode_name(rcode),
        proto: t.label(),
    }
}

/// Decrements the in-flight gauge when dropped (the exchange ended, however it ended).
pub(crate) struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The value of the sample `series` (`name{a="x",b="y"}`, its labels in any order) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    let key = |s: &str| -> (String, Vec<String>) {
        let (name, labels) = s.split_once('{').unwrap_or((s, "}"));
        let labels = labels.trim_end_matches('}');
        let mut l: Vec<String> = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .map(|p| p.trim_end_matches('"').to_string())
            .collect();
        l.sort();
        (name.to_string(), l)
    };
    let want = key(series);
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        (key(series) == want).then(|| value.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_counted_by_transport_and_wire_rcode() {
        let m = DnsMetrics::new();
        let reply = |rc: u8| vec![0x12, 0x34, 0x84, 0x80 | rc];
        let mut t = Tally::default();
        for rc in [0, 0, 3, 5, 9] {
            t.response(&reply(rc));
        }
        t.dropped();
        t.response(&[0, 1]); // no header: not a response
        m.add_udp(&t);
        m.response(Transport::Tcp, &reply(2));
        let text = m.encode();
        let s = |series: &str| sample(&text, series);
        let udp = |rc: &str| {
            s(&format!(
                "coredns_dns_responses_total{{rcode=\"{rc}\",proto=\"udp\",server=\"dns://:53\",zone=\".\"}}"
            ))
        };
        assert_eq!(udp("NOERROR"), Some(2.0), "{text}");
        assert_eq!(udp("NXDOMAIN"), Some(1.0));
        assert_eq!(udp("REFUSED"), Some(1.0));
        assert_eq!(udp("NOTAUTH"), Some(1.0));
        assert_eq!(udp("SERVFAIL"), Some(0.0));
        assert_eq!(
            s("coredns_dns_responses_total{rcode=\"SERVFAIL\",proto=\"tcp\",server=\"dns://:53\",zone=\".\"}"),
            Some(1.0)
        );
        assert_eq!(
            s("weir_dns_requests_dropped_total{transport=\"udp\"}"),
            Some(1.0)
        );
    }

    /// A query of `qtype` for `example.com` in wire form.
    fn query(qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(b"\x07example\x03com\x00");
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn request_durations_in_corednss_buckets_by_type() {
        let m = DnsMetrics::for_listen("10.0.0.10:53".parse().unwrap());
        let mut t = Tally::default();
        t.request(&query(1), Duration::from_micros(100));
        t.request(&query(1), Duration::from_millis(3));
        t.request(&query(33), Duration::from_micros(250));
        t.request(&query(99), Duration::from_secs(9));
        t.request(&[0, 1, 2], Duration::from_micros(1));
        m.add_udp(&t);
        m.request(Transport::Tcp, &query(28), Duration::from_millis(20));
        let text = m.encode();
        let s = |series: &str| sample(&text, series);
        let at = "server=\"dns://10.0.0.10:53\",zone=\".\"";
        let bucket = |ty: &str, le: &str| {
            s(&format!(
                "coredns_dns_request_duration_seconds_bucket{{type=\"{ty}\",{at},le=\"{le}\"}}"
            ))
        };
        assert_eq!(bucket("A", "0.00025"), Some(1.0), "{text}");
        assert_eq!(bucket("A", "0.002"), Some(1.0));
        assert_eq!(bucket("A", "0.004"), Some(2.0));
        assert_eq!(bucket("A", "+Inf"), Some(2.0));
        assert_eq!(
            bucket("SRV", "0.00025"),
            Some(1.0),
            "the bound is inclusive"
        );
        assert_eq!(bucket("AAAA", "0.016"), Some(0.0));
        assert_eq!(bucket("AAAA", "0.032"), Some(1.0));
        assert_eq!(bucket("other", "8.192"), Some(1.0), "no header: other");
        assert_eq!(bucket("other", "+Inf"), Some(2.0));
        let sum = s(&format!(
            "coredns_dns_request_duration_seconds_sum{{type=\"A\",{at}}}"
        ))
        .unwrap();
        assert!((sum - 0.0031).abs() < 1e-9, "{sum}");
        assert_eq!(bucket("MX", "+Inf"), None, "types never seen are left out");
        let requests = |proto: &str, ty: &str| {
            s(&format!(
                "coredns_dns_requests_total{{proto=\"{proto}\",family=\"1\",type=\"{ty}\",{at}}}"
            ))
        };
        assert_eq!(requests("udp", "A"), Some(2.0));
        assert_eq!(requests("udp", "SRV"), Some(1.0));
        assert_eq!(requests("tcp", "AAAA"), Some(1.0));
        assert_eq!(requests("tcp", "A"), Some(0.0));
        // Every CoreDNS bucket bound, in order.
        let les: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("coredns_dns_request_duration_seconds_bucket{"))
            .filter(|l| l.contains("type=\"A\""))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            les,
            [
                "0.00025", "0.0005", "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064",
                "0.128", "0.256", "0.512", "1.024", "2.048", "4.096", "8.192", "+Inf"
            ]
        );
    }

    #[test]
    fn the_in_flight_gauge_follows_its_guards() {
        let m = DnsMetrics::new();
        let a = m.in_flight();
        let b = m.in_flight();
        assert_eq!(
            sample(&m.encode(), "weir_dns_upstream_in_flight"),
            Some(2.0)
        );
        drop(a);
        drop(b);
        assert_eq!(
            sample(&m.encode(), "weir_dns_upstream_in_flight"),
            Some(0.0)
        );
    }
}
