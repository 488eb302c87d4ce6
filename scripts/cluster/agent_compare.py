#!/usr/bin/env python3
"""The API side of agent-compare.sh (one `weir agent` against the separate weir proxy, routes and
policy on the real cluster): the objects, the churn, and the audit log's count of the requests
each measured process made.

  agent_compare.py RUN_DIR objects SERVICES NAMESPACES
      SERVICES selector-less Services (namespace cmp) with one EndpointSlice of 10 endpoints
      each (addresses nothing answers), NAMESPACES namespaces cmp-<i> each with one
      NetworkPolicy (an ingress rule with a namespace and a pod selector), and the Deployment
      `churn` (busybox, 2 replicas) behind the Service `churn`.
  agent_compare.py RUN_DIR churn ROUNDS SERVICES PHASE
      ROUNDS rounds one second apart, each: one endpoint of one cmp Service's slice replaced and
      one churn pod relabelled; every 15th round the Deployment scaled between 2 and 6
      replicas. The same ROUNDS make as many changes whichever side is measured; PHASE (0, 1,
      ...) makes every value new, so no write repeats an earlier phase's (a no-op update would
      send no event).
  agent_compare.py RUN_DIR audit USER...
      from RUN_DIR/audit.log: per user (a ServiceAccount's name) and resource, the list and watch
      requests, as JSON {user: {resource: {"list": n, "watch": n}}}.

Run in the control plane's namespace (agent-compare.sh does): it talks to the apiserver
directly, with the admin token.
"""
import http.client
import json
import ssl
import sys
import time
import threading
from concurrent.futures import ThreadPoolExecutor

RUN, CMD = sys.argv[1], sys.argv[2]
NS = "cmp"
env = dict(l.strip().split("=", 1) for l in open(f"{RUN}/env") if "=" in l)
kc = open(f"{RUN}/kubeconfig").read()
TOKEN = kc.split("token: ")[1].split("}")[0].strip()
CTX = ssl.create_default_context(cafile=f"{RUN}/pki/ca.crt")
local = threading.local()


def request(method, path, body=None, content="application/json"):
    for attempt in range(5):
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPSConnection(env["CP_IP"], 16443, context=CTX, timeout=60)
        try:
            headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": content}
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            local.conn = None
            time.sleep(0.5)
            continue
        if resp.status == 429 or resp.status >= 500:
            time.sleep(0.5 * (attempt + 1))
            continue
        if resp.status >= 400 and not (method == "POST" and resp.status == 409):
            raise SystemExit(f"{method} {path}: {resp.status} {data[:300]!r}")
        return json.loads(data) if data else None
    raise SystemExit(f"{method} {path}: no answer after 5 tries")


def ep_ip(i, j):  # endpoint j of Service i: 10.250.0.0/16, nothing answers there
    n = i * 10 + j
    return f"10.250.{n // 250 % 250}.{n % 250 + 1}"


def service(i):
    name = f"s{i}"
    request("POST", f"/api/v1/namespaces/{NS}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
    request("POST", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", slice_body(i, 0))


def slice_body(i, version):
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"s{i}-1", "labels": {"kubernetes.io/service-name": f"s{i}"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ep_ip(i + version if j == 0 else i, j)], "conditions": {"ready": True}}
                      for j in range(10)],
    }


def policy_ns(i):
    ns = f"cmp-{i}"
    request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": ns, "labels": {"team": f"t{i % 10}"}}})
    request("POST", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "allow-team"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": f"t{i % 10}"}},
                                        "podSelector": {"matchLabels": {"role": "client"}}}],
                              "ports": [{"port": 8080, "protocol": "TCP"}]}]}})


def objects(services, namespaces):
    request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(service, range(services)))
        list(pool.map(policy_ns, range(namespaces)))
    request("POST", f"/api/v1/namespaces/{NS}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "churn"},
        "spec": {"selector": {"app": "churn"}, "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
    request("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "churn"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "churn"}},
                 "template": {"metadata": {"labels": {"app": "churn"}}, "spec": {
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "sleep", "image": "localhost/weir/busybox:1.35",
                                     "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", "exec busybox sleep 100000"]}]}}}})


def churn(rounds, services, phase):
    merge = "application/merge-patch+json"
    start = time.monotonic()
    for r in range(rounds):
        i = r % services
        # an unconditional update: the first endpoint's address moves
        version = phase * rounds + r + 1
        request("PUT", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/s{i}-1", slice_body(i, version))
        pods = request("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dchurn")["items"]
        if pods:
            p = pods[r % len(pods)]["metadata"]["name"]
            request("PATCH", f"/api/v1/namespaces/{NS}/pods/{p}", {"metadata": {"labels": {"round": f"{phase}-{r}"}}}, merge)
        if r % 15 == 14:
            replicas = 6 if (r // 15) % 2 == 0 else 2
            request("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/churn/scale",
                    {"spec": {"replicas": replicas}}, merge)
        time.sleep(max(0.0, start + r + 1 - time.monotonic()))


def audit(users):
    counts = {u: {} for u in users}
    seen = set()
    with open(f"{RUN}/audit.log") as f:
        for line in f:
            e = json.loads(line)
            user = e.get("user", {}).get("username", "").rsplit(":", 1)[-1]
            verb = e.get("verb")
            if user not in counts or verb not in ("list", "watch") or e["auditID"] in seen:
                continue
            seen.add(e["auditID"])
            res = counts[user].setdefault(e.get("objectRef", {}).get("resource", "?"), {"list": 0, "watch": 0})
            res[verb] += 1
    print(json.dumps(counts))


if CMD == "objects":
    objects(int(sys.argv[3]), int(sys.argv[4]))
elif CMD == "churn":
    churn(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
elif CMD == "audit":
    audit(sys.argv[3:])
else:
    raise SystemExit(__doc__)
