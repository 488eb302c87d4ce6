//! `weir-fakeapi --listen 127.0.0.1:6443 [FILE.yaml…]`: the fake Kubernetes API server as a
//! process, serving the objects of the given manifests until killed (for trying `weir proxy
//! --master http://127.0.0.1:6443` by hand; the tests use the library in-process).

use std::net::SocketAddr;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let mut listen: SocketAddr = "127.0.0.1:6443".parse()?;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => {
                let v = args.next().context("--listen needs an address")?;
                listen = v.parse().with_context(|| format!("--listen {v:?}"))?;
            }
            "-h" | "--help" => {
                println!("usage: weir-fakeapi [--listen ADDR] [MANIFEST.yaml ...]");
                return Ok(());
            }
            f => files.push(f.to_string()),
        }
    }
    let api = weir_fakeapi::FakeApi::start(None, listen)?;
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {f}"))?;
        api.apply_yaml(&text).with_context(|| f.clone())?;
    }
    eprintln!("weir-fakeapi: serving {} on {}", files.len(), api.url());
    loop {
        std::thread::park();
    }
}
