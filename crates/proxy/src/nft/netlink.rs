//! nf_tables set elements over netlink, without the `nft` tool: the fast path for the
//! changes that dominate a proxy's life (endpoints and services coming and going are element
//! updates in weir's ruleset shape).
//!
//! Hand-encoded: the rust-netlink family has no nf_tables support, and `rustables`/`nftnl`
//! cover neither map data nor verdict elements (nftnl also needs libnftnl). The encoding is
//! small (a batch, one message type, a few nested attributes) and every path is checked
//! against the `nft` tool's own view of the result in the kernel tests.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::element::{encode, encode_into, Data, Element, Val};
use crate::backend::{Error, Result};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NFPROTO_INET: u8 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NF_DROP: i32 = 0;
const NFT_GOTO: i32 = -4;
/// Elements per netlink message; a transaction holds as many messages as it needs.
const ELEMENTS_PER_MESSAGE: usize = 1024;
/// Bytes of elements after which a message is closed: one more element (at most a few
/// hundred bytes: a verdict names a chain of up to 256) must still fit a 16-bit length.
const MESSAGE_LIST_BYTES: usize = 64 * 1024 - 1024;

/// Element data as the kernel stores it (what a dump returns), for comparing with a plan.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RawData {
    Value(Vec<u8>),
    Verdict(i32, Option<String>),
}

impl RawData {
    pub fn of(data: &Data) -> RawData {
        match data {
            Data::Goto(chain) => RawData::Verdict(NFT_GOTO, Some(chain.clone())),
            Data::Drop => RawData::Verdict(NF_DROP, None),
            Data::Values(v) => RawData::Value(encode(v)),
        }
    }
}

/// One element as raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RawElement {
    pub key: Vec<u8>,
    pub data: Option<RawData>,
}

impl RawElement {
    pub fn of(e: &Element) -> RawElement {
        RawElement {
            key: encode(&e.key),
            data: e.data.as_ref().map(RawData::of),
        }
    }
}

/// An element of a batch: one of the plan's (encoded straight into the message, with no
/// copy in between), one as a dump returned it (a stale element to delete), or one already
/// encoded by [`EncodedElements`] (an add: its bytes are copied into the message as they are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire<'a> {
    Plan(&'a Element),
    Raw(RawElement),
    /// One `NFTA_LIST_ELEM` attribute with its data, from [`EncodedElements::iter`]; only
    /// for adds (a delete carries the key alone).
    Encoded(&'a [u8]),
}

/// Bytes per block of [`EncodedElements`]: a block's allocation is amortised over thousands
/// of elements, and it is above glibc's mmap threshold, so the blocks of a full sync go back
/// to the system when it ends instead of staying in the heap (the pages a small set never
/// touches are never resident).
const ENCODED_BLOCK: usize = 256 * 1024;

/// The elements of one set, each kept only as the `NFTA_LIST_ELEM` attribute (with its data)
/// that a netlink add message carries: a few dozen bytes per element instead of an
/// [`Element`]'s heap values, in blocks that never move once written (no doubling copy of a
/// million elements). What a full sync holds between rendering and sending.
#[derive(Debug, Default)]
pub struct EncodedElements {
    blocks: Vec<Vec<u8>>,
    len: usize,
}

impl EncodedElements {
    /// Appends `e` (encoded for an add).
    pub fn push(&mut self, e: &Element) {
        let need = self
            .blocks
            .last()
            .is_none_or(|b| b.capacity() - b.len() < 1024);
        if need {
            self.blocks.push(Vec::with_capacity(ENCODED_BLOCK));
        }
        let block = self.blocks.last_mut().expect("just pushed");
        encode_element(block, &Wire::Plan(e), true);
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each element's attribute, in the order pushed.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.blocks.iter().flat_map(|b| {
            let mut rest = &b[..];
            std::iter::from_fn(move || {
                if rest.len() < 4 {
                    return None;
                }
                let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
                let (el, tail) = rest.split_at(((len + 3) & !3).min(rest.len()));
                rest = tail;
                Some(el)
            })
        })
    }

    /// Heap bytes held (for the phase log).
    pub fn capacity_bytes(&self) -> usize {
        self.blocks.iter().map(Vec::capacity).sum()
    }
}

impl RawElement {
    /// The element an [`EncodedElements`] attribute holds, as a dump would return it.
    pub fn of_encoded(attr: &[u8]) -> Option<RawElement> {
        attrs(attr).next().and_then(|(_, e)| decode_element(e))
    }
}

/// What a socket has sent so far: counts that tests bound (elements per message, messages per
/// batch), never times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Transactions (batches) sent.
    pub batches: usize,
    /// Element messages in them.
    pub messages: usize,
    /// Elements in those messages.
    pub elements: usize,
    /// Bytes handed to the kernel.
    pub bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Delete,
}

/// A netfilter netlink socket in the network namespace of the thread that opened it.
pub struct NftNetlink {
    socket: Socket,
    seq: u32,
    /// One receive buffer for the socket's life: a fresh megabyte per datagram cost a page
    /// fault per page touched, hundreds of datagrams per full sync.
    rx: Vec<u8>,
    sent: Sent,
}

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

fn attr_str(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    attr_end(buf, at);
}

/// Sets the length of the attribute starting at `at` and pads it to 4 bytes.
fn attr_end(buf: &mut Vec<u8>, at: usize) {
    let len = buf.len() - at;
    buf[at..at + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

/// A value attribute holding the kernel encoding of `vals`, written in place.
fn attr_vals(buf: &mut Vec<u8>, kind: u16, vals: &[Val]) {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&kind.to_ne_bytes());
    encode_into(buf, vals);
    attr_end(buf, at);
}

/// Starts a nested attribute; returns its offset for [`nest_end`].
fn nest_start(buf: &mut Vec<u8>, kind: u16) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    at
}

fn nest_end(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u16;
    buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
}

fn encode_element(buf: &mut Vec<u8>, e: &Wire, with_data: bool) {
    if let Wire::Encoded(a) = e {
        debug_assert!(with_data, "an encoded element is written whole: adds only");
        buf.extend_from_slice(a);
        return;
    }
    let el = nest_start(buf, NFTA_LIST_ELEM);
    let key = nest_start(buf, NFTA_SET_ELEM_KEY);
    match e {
        Wire::Encoded(_) => unreachable!("written above"),
        Wire::Plan(e) => attr_vals(buf, NFTA_DATA_VALUE, &e.key),
        Wire::Raw(e) => attr(buf, NFTA_DATA_VALUE, &e.key),
    }
    nest_end(buf, key);
    if with_data {
        match e {
            Wire::Plan(Element { data: Some(d), .. }) => {
                let data = nest_start(buf, NFTA_SET_ELEM_DATA);
                match d {
                    Data::Values(v) => attr_vals(buf, NFTA_DATA_VALUE, v),
                    Data::Goto(chain) => verdict(buf, NFT_GOTO, Some(chain)),
                    Data::Drop => verdict(buf, NF_DROP, None),
                }
                nest_end(buf, data);
            }
            Wire::Raw(RawElement { data: Some(d), .. }) => {
                let data = nest_start(buf, NFTA_SET_ELEM_DATA);
                match d {
                    RawData::Value(v) => attr(buf, NFTA_DATA_VALUE, v),
                    RawData::Verdict(code, chain) => verdict(buf, *code, chain.as_deref()),
                }
                nest_end(buf, data);
            }
            _ => {}
        }
    }
    nest_end(buf, el);
}

fn verdict(buf: &mut Vec<u8>, code: i32, chain: Option<&str>) {
    let v = nest_start(buf, NFTA_DATA_VERDICT);
    attr(buf, NFTA_VERDICT_CODE, &code.to_be_bytes());
    if let Some(c) = chain {
        attr_str(buf, NFTA_VERDICT_CHAIN, c);
    }
    nest_end(buf, v);
}

/// Iterates over the attributes in `buf`: (type without flags, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[(len + 3) & !3..];
        Some((kind, payload))
    })
}

fn find(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf).find(|(k, _)| *k == kind).map(|(_, p)| p)
}

fn decode_element(buf: &[u8]) -> Option<RawElement> {
    let key = find(find(buf, NFTA_SET_ELEM_KEY)?, NFTA_DATA_VALUE)?.to_vec();
    let data = find(buf, NFTA_SET_ELEM_DATA).and_then(|d| {
        if let Some(v) = find(d, NFTA_DATA_VALUE) {
            return Some(RawData::Value(v.to_vec()));
        }
        let v = find(d, NFTA_DATA_VERDICT)?;
        let code = i32::from_be_bytes(find(v, NFTA_VERDICT_CODE)?.try_into().ok()?);
        let chain = find(v, NFTA_VERDICT_CHAIN)
            .map(|c| String::from_utf8_lossy(c.split(|b| *b == 0).next().unwrap_or(c)).into());
        Some(RawData::Verdict(code, chain))
    });
    Some(RawElement { key, data })
}

/// Appends one netlink message (header + nfgenmsg + body) to `buf`.
fn message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, res_id: u16, body: &[u8]) {
    let len = 16 + 4 + body.len();
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[NFPROTO_INET, 0]);
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(body);
}

/// The bytes of one transaction applying `ops` to sets of `table`, and (seq, op, set) of each
/// element message in it. Consecutive ops on one set share a message, up to
/// [`ELEMENTS_PER_MESSAGE`] elements and [`MESSAGE_LIST_BYTES`] bytes of elements (a nested
/// attribute's length is 16 bits: a thousand IPv6 elements would overflow it).
fn batch<'o>(
    seq: &mut u32,
    table: &str,
    ops: &'o [(Op, &'o str, Wire)],
) -> (Vec<u8>, Vec<(u32, Op, &'o str)>) {
    let mut next = || {
        *seq = seq.wrapping_add(1);
        *seq
    };
    let mut buf = Vec::with_capacity(64 + ops.len() * 64);
    message(
        &mut buf,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        next(),
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    let mut sent = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        let (op, set) = (ops[i].0, ops[i].1);
        let (kind, flags) = match op {
            Op::Add => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE),
            Op::Delete => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
        };
        let seq = next();
        // Written in place: the header first, its length set once the body is known.
        let at = buf.len();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            flags,
            seq,
            0,
            &[],
        );
        attr_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, table);
        attr_str(&mut buf, NFTA_SET_ELEM_LIST_SET, set);
        let list = nest_start(&mut buf, NFTA_SET_ELEM_LIST_ELEMENTS);
        let mut j = i;
        while j < ops.len()
            && j - i < ELEMENTS_PER_MESSAGE
            && buf.len() - list < MESSAGE_LIST_BYTES
            && ops[j].0 == op
            && ops[j].1 == set
        {
            encode_element(&mut buf, &ops[j].2, op == Op::Add);
            j += 1;
        }
        nest_end(&mut buf, list);
        let len = (buf.len() - at) as u32;
        buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
        sent.push((seq, op, set));
        i = j;
    }
    message(
        &mut buf,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        next(),
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    (buf, sent)
}

fn netlink_error(what: &str, errno: i32) -> Error {
    Error::Netlink(format!(
        "{what}: {}",
        io::Error::from_raw_os_error(errno.abs())
    ))
}

impl NftNetlink {
    pub fn new() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // A cold-start transaction can be megabytes; the default send buffer is ~200 KiB.
        set_buffers(&socket, 64 << 20);
        Ok(NftNetlink {
            socket,
            seq: 1,
            rx: vec![0u8; 1 << 20],
            sent: Sent::default(),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// What this socket has sent so far.
    pub fn sent(&self) -> Sent {
        self.sent
    }

    /// Applies `ops` to sets of `table` (family inet) as ONE transaction: all or nothing.
    pub fn apply(&mut self, table: &str, ops: &[(Op, &str, Wire)]) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let (buf, sent) = batch(&mut self.seq, table, ops);
        self.sent.messages += sent.len();
        self.sent.elements += ops.len();
        self.socket.send(&buf, 0)?;
        self.sent.batches += 1;
        self.sent.bytes += buf.len();
        // One answer per message (ack or error), delivered after the whole batch ran.
        let mut answered = 0;
        let mut first_error = None;
        while answered < sent.len() {
            for (kind, seq, payload) in self.recv()? {
                if kind != NLMSG_ERROR || !sent.iter().any(|s| s.0 == seq) {
                    continue;
                }
                answered += 1;
                let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                if errno != 0 && first_error.is_none() {
                    let (_, op, set) = sent.iter().find(|s| s.0 == seq).expect("seq is ours");
                    first_error = Some(netlink_error(
                        &format!("{op:?} elements of {table} {set}"),
                        errno,
                    ));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether chain `chain` exists in table `table` (family inet): the canary that tells a
    /// proxy its table was deleted or replaced behind its back.
    pub fn chain_exists(&mut self, table: &str, chain: &str) -> Result<bool> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_CHAIN_TABLE, table);
        attr_str(&mut body, NFTA_CHAIN_NAME, chain);
        let seq = self.next_seq();
        let mut buf = Vec::new();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            0,
            &body,
        );
        self.socket.send(&buf, 0)?;
        loop {
            for (kind, s, payload) in self.recv()? {
                if s != seq {
                    continue;
                }
                if kind != NLMSG_ERROR {
                    // The chain itself; the ack follows.
                    continue;
                }
                let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                return match -errno {
                    0 => Ok(true),
                    libc::ENOENT => Ok(false),
                    _ => Err(netlink_error(&format!("get chain {table} {chain}"), errno)),
                };
            }
        }
    }

    /// The ruleset's generation: a counter the kernel bumps on every committed nf_tables
    /// transaction in this namespace, whatever the table or the tool (`nft`, iptables-nft).
    /// Unchanged means nothing at all was changed in between: a one-message check.
    pub fn generation(&mut self) -> Result<u32> {
        let seq = self.next_seq();
        let mut buf = Vec::new();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            0,
            &[],
        );
        self.socket.send(&buf, 0)?;
        let mut gen = None;
        loop {
            for (kind, s, payload) in self.recv()? {
                if s != seq {
                    continue;
                }
                if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
                    gen = find(payload.get(4..).unwrap_or_default(), NFTA_GEN_ID)
                        .and_then(|v| v.get(..4)?.try_into().ok())
                        .map(u32::from_be_bytes);
                    continue;
                }
                if kind != NLMSG_ERROR {
                    continue;
                }
                let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                if errno != 0 {
                    return Err(netlink_error("get ruleset generation", errno));
                }
                return gen.ok_or_else(|| Error::Netlink("no generation in the answer".into()));
            }
        }
    }

    /// The number of rules in each chain of table `table` (family inet; chains without
    /// rules are absent). One dump of the table's rules: weir's table has a fixed number of
    /// chains whatever the number of services, so this stays cheap. It is how the backend
    /// notices that someone flushed its chains (`nft flush table`, `nft flush chain`).
    pub fn rule_counts(&mut self, table: &str) -> Result<HashMap<String, usize>> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_RULE_TABLE, table);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for msg in self.dump_request(NFT_MSG_GETRULE, &body, &format!("list rules of {table}"))? {
            // The kernel filters the dump by table; check anyway (older kernels did not).
            let name = |kind| {
                find(&msg, kind).map(|n| {
                    String::from_utf8_lossy(n.split(|b| *b == 0).next().unwrap_or(n)).into_owned()
                })
            };
            if name(NFTA_RULE_TABLE).as_deref() != Some(table) {
                continue;
            }
            if let Some(chain) = name(NFTA_RULE_CHAIN) {
                *counts.entry(chain).or_default() += 1;
            }
        }
        Ok(counts)
    }

    /// Every element of set `set` in table `table` (family inet).
    pub fn dump(&mut self, table: &str, set: &str) -> Result<Vec<RawElement>> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_SET_ELEM_LIST_TABLE, table);
        attr_str(&mut body, NFTA_SET_ELEM_LIST_SET, set);
        let mut out = Vec::new();
        for msg in self.dump_request(NFT_MSG_GETSETELEM, &body, &format!("dump {table} {set}"))? {
            if let Some(list) = find(&msg, NFTA_SET_ELEM_LIST_ELEMENTS) {
                out.extend(
                    attrs(list)
                        .filter(|(k, _)| *k == NFTA_LIST_ELEM)
                        .filter_map(|(_, e)| decode_element(e)),
                );
            }
        }
        Ok(out)
    }

    /// Names of the sets and maps of table `table` (family inet). (`nft list sets` would
    /// print every element too: seconds at 10k services.)
    pub fn set_names(&mut self, table: &str) -> Result<Vec<String>> {
        let mut body = Vec::new();
        attr_str(&mut body, NFTA_SET_TABLE, table);
        let msgs = self.dump_request(NFT_MSG_GETSET, &body, &format!("list sets of {table}"))?;
        Ok(msgs
            .iter()
            .filter_map(|m| find(m, NFTA_SET_NAME))
            .map(|n| String::from_utf8_lossy(n.split(|b| *b == 0).next().unwrap_or(n)).into())
            .collect())
    }

    /// Sends a dump request and returns the attributes of every answer (after nfgenmsg).
    fn dump_request(&mut self, kind: u16, body: &[u8], what: &str) -> Result<Vec<Vec<u8>>> {
        let seq = self.next_seq();
        let mut buf = Vec::new();
        message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            0,
            body,
        );
        self.socket.send(&buf, 0)?;
        let mut out = Vec::new();
        loop {
            for (kind, s, payload) in self.recv()? {
                if s != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                        return Err(netlink_error(what, errno));
                    }
                    _ => out.push(payload.get(4..).unwrap_or_default().to_vec()),
                }
            }
        }
    }

    /// Reads one datagram: (type, seq, payload after the header) of each message in it.
    fn recv(&mut self) -> Result<Vec<(u16, u32, Vec<u8>)>> {
        let n = self.socket.recv(&mut &mut self.rx[..], 0)?;
        let mut out = Vec::new();
        let mut b = &self.rx[..n];
        while b.len() >= 16 {
            let len = u32::from_ne_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
            if len < 16 || len > b.len() {
                break;
            }
            let kind = u16::from_ne_bytes([b[4], b[5]]);
            let seq = u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes"));
            out.push((kind, seq, b[16..len].to_vec()));
            b = &b[(len + 3) & !3..];
        }
        Ok(out)
    }
}

/// Raises the socket buffers (SO_*BUFFORCE works for root beyond the sysctl limits) and
/// bounds receive waits so that a lost answer cannot hang the proxy.
fn set_buffers(socket: &Socket, size: i32) {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let tv = libc::timeval {
        tv_sec: Duration::from_secs(30).as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: plain setsockopt calls on a socket we own, with correctly sized values.
    unsafe {
        for opt in [libc::SO_SNDBUFFORCE, libc::SO_RCVBUFFORCE] {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &size as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::element::Val;

    #[test]
    fn element_roundtrips_through_the_attribute_encoding() {
        let e = Element::map(
            vec![Val::Proto(weir_model::Protocol::Tcp), Val::Port(30080)],
            Data::Goto("ep4-n2-o".into()),
        );
        let raw = RawElement::of(&e);
        // Both ways of writing an element give the same bytes, which decode to the element.
        let mut from_plan = Vec::new();
        encode_element(&mut from_plan, &Wire::Plan(&e), true);
        let mut from_raw = Vec::new();
        encode_element(&mut from_raw, &Wire::Raw(raw.clone()), true);
        assert_eq!(from_plan, from_raw);
        let (kind, inner) = attrs(&from_plan).next().unwrap();
        assert_eq!(kind, NFTA_LIST_ELEM);
        assert_eq!(decode_element(inner), Some(raw));
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::nft::element::Val;

    /// The element messages of a batch, decoded back: (message type, set, elements).
    fn decode_batch(buf: &[u8]) -> Vec<(u16, String, Vec<RawElement>)> {
        let mut out = Vec::new();
        let mut b = buf;
        while b.len() >= 16 {
            let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes([b[4], b[5]]);
            let body = &b[20..len];
            if kind & 0xff == NFT_MSG_NEWSETELEM || kind & 0xff == NFT_MSG_DELSETELEM {
                let set = find(body, NFTA_SET_ELEM_LIST_SET).unwrap();
                let set = String::from_utf8_lossy(&set[..set.len() - 1]).into_owned();
                let list = find(body, NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
                let els = attrs(list).filter_map(|(_, e)| decode_element(e)).collect();
                out.push((kind & 0xff, set, els));
            }
            b = &b[(len + 3) & !3..];
        }
        out
    }

    fn v6_endpoint(i: u32) -> Element {
        let vip: std::net::Ipv6Addr = "fd00:96::1".parse().unwrap();
        let ep = std::net::Ipv6Addr::from(u128::from(vip) + 0x1_0000 + u128::from(i));
        Element::map(
            vec![
                Val::Addr(vip.into()),
                Val::Proto(weir_model::Protocol::Tcp),
                Val::Port(80),
                Val::Slot(i),
            ],
            Data::Values(vec![Val::Addr(ep.into()), Val::Port(8080)]),
        )
    }

    /// A full message of IPv6 endpoint elements is over 64 KiB: its element list's 16-bit
    /// length wrapped, and the kernel (like this decoder) read a different list than sent.
    #[test]
    fn every_element_of_a_large_ipv6_batch_decodes_back() {
        let els: Vec<Element> = (0..3000).map(v6_endpoint).collect();
        let ops: Vec<(Op, &str, Wire)> = els
            .iter()
            .map(|e| (Op::Add, "ep6tcp", Wire::Plan(e)))
            .collect();
        let mut seq = 0;
        let (buf, sent) = batch(&mut seq, "weir", &ops);
        let decoded = decode_batch(&buf);
        assert_eq!(decoded.len(), sent.len());
        let back: Vec<RawElement> = decoded.into_iter().flat_map(|(_, _, e)| e).collect();
        let want: Vec<RawElement> = els.iter().map(RawElement::of).collect();
        assert_eq!(back.len(), want.len(), "elements lost in the encoding");
        assert_eq!(back, want);
    }

    /// Counts, not times: consecutive operations on one set share messages of up to
    /// ELEMENTS_PER_MESSAGE elements, a new set or operation starts a new one.
    #[test]
    fn a_batch_has_as_few_messages_as_its_sets_allow() {
        let v4: Vec<Element> = (0..2500u32)
            .map(|i| {
                Element::set(vec![
                    Val::Addr(std::net::Ipv4Addr::from(0x0a80_0000 + i).into()),
                    Val::Addr(std::net::Ipv4Addr::from(0x0a80_0000 + i).into()),
                ])
            })
            .collect();
        let mut ops: Vec<(Op, &str, Wire)> = v4[..100]
            .iter()
            .map(|e| (Op::Delete, "hairpin4", Wire::Plan(e)))
            .collect();
        ops.extend(v4.iter().map(|e| (Op::Add, "hairpin4", Wire::Plan(e))));
        let mut seq = 0;
        let (buf, sent) = batch(&mut seq, "weir", &ops);
        // 100 deletes in one message, 2,500 adds in ⌈2500 / 1024⌉ = 3.
        assert_eq!(sent.len(), 4);
        let decoded = decode_batch(&buf);
        let sizes: Vec<usize> = decoded.iter().map(|(_, _, e)| e.len()).collect();
        assert_eq!(sizes, vec![100, 1024, 1024, 452]);
        // Deletes carry the key only.
        assert!(decoded[0].2.iter().all(|e| e.data.is_none()));
    }
}
