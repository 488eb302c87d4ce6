//! The cluster zone's answers as precomputed wire bytes, and the request fast path that serves
//! them without decoding into a hickory [`Message`](hickory_proto::op::Message).
//!
//! Why: per query, the general path decodes the request (a `Name` and vectors allocated), clones
//! the zone's records, builds a response `Message` and encodes it with name compression. The
//! zone does not change between rebuilds, so [`WireZone::build`] encodes every (name, type)
//! answer once, when the zone is swapped in, from [`Zone::lookup`]'s own answers. Answer
//! records are stored with their owner as a pointer to the question (offset 12), so a reply
//! keeps the question's spelling exactly as the general path's does.
//!
//! [`WireZone::answer`] handles only the plain case — a QUERY with one IN question whose name
//! is uncompressed, at most an OPT record (EDNS version 0, options the general path parses
//! leniently) and nothing after it — for names whose answer depends on the zone alone. Anything
//! else returns `false` and takes the general path, so the two paths can differ only where
//! the differential property test below would see it.
//!
//! Layout: one byte arena of entries (`[key len][lower-case wire name][flags][type count]`,
//! then per type `[qtype u16][answer count u16][byte len u16][records]`) and an open-addressed
//! table of arena offsets: a lookup is one hash of the lower-cased name, about one probe and
//! one comparison, with no allocation.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{Name, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder, NameEncoding};

use crate::respond::{CLASSIC_UDP_PAYLOAD, SERVER_UDP_PAYLOAD};
use crate::zone::{Answer, PodRecords, Zone};

/// Entry flag: the name's answers depend on more than the zone (a CNAME that may be chased
/// upstream): always the general path.
const SLOW: u8 = 1;

/// The OPT record of every EDNS0 reply: root owner, type 41, our payload size, version 0, no
/// flags, no options (what [`crate::respond::response`] sets).
const SERVER_OPT: [u8; 11] = {
    let p = SERVER_UDP_PAYLOAD.to_be_bytes();
    [0, 0, 41, p[0], p[1], 0, 0, 0, 0, 0, 0]
};

/// Entries encoded before [`WireZone::build`] sizes its arena from them.
const SAMPLE: usize = 1024;

/// The zone's answers, encoded.
#[derive(Debug, Default)]
pub struct WireZone {
    /// Arena offset + 1 of each entry; 0 is empty. Length a power of two, at most half full.
    slots: Vec<u32>,
    arena: Vec<u8>,
    /// `64 - log2(slots.len())`: the table index is the hash's top bits.
    shift: u32,
    /// The zone origin, lower-case wire form.
    origin: Vec<u8>,
    /// The SOA record for the authority section of negative answers.
    soa: Vec<u8>,
    /// A name under the origin that is not in the table is NXDOMAIN (no names computed at
    /// lookup, i.e. pod records disabled).
    absent_is_nxdomain: bool,
}

impl WireZone {
    /// Encodes every answer of `zone`. Names whose records cannot be encoded are left to the
    /// general path.
    pub fn build(zone: &Zone) -> WireZone {
        let mut w = WireZone {
            origin: lower_wire(zone.origin()),
            absent_is_nxdomain: zone.pod_records() == PodRecords::Disabled,
            ..WireZone::default()
        };
        if let Answer::Authoritative { answers, .. } = zone.lookup(zone.origin(), RecordType::SOA) {
            if let Some(soa) = answers.first().and_then(encode_record) {
                w.soa = soa;
            }
        }
        if w.soa.is_empty() {
            // Cannot happen for a built zone; without a SOA, negative answers go the slow way.
            w.absent_is_nxdomain = false;
        }
        let names: Vec<&Name> = zone.owner_names().collect();
        if names.len() > SAMPLE {
            // The arena at its final size from the start, as entries spread over the names
            // predict it (forward and reverse names differ): one that grows doubles, holding
            // its old and new buffers at once.
            for i in 0..SAMPLE {
                w.push_entry(zone, names[i * names.len() / SAMPLE]);
            }
            let each = w.arena.len().div_ceil(SAMPLE);
            w.arena = Vec::with_capacity(names.len() * each * 17 / 16);
        }
        let mut offsets = Vec::with_capacity(names.len());
        for name in &names {
            if let Some(off) = w.push_entry(zone, name) {
                offsets.push(off);
            }
        }
        drop(names);
        let size = (offsets.len() * 2).next_power_of_two().max(16);
        w.slots = vec![0; size];
        w.shift = 64 - size.trailing_zeros();
        for off in offsets {
            let key = w.key_at(off as usize);
            let mut i = w.index(key);
            while w.slots[i] != 0 {
                i = (i + 1) & (size - 1);
            }
            w.slots[i] = off + 1;
        }
        w.arena.shrink_to_fit();
        w
    }

    /// Appends `name`'s entry to the arena; its offset, or None if it cannot be encoded.
    fn push_entry(&mut self, zone: &Zone, name: &Name) -> Option<u32> {
        let key = lower_wire(name);
        let start = self.arena.len();
        let mut flags = 0;
        let mut types: Vec<(u16, u16, Vec<u8>)> = Vec::new();
        if let Answer::Authoritative { answers, .. } = zone.lookup(name, RecordType::ANY) {
            if answers.iter().any(|r| r.record_type() == RecordType::CNAME) {
                flags |= SLOW;
            }
            let mut seen: Vec<RecordType> = answers.iter().map(Record::record_type).collect();
            seen.dedup();
            for t in seen {
                if flags & SLOW != 0 || types.iter().any(|(q, ..)| *q == u16::from(t)) {
                    continue;
                }
                let Answer::Authoritative { answers, .. } = zone.lookup(name, t) else {
                    return None;
                };
                let mut bytes = Vec::new();
                for r in &answers {
                    let rr = encode_record(r)?;
                    bytes.extend_from_slice(&[0xc0, 0x0c]);
                    bytes.extend_from_slice(&rr[wire_name_len(&rr)?..]);
                }
                let count = u16::try_from(answers.len()).ok()?;
                if bytes.len() > usize::from(u16::MAX) {
                    flags |= SLOW;
                    continue;
                }
                types.push((u16::from(t), count, bytes));
            }
        }
        let n = u8::try_from(types.len()).ok()?;
        self.arena.push(u8::try_from(key.len()).ok()?);
        self.arena.extend_from_slice(&key);
        self.arena.push(flags);
        self.arena.push(n);
        for (t, count, bytes) in types {
            self.arena.extend_from_slice(&t.to_be_bytes());
            self.arena.extend_from_slice(&count.to_be_bytes());
            self.arena
                .extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            self.arena.extend_from_slice(&bytes);
        }
        u32::try_from(start).ok()
    }

    fn key_at(&self, off: usize) -> &[u8] {
        let len = usize::from(self.arena[off]);
        &self.arena[off + 1..off + 1 + len]
    }

    fn index(&self, key: &[u8]) -> usize {
        (hash(key) >> self.shift) as usize
    }

    /// The entry offset of the lower-case wire name `key`.
    fn find(&self, key: &[u8]) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.index(key);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            let off = (slot - 1) as usize;
            if self.key_at(off) == key {
                return Some(off);
            }
            i = (i + 1) & mask;
        }
    }

    /// Writes the reply to `req` into `out` and returns true, or returns false: the request
    /// needs the general path (anything unusual, names outside the table's knowledge, or
    /// NXDOMAIN when `nxdomain` is false — the server's autopath works on those). `udp`: the
    /// reply must fit the client's UDP size (else the general path truncates it).
    pub fn answer(&self, req: &[u8], udp: bool, nxdomain: bool, out: &mut Vec<u8>) -> bool {
        let Some(q) = parse_plain_query(req) else {
            return false;
        };
        let key = &q.key[..q.key_len];
        let (rcode, count, records): (ResponseCode, u16, &[u8]) = match self.find(key) {
            Some(off) => {
                let mut p = off + 1 + key.len();
                if self.arena[p] & SLOW != 0 {
                    return false;
                }
                let n = self.arena[p + 1];
                p += 2;
                let mut found = None;
                for _ in 0..n {
                    let t = u16::from_be_bytes([self.arena[p], self.arena[p + 1]]);
                    let count = u16::from_be_bytes([self.arena[p + 2], self.arena[p + 3]]);
                    let len =
                        usize::from(u16::from_be_bytes([self.arena[p + 4], self.arena[p + 5]]));
                    if t == q.qtype {
                        found = Some((count, &self.arena[p + 6..p + 6 + len]));
                        break;
                    }
                    p += 6 + len;
                }
                match found {
                    Some((count, bytes)) => (ResponseCode::NoError, count, bytes),
                    None if self.soa.is_empty() => return false,
                    None => (ResponseCode::NoError, 0, &[][..]),
                }
            }
            None if nxdomain && self.absent_is_nxdomain && q.under(&self.origin) => {
                (ResponseCode::NXDomain, 0, &[][..])
            }
            None => return false,
        };
        let authority: &[u8] = if count == 0 { &self.soa } else { &[] };
        out.clear();
        out.extend_from_slice(&req[..2]);
        // QR, AA, the request's RD; RA, the request's CD, the response code.
        out.push(0x80 | 0x04 | (req[2] & 0x01));
        out.push(0x80 | (req[3] & 0x10) | rcode.low());
        out.extend_from_slice(&[0, 1]);
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&[0, u8::from(!authority.is_empty())]);
        out.extend_from_slice(&[0, u8::from(q.edns.is_some())]);
        out.extend_from_slice(&req[12..q.question_end]);
        out.extend_from_slice(records);
        out.extend_from_slice(authority);
        if q.edns.is_some() {
            out.extend_from_slice(&SERVER_OPT);
        }
        let limit = match q.edns {
            _ if !udp => usize::from(u16::MAX),
            Some(size) => usize::from(size.clamp(CLASSIC_UDP_PAYLOAD, SERVER_UDP_PAYLOAD)),
            None => usize::from(CLASSIC_UDP_PAYLOAD),
        };
        out.len() <= limit
    }
}

/// A query the fast path can answer, as parsed from the wire.
struct PlainQuery {
    /// The question name, lower-case wire form.
    key: [u8; 255],
    key_len: usize,
    /// Where each label of `key` starts (up to 127 labels).
    labels: [u8; 128],
    label_count: usize,
    qtype: u16,
    /// End of the question section in the request.
    question_end: usize,
    /// The client's EDNS0 UDP payload size, if it sent an OPT record.
    edns: Option<u16>,
}

impl PlainQuery {
    /// Whether the name is `origin` or below it.
    fn under(&self, origin: &[u8]) -> bool {
        let key = &self.key[..self.key_len];
        let Some(start) = key.len().checked_sub(origin.len()) else {
            return false;
        };
        key[start..] == *origin
            && (start == 0 || self.labels[..self.label_count].contains(&(start as u8)))
    }
}

/// Query types answered only by the general path: 0, OPT, and the meta and query-only types
/// (TKEY, TSIG, IXFR, AXFR, MAILB, MAILA, ANY).
fn general_only(qtype: u16) -> bool {
    qtype == 0 || qtype == 41 || (249..=255).contains(&qtype)
}

/// EDNS option codes hickory decodes strictly (a malformed one fails the whole request there):
/// NSID, DAU, DHU, N3U and Client Subnet. Others it keeps as opaque bytes.
fn strictly_decoded_option(code: u16) -> bool {
    matches!(code, 3 | 5 | 6 | 7 | 8)
}

fn parse_plain_query(req: &[u8]) -> Option<PlainQuery> {
    if req.len() < 17 || req[2] & 0xf8 != 0 {
        // Too short, a response, or an opcode other than QUERY.
        return None;
    }
    let count = |i: usize| u16::from_be_bytes([req[i], req[i + 1]]);
    if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
        return None;
    }
    let mut q = PlainQuery {
        key: [0; 255],
        key_len: 0,
        labels: [0; 128],
        label_count: 0,
        qtype: 0,
        question_end: 0,
        edns: None,
    };
    let mut pos = 12;
    loop {
        let len = usize::from(*req.get(pos)?);
        if len == 0 {
            q.key[q.key_len] = 0;
            q.key_len += 1;
            pos += 1;
            break;
        }
        // Compression pointers (and the reserved label types) are left to the general path.
        if len > 63 || q.key_len + len + 2 > 255 || pos + 1 + len > req.len() {
            return None;
        }
        q.labels[q.label_count] = q.key_len as u8;
        q.label_count += 1;
        q.key[q.key_len] = len as u8;
        for (k, b) in q.key[q.key_len + 1..q.key_len + 1 + len]
            .iter_mut()
            .zip(&req[pos + 1..pos + 1 + len])
        {
            *k = b.to_ascii_lowercase();
        }
        q.key_len += 1 + len;
        pos += 1 + len;
    }
    let fixed = req.get(pos..pos + 4)?;
    q.qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    if u16::from_be_bytes([fixed[2], fixed[3]]) != 1 || general_only(q.qtype) {
        return None;
    }
    pos += 4;
    q.question_end = pos;
    if count(10) == 1 {
        // OPT: root owner, type 41, payload size, extended rcode, version 0, flags, options.
        let opt = req.get(pos..pos + 11)?;
        if opt[0] != 0 || opt[1..3] != [0, 41] || opt[6] != 0 {
            return None;
        }
        q.edns = Some(u16::from_be_bytes([opt[3], opt[4]]));
        let rdlen = usize::from(u16::from_be_bytes([opt[9], opt[10]]));
        pos += 11;
        let end = pos + rdlen;
        if end != req.len() {
            return None;
        }
        while pos < end {
            let head = req.get(pos..pos + 4)?;
            let code = u16::from_be_bytes([head[0], head[1]]);
            let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
            // COOKIE (10): the reply carries a server cookie only the general path makes.
            if strictly_decoded_option(code) || code == 10 || pos + 4 + len > end {
                return None;
            }
            pos += 4 + len;
        }
    } else if pos != req.len() {
        return None;
    }
    Some(q)
}

/// FxHash over 8-byte words; the table uses the top bits.
fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0;
    for chunk in key.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    h
}

/// `name` in lower-case wire form (labels, then the root's zero).
fn lower_wire(name: &Name) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name.iter() {
        out.push(label.len() as u8);
        out.extend(label.iter().map(u8::to_ascii_lowercase));
    }
    out.push(0);
    out
}

/// A record on its own, every name uncompressed (so the bytes can go anywhere in a message).
fn encode_record(r: &Record) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut enc = BinEncoder::new(&mut buf);
    enc.set_name_encoding(NameEncoding::Uncompressed);
    r.emit(&mut enc).ok()?;
    Some(buf)
}

/// Length of the uncompressed wire name at the start of `bytes`.
fn wire_name_len(bytes: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let len = usize::from(*bytes.get(i)?);
        i += 1 + len;
        if len == 0 {
            return Some(i);
        }
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
