#!/usr/bin/env bash
# The project's two entry points on a fresh Debian 12 machine (run as root):
#   bash scripts/dev.sh demo   install what is missing, build, run `weir lab demo`
#   bash scripts/dev.sh test   install what is missing, build, run every test (and the lints)
#   bash scripts/dev.sh bench  install what is missing, run the benchmarks
#   bash scripts/dev.sh proxy-bench  build release weir, run the service-proxy scale bench (minutes)
#   bash scripts/dev.sh dns-bench [services]  build release weir, dnsperf: weir dns vs NSD
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages weir and its tests drive: the kernel's user-space tools, real DNS clients and
# servers (NSD is the DNS tests' upstream and the benchmark's reference), and the reference CNI
# plugins we compare against.
PACKAGES=(iproute2 nftables iptables ipset conntrack bind9-dnsutils containernetworking-plugins curl tcpdump procps kmod nsd dnsperf)

step() { printf '\n==> %s\n' "$*" >&2; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    step "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  command -v cargo >/dev/null || { echo "cargo is required (rustup)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "run as root: weir creates network namespaces" >&2; exit 1; }
}

case "${1:-}" in
  demo)
    install_packages
    step "building weir (release)"
    cargo build --release --bins
    step "weir lab demo"
    exec ./target/release/weir lab demo "${@:2}"
    ;;
  test)
    install_packages
    step "formatting and lints"
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    step "every test (unit, property, kernel, lab end-to-end)"
    cargo test --workspace --all-targets -- "${@:2}"
    ;;
  bench)
    install_packages
    step "CNI ADD/DEL latency: weir-cni vs reference bridge+host-local"
    cargo bench -p weir-cni --bench add_del
    ;;
  proxy-bench)
    install_packages
    step "building weir (release): the bench starts the real agent"
    cargo build --release -p weir
    step "service proxy at scale (WEIR_BENCH_SIZES, WEIR_BENCH_MODES, WEIR_BENCH_BIG, WEIR_BENCH_JSON)"
    cargo bench -p weir-proxy --bench scale -- "${@:2}"
    ;;
  dns-bench)
    install_packages
    step "building weir (release)"
    cargo build --release -p weir
    step "weir dns vs NSD under dnsperf"
    exec bash scripts/dns-bench.sh "${@:2}"
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test|bench|proxy-bench|dns-bench" >&2
    exit 2
    ;;
esac
