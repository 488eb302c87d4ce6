//! DNS cookies (RFC 7873), with server cookies made as RFC 9018 specifies (so a fleet of
//! servers sharing a secret could verify each other's): a client that sends a COOKIE option
//! gets its client cookie back with a server cookie, which it returns on later queries and
//! which off-path spoofers cannot know. Knot and Unbound answer cookies; a server that
//! ignores them leaves clients without that protection.
//!
//! Policy (RFC 7873 5.2): a malformed COOKIE option is FORMERR; otherwise the query is
//! answered as usual with a fresh server cookie, whether or not the client sent a valid one
//! (weir does not require cookies, so it never answers BADCOOKIE).

use std::hash::Hasher;
use std::net::IpAddr;

use hickory_proto::op::Edns;
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use siphasher::sip::SipHasher24;

/// The EDNS option code of COOKIE.
const COOKIE: u16 = 10;

/// What a query's COOKIE option holds.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientCookie {
    Absent,
    /// Not 8 bytes of client cookie plus an optional 8 to 32 of server cookie.
    Malformed,
    /// The client cookie (the server cookie it sent, if any, is not needed: a fresh one is
    /// always returned).
    Present([u8; 8]),
}

/// The COOKIE option of a query's OPT record.
pub fn client_cookie(edns: Option<&Edns>) -> ClientCookie {
    let Some(option) = edns.and_then(|e| e.options().get(EdnsCode::Cookie)) else {
        return ClientCookie::Absent;
    };
    let EdnsOption::Unknown(_, data) = option else {
        return ClientCookie::Malformed;
    };
    match data.len() {
        8 | 16..=40 => ClientCookie::Present(data[..8].try_into().expect("8 bytes")),
        _ => ClientCookie::Malformed,
    }
}

/// The server's secret: 16 random bytes per process (a restart only makes clients fetch a
/// new server cookie).
#[derive(Clone)]
pub struct CookieSecret([u8; 16]);

impl std::fmt::Debug for CookieSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieSecret(..)")
    }
}

impl CookieSecret {
    pub fn random() -> Self {
        let mut key = [0u8; 16];
        let filled = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key));
        if filled.is_err() {
            // No urandom (a bare chroot): the clock still differs per process.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            key = (t ^ u128::from(std::process::id())).to_le_bytes();
        }
        CookieSecret(key)
    }

    #[cfg(test)]
    pub fn from_bytes(key: [u8; 16]) -> Self {
        CookieSecret(key)
    }

    /// RFC 9018's server cookie: version 1, three reserved bytes, the timestamp (seconds),
    /// and SipHash-2-4 of the client cookie, those 8 bytes and the client's address.
    pub fn server_cookie(&self, client: &[u8; 8], ip: IpAddr, now: u32) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[0] = 1;
        out[4..8].copy_from_slice(&now.to_be_bytes());
        let mut h = SipHasher24::new_with_key(&self.0);
        h.write(client);
        h.write(&out[..8]);
        match ip {
            IpAddr::V4(a) => h.write(&a.octets()),
            IpAddr::V6(a) => h.write(&a.octets()),
        }
        out[8..].copy_from_slice(&h.finish().to_le_bytes());
        out
    }

    /// The COOKIE option of a reply: the client cookie and a fresh server cookie.
    pub fn reply_option(&self, client: &[u8; 8], ip: IpAddr) -> EdnsOption {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as u32);
        let mut data = client.to_vec();
        data.extend_from_slice(&self.server_cookie(client, ip, now));
        EdnsOption::Unknown(COOKIE, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 9018 Appendix A.1 and A.2: the published server cookies for a client at
    /// 198.51.100.100 and the secret e5e973e5a6b2a43f48e7dc849e37bfcf, first and refreshed.
    #[test]
    fn server_cookies_match_rfc_9018s_test_vectors() {
        let secret =
            CookieSecret::from_bytes(hex("e5e973e5a6b2a43f48e7dc849e37bfcf").try_into().unwrap());
        let ip: IpAddr = "198.51.100.100".parse().unwrap();
        let client: [u8; 8] = hex("2464c4abcf10c957").try_into().unwrap();
        assert_eq!(
            secret.server_cookie(&client, ip, 1559731985).to_vec(),
            hex("010000005cf79f111f8130c3eee29480")
        );
        let client: [u8; 8] = hex("2464c4abcf10c957").try_into().unwrap();
        assert_eq!(
            secret.server_cookie(&client, ip, 1559734385).to_vec(),
            hex("010000005cf7a871d4a564a1442aca77")
        );
    }

    #[test]
    fn a_cookie_option_is_read_or_called_malformed() {
        let with = |data: Vec<u8>| {
            let mut e = Edns::new();
            e.options_mut().insert(EdnsOption::Unknown(COOKIE, data));
            client_cookie(Some(&e))
        };
        assert_eq!(client_cookie(None), ClientCookie::Absent);
        assert_eq!(client_cookie(Some(&Edns::new())), ClientCookie::Absent);
        assert_eq!(with(vec![7; 8]), ClientCookie::Present([7; 8]));
        assert_eq!(with(vec![7; 24]), ClientCookie::Present([7; 8]));
        for bad in [0, 5, 9, 15, 41] {
            assert_eq!(with(vec![7; bad]), ClientCookie::Malformed, "{bad} bytes");
        }
    }
}
