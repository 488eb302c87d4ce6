#!/usr/bin/env python3
"""deploy/ as applied to the cluster up.sh makes: the same objects, with what a cluster of
namespaces on one machine needs changed, and nothing else.

- One DaemonSet (and CNI ConfigMap) per node, pinned by nodeSelector: both nodes share this
  machine's filesystem, so each node's hostPaths (CNI bin and conf dirs, proxy state, routes
  run dir, IPAM dataDir) point into that node's own directory under RUN_DIR instead of /opt/cni,
  /etc/cni, /var/lib and /run, which belong to this machine.
- The image: the one `bash scripts/dev.sh image` built, imported into each node's containerd
  (imagePullPolicy Never).
- weir-apiserver: the control plane's address (what the ConfigMap asks the operator to fill in).
usage: render_deploy.py RUN_DIR IMAGE > deploy.yaml
"""
import copy
import json
import pathlib
import sys

import yaml

run, image = sys.argv[1], sys.argv[2]
env = dict(l.strip().split("=", 1) for l in open(f"{run}/env") if "=" in l)
nodes = env["NODES"].strip('"').split()
deploy = pathlib.Path(__file__).resolve().parents[2] / "deploy"

out = []
for name in ["rbac.yaml", "apiserver.yaml", "proxy-config.yaml"]:
    for doc in yaml.safe_load_all((deploy / name).read_text()):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "weir-apiserver":
            doc["data"]["KUBERNETES_SERVICE_HOST"] = env["CP_IP"]
            doc["data"]["KUBERNETES_SERVICE_PORT"] = "16443"
        if doc:
            out.append(doc)

cni = next(d for d in yaml.safe_load_all((deploy / "cni-config.yaml").read_text()) if d)
ds = next(d for d in yaml.safe_load_all((deploy / "daemonset.yaml").read_text()) if d)
host_paths = {
    "/opt/cni/bin": "cni-bin",
    "/etc/cni/net.d": "cni/net.d",
    "/var/lib/weir/proxy": "weir-proxy",
    "/run/xtables.lock": "xtables.lock",
}
for node in nodes:
    own = f"{run}/{node}"
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
