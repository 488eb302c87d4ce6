//! The host side of the guest agent protocol (described in [`crate::guest`]): one writer, one
//! reader thread that routes each `DONE` to the request waiting for it.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A message from the guest.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    Ready {
        release: String,
        missing: Vec<String>,
    },
    /// The guest has read request `id` and is starting its script.
    Got {
        id: u64,
    },
    Done {
        id: u64,
        status: i32,
    },
}

pub fn parse_message(line: &str) -> Option<Message> {
    let mut words = line.split_whitespace();
    match words.next()? {
        "READY" => {
            let release = words.next()?.to_string();
            let missing = match words.next() {
                None | Some("-") => Vec::new(),
                Some(list) => list.split(',').map(str::to_string).collect(),
            };
            Some(Message::Ready { release, missing })
        }
        "GOT" => Some(Message::Got {
            id: words.next()?.parse().ok()?,
        }),
        "DONE" => Some(Message::Done {
            id: words.next()?.parse().ok()?,
            status: words.next()?.parse().ok()?,
        }),
        _ => None,
    }
}

/// What a script printed and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    /// The exit status (128 + n when killed by signal n).
    pub status: i32,
    /// From sending the request to reading the result.
    pub elapsed: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

#[derive(Default)]
struct Pending {
    waiters: HashMap<u64, mpsc::Sender<i32>>,
    /// Requests the guest has acknowledged (`GOT`) and not yet answered.
    acknowledged: HashSet<u64>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

pub struct Agent {
    writer: Mutex<UnixStream>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    /// The host's side of the I/O directory.
    io_dir: PathBuf,
}

impl Agent {
    /// Takes over a connection whose `READY` line has been read (`reader` holds whatever was
    /// buffered after it).
    pub fn start(stream: UnixStream, reader: BufReader<UnixStream>, io_dir: PathBuf) -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let routes = pending.clone();
        std::thread::spawn(move || route_replies(reader, &routes));
        Agent {
            writer: Mutex::new(stream),
            pending,
            next_id: AtomicU64::new(1),
            io_dir,
        }
    }

    /// Runs `script` with `/bin/sh` in the guest and waits up to `timeout` for it.
    pub fn run(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        self.run_sending(script, timeout, |port, line| {
            port.write_all(line.as_bytes())
        })
    }

    /// As [`Agent::run`], but the request line goes out in two writes with `pause` between
    /// them, as the port may deliver it: the harness's own regression test for a guest that lost
    /// a request arriving in pieces while another script ended.
    #[doc(hidden)]
    pub fn run_split_request(
        &self,
        script: &str,
        timeout: Duration,
        pause: Duration,
    ) -> anyhow::Result<Output> {
        self.run_sending(script, timeout, |port, line| {
            let (head, tail) = line.split_at(line.len() / 2);
            port.write_all(head.as_bytes())?;
            std::thread::sleep(pause);
            port.write_all(tail.as_bytes())
        })
    }

    fn run_sending(
        &self,
        script: &str,
        timeout: Duration,
        send: impl FnOnce(&mut UnixStream, &str) -> std::io::Result<()>,
    ) -> anyhow::Result<Output> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let file = |ext: &str| self.io_dir.join(format!("{id}.{ext}"));
        fs::write(file("sh"), script).context("write the script into the I/O directory")?;
        let (tx, rx) = mpsc::channel();
        {
            let mut pending = self.pending.lock().unwrap();
            if let Some(why) = &pending.closed {
                bail!("the VM is gone: {why}");
            }
            pending.waiters.insert(id, tx);
        }
        let started = Instant::now();
        // Whole seconds for the guest's `timeout`, at least one.
        let secs = timeout.as_secs().max(1);
        let result = self.send_and_wait(id, secs, rx, started, send);
        for ext in ["sh", "out", "err"] {
            let _ = fs::remove_file(file(ext));
        }
        result
    }

    fn send_and_wait(
        &self,
        id: u64,
        secs: u64,
        rx: mpsc::Receiver<i32>,
        started: Instant,
        send: impl FnOnce(&mut UnixStream, &str) -> std::io::Result<()>,
    ) -> anyhow::Result<Output> {
        let file = |ext: &str| self.io_dir.join(format!("{id}.{ext}"));
        // One write for the whole line (writeln! would make several).
        send(
            &mut self.writer.lock().unwrap(),
            &format!("RUN {id} {secs}\n"),
        )
        .context("send to the VM")?;
        // The guest kills the script at `secs`; the margin covers reporting that.
        let margin = Duration::from_secs(15);
        let status = match rx.recv_timeout(Duration::from_secs(secs) + margin) {
            Ok(status) => status,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut pending = self.pending.lock().unwrap();
                pending.waiters.remove(&id);
                let heard = if pending.acknowledged.remove(&id) {
                    "the guest started the script but never reported its end"
                } else {
                    "the guest never acknowledged the request"
                };
                bail!(
                    "no answer from the VM within {} s: {heard}",
                    secs + margin.as_secs()
                )
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let why = self.pending.lock().unwrap().closed.clone();
                bail!("the VM is gone: {}", why.unwrap_or_default())
            }
        };
        let read = |ext| fs::read(file(ext)).map(|b| String::from_utf8_lossy(&b).into_owned());
        let output = Output {
            stdout: read("out").context("read the script's stdout")?,
            stderr: read("err").context("read the script's stderr")?,
            status,
            elapsed: started.elapsed(),
        };
        if status == 128 + libc::SIGKILL && output.elapsed >= Duration::from_secs(secs) {
            bail!(
                "timed out after {secs} s (killed in the VM); stdout so far:\n{}\nstderr so far:\n{}",
                output.stdout,
                output.stderr
            );
        }
        Ok(output)
    }
}

fn route_replies(reader: BufReader<UnixStream>, pending: &Mutex<Pending>) {
    let mut why = "the agent closed the connection".to_string();
    for line in reader.lines() {
        match line {
            Ok(line) => {
                let mut pending = pending.lock().unwrap();
                match parse_message(&line) {
                    Some(Message::Got { id }) if pending.waiters.contains_key(&id) => {
                        pending.acknowledged.insert(id);
                    }
                    Some(Message::Done { id, status }) => {
                        pending.acknowledged.remove(&id);
                        if let Some(tx) = pending.waiters.remove(&id) {
                            let _ = tx.send(status);
                        }
                    }
                    _ => {}
                }
            }
            Err(e) => {
                why = format!("reading from the agent: {e}");
                break;
            }
        }
    }
    let mut pending = pending.lock().unwrap();
    pending.closed = Some(why);
    // Dropping the senders wakes every waiter.
    pending.waiters.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_carries_the_release_and_the_modules_that_did_not_load() {
        assert_eq!(
            parse_message("READY 6.1.0-56-amd64 -"),
            Some(Message::Ready {
                release: "6.1.0-56-amd64".into(),
                missing: vec![]
            })
        );
        assert_eq!(
            parse_message("READY 6.1.0 ip_vs_mh,vxlan\n"),
            Some(Message::Ready {
                release: "6.1.0".into(),
                missing: vec!["ip_vs_mh".into(), "vxlan".into()]
            })
        );
    }

    #[test]
    fn done_needs_a_numeric_id_and_status() {
        assert_eq!(
            parse_message("DONE 7 137"),
            Some(Message::Done { id: 7, status: 137 })
        );
        assert_eq!(parse_message("GOT 7"), Some(Message::Got { id: 7 }));
        assert_eq!(parse_message("GOT"), None);
        assert_eq!(parse_message("DONE x 0"), None);
        assert_eq!(parse_message("DONE 7"), None);
        assert_eq!(parse_message("[ 1.0] kernel noise"), None);
        assert_eq!(parse_message(""), None);
    }
}
