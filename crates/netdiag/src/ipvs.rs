//! `ipvsadm -Ln` and `ipvsadm -Sn` (save format): the IPVS virtual servers and their real
//! servers. Either form is accepted (a file may hold both, as people paste them); what cannot
//! be read is reported in [`Skipped`].

use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

use crate::{paste, Parsed, Skipped};

/// A virtual server's key: `TCP 10.96.0.10:80`, or a firewall mark (`FWM 5`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum VirtualKey {
    /// protocol (`tcp`, `udp`, `sctp`), address and port
    Addr(String, SocketAddr),
    Fwmark(u32),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RealServer {
    pub addr: SocketAddr,
    /// `Masq`, `Route` (direct routing), `Tunnel`, `Local`.
    pub forward: String,
    pub weight: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VirtualServer {
    pub key: VirtualKey,
    pub scheduler: String,
    /// Persistence timeout in seconds (`persistent 600`, `-p 600`): ClientIP affinity.
    pub persistent: Option<u32>,
    pub real_servers: Vec<RealServer>,
    /// As written in the input.
    pub text: String,
    /// Its real-server list may be incomplete: the output was cut with grep and the list ends
    /// where a cut does (a `--` separator or the end of the file), or the paste cut it off.
    pub cut: bool,
}

impl VirtualServer {
    /// Whether a packet to `dst:dport` over `proto` (lowercase) hits this virtual server.
    pub fn matches(&self, proto: &str, dst: IpAddr, dport: u16) -> bool {
        match &self.key {
            VirtualKey::Addr(p, a) => p == proto && a.ip() == dst && a.port() == dport,
            VirtualKey::Fwmark(_) => false,
        }
    }

    /// The real servers a new connection can go to: weight 0 means draining, no new ones.
    pub fn eligible(&self) -> Vec<&RealServer> {
        self.real_servers.iter().filter(|r| r.weight > 0).collect()
    }
}

/// Parses `ipvsadm -Ln` or `ipvsadm -Sn` output (or both), as pasted: a `grep -A`/`-B` cut
/// (`--` separators) ends the current virtual server, so real servers after a separator are
/// never given to the one before it, and a list that ends at a cut is marked
/// [`VirtualServer::cut`].
pub fn parse(text: &str) -> Parsed<Vec<VirtualServer>> {
    let mut out: Vec<VirtualServer> = Vec::new();
    let mut skipped = Vec::new();
    let pasted = paste::lines(text);
    // The `-Ln` virtual server the following `->` lines belong to (an index into `out`).
    let mut current: Option<usize> = None;
    // The `->` lines follow a virtual server already read (the file holds both forms).
    let mut repeated = false;
    for l in &pasted.lines {
        if l.grep_break {
            if let Some(i) = current.take() {
                out[i].cut = true;
            }
            repeated = false;
            continue;
        }
        let (raw, line) = (l.text, l.text.trim());
        if line.is_empty()
            || line.starts_with("IP Virtual Server")
            || line.starts_with("Prot ")
            || line.starts_with("-> RemoteAddress")
            || line.starts_with('#')
        {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let res = if line.starts_with("->") && repeated {
            Ok(())
        } else if line.starts_with("->") {
            if l.unterminated && words.len() < 6 {
                if let Some(i) = current {
                    out[i].cut = true;
                }
                Err(
                    "the last line, cut off by the paste? (a real server line has 5 columns)"
                        .into(),
                )
            } else {
                list_real(&words[1..]).and_then(|r| match current {
                    Some(i) => {
                        out[i].real_servers.push(r);
                        Ok(())
                    }
                    None if pasted.grep_cut => {
                        Err("a real server whose virtual server grep cut away".into())
                    }
                    None => Err("a real server before any virtual server".into()),
                })
            }
        } else if words[0] == "-A" {
            current = None;
            repeated = false;
            save_virtual(&words, line).map(|v| {
                upsert(&mut out, v);
            })
        } else if words[0] == "-a" {
            current = None;
            repeated = false;
            save_real(&words).and_then(|(key, r)| match out.iter_mut().find(|v| v.key == key) {
                Some(v) => {
                    v.real_servers.push(r);
                    Ok(())
                }
                None => Err("a real server of a virtual server not listed".into()),
            })
        } else {
            current = None;
            list_virtual(&words, line).map(|v| {
                current = upsert(&mut out, v);
                repeated = current.is_none();
            })
        };
        if let Err(reason) = res {
            skipped.push(Skipped::new(l.no, raw, l.reason(reason)));
        }
    }
    // A grep cut file ends with a cut too.
    if pasted.grep_cut {
        if let Some(i) = current {
            out[i].cut = true;
        }
    }
    Parsed {
        value: out,
        skipped,
    }
}

/// A virtual server seen twice (both formats in one file) is kept once, with the first's real
/// servers.
/// Its index in `out` when it is new.
fn upsert(out: &mut Vec<VirtualServer>, v: VirtualServer) -> Option<usize> {
    if out.iter().any(|x| x.key == v.key) {
        return None;
    }
    out.push(v);
    Some(out.len() - 1)
}

fn sock(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("not an address:port: {s:?} (use -n for numeric output)"))
}

/// `TCP  10.96.0.10:80 rr persistent 600` / `FWM  5 rr`.
fn list_virtual(w: &[&str], line: &str) -> Result<VirtualServer, String> {
    if w.len() < 3 {
        return Err("expected `PROT ADDR:PORT SCHEDULER`".into());
    }
    let key = match w[0] {
        "TCP" | "UDP" | "SCTP" => VirtualKey::Addr(w[0].to_ascii_lowercase(), sock(w[1])?),
        "FWM" => VirtualKey::Fwmark(w[1].parse().map_err(|_| "bad fwmark")?),
        other => return Err(format!("unknown protocol {other}")),
    };
    let persistent = w
        .iter()
        .position(|x| *x == "persistent")
        .and_then(|i| w.get(i + 1))
        .and_then(|s| s.parse().ok());
    Ok(VirtualServer {
        key,
        scheduler: w[2].to_string(),
        persistent,
        real_servers: Vec::new(),
        text: line.to_string(),
        cut: false,
    })
}

/// `-> 10.244.1.11:8080  Masq  1  0  0`
fn list_real(w: &[&str]) -> Result<RealServer, String> {
    if w.len() < 3 {
        return Err("expected `-> ADDR:PORT FORWARD WEIGHT`".into());
    }
    Ok(RealServer {
        addr: sock(w[0])?,
        forward: w[1].to_string(),
        weight: w[2].parse().map_err(|_| format!("bad weight {}", w[2]))?,
    })
}

/// The `-t|-u|--sctp-service|-f` option of a save line.
fn save_key(w: &[&str]) -> Result<VirtualKey, String> {
    for (i, x) in w.iter().enumerate() {
        let proto = match *x {
            "-t" | "--tcp-service" => "tcp",
            "-u" | "--udp-service" => "udp",
            "--sctp-service" => "sctp",
            "-f" | "--fwmark-service" => {
                let m = w.get(i + 1).ok_or("-f without a mark")?;
                return Ok(VirtualKey::Fwmark(m.parse().map_err(|_| "bad fwmark")?));
            }
            _ => continue,
        };
        let a = w.get(i + 1).ok_or("service without an address")?;
        return Ok(VirtualKey::Addr(proto.into(), sock(a)?));
    }
    Err("no -t, -u or -f service".into())
}

fn opt<'a>(w: &[&'a str], names: &[&str]) -> Option<&'a str> {
    w.iter()
        .position(|x| names.contains(x))
        .and_then(|i| w.get(i + 1).copied())
}

/// `-A -t 10.96.0.13:80 -s rr -p 600`
fn save_virtual(w: &[&str], line: &str) -> Result<VirtualServer, String> {
    Ok(VirtualServer {
        key: save_key(w)?,
        scheduler: opt(w, &["-s", "--scheduler"]).unwrap_or("wlc").to_string(),
        persistent: opt(w, &["-p", "--persistent"]).and_then(|s| s.parse().ok()),
        real_servers: Vec::new(),
        text: line.to_string(),
        cut: false,
    })
}

/// `-a -t 10.96.0.10:80 -r 10.244.1.11:8080 -m -w 1`
fn save_real(w: &[&str]) -> Result<(VirtualKey, RealServer), String> {
    let key = save_key(w)?;
    let addr = sock(opt(w, &["-r", "--real-server"]).ok_or("no -r")?)?;
    let forward = if w.contains(&"-m") || w.contains(&"--masquerading") {
        "Masq"
    } else if w.contains(&"-i") || w.contains(&"--ipip") {
        "Tunnel"
    } else {
        "Route"
    };
    let weight = opt(w, &["-w", "--weight"])
        .map(|s| s.parse().map_err(|_| format!("bad weight {s}")))
        .transpose()?
        .unwrap_or(1);
    Ok((
        key,
        RealServer {
            addr,
            forward: forward.into(),
            weight,
        },
    ))
}

/// One IPVS connection entry of `ipvsadm -Lnc`:
/// `TCP 00:51  SYN_RECV    10.254.0.1:37954   10.254.0.1:443     10.111.32.241:6443`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// 1-based line in the paste.
    pub line: usize,
    pub text: String,
    /// `tcp`, `udp`, `sctp`.
    pub proto: String,
    pub state: String,
    pub source: SocketAddr,
    pub virtual_addr: SocketAddr,
    pub destination: SocketAddr,
}

/// Parses `ipvsadm -Lnc` (connection entries); its two header lines are not entries. Lines it
/// cannot read (`-Lc` without `-n` prints names) are skipped and reported.
pub fn parse_connections(text: &str) -> Parsed<Vec<Connection>> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for l in paste::lines(text).data() {
        let line = l.text.trim();
        if line.is_empty()
            || line.starts_with("IPVS connection entries")
            || line.starts_with("pro ")
        {
            continue;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let read = || -> Result<Connection, String> {
            let [proto, _expire, state, source, virt, dest] = w.as_slice() else {
                return Err(
                    "not an `ipvsadm -Lnc` entry (pro expire state source virtual destination)"
                        .into(),
                );
            };
            Ok(Connection {
                line: l.no,
                text: line.to_string(),
                proto: proto.to_lowercase(),
                state: state.to_string(),
                source: sock(source)?,
                virtual_addr: sock(virt)?,
                destination: sock(dest)?,
            })
        };
        match read() {
            Ok(c) => out.push(c),
            Err(e) => skipped.push(Skipped::new(l.no, l.text, l.reason(e))),
        }
    }
    Parsed {
        value: out,
        skipped,
    }
}
