//! host-local's allocation order: round-robin through a range set, starting after the last reserved
//! address (or at the first range's start), wrapping from each range's end to the next range's start,
//! and giving up after one full turn.

use std::net::IpAddr;

use super::config::{from_u128, to_u128, Resolved};

/// Every address of `set` once, in host-local's order: after `last` if `last` lies in the set,
/// else from the first range's start. Gateways are *not* skipped here (see [`candidates`]).
pub(crate) struct RangeIter<'a> {
    set: &'a [Resolved],
    range: usize,
    cur: u128,
    remaining: u128,
}

impl<'a> RangeIter<'a> {
    pub fn new(set: &'a [Resolved], last: Option<IpAddr>) -> Self {
        let total = set.iter().fold(0u128, |acc, r| {
            acc.saturating_add((r.end - r.start).saturating_add(1))
        });
        let mut it = RangeIter {
            set,
            range: 0,
            cur: set[0].start,
            remaining: total,
        };
        if let Some((idx, ip)) =
            last.and_then(|ip| set.iter().position(|r| r.contains(ip)).map(|i| (i, ip)))
        {
            it.range = idx;
            it.cur = to_u128(ip);
            it.advance();
        }
        it
    }

    fn advance(&mut self) {
        if self.cur >= self.set[self.range].end {
            self.range = (self.range + 1) % self.set.len();
            self.cur = self.set[self.range].start;
        } else {
            self.cur += 1;
        }
    }
}

impl Iterator for RangeIter<'_> {
    /// (address, index of its range in the set)
    type Item = (IpAddr, usize);

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let item = (from_u128(self.set[self.range].v4, self.cur), self.range);
        self.advance();
        Some(item)
    }
}

/// The addresses of `set` that may be handed out, in allocation order: [`RangeIter`] without each
/// range's gateway and without `reserved` addresses. `held` is checked by the caller.
pub(crate) fn candidates<'a>(
    set: &'a [Resolved],
    last: Option<IpAddr>,
    reserved: &'a [IpAddr],
) -> impl Iterator<Item = (IpAddr, usize)> + 'a {
    RangeIter::new(set, last)
        .filter(move |(ip, r)| *ip != set[*r].gateway && !reserved.contains(ip))
}
