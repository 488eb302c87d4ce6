//! Reading the answer to one netlink request, shared by the conntrack, IPVS and ipset clients:
//! split each datagram into messages, skip late answers to earlier requests, end at
//! `NLMSG_DONE` or the ACK, and turn an error message into the errno it carries; and reading
//! the acknowledgements of a batch of requests sent in one datagram (those clients and
//! [`crate::Rtnl::request_batch`]).

use std::io;

use netlink_sys::Socket;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;

/// What the caller wants after one answer message.
pub enum Next {
    /// More messages belong to this answer (a dump, or an ACK still to come).
    More,
    /// This was the whole answer (a plain request sent without `NLM_F_ACK`).
    Done,
}

/// Receives the answer to the request sent with `sequence`, handing each message's type and
/// payload (after the netlink header) to `each`.
pub fn read_answer(
    socket: &mut Socket,
    sequence: u32,
    mut each: impl FnMut(u16, &[u8]) -> Next,
) -> io::Result<()> {
    loop {
        let (data, _) = socket.recv_from_full()?;
        for message in messages(&data) {
            let Message { kind, seq, payload } = message?;
            if seq != sequence {
                continue; // a late answer to an earlier request
            }
            match kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    return match error_code(payload) {
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

/// One netlink message of a datagram.
struct Message<'a> {
    kind: u16,
    seq: u32,
    /// After the netlink header.
    payload: &'a [u8],
}

/// The messages of one datagram; a length that runs past its end is an error.
fn messages(data: &[u8]) -> impl Iterator<Item = io::Result<Message<'_>>> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            rest = &[];
            return Some(Err(io::Error::other("truncated netlink message")));
        }
        let message = Message {
            kind: u16::from_ne_bytes(rest[4..6].try_into().unwrap()),
            seq: u32::from_ne_bytes(rest[8..12].try_into().unwrap()),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some(Ok(message))
    })
}

/// The (negative) errno of an `NLMSG_ERROR` message; 0 is an acknowledgement.
fn error_code(payload: &[u8]) -> i32 {
    payload
        .get(0..4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .unwrap_or(-libc::EIO)
}

/// Receives the acknowledgements of `count` requests sent with consecutive sequence numbers
/// from `first`; returns the first refusal (the request's offset from `first`, and the errno).
pub fn read_acks(
    socket: &mut Socket,
    first: u32,
    count: usize,
) -> io::Result<Option<(usize, io::Error)>> {
    let mut acks = Acks::default();
    read_each_ack(socket, first, count, |offset, errno| {
        acks.note(offset, errno)
    })?;
    Ok(acks
        .refused
        .map(|(offset, errno)| (offset, io::Error::from_raw_os_error(errno))))
}

/// Receives the acknowledgements of `count` requests sent with consecutive sequence numbers
/// from `first`, handing each one's offset from `first` and errno (0: done) to `each`.
pub fn read_each_ack(
    socket: &mut Socket,
    first: u32,
    count: usize,
    mut each: impl FnMut(usize, i32),
) -> io::Result<()> {
    let mut seen = 0;
    while seen < count {
        let (data, _) = socket.recv_from_full()?;
        seen += acks_in(&data, first, count, &mut each)?;
    }
    Ok(())
}

/// The acknowledgements in one datagram, handed to `each`; other messages (late answers to
/// earlier requests) are skipped. Returns how many there were.
fn acks_in(
    data: &[u8],
    first: u32,
    count: usize,
    each: &mut impl FnMut(usize, i32),
) -> io::Result<usize> {
    let mut seen = 0;
    for message in messages(data) {
        let Message { kind, seq, payload } = message?;
        let offset = seq.wrapping_sub(first) as usize;
        if kind != NLMSG_ERROR || offset >= count {
            continue;
        }
        seen += 1;
        each(offset, -error_code(payload));
    }
    Ok(seen)
}

/// The acknowledgements of one batch seen so far.
#[derive(Debug, Default, PartialEq)]
struct Acks {
    seen: usize,
    /// The earliest refused request: its offset and errno.
    refused: Option<(usize, i32)>,
}

impl Acks {
    fn note(&mut self, offset: usize, errno: i32) {
        self.seen += 1;
        if errno != 0 && self.refused.is_none_or(|(o, _)| offset < o) {
            self.refused = Some((offset, errno));
        }
    }

    #[cfg(test)]
    fn take(&mut self, data: &[u8], first: u32, count: usize) -> io::Result<()> {
        acks_in(data, first, count, &mut |offset, errno| {
            self.note(offset, errno)
        })
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message: header (type, sequence) and payload.
    fn msg(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = (NLMSG_HDRLEN + payload.len()) as u32;
        let mut m = len.to_ne_bytes().to_vec();
        m.extend(kind.to_ne_bytes());
        m.extend(0u16.to_ne_bytes());
        m.extend(seq.to_ne_bytes());
        m.extend(0u32.to_ne_bytes());
        m.extend(payload);
        m
    }

    fn ack(seq: u32, code: i32) -> Vec<u8> {
        msg(NLMSG_ERROR, seq, &code.to_ne_bytes())
    }

    #[test]
    fn a_batch_is_done_once_every_request_is_acknowledged() {
        let mut acks = Acks::default();
        // a late answer to an earlier request, then two of three acknowledgements
        let data = [msg(16, 99, &[0; 8]), ack(99, 0), ack(100, 0), ack(101, 0)].concat();
        acks.take(&data, 100, 3).unwrap();
        assert_eq!(
            acks,
            Acks {
                seen: 2,
                refused: None
            }
        );
        acks.take(&ack(102, 0), 100, 3).unwrap();
        assert_eq!(acks.seen, 3);
    }

    #[test]
    fn the_earliest_refusal_is_reported() {
        let mut acks = Acks::default();
        let data = [
            ack(7, 0),
            ack(9, -libc::ENOENT),
            ack(8, -libc::EEXIST),
            ack(10, 0),
        ]
        .concat();
        acks.take(&data, 7, 4).unwrap();
        assert_eq!(
            acks,
            Acks {
                seen: 4,
                refused: Some((1, libc::EEXIST))
            }
        );
        assert!(
            Acks::default().take(&ack(1, 0)[..10], 1, 1).is_ok(),
            "short tail ignored"
        );
        let mut truncated = ack(1, 0);
        truncated[0] = 200;
        assert!(Acks::default().take(&truncated, 1, 1).is_err());
    }
}
