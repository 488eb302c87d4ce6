//! Does an nftables chain exist? Asked over netfilter netlink (one NFT_MSG_GETCHAIN request)
//! rather than by running `nft list chain`: every ADD asks, and the `nft` tool spends ~14 ms
//! starting up and filling its cache, more than half of an ADD (docs/benchmarks.md).

use std::io;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETCHAIN: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NFPROTO_INET: u8 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const SEQ: u32 = 1;

/// Appends a NUL-terminated string attribute, padded to 4 bytes.
fn attr_str(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let len = 4 + s.len() + 1;
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

/// The request: netlink header, nfgenmsg (family inet, version 0), table and chain names.
pub fn getchain_request(table: &str, chain: &str) -> Vec<u8> {
    let mut body = Vec::new();
    attr_str(&mut body, NFTA_CHAIN_TABLE, table);
    attr_str(&mut body, NFTA_CHAIN_NAME, chain);
    let mut buf = Vec::with_capacity(20 + body.len());
    buf.extend_from_slice(&((20 + body.len()) as u32).to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN).to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    buf.extend_from_slice(&SEQ.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[NFPROTO_INET, 0, 0, 0]);
    buf.extend_from_slice(&body);
    buf
}

/// The errno of the acknowledgement to our request in `buf`, if `buf` holds it (0: success).
/// The chain itself, when it exists, comes first as an ordinary message; the ack follows.
pub fn ack_errno(mut buf: &[u8]) -> Option<i32> {
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > buf.len() {
            return None;
        }
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let seq = u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes"));
        if kind == NLMSG_ERROR && seq == SEQ && len >= 20 {
            return Some(i32::from_ne_bytes(buf[16..20].try_into().expect("4 bytes")));
        }
        buf = &buf[((len + 3) & !3).min(buf.len())..];
    }
    None
}

/// Whether chain `chain` exists in table `table` (family inet) of this network namespace.
pub fn chain_exists(table: &str, chain: &str) -> io::Result<bool> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    set_timeout(&socket, Duration::from_secs(5));
    socket.send(&getchain_request(table, chain), 0)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        if let Some(errno) = ack_errno(&buf[..n]) {
            return match -errno {
                0 => Ok(true),
                libc::ENOENT => Ok(false),
                e => Err(io::Error::from_raw_os_error(e)),
            };
        }
    }
}

/// A lost answer must not hang the plugin (the receive then fails with EAGAIN).
fn set_timeout(socket: &Socket, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized timeval.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
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

    #[test]
    fn request_is_padded_and_sized() {
        let r = getchain_request("weir-eni", "net-a");
        assert_eq!(r.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(r[0..4].try_into().unwrap()) as usize,
            r.len()
        );
        // "weir-eni\0" is 9 bytes: attribute 13, padded to 16
        assert_eq!(u16::from_ne_bytes([r[20], r[21]]), 13);
        assert_eq!(&r[24..33], b"weir-eni\0");
    }

    #[test]
    fn the_ack_is_found_after_the_chain_message() {
        let msg = |kind: u16, seq: u32, payload: &[u8]| {
            let mut m = Vec::new();
            m.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(&0u16.to_ne_bytes());
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&0u32.to_ne_bytes());
            m.extend_from_slice(payload);
            m
        };
        let mut both = msg((NFNL_SUBSYS_NFTABLES << 8) | 3, SEQ, &[0; 8]);
        both.extend(msg(NLMSG_ERROR, SEQ, &(-2i32).to_ne_bytes()));
        assert_eq!(ack_errno(&both), Some(-2));
        assert_eq!(ack_errno(&msg(NLMSG_ERROR, 7, &0i32.to_ne_bytes())), None);
        assert_eq!(ack_errno(&both[..10]), None);
    }
}
