#!/usr/bin/env python3
"""deploy/ as applied to the cluster up.sh makes: the objects `kubectl apply -k` would send
(kubectl kustomize, of deploy/ or of the proxy-only overlay), with what a cluster of namespaces
on one machine needs changed, and nothing else.

- One DaemonSet (and CNI ConfigMap, where there is one) per node, pinned by nodeSelector: both
  nodes share this machine's filesystem, so each node's hostPaths (CNI bin and conf dirs, proxy
  state, IPAM dataDir) point into that node's own directory under RUN_DIR instead of /opt/cni,
  /etc/cni, /var/lib and /run, which belong to this machine.
- The image: the one `bash scripts/dev.sh image` built, imported into each node's containerd
  (imagePullPolicy Never).
- weir-apiserver: the control plane's address (what the ConfigMap asks the operator to fill in).
usage: render_deploy.py RUN_DIR IMAGE [full|proxy-only] > deploy.yaml
"""
import copy
import json
import pathlib
import subprocess
import sys

import yaml

run, image = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "full"
if mode not in ("full", "proxy-only"):
    sys.exit(f"render_deploy.py: the mode is full or proxy-only, not {mode}")
env = dict(l.strip().split("=", 1) for l in open(f"{run}/env") if "=" in l)
nodes = env["NODES"].strip('"').split()
deploy = pathlib.Path(__file__).resolve().parents[2] / "deploy"
source = deploy if mode == "full" else deploy / mode
# The cluster's own kubectl (kustomize is built in): what `kubectl apply -k` would send.
rendered = subprocess.run([env["KUBECTL"], "kustomize", str(source)], check=True,
                          capture_output=True, text=True).stdout
docs = [d for d in yaml.safe_load_all(rendered) if d]

out, cni, ds = [], None, None
for doc in docs:
    kind, name = doc["kind"], doc["metadata"]["name"]
    if kind == "ConfigMap" and name == "weir-apiserver":
        doc["data"]["KUBERNETES_SERVICE_HOST"] = env["CP_IP"]
        doc["data"]["KUBERNETES_SERVICE_PORT"] = "16443"
    if kind == "ConfigMap" and name == "weir-cni-config":
        cni = doc
    elif kind == "DaemonSet" and name == "weir":
        ds = doc
    else:
        out.append(doc)
host_paths = {
    "/opt/cni/bin": "cni-bin",
    "/etc/cni/net.d": "cni/net.d",
    "/var/lib/weir/proxy": "weir-proxy",
    "/run/xtables.lock": "xtables.lock",
}
for node in nodes:
    own = f"{run}/{node}"
    if cni is not None:
        c = copy.deepcopy(cni)
        c["metadata"]["name"] = f"weir-cni-config-{node}"
        conflist = yaml.safe_load(c["data"]["10-weir.conflist"])  # JSON is YAML
        conflist["plugins"][0]["ipam"]["dataDir"] = f"{own}/cni/networks"
        c["data"]["10-weir.conflist"] = json.dumps(conflist, indent=2)
        out.append(c)
    d = copy.deepcopy(ds)
    d["metadata"]["name"] = f"weir-{node}"
    spec = d["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    for ctr in spec.get("initContainers", []) + spec["containers"]:
        ctr["image"] = image
        ctr["imagePullPolicy"] = "Never"
    for v in spec["volumes"]:
        if "hostPath" in v:
            p = v["hostPath"]["path"]
            v["hostPath"]["path"] = f"{own}/{host_paths.get(p, p.strip('/').replace('/', '-'))}"
        if v.get("configMap", {}).get("name") == "weir-cni-config":
            v["configMap"]["name"] = f"weir-cni-config-{node}"
    out.append(d)

yaml.safe_dump_all(out, sys.stdout, sort_keys=False)
