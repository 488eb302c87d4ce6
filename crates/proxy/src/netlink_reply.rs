//! Reading the answer to one netlink request, shared by the conntrack and IPVS clients: split
//! each datagram into messages, skip late answers to earlier requests, end at `NLMSG_DONE` or
//! the ACK, and turn an error message into the errno it carries.

use std::io;

use netlink_sys::Socket;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;

/// What the caller wants after one answer message.
pub(crate) enum Next {
    /// More messages belong to this answer (a dump, or an ACK still to come).
    More,
    /// This was the whole answer (a plain request sent without `NLM_F_ACK`).
    Done,
}

/// Receives the answer to the request sent with `sequence`, handing each message's type and
/// payload (after the netlink header) to `each`.
pub(crate) fn read_answer(
    socket: &mut Socket,
    sequence: u32,
    mut each: impl FnMut(u16, &[u8]) -> Next,
) -> io::Result<()> {
    loop {
        let (data, _) = socket.recv_from_full()?;
        let mut rest = &data[..];
        while rest.len() >= NLMSG_HDRLEN {
            let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
            if len < NLMSG_HDRLEN || len > rest.len() {
                return Err(io::Error::other("truncated netlink message"));
            }
            let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
            let seq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
            let payload = &rest[NLMSG_HDRLEN..len];
            rest = &rest[((len + 3) & !3).min(rest.len())..];
            if seq != sequence {
                continue; // a late answer to an earlier request
            }
            match kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let code = payload
                        .get(0..4)
                        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                        .unwrap_or(-libc::EIO);
                    return match code {
                        0 => Ok(()),
                        c => Err(io::Error::from_raw_os_error(-c)),
                    };
                }
                _ => {
                    if let Next::Done = each(kind, payload) {
                        return Ok(());
                    }
                }
            }
        }
    }
}
