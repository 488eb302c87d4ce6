#!/usr/bin/env bash
# The project's two entry points on a fresh Debian 12 machine (run as root):
#   bash scripts/dev.sh demo   install what the lab needs, build weir and weir-cni, run `weir lab demo`
#   bash scripts/dev.sh test   install what is missing, build, run every test (and the lints)
#   bash scripts/dev.sh packages COMMAND  print the Debian packages COMMAND installs (each command
#                              installs only what it uses; `test` every package the project uses)
#   bash scripts/dev.sh bench  install what is missing, run the benchmarks
#   bash scripts/dev.sh proxy-bench  build release weir, run the service-proxy scale bench (minutes)
#   bash scripts/dev.sh agent-bench  build release weir, the real `weir proxy` at 1k/10k/100k services:
#                              full sync, RSS, one endpoint change event → rules (WEIR_BIN_BASE:
#                              an older binary measured side by side)
#   bash scripts/dev.sh agent-compare  build release weir, one `weir agent` vs the separate
#                              `weir proxy` + `weir routes` + `weir policy` on the fake API server
#                              (10,000 Services, 100 Nodes, 1,000 namespaces, 10,000 pods, 1,000
#                              policies): lists/watches per kind, bytes received over a churn
#                              (WEIR_BENCH_CHURN_SECONDS, default 120; 600 = the issue's 10 min),
#                              RSS per process (docs/benchmarks.md)
#   bash scripts/dev.sh routes-bench  node routes: pod → pod throughput and connection rate
#                              (host-gw, vxlan, underlay) and convergence with 1,000 nodes
#   bash scripts/dev.sh dns-bench [services]  build release weir, dnsperf: weir dns vs NSD
#   bash scripts/dev.sh modes-bench  the proxy modes side by side: conn/s and throughput through a
#                              ClusterIP (nftables, iptables, userspace spliced and copied) vs direct
#   bash scripts/dev.sh dist   build release weir and weir-cni, and write shell completions and man
#                              pages (generated from the command-line definition) into target/dist
#   bash scripts/dev.sh vm -- '<shell command>'  run a command as root in the test VM (Debian's
#                              kernel with IPVS, dummy, ipvlan; this machine's / and target/)
#   bash scripts/dev.sh image  podman build the Containerfile, then run the image's install-cni
#                              and agent containers as deploy/base/daemonset.yaml does, against
#                              the fake API server in a netns (minutes: a release build inside)
#   bash scripts/dev.sh vm-bench  build release weir, the proxy modes side by side in ONE VM boot
#                              (ipvs needs the VM's kernel): sync times, conn/s, throughput
#   bash scripts/dev.sh cluster [--keep] [--kube 1.20]  a real two-node Kubernetes cluster (the
#                              version scripts/cluster/kube/go.mod pins, built from Go modules and
#                              cached; --kube 1.20: 1.20.2 from Debian's source) with weir as its
#                              networking: nodes, pods, services and a probe matrix, then torn
#                              down (--keep: left up)
#   bash scripts/dev.sh cluster-daemonset [--keep] [--proxy-only]  deploy/'s DaemonSet on the
#                              real cluster: the image (dev.sh image) imported into the nodes'
#                              containerd, deploy/ applied with kubectl, the agent's /healthz
#                              parts, the probe matrix, a default-deny NetworkPolicy applied and
#                              deleted (about 8-10 min: the image; WEIR_IMAGE=<one built before>
#                              reuses it). --proxy-only: deploy/proxy-only/ beside the reference
#                              bridge plugin as the CNI (the proxy alone, the probe matrix)
#   bash scripts/dev.sh cluster-agent-compare  build release weir, then on the real cluster one
#                              `weir agent` vs the separate weir proxy + routes + policy on the
#                              same node through the same churn: watches (the apiserver's audit
#                              log), bytes from the apiserver, RSS (scripts/cluster/agent-compare.sh;
#                              WEIR_BENCH_SERVICES, WEIR_BENCH_CHURN_SECONDS; WEIR_BIN: binaries
#                              built before, no build)
#   bash scripts/dev.sh cluster-bench  weir proxy vs real kube-proxy fed by a real apiserver
#                              (1,000 and 10,000 Services x 10 endpoints; WEIR_BENCH_SIZES, ...)
#   bash scripts/dev.sh policy-bench  weir policy at scale (1,000 namespaces, 10,000 pods and
#                              NetworkPolicies: full sync, change → rules, RSS, conn/s with 1,000
#                              policies vs none), then beside sigs.k8s.io/kube-network-policies on
#                              the real cluster (change → verdict, conn/s) and its NetworkPolicy
#                              e2e pass count (WEIR_BENCH_CLUSTER=0 or WEIR_BENCH_E2E=0 leave those out)
#   bash scripts/dev.sh conformance [--proxy-mode M] [-- ginkgo args]  Kubernetes' own
#                              [sig-network] [Conformance] tests (e2e.test of the pinned version)
#                              on the real cluster networked by weir (CNI, proxy in mode M,
#                              nftables by default, DNS as deploy/dns configures it); --netpol:
#                              the NetworkPolicy suite ([sig-network] Netpol) with weir policy
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages weir and its tests drive: the kernel's user-space tools, real DNS clients and
# servers (NSD is the DNS tests' upstream and the benchmark's reference), the reference CNI plugins
# we compare against, the container runtimes that drive weir-cni in the tests (podman, containerd +
# runc, a busybox-static rootfs: no image pull), the test VM for what the host kernel lacks (qemu,
# busybox for its initramfs, xz to unpack the kernel, ipvsadm; docs/vm.md), and iperf3 for the
# node-routes benchmark.
PACKAGES=(iproute2 nftables iptables ipset conntrack bind9-dnsutils containernetworking-plugins curl tcpdump procps kmod
  podman containerd runc busybox-static qemu-system-x86 xz-utils ipvsadm iperf3 nsd dnsperf unbound
  knot knot-resolver)
# deploy/'s CNI install step uses jq and curl (its test runs it, and shellcheck on it; the
# Containerfile test checks the image's packages against these); python3-venv
# holds kubernetes-validate.
PACKAGES+=(jq shellcheck python3-venv ca-certificates)

# The deploy/ manifests are validated offline against Kubernetes' OpenAPI schemas, as PyPI's
# kubernetes-validate ships them (crates/weir/tests/deploy.rs), from a venv of its own: Debian's
# Python is externally managed. The test looks for it there ($WEIR_TOOLS) or on PATH.
KUBERNETES_VALIDATE_VERSION=1.37.0
WEIR_TOOLS=${WEIR_TOOLS:-/opt/weir-tools}
PACKAGES+=(iputils-ping) # lab_e2e: DF pings (ping -M do) across the vxlan overlay
PACKAGES+=(debootstrap) # scripts/image.sh: local base images where Docker Hub is unreachable
# A real Kubernetes (tests/kube_cluster.rs, `dev.sh cluster`, the conformance run): the version
# scripts/cluster/kube/go.mod pins, built once from Go modules into $WEIR_TOOLS/kube-<version>
# with its etcd, containerd 2 and the e2e suite (scripts/cluster/kube/build.sh; docs/cluster.md
# has its cold time and disk). 1.20.2 from Debian's source stays available (`cluster --kube 1.20`).
KUBE_VERSION=$(bash scripts/cluster/kube/version.sh)
export WEIR_KUBE_BUILD=${WEIR_KUBE_BUILD:-$WEIR_TOOLS/kube-$KUBE_VERSION}
export PATH=$PATH:/usr/local/go/bin
PACKAGES+=(python3-yaml bsdextrautils) # dev.sh cluster-daemonset renders deploy/; matrix.sh's table
PACKAGES+=(openssl gcc libc6-dev) # the real cluster's PKI, its static pause and busybox images

step() { printf '\n==> %s\n' "$*" >&2; }

# The real Kubernetes, for the commands that run one (not the demo): built once, cached.
ensure_kube() {
  if [ -n "${KUBE_LEGACY:-}" ]; then
    bash scripts/cluster/build-kube.sh "$WEIR_KUBE_BUILD" | grep -v '^already built' >&2 || true
  else
    [ -f "$WEIR_KUBE_BUILD/VERSION" ] ||
      step "building Kubernetes $KUBE_VERSION from Go modules into $WEIR_KUBE_BUILD (once)"
    command -v go >/dev/null || { echo "Go is required to build Kubernetes (1.26)" >&2; exit 1; }
    # progress on stderr; nothing when it is already built
    bash scripts/cluster/kube/build.sh "$WEIR_KUBE_BUILD" >/dev/null ||
      { echo "the Kubernetes build failed" >&2; exit 1; }
  fi
  [ -x "$WEIR_KUBE_BUILD/bin/kubelet" ] || { echo "the Kubernetes build failed" >&2; exit 1; }
  # runc, the CNI plugins containerd calls beside weir-cni, openssl for the PKI, gcc for pause
  local missing=()
  for p in runc containernetworking-plugins openssl gcc libc6-dev busybox-static; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Each command installs only what it uses (`dev.sh packages COMMAND` prints the list; `test`
# takes all of PACKAGES). The kernel's user-space tools weir and its checks run:
KERNEL_PACKAGES=(iproute2 nftables iptables ipset conntrack procps kmod)
# What `weir lab demo` drives (the lab's namespaces, rules and probes, its DNS upstream): the
# demo installs only these, and builds no Kubernetes.
DEMO_PACKAGES=("${KERNEL_PACKAGES[@]}" bind9-dnsutils nsd curl iputils-ping)
# What the benchmarks drive besides (the reference CNI plugins, iperf3, the DNS servers and
# dnsperf they are measured beside): no VM, container runtime or image tooling.
BENCH_PACKAGES=("${DEMO_PACKAGES[@]}" jq containernetworking-plugins iperf3 dnsperf unbound knot knot-resolver)
# The real cluster (scripts/cluster/up.sh, down.sh, matrix.sh, netpol.sh and the checks of
# bench.sh, agent-compare.sh, conformance.sh): the nodes' weir (the kernel tools), containerd's
# runc and the reference loopback/portmap (and bridge/host-local) plugins, the PKI (openssl),
# the static pause and busybox images (gcc, libc6-dev, busybox-static), the YAML and the probes
# (python3-yaml, curl, jq, column). containerd, etcd and Kubernetes come from its build (Go);
# the e2e suite's images install their own packages (cluster/e2e-images.sh).
CLUSTER_PACKAGES=("${KERNEL_PACKAGES[@]}" runc containernetworking-plugins openssl gcc libc6-dev
  busybox-static curl jq bsdextrautils python3-yaml)
# The node image (scripts/image.sh): podman builds and runs it, debootstrap makes the base images
# where Docker Hub is unreachable, and the checks run the agent against the fake API server in a
# namespace (ip, nft, curl, jq). The image's own tools are installed inside its build.
IMAGE_PACKAGES=(podman debootstrap iproute2 nftables curl jq ca-certificates)
# The test VM (docs/vm.md): qemu, the initramfs's busybox, xz for Debian's kernel, its modules
# (kmod's depmod), ipvsadm for IPVS inside it.
VM_PACKAGES=(qemu-system-x86 busybox-static xz-utils kmod ipvsadm)

# The Debian packages COMMAND installs, on one line (empty: none); fails for another word.
packages_for() {
  case $1 in
    test) echo "${PACKAGES[*]}" ;;
    demo) echo "${DEMO_PACKAGES[*]}" ;;
    bench | proxy-bench | agent-bench | agent-compare | routes-bench | modes-bench | dns-bench)
      echo "${BENCH_PACKAGES[*]}" ;;
    cluster | cluster-bench | cluster-agent-compare | conformance) echo "${CLUSTER_PACKAGES[*]}" ;;
    # the image (built when missing), then the cluster
    cluster-daemonset) echo "${CLUSTER_PACKAGES[*]} ${IMAGE_PACKAGES[*]}" ;;
    # the bench's own node (ip, nft, conntrack, sysctl); with its cluster part, the cluster's
    policy-bench)
      if [ "${WEIR_BENCH_CLUSTER:-1}" = 1 ]; then echo "${CLUSTER_PACKAGES[*]}"; else echo "${KERNEL_PACKAGES[*]}"; fi ;;
    image) echo "${IMAGE_PACKAGES[*]}" ;;
    vm) echo "${VM_PACKAGES[*]}" ;;
    # the guest runs this machine's /: the modes' tools, iperf3 and jq (vm-bench.sh)
    vm-bench) echo "${VM_PACKAGES[*]} ${KERNEL_PACKAGES[*]} iperf3 jq" ;;
    dist) echo "" ;;
    *) return 1 ;;
  esac
}

# Installs what COMMAND uses (`test`: everything, and the kubernetes-validate venv).
install_for() {
  local list
  [ "$1" != test ] || { install_packages; return; }
  read -r -a list <<<"$(packages_for "$1")"
  install_packages "${list[@]}"
}

# Installs the Debian packages named (default: every one the project uses) and, for the full
# set, the kubernetes-validate venv; checks cargo and root.
install_packages() {
  local wanted=("$@") missing=()
  ((${#wanted[@]})) || wanted=("${PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    step "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    # The tests start their own nsd/containerd inside namespaces: keep the packages' services
    # from starting on the host (Debian's policy-rc.d hook; an existing one is left alone).
    local policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      policy=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    [ -z "$policy" ] || rm -f "$policy"
  fi
  if (($# == 0)); then
    local venv="$WEIR_TOOLS/venv"
    if ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION"; then
      step "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION (PyPI) into $venv"
      python3 -m venv "$venv"
      "$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    fi
  fi
  command -v cargo >/dev/null || { echo "cargo is required (rustup)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "run as root: weir creates network namespaces" >&2; exit 1; }
}

case "${1:-}" in
  demo)
    install_for demo
    step "building weir and weir-cni (release)"
    cargo build --release -p weir -p weir-cni --bins
    step "weir lab demo"
    exec ./target/release/weir lab demo "${@:2}"
    ;;
  test)
    install_for test
    ensure_kube
    step "formatting and lints"
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    # The node image's weir: without the lab (the Containerfile's --no-default-features).
    cargo clippy -p weir --no-default-features --all-targets -- -D warnings
    # No module of any crate imports in a circle (scripts/module_cycles.py, file by file).
    for src in crates/*/src; do
      python3 scripts/module_cycles.py "$src" | tail -1 | grep -q ' cycles 0$' ||
        { python3 scripts/module_cycles.py "$src" >&2; exit 1; }
    done
    # A test that cannot do what it is named for (not root, a tool or the VM missing) fails under
    # CI=true, naming what is missing (weir-testkit; the VM tests through WEIR_VM_REQUIRED);
    # elsewhere it is skipped, and each skip is a line in $skips, summarised below.
    [ "${CI:-}" != true ] || export WEIR_VM_REQUIRED=1
    skips="${CARGO_TARGET_DIR:-target}/test-skips.txt"
    rm -f "$skips"
    step "every test (unit, property, kernel, lab end-to-end)"
    status=0
    cargo test --workspace --all-targets --no-fail-fast -- "${@:2}" || status=$?
    if (($# < 2)); then # the whole suite, not a filtered run
      # Kubernetes' own [sig-network] conformance tests on the real cluster networked by weir
      # (nftables mode; docs/cluster.md: the other modes, by hand). Alone: a cluster's
      # processes beside the parallel tests above would starve both on two cores.
      step "Kubernetes $KUBE_VERSION [sig-network] conformance (scripts/cluster/conformance.sh)"
      bash scripts/cluster/conformance.sh || status=$?
      step "Kubernetes $KUBE_VERSION NetworkPolicy suite, [sig-network] Netpol (conformance.sh --netpol)"
      bash scripts/cluster/conformance.sh --netpol || status=$?
    fi
    if [ -s "$skips" ]; then
      n=$(sort -u "$skips" | wc -l)
      names=$(sort -u "$skips" | sed -E 's/^SKIPPED (.*): missing .*/\1/' | paste -sd, - | sed 's/,/, /g')
      step "$n test(s) skipped: $names"
      sort -u "$skips" | sed 's/^/  /' >&2
    else
      step "no test skipped"
    fi
    exit $status
    ;;
  bench)
    install_for bench
    step "CNI ADD/DEL latency: weir-cni vs reference bridge+host-local and ptp+host-local (BENCH=bridge or eni for one)"
    cargo bench -p weir-cni --bench add_del
    ;;
  proxy-bench)
    install_for proxy-bench
    step "building weir (release): the bench starts the real agent"
    cargo build --release -p weir
    step "service proxy at scale (WEIR_BENCH_SIZES, WEIR_BENCH_MODES, WEIR_BENCH_BIG, WEIR_BENCH_JSON)"
    cargo bench -p weir-proxy --bench scale -- "${@:2}"
    ;;
  agent-bench)
    install_for agent-bench
    step "building weir (release): the bench starts the real agent"
    cargo build --release -p weir
    step "weir proxy end to end (WEIR_BENCH_SIZES, WEIR_BENCH_CHANGES, WEIR_BENCH_RUNS, WEIR_BIN_BASE)"
    cargo bench -p weir --bench agent
    ;;
  agent-compare)
    install_for agent-compare
    step "building weir (release): the bench starts the real agent and the separate processes"
    cargo build --release -p weir
    step "weir agent vs proxy + routes + policy (WEIR_BENCH_CHURN_SECONDS, WEIR_BENCH_SERVICES, WEIR_BENCH_NODES, WEIR_BENCH_RUNS, ...)"
    cargo bench -p weir --bench agent_compare
    ;;
  routes-bench)
    install_for routes-bench
    step "node routes: datapath (iperf3, medians of WEIR_BENCH_RUNS rounds) and convergence (WEIR_BENCH_NODES, WEIR_BENCH_SECONDS, WEIR_BENCH_ROUNDS)"
    cargo bench -p weir-routes --bench routes
    ;;
  modes-bench)
    install_for modes-bench
    step "proxy modes: conn/s and throughput via a ClusterIP vs direct (WEIR_BENCH_ROUNDS, WEIR_BENCH_SECONDS, WEIR_BENCH_CLIENTS, WEIR_BENCH_MODES)"
    cargo bench -p weir-proxy --bench modes
    ;;
  dist)
    step "building weir and weir-cni (release)"
    cargo build --release -p weir -p weir-cni --bins
    out=target/dist
    rm -rf "$out" && mkdir -p "$out/completions" "$out/man"
    cp target/release/weir target/release/weir-cni "$out/"
    for shell in bash zsh fish; do ./target/release/weir completions "$shell" >"$out/completions/weir.$shell"; done
    ./target/release/weir man "$out/man"
    step "$out: weir, weir-cni, completions/, man/"
    ;;
  vm)
    install_for vm
    shift
    [ "${1:-}" = "--" ] && shift
    (($#)) || { echo "usage: bash scripts/dev.sh vm -- '<shell command>'" >&2; exit 2; }
    cargo build -q -p weir-vmtest --bin weir-vm
    exec ./target/debug/weir-vm "$@"
    ;;
  vm-bench)
    install_for vm-bench
    step "building weir and the scale bench (release), and the VM runner"
    cargo build --release -p weir
    scale=$(cargo bench -p weir-proxy --bench scale --no-run --message-format=json |
      jq -r 'select(.target.name == "scale" and .executable != null) | .executable' | tail -1)
    cargo build -q -p weir-vmtest --bin weir-vm
    # the guest sees none of this shell's environment: hand the bench's variables over
    vars=$(env | grep -E '^WEIR_BENCH_[A-Z_]+=[A-Za-z0-9,._-]*$' | tr '\n' ' ' || true)
    out=target/vm-bench.md
    step "in the VM: scale bench and iperf3 per mode (${WEIR_BENCH_MODES:-nftables,ipvs}); report -> $out"
    ./target/debug/weir-vm "$vars bash $PWD/scripts/vm-bench.sh $scale $PWD/target/release/weir /tmp/vm-bench" | tee "$out"
    ;;
  dns-bench)
    install_for dns-bench
    step "building weir and the fake API server (release)"
    cargo build --release -p weir -p weir-fakeapi
    step "weir dns vs NSD under dnsperf"
    exec bash scripts/dns-bench.sh "${@:2}"
    ;;
  image)
    install_for image
    step "the node agent's image: podman build, then run as the DaemonSet runs it"
    exec bash scripts/image.sh "${@:2}"
    ;;
  cluster)
    keep=""
    for a in "${@:2}"; do
      case $a in
        --keep) keep=1 ;;
        --kube) ;;
        1.20) KUBE_LEGACY=1; WEIR_KUBE_BUILD=$WEIR_TOOLS/kube-1.20.2; KUBE_VERSION=v1.20.2 ;;
        *) echo "usage: bash scripts/dev.sh cluster [--keep] [--kube 1.20]" >&2; exit 2 ;;
      esac
    done
    install_for cluster
    ensure_kube
    step "building weir"
    cargo build -q -p weir -p weir-cni --bins
    run=${WEIR_CLUSTER_RUN:-/tmp/weir-cluster}
    name=${WEIR_CLUSTER_NAME:-demo}
    bash scripts/cluster/down.sh "$run" >/dev/null 2>&1 || true
    rm -rf "$run"
    [ -n "$keep" ] || trap 'step "tearing down"; bash scripts/cluster/down.sh "$run"' EXIT
    step "a two-node Kubernetes $KUBE_VERSION cluster, networked by weir ($run)"
    KUBE_BUILD=$WEIR_KUBE_BUILD bash scripts/cluster/up.sh "$name" "$run"
    "$run/kubectl" apply -f scripts/cluster/demo.yaml >/dev/null
    "$run/kubectl" rollout status deploy/web --timeout=120s >/dev/null
    "$run/kubectl" wait --for=condition=Ready pod/client --timeout=60s >/dev/null
    step "nodes, pods, services"
    "$run/kubectl" get nodes,pods,services -o wide
    step "probe matrix"
    status=0
    bash scripts/cluster/matrix.sh "$run" || status=$?
    if [ -n "$keep" ]; then
      step "left up: $run/kubectl (KUBECONFIG=$run/kubeconfig, from the namespace ${name}-cp); stop: bash scripts/cluster/down.sh $run"
    fi
    exit $status
    ;;
  cluster-daemonset)
    install_for cluster-daemonset
    ensure_kube
    step "deploy/ on a real two-node cluster (scripts/cluster/daemonset.sh)"
    exec bash scripts/cluster/daemonset.sh "${@:2}"
    ;;
  cluster-bench)
    install_for cluster-bench
    ensure_kube
    step "building weir (release)"
    cargo build --release -p weir -p weir-cni --bins
    step "weir proxy vs kube-proxy $KUBE_VERSION through a real apiserver (scripts/cluster/bench.sh)"
    exec bash scripts/cluster/bench.sh
    ;;
  policy-bench)
    install_for policy-bench
    step "building weir and weir-cni (release): the bench starts the real agent, the cluster runs both"
    cargo build --release -p weir -p weir-cni --bins
    cluster=${WEIR_BENCH_CLUSTER:-1}
    if [ "$cluster" = 1 ]; then
      ensure_kube
      ref_version=$(awk '{ for (i = 1; i < NF; i++) if ($i == "sigs.k8s.io/kube-network-policies") { print $(i + 1); exit } }' scripts/cluster/netpol-ref/go.mod)
      export NETPOL_REF_BUILD=${NETPOL_REF_BUILD:-$WEIR_TOOLS/netpol-ref-$ref_version}
      step "kube-network-policies $ref_version from Go modules into $NETPOL_REF_BUILD (once)"
      bash scripts/cluster/netpol-ref/build.sh "$NETPOL_REF_BUILD" >/dev/null ||
        { echo "the kube-network-policies build failed" >&2; exit 1; }
    fi
    out=target/policy-bench.txt
    step "weir policy at scale (WEIR_BENCH_NODES, WEIR_BENCH_CHANGES, WEIR_BENCH_ROUNDS, ...); report -> $out"
    WEIR_BENCH_CLUSTER=$cluster cargo bench -p weir --bench policy | tee "$out"
    line=$(tail -1 "$out")
    if [ "$cluster" = 1 ] && [ "${WEIR_BENCH_E2E:-1}" = 1 ]; then
      step "Kubernetes' NetworkPolicy suite with kube-network-policies on both nodes (conformance.sh --netpol)"
      e2e=target/policy-bench-e2e.txt
      WEIR_POLICY=kube-network-policies WEIR_BIN=$PWD/target/release \
        bash scripts/cluster/conformance.sh --netpol 2>&1 | tee "$e2e" >&2 || true
      counts=$(sed -nE 's/^passed ([0-9]+), failed ([0-9]+), not run [0-9]+$/\1 \2/p' "$e2e" | tail -1)
      read -r passed failed <<<"${counts:-0 0}"
      line="$line knp_e2e=$passed/$((passed + failed))"
    fi
    step "result"
    echo "$line"
    ;;
  cluster-agent-compare)
    install_for cluster-agent-compare
    ensure_kube
    if [ -z "${WEIR_BIN:-}" ]; then
      step "building weir (release)"
      cargo build --release -p weir -p weir-cni --bins
    fi
    step "weir agent vs weir proxy + routes + policy through a real apiserver (scripts/cluster/agent-compare.sh)"
    exec bash scripts/cluster/agent-compare.sh
    ;;
  conformance)
    install_for conformance
    ensure_kube
    step "building weir"
    cargo build -q -p weir -p weir-cni --bins
    step "Kubernetes $KUBE_VERSION [sig-network] conformance on a cluster networked by weir (scripts/cluster/conformance.sh)"
    exec bash scripts/cluster/conformance.sh "${@:2}"
    ;;
  packages)
    words=$(packages_for "${2:-}") ||
      { echo "usage: bash scripts/dev.sh packages COMMAND (one of dev.sh's commands)" >&2; exit 2; }
    for p in $words; do echo "$p"; done | awk '!seen[$0]++'
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test|packages|dist|bench|proxy-bench|agent-bench|agent-compare|policy-bench|routes-bench|dns-bench|modes-bench|vm|vm-bench|image|cluster|cluster-daemonset|cluster-agent-compare|cluster-bench|conformance" >&2
    exit 2
    ;;
esac
