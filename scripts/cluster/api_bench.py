#!/usr/bin/env python3
"""Service proxies fed by a real kube-apiserver, side by side: real kube-proxy on node-1, weir
proxy on node-2 (up.sh with WEIR_PROXY_MODES="kube-proxy-<mode> <weir mode>"), the same objects
at the same moment.

N Services x E endpoints are created through the API (selector-less Services and their
EndpointSlices, 16 requests in flight). The last Service's one endpoint is a real pod (A), so
"rules in the kernel" is tested by the packet: curl from each node to its ClusterIP, back to
back, until it answers. Then R endpoint changes (the slice's endpoint A -> B -> A ...): from
the API write's answer until each node's curl gets the new pod's page, spaced WEIR_BENCH_GAP
seconds (default 1.5) after both proxies served the last one, past either's minimum sync
period (1 s for both), so each is a change arriving on a settled proxy, not one queued behind
the other's pace. Both figures include what both proxies pay: the apiserver's watch delivery
and one probe (the probe floor: one nsenter + curl answered at once, a request straight to pod
A). The proxies' own part is their kubeproxy_sync_proxy_rules_duration_seconds (both export
it): its mean over the syncs during the changes. Each proxy's resident memory (VmRSS) is read
after the changes. Then the full sync from nothing: each proxy in turn is stopped, its rules
cleaned up, and started again with every object in the API; the time from its start until the
last Service answers on its node. Results as a table (--json for machines) and one ratio line.

Run in the control plane's namespace (dev.sh cluster-bench does): it talks to the apiserver
directly and reaches the nodes with `nsenter`.
usage: api_bench.py RUN_DIR SERVICES ENDPOINTS POD_A_IP POD_A_NAME POD_B_IP POD_B_NAME [--json]
"""
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

RUN, N, E = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
A_IP, A_NAME, B_IP, B_NAME = sys.argv[4:8]
AS_JSON = "--json" in sys.argv
ROUNDS = int(os.environ.get("WEIR_BENCH_CHANGES", "5"))
NS = "bench"

env = dict(l.strip().split("=", 1) for l in open(f"{RUN}/env") if "=" in l)
NODE_NS = env["NODE_NS"].strip('"').split()
MODES = env["PROXY_MODES"].strip('"').split()
LEGACY = env.get("KUBE_VERSION", "v1.20.2") == "v1.20.2"
SLICE_API = "discovery.k8s.io/v1beta1" if LEGACY else "discovery.k8s.io/v1"
kc = open(f"{RUN}/kubeconfig").read()
TOKEN = kc.split("token: ")[1].split("}")[0].strip()
HOST = env["CP_IP"]
CTX = ssl.create_default_context(cafile=f"{RUN}/pki/ca.crt")
local = threading.local()


def request(method, path, body=None):
    conn = getattr(local, "conn", None)
    if conn is None:
        conn = local.conn = http.client.HTTPSConnection(HOST, 16443, context=CTX, timeout=60)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for attempt in range(5):
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status == 429 or r.status >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status >= 300 and not (method == "POST" and r.status == 409):
                raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
            return json.loads(data or b"{}")
        except (OSError, http.client.HTTPException):  # a dropped connection (ssl errors too)
            conn = local.conn = http.client.HTTPSConnection(HOST, 16443, context=CTX, timeout=60)
    raise RuntimeError(f"{method} {path}: gave up")


def service(i):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"s{i}", "namespace": NS},
            "spec": {"ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}}


def fake_endpoints(i):
    # addresses outside every pod CIDR: nothing answers them, the rules still hold them
    return [{"addresses": [f"10.{200 + (i * E + j) // 65536 % 50}.{(i * E + j) // 256 % 256}.{(i * E + j) % 256}"],
             "conditions": {"ready": True}} for j in range(E)]


def slice_(i, endpoints):
    return {"apiVersion": SLICE_API, "kind": "EndpointSlice",
            "metadata": {"name": f"s{i}-bench", "namespace": NS,
                         "labels": {"kubernetes.io/service-name": f"s{i}",
                                    "endpointslice.kubernetes.io/managed-by": "weir-bench"}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "", "port": 8080, "protocol": "TCP"}]}


SVC = f"/api/v1/namespaces/{NS}/services"
SLICES = f"/apis/{SLICE_API}/namespaces/{NS}/endpointslices"


def create(i):
    request("POST", SVC, service(i))
    request("POST", SLICES, slice_(i, fake_endpoints(i)))


def answer(ns, url):
    r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "curl", "-s", "--connect-timeout", "0.1", "-m", "0.5", url],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def until(ns, url, want, since, limit):
    """Seconds from `since` until `url` answers `want` from namespace `ns` (polled back to back:
    one probe, an nsenter + curl, is the resolution, ~10 ms here)."""
    while time.monotonic() - since < limit:
        got = answer(ns, url)
        if got is not None and (want is None or got == want):
            return time.monotonic() - since
        time.sleep(0.002)
    return None


def both(url, want, since, limit):
    out = [None, None]
    ts = [threading.Thread(target=lambda k=k: out.__setitem__(k, until(NODE_NS[k], url, want, since, limit)))
          for k in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return out


def log(msg):
    print(f"[{time.strftime('%T')}] {msg}", file=sys.stderr, flush=True)


request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
log(f"creating {N - 1} Services x {E} endpoints through the API")
t0 = time.monotonic()
done = 0
with ThreadPoolExecutor(16) as pool:
    for _ in pool.map(create, range(N - 1)):
        done += 1
        if done % 1000 == 0:
            log(f"  {done} created ({done / (time.monotonic() - t0):.0f}/s)")
create_s = time.monotonic() - t0
last = N - 1
request("POST", SVC, service(last))
request("POST", SLICES, slice_(last, [{"addresses": [A_IP], "conditions": {"ready": True}}]))
t_last = time.monotonic()
cip = request("GET", f"{SVC}/s{last}")["spec"]["clusterIP"]
url = f"http://{cip}/"
log(f"last object created after {create_s:.1f} s; waiting for {url} to answer on both nodes")
limit = float(os.environ.get("WEIR_BENCH_LIMIT", "900"))
ready = both(url, A_NAME, t_last, limit)
log(f"rules in the kernel after the last create: {ready}")

def sync_seconds(k):
    """(sum, count) of kubeproxy_sync_proxy_rules_duration_seconds on node k+1: both proxies
    export it (the time one sync takes to write its rules)."""
    r = subprocess.run(["nsenter", f"--net=/run/netns/{NODE_NS[k]}", "curl", "-s", "-m", "5",
                        "http://127.0.0.1:10249/metrics"], capture_output=True, text=True)
    got = {}
    for line in r.stdout.splitlines():
        for what in ("sum", "count"):
            name = f"kubeproxy_sync_proxy_rules_duration_seconds_{what}"
            # kube-proxy 1.37 labels it per family; the IPv4 series is this cluster's
            if line.startswith(name + " ") or line.startswith(name + '{ip_family="IPv4"}'):
                got[what] = float(line.split()[-1])
    return got.get("sum"), got.get("count")


syncs_before = [sync_seconds(k) for k in range(2)]
changes = [[], []]
target = (B_IP, B_NAME)
for r in range(ROUNDS):
    s = request("GET", f"{SLICES}/s{last}-bench")
    s["endpoints"] = [{"addresses": [target[0]], "conditions": {"ready": True}}]
    request("PUT", f"{SLICES}/s{last}-bench", s)
    t = time.monotonic()
    got = both(url, target[1], t, 60)
    for k in range(2):
        if got[k] is not None:
            changes[k].append(got[k])
    log(f"endpoint change {r + 1}: {got}")
    target = (A_IP, A_NAME) if target[0] == B_IP else (B_IP, B_NAME)
    time.sleep(float(os.environ.get("WEIR_BENCH_GAP", "1.5")))


def med(xs):
    return statistics.median(xs) if xs else None


def mean_sync_ms(k):
    """The mean time of the syncs during the changes, by the proxy's own metric."""
    (s0, c0), (s1, c1) = syncs_before[k], syncs_after[k]
    if None in (s0, c0, s1, c1) or c1 <= c0:
        return None
    return (s1 - s0) / (c1 - c0) * 1000


syncs_after = [sync_seconds(k) for k in range(2)]
# The measurement's own floor: one nsenter + curl that answers at once (the pod directly).
floor = [med([until(NODE_NS[k], f"http://{A_IP}:8080/", None, time.monotonic(), 5) or 0 for _ in range(7)])
         for k in range(2)]


def process(k):
    """The proxy process of node k+1 (up.sh's PID files)."""
    node = f"node-{k + 1}"
    if MODES[k].startswith("kube-proxy"):
        mode = MODES[k][len("kube-proxy"):].lstrip("-") or "iptables"
        return f"{node}-kube-proxy-{mode}", f"kube-proxy {env['KUBE_VERSION']} {mode}"
    return f"{node}-proxy", f"weir proxy {MODES[k]}"


def rss_mib(name):
    try:
        pid = open(f"{RUN}/{name}.pid").read().strip()
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None


def ctl(op, name):
    subprocess.run(["bash", f"{os.path.dirname(os.path.abspath(__file__))}/ctl.sh", RUN, op, name], check=True)


def restart_to_rules(k):
    """Seconds from starting node k+1's proxy on a clean node until the last Service answers."""
    name, _ = process(k)
    ctl("stop", name)
    binary = env["KUBE_PROXY"] + " --cleanup" if MODES[k].startswith("kube-proxy") else \
        open(f"{RUN}/{name}.cmd").read().split("\n")[3] + " proxy cleanup"
    subprocess.run(["nsenter", f"--net=/run/netns/{NODE_NS[k]}", "sh", "-c", binary + " >/dev/null 2>&1"])
    if answer(NODE_NS[k], url) is not None:
        raise RuntimeError(f"{name}: the Service still answers after the cleanup")
    t = time.monotonic()
    ctl("start", name)
    return until(NODE_NS[k], url, None, t, limit)


rss = [rss_mib(process(k)[0]) for k in range(2)]
full = [restart_to_rules(k) for k in range(2)]
log(f"start on a clean node -> the last Service served: {full}")

rows = []
for k in range(2):
    name, who = process(k)
    rows.append({"proxy": who, "node": f"node-{k + 1}", "services": N, "endpoints": E, "rss_mib": rss[k], "start_to_rules_s": full[k], "sync_ms_mean": mean_sync_ms(k),
                 "last_create_to_rules_s": ready[k], "endpoint_change_ms_median": (med(changes[k]) or 0) * 1000,
                 "endpoint_change_ms": [round(x * 1000, 1) for x in changes[k]], "create_s": create_s,
                 "probe_floor_ms": floor[k] * 1000})


def ratio_line(k, w):
    """weir over kube-proxy: below 1 is weir ahead (targets: full <= 0.5, change <= 0.1, rss <= 1)."""
    def ratio(a, b):
        return f"{a / b:.3f}" if a and b else "n/a"
    return (f"ratio weir/{MODES[0]} services={N} full={ratio(w['start_to_rules_s'], k['start_to_rules_s'])} "
            f"last_create={ratio(w['last_create_to_rules_s'], k['last_create_to_rules_s'])} "
            f"change={ratio(w['endpoint_change_ms_median'], k['endpoint_change_ms_median'])} "
            f"change_sync={ratio(w['sync_ms_mean'], k['sync_ms_mean'])} "
            f"rss={ratio(w['rss_mib'], k['rss_mib'])}")


if AS_JSON:
    print(json.dumps(rows, indent=1))
    print(ratio_line(rows[0], rows[1]), file=sys.stderr)
else:
    def f(x, unit=""):
        return "timeout" if x is None else f"{x:.2f}{unit}"
    print(f"\n{N} Services x {E} endpoints, created through the API in {create_s:.1f} s")
    print(f"{'proxy':<30} {'last create -> rules':>21} {'start -> rules':>15} {'one endpoint change (median)':>29} {'probe floor':>12} {'RSS':>11}")
    for r in rows:
        print(f"{r['proxy']:<30} {f(r['last_create_to_rules_s'], ' s'):>21} {f(r['start_to_rules_s'], ' s'):>15} "
              f"{r['endpoint_change_ms_median']:>26.1f} ms {r['probe_floor_ms']:>9.0f} ms {f(r['rss_mib'], ' MiB'):>11}")
    print(ratio_line(rows[0], rows[1]))
