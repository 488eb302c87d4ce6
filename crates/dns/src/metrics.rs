//! Prometheus metrics of `weir dns`: responses by rcode and transport, the forwarder's cache
//! and upstreams, the in-flight cap, and the zone's size. Names follow CoreDNS's where the
//! meaning is the same (`coredns_dns_responses_total`, `coredns_cache_hits_total`, …) with a
//! `weir_dns_` prefix, so existing dashboards map one to one.
//!
//! Every handle is an atomic shared with the registry. The UDP threads do not touch them per
//! query: they tally a batch in a plain [`Tally`] and add it once ([`DnsMetrics::add_udp`]).

use std::fmt;
use std::net::SocketAddr;

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
    transport: &'static str,
    rcode: &'static str,
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

/// Responses of one UDP batch by rcode, and requests dropped unanswered.
#[derive(Default)]
pub struct Tally {
    by_rcode: [u32; 16],
    dropped: u32,
}

impl Tally {
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
    pub fn new() -> Self {
        let mut m = DnsMetrics {
            registry: Registry::default(),
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
        let r = &mut m.registry;
        // Counters are named without `_total`: the encoder appends it.
        r.register(
            "weir_dns_responses",
            "Responses sent, by transport and rcode",
            m.responses.clone(),
        );
        r.register(
            "weir_dns_requests_dropped",
            "Requests not answered at all (too short or garbled to carry an ID), by transport",
            m.dropped.clone(),
        );
        r.register(
            "weir_dns_cache_hits",
            "Names outside the zone answered from the cache",
            m.cache_hits.clone(),
        );
        r.register(
            "weir_dns_cache_misses",
            "Names outside the zone not in the cache (asked upstream)",
            m.cache_misses.clone(),
        );
        r.register(
            "weir_dns_cache_entries",
            "Entries in the forwarder's cache",
            m.cache_entries.clone(),
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
            "weir_dns_overload_refused",
            "Queries answered REFUSED because the upstream in-flight cap was reached",
            m.overload_refused.clone(),
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
            let _ = m.dropped.get_or_create(&TransportLabel {
                transport: t.label(),
            });
        }
        m
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
        transport: t.label(),
        rcode: rcode_name(rcode),
    }
}

/// Decrements the in-flight gauge when dropped (the exchange ended, however it ended).
pub(crate) struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

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
                "weir_dns_responses_total{{transport=\"udp\",rcode=\"{rc}\"}}"
            ))
        };
        assert_eq!(udp("NOERROR"), Some(2.0), "{text}");
        assert_eq!(udp("NXDOMAIN"), Some(1.0));
        assert_eq!(udp("REFUSED"), Some(1.0));
        assert_eq!(udp("NOTAUTH"), Some(1.0));
        assert_eq!(udp("SERVFAIL"), Some(0.0));
        assert_eq!(
            s("weir_dns_responses_total{transport=\"tcp\",rcode=\"SERVFAIL\"}"),
            Some(1.0)
        );
        assert_eq!(
            s("weir_dns_requests_dropped_total{transport=\"udp\"}"),
            Some(1.0)
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
