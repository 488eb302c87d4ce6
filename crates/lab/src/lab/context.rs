//! What every lab operation is given: the programs to run and where progress lines go.

use std::path::PathBuf;
use std::time::Instant;

/// The programs a lab runs: `weir` (for echo servers) and `weir-cni`.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub weir: PathBuf,
    pub weir_cni: PathBuf,
}

/// Where progress lines go (`[3/9] node b: pod b1 10.244.2.2 (ADD 4 ms)`).
pub type Progress<'a> = &'a mut dyn FnMut(&str);

pub(super) struct Steps<'a> {
    pub(super) done: usize,
    pub(super) total: usize,
    pub(super) out: Progress<'a>,
}

impl Steps<'_> {
    pub(super) fn step(&mut self, msg: &str) {
        self.done += 1;
        (self.out)(&format!("[{}/{}] {msg}", self.done, self.total));
    }
}

pub(super) fn ms(since: Instant) -> u128 {
    since.elapsed().as_millis()
}
