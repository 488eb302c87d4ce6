//! The cluster zone: every record the Kubernetes DNS-based service discovery specification
//! (schema 1.0.1, github.com/kubernetes/dns docs/specification.md) asks for, built once per
//! object change from a [`Snapshot`] and then only read. [`Zone::lookup`] is pure.
//!
//! What is built, for a zone `<zone>` (e.g. `cluster.local`):
//! * ClusterIP service: `<svc>.<ns>.svc.<zone>` A/AAAA for each cluster IP, PTR for each IP.
//! * Headless service (clusterIP `None`): the service name gets one A/AAAA per ready endpoint,
//!   and `<hostname>.<svc>.<ns>.svc.<zone>` the endpoint's own; PTR of the endpoint IP points
//!   there. `<hostname>` is the endpoint's `hostname`, else its address with `.`/`:` as `-`
//!   (the spec leaves the system-assigned form open; CoreDNS uses the same dashed address).
//! * SRV `_<port>._<proto>.<svc>.<ns>.svc.<zone>` for named ports: to the service name
//!   (ClusterIP) or to each ready endpoint's hostname with the endpoint's port (headless).
//! * ExternalName: CNAME to the external name.
//! * `dns-version.<zone>` TXT `1.0.1`; SOA and NS at the apex.
//! * Pod names `<a-b-c-d>.<ns>.pod.<zone>` ([`PodRecords`]): computed at lookup from the name,
//!   not stored; in verified mode only for an address a Pod in `<ns>` holds (the zone keeps
//!   the set of (namespace, IP) pairs of the snapshot's Pods).
//!
//! Ready: an endpoint whose `ready` condition is not false (the API reads nil as ready), or any
//! endpoint of a service with `publishNotReadyAddresses`.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use weir_model::{EndpointSliceInfo, IpText, ServiceInfo, Snapshot};

/// The schema version served in `dns-version.<zone>`.
pub const SCHEMA_VERSION: &str = "1.0.1";

/// Whether `<a-b-c-d>.<ns>.pod.<zone>` names are answered (CoreDNS's `pods` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodRecords {
    /// No pod names: NXDOMAIN (the default, as CoreDNS's).
    #[default]
    Disabled,
    /// Any well-formed name is answered with the address it spells, whether or not such a pod
    /// exists (kube-dns's behaviour, kept for compatibility). `pod.<zone>` and
    /// `<ns>.pod.<zone>` exist (NODATA).
    Insecure,
    /// As insecure, but only when a Pod in `<ns>` (not Succeeded or Failed) holds the address
    /// (CoreDNS's `pods verified`; the snapshot must carry Pods). Otherwise NXDOMAIN.
    Verified,
}

/// How the zone is built.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The cluster domain, e.g. `cluster.local.`.
    pub origin: Name,
    /// TTL of every record, and the SOA minimum (negative-answer TTL).
    pub ttl: u32,
    /// SOA serial; the caller bumps it on every rebuild (e.g. from the clock).
    pub serial: u32,
    /// Addresses of this DNS server, published as the A/AAAA of the apex NS target
    /// `ns.dns.<zone>` (none: the NS name has no address records).
    pub ns_addresses: Vec<IpAddr>,
    /// Pod names (default disabled).
    pub pods: PodRecords,
}

impl ZoneConfig {
    /// `origin` as text (`cluster.local`); TTL 5 s as the issue asks.
    pub fn new(origin: &str) -> Result<Self, String> {
        let mut origin = Name::from_ascii(origin).map_err(|e| format!("zone {origin:?}: {e}"))?;
        origin.set_fqdn(true);
        if origin.is_root() {
            return Err("the cluster zone cannot be the root".into());
        }
        Ok(ZoneConfig {
            origin: origin.to_lowercase(),
            ttl: 5,
            serial: 1,
            ns_addresses: Vec::new(),
            pods: PodRecords::Disabled,
        })
    }
}

/// What a lookup decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The zone is authoritative for the name: NOERROR with answers, NODATA (NOERROR, no
    /// answers, SOA in authority) or NXDOMAIN (SOA in authority).
    Authoritative {
        rcode: ResponseCode,
        answers: Vec<Record>,
        authority: Vec<Record>,
    },
    /// Not ours: forward it (names outside the zone, and reverse names of no cluster IP).
    NotInZone,
}

impl Answer {
    /// An out-of-zone CNAME target the server should resolve for `qtype` and append
    /// (ExternalName). None when the client asked for the CNAME itself (or ANY): the CNAME
    /// is the whole answer then.
    pub fn cname_outside(&self, zone: &Zone, qtype: RecordType) -> Option<Name> {
        let Answer::Authoritative { answers, .. } = self else {
            return None;
        };
        if matches!(qtype, RecordType::CNAME | RecordType::ANY) {
            return None;
        }
        match answers.last().map(|r| &r.data) {
            Some(RData::CNAME(CNAME(target))) if !zone.origin.zone_of(target) => {
                Some(target.clone())
            }
            _ => None,
        }
    }
}

/// A record's data as the zone stores it. A name's records share its owner, class and the
/// zone's TTL, so those are added at lookup; addresses (most records) are held inline and a
/// PTR's target as a boxed name. Storing hickory's `Record` (272 bytes: owner name, a 184-byte
/// `RData`, TTL) per record made the zone ~2× larger at 100,000 services.
#[derive(Debug, Clone, PartialEq)]
enum Data {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Ptr(Box<Name>),
    Other(Box<RData>),
}

impl Data {
    fn record_type(&self) -> RecordType {
        match self {
            Data::V4(_) => RecordType::A,
            Data::V6(_) => RecordType::AAAA,
            Data::Ptr(_) => RecordType::PTR,
            Data::Other(r) => r.record_type(),
        }
    }

    fn record(&self, owner: &Name, ttl: u32) -> Record {
        let data = match self {
            Data::V4(ip) => RData::A((*ip).into()),
            Data::V6(ip) => RData::AAAA((*ip).into()),
            Data::Ptr(target) => RData::PTR(PTR((**target).clone())),
            Data::Other(r) => (**r).clone(),
        };
        Record::from_rdata(owner.clone(), ttl, data)
    }
}

impl From<RData> for Data {
    fn from(r: RData) -> Self {
        match r {
            RData::A(a) => Data::V4(a.0),
            RData::AAAA(a) => Data::V6(a.0),
            RData::PTR(p) => Data::Ptr(Box::new(p.0)),
            other => Data::Other(Box::new(other)),
        }
    }
}

/// The immutable zone. Names are compared case-insensitively ([`Name`]'s own `Eq`/`Hash`).
#[derive(Debug, Clone)]
pub struct Zone {
    origin: Name,
    ttl: u32,
    soa: Record,
    /// Every name in the zone, including empty non-terminals (`<ns>.svc.<zone>`), which
    /// answer NODATA rather than NXDOMAIN.
    names: HashMap<Name, Vec<Data>>,
    /// PTR records of cluster IPs and endpoint IPs, keyed by the reverse name.
    reverse: HashMap<Name, Vec<Data>>,
    pods: PodRecords,
    /// (namespace, IP) of every Pod holding an IP, in verified mode only (else empty).
    pod_ips: HashSet<(Box<str>, IpAddr)>,
    /// Objects skipped because a name or value could not be a DNS name.
    pub warnings: Vec<String>,
}

impl Zone {
    pub fn origin(&self) -> &Name {
        &self.origin
    }

    /// The TTL of the zone's records.
    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    /// Whether `<ns>.svc.<zone>` exists, i.e. the namespace has a service.
    pub fn has_namespace(&self, ns: &str) -> bool {
        Name::from_labels([ns, "svc"])
            .and_then(|n| n.append_domain(&self.origin))
            .is_ok_and(|n| self.names.contains_key(&n))
    }

    /// Number of distinct owner names (for logs and tests).
    pub fn name_count(&self) -> usize {
        self.names.len() + self.reverse.len()
    }

    /// Number of stored records (pod names, computed at lookup, are not stored).
    pub fn record_count(&self) -> usize {
        self.names
            .values()
            .chain(self.reverse.values())
            .map(Vec::len)
            .sum()
    }

    /// Every owner name with stored records or existing empty (zone names, then reverse
    /// names): what the server's wire table precomputes answers for. Names computed at lookup
    /// (pod names) are not among them; see [`Zone::pod_records`].
    pub fn owner_names(&self) -> impl Iterator<Item = &Name> {
        self.names.keys().chain(self.reverse.keys())
    }

    /// How pod names are answered (anything but `Disabled` makes names outside
    /// [`Zone::owner_names`] possibly positive).
    pub fn pod_records(&self) -> PodRecords {
        self.pods
    }

    /// Answers `qname`/`qtype`. Answer owner names are the query's own spelling (case kept,
    /// so resolvers that randomise case still match).
    pub fn lookup(&self, qname: &Name, qtype: RecordType) -> Answer {
        let mut fqdn = qname.clone();
        fqdn.set_fqdn(true);
        if self.origin.zone_of(&fqdn) {
            return match self.names.get(&fqdn) {
                None => self
                    .pod_lookup(&fqdn, qtype)
                    .unwrap_or_else(|| self.negative(ResponseCode::NXDomain)),
                Some(records) => self.positive(&fqdn, qtype, records),
            };
        }
        match self.reverse.get(&fqdn) {
            Some(records) => self.positive(&fqdn, qtype, records),
            None => Answer::NotInZone,
        }
    }

    /// A name under `pod.<zone>` when pod records are on: `pod.<zone>` and `<ns>.pod.<zone>`
    /// exist without records; `<addr>.<ns>.pod.<zone>` has the A or AAAA record its first
    /// label spells (`10-244-1-2`, `fd00--1`). None: not a pod name (NXDOMAIN).
    fn pod_lookup(&self, fqdn: &Name, qtype: RecordType) -> Option<Answer> {
        if self.pods == PodRecords::Disabled {
            return None;
        }
        let below = fqdn.num_labels().checked_sub(self.origin.num_labels())? as usize;
        let labels: Vec<&[u8]> = fqdn.iter().collect();
        if below == 0 || below > 3 || !labels[below - 1].eq_ignore_ascii_case(b"pod") {
            return None;
        }
        if below < 3 {
            return Some(self.negative(ResponseCode::NoError));
        }
        let ip = pod_address(std::str::from_utf8(labels[0]).ok()?)?;
        if self.pods == PodRecords::Verified {
            // Namespaces are lower-case DNS labels; the query's spelling may not be.
            let ns = std::str::from_utf8(labels[1]).ok()?.to_ascii_lowercase();
            if !self.pod_ips.contains(&(ns.into_boxed_str(), ip)) {
                return None;
            }
        }
        Some(self.positive(fqdn, qtype, &[Data::from(address(ip))]))
    }

    fn positive(&self, qname: &Name, qtype: RecordType, records: &[Data]) -> Answer {
        let cname = records
            .iter()
            .find(|r| r.record_type() == RecordType::CNAME);
        let answers: Vec<Record> = match cname {
            Some(c) if qtype != RecordType::CNAME => vec![c.record(qname, self.ttl)],
            _ => records
                .iter()
                .filter(|r| qtype == RecordType::ANY || r.record_type() == qtype)
                .map(|r| r.record(qname, self.ttl))
                .collect(),
        };
        if answers.is_empty() {
            return self.negative(ResponseCode::NoError);
        }
        Answer::Authoritative {
            rcode: ResponseCode::NoError,
            answers,
            authority: Vec::new(),
        }
    }

    fn negative(&self, rcode: ResponseCode) -> Answer {
        Answer::Authoritative {
            rcode,
            answers: Vec::new(),
            authority: vec![self.soa.clone()],
        }
    }

    /// Builds the zone from the objects. Objects whose names cannot be DNS names are
    /// skipped with a warning; the rest of the zone is unaffected.
    pub fn build(snapshot: &Snapshot, config: &ZoneConfig) -> Zone {
        let mut b = Builder::new(config, snapshot.services.len());
        let mut slices: HashMap<(&str, &str), Vec<&EndpointSliceInfo>> = HashMap::new();
        for ((ns, _), slice) in &snapshot.endpoint_slices {
            if let Some(svc) = slice.service_name.as_deref() {
                slices.entry((&**ns, svc)).or_default().push(slice);
            }
        }
        for ((ns, name), svc) in &snapshot.services {
            let svc_slices = slices
                .get(&(&**ns, &**name))
                .map(Vec::as_slice)
                .unwrap_or_default();
            if let Err(e) = b.service(ns, name, svc, svc_slices) {
                b.warnings.push(format!("service {ns}/{name}: {e}"));
            }
        }
        let mut zone = b.finish();
        if config.pods == PodRecords::Verified {
            zone.pod_ips = snapshot
                .pods
                .values()
                .filter(|p| !p.terminated)
                .flat_map(|p| p.ips.iter().map(|ip| (Box::from(&*p.namespace), *ip)))
                .collect();
        }
        zone
    }
}

struct Builder<'c> {
    config: &'c ZoneConfig,
    names: HashMap<Name, Vec<Data>>,
    reverse: HashMap<Name, Vec<Data>>,
    warnings: Vec<String>,
}

type BuildResult = Result<(), String>;

fn name_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The address a pod label spells: `10-244-1-2` (four decimal parts) or an IPv6 address
/// with `:` written as `-` (`fd00--1`).
pub fn pod_address(label: &str) -> Option<IpAddr> {
    if let Ok(v4) = label.replace('-', ".").parse::<std::net::Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    // An IPv4 spelling that failed must not pass as IPv6 (`1-2-3-4` has no IPv6 reading,
    // but `1-2-3-4-5-6-7-8` does, and is IPv6).
    label
        .replace('-', ":")
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// An endpoint address as a DNS label: `10.0.0.1` → `10-0-0-1`, `fd00::1` → `fd00--1`.
fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

impl<'c> Builder<'c> {
    /// Room for `services` ClusterIP services (a name and a reverse name each) from the
    /// start: a map that grows doubles, holding its old and new tables at once (at 100,000
    /// services that was the zone build's peak).
    fn new(config: &'c ZoneConfig, services: usize) -> Self {
        let mut b = Builder {
            config,
            names: HashMap::with_capacity(services + 16),
            reverse: HashMap::with_capacity(services),
            warnings: Vec::new(),
        };
        let origin = &config.origin;
        let ns_name = Name::from_ascii("ns.dns")
            .and_then(|n| n.append_domain(origin))
            .expect("a valid zone has room for ns.dns");
        b.add(origin.clone(), RData::SOA(b.soa_rdata(&ns_name)));
        b.add(origin.clone(), RData::NS(NS(ns_name.clone())));
        for ip in &config.ns_addresses {
            b.add(ns_name.clone(), address(*ip));
        }
        let version = Name::from_ascii("dns-version")
            .and_then(|n| n.append_domain(origin))
            .expect("a valid zone has room for dns-version");
        b.add(
            version,
            RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])),
        );
        b
    }

    fn soa_rdata(&self, ns_name: &Name) -> SOA {
        let rname = Name::from_ascii("hostmaster")
            .and_then(|n| n.append_domain(&self.config.origin))
            .expect("a valid zone has room for hostmaster");
        // Refresh/retry/expire as CoreDNS publishes them; they matter only to secondaries.
        SOA::new(
            ns_name.clone(),
            rname,
            self.config.serial,
            7200,
            1800,
            86400,
            self.config.ttl,
        )
    }

    /// Adds a record (once) and makes every name between it and the origin exist.
    fn add(&mut self, name: Name, data: RData) {
        let record = Data::from(data);
        let mut parent = name.base_name();
        let records = self.names.entry(name).or_default();
        if !records.contains(&record) {
            if records.is_empty() {
                // Most names hold one record; a first push would reserve four (see finish).
                records.reserve_exact(1);
            }
            records.push(record);
        }
        while parent.num_labels() > self.config.origin.num_labels() {
            let next = parent.base_name();
            self.names.entry(parent).or_default();
            parent = next;
        }
    }

    /// Makes a name exist with no records (a headless service without ready endpoints
    /// answers NODATA, not NXDOMAIN: the service exists).
    fn touch(&mut self, name: Name) {
        let mut n = name;
        while n.num_labels() > self.config.origin.num_labels() {
            let next = n.base_name();
            self.names.entry(n).or_default();
            n = next;
        }
    }

    fn add_ptr(&mut self, ip: IpAddr, target: &Name) {
        let owner = Name::from(ip);
        let record = Data::Ptr(Box::new(target.clone()));
        let records = self.reverse.entry(owner).or_default();
        if !records.contains(&record) {
            if records.is_empty() {
                // Most names hold one record; a first push would reserve four (see finish).
                records.reserve_exact(1);
            }
            records.push(record);
        }
    }

    fn service(
        &mut self,
        ns: &str,
        name: &str,
        svc: &ServiceInfo,
        slices: &[&EndpointSliceInfo],
    ) -> BuildResult {
        let base = Name::from_labels([name, ns, "svc"])
            .and_then(|n| n.append_domain(&self.config.origin))
            .map_err(name_err)?;
        let Some(spec) = svc.spec.as_ref() else {
            return Err("no spec".into());
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            let ext = spec.external_name().unwrap_or_default();
            let mut target =
                Name::from_ascii(ext).map_err(|e| format!("externalName {ext:?}: {e}"))?;
            target.set_fqdn(true);
            if target.is_root() {
                return Err("externalName is empty".into());
            }
            self.add(base, RData::CNAME(CNAME(target)));
            return Ok(());
        }
        if spec.cluster_ips.iter().any(|ip| ip.is("None")) {
            return self.headless(&base, svc, slices);
        }
        self.touch(base.clone());
        for ip in spec.cluster_ips.iter() {
            let ip: IpAddr = match ip {
                IpText::Ip(ip) => *ip,
                IpText::Text(ip) => {
                    self.warnings.push(format!(
                        "service {ns}/{name}: clusterIP {ip:?} is not an IP"
                    ));
                    continue;
                }
            };
            self.add(base.clone(), address(ip));
            self.add_ptr(ip, &base);
        }
        for port in spec.ports.iter() {
            let Some(pname) = port.name.as_deref().filter(|n| !n.is_empty()) else {
                continue;
            };
            let proto = port.protocol.as_deref().unwrap_or("TCP");
            let Ok(number) = u16::try_from(port.port) else {
                continue;
            };
            let owner = srv_name(pname, proto, &base).map_err(name_err)?;
            self.add(owner, RData::SRV(SRV::new(0, 100, number, base.clone())));
        }
        Ok(())
    }

    fn headless(
        &mut self,
        base: &Name,
        svc: &ServiceInfo,
        slices: &[&EndpointSliceInfo],
    ) -> BuildResult {
        self.touch(base.clone());
        let publish_not_ready = svc
            .spec
            .as_ref()
            .is_some_and(|s| s.publish_not_ready_addresses);
        for slice in slices {
            if &*slice.address_type == "FQDN" {
                continue;
            }
            for ep in slice.endpoints.iter() {
                let ready = ep.ready != Some(false);
                if !(ready || publish_not_ready) {
                    continue;
                }
                for addr in ep.addresses.iter() {
                    let ip = match addr {
                        IpText::Ip(ip) => *ip,
                        IpText::Text(addr) => {
                            self.warnings
                                .push(format!("endpoint address {addr:?} is not an IP"));
                            continue;
                        }
                    };
                    let label = ep
                        .hostname()
                        .map(String::from)
                        .unwrap_or_else(|| dashed(ip));
                    let host = match base.prepend_label(label.as_str()) {
                        Ok(h) => h,
                        Err(e) => {
                            self.warnings
                                .push(format!("endpoint hostname {label:?}: {e}"));
                            continue;
                        }
                    };
                    self.add(base.clone(), address(ip));
                    self.add(host.clone(), address(ip));
                    self.add_ptr(ip, &host);
                    for port in slice.ports.iter() {
                        let (Some(pname), Some(number)) = (
                            port.name.as_deref().filter(|n| !n.is_empty()),
                            port.port.and_then(|p| u16::try_from(p).ok()),
                        ) else {
                            continue;
                        };
                        let proto = port.protocol.as_deref().unwrap_or("TCP");
                        let owner = srv_name(pname, proto, base).map_err(name_err)?;
                        self.add(owner, RData::SRV(SRV::new(0, 100, number, host.clone())));
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Zone {
        // A Vec's first push reserves four records; `add` reserves one for the first, and
        // what grew beyond is trimmed here (the zone was 2.4 KB per service).
        for records in self.names.values_mut().chain(self.reverse.values_mut()) {
            records.shrink_to_fit();
        }
        self.names.shrink_to_fit();
        self.reverse.shrink_to_fit();
        let origin = &self.config.origin;
        let soa = self.names[origin]
            .iter()
            .find(|r| r.record_type() == RecordType::SOA)
            .expect("the builder adds the SOA first")
            .record(origin, self.config.ttl);
        Zone {
            origin: self.config.origin.clone(),
            ttl: self.config.ttl,
            soa,
            names: self.names,
            reverse: self.reverse,
            pods: self.config.pods,
            pod_ips: HashSet::new(),
            warnings: self.warnings,
        }
    }
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(v4.into()),
        IpAddr::V6(v6) => RData::AAAA(v6.into()),
    }
}

/// `_<port>._<proto>.<base>`, protocol lower-cased (`TCP` → `_tcp`).
fn srv_name(port: &str, proto: &str, base: &Name) -> Result<Name, hickory_proto::ProtoError> {
    base.prepend_label(format!("_{}", proto.to_ascii_lowercase()).as_str())?
        .prepend_label(format!("_{port}").as_str())
}
