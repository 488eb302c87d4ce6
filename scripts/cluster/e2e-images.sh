#!/usr/bin/env bash
# Build, from local files only, every container image the Kubernetes e2e suite's sig-network
# [Conformance] tests start, under exactly the name the suite asks for, so the nodes' containerd
# (namespace k8s.io) has them and pods with imagePullPolicy IfNotPresent never pull.
#
# Usage: e2e-images.sh KUBE_BUILD OUT_DIR
#   KUBE_BUILD/bin/agnhost   static agnhost (k8s.io/kubernetes/test/images/agnhost of the suite's version)
#   KUBE_BUILD/bin/e2e.test  the suite; `e2e.test --list-images` names the images. Without it the
#                            names come from the Kubernetes source's test/utils/image/manifest.go.
#   -> OUT_DIR/<name>-<tag>.tar (docker-archive, for `ctr -n k8s.io images import`), OUT_DIR/images.txt
# Idempotent: an image whose inputs (arguments, host files' size and mtime) are unchanged is not
# rebuilt (mkimage.py --stamp); tarballs of images no longer wanted are removed.
# Environment: KUBE_SRC = the Kubernetes source tree (default: the Go module cache's
# k8s.io/kubernetes@VERSION, VERSION from KUBE_BUILD/VERSION or kube/version.sh).
#
# Which images, and why (test/e2e/network/*.go, test/e2e/common/network/*.go and the framework
# helpers they call):
#   Agnhost          nearly all of them: netexec/serve-hostname/porter/test-webserver/pause servers,
#                    exec pods (e2epod.CreateExecPodOrFail, NewExecPodSpec host-exec pods, the
#                    NetworkingTestConfig test pods) that run `/bin/sh -x -c` with curl, nc, wget,
#                    seq, echo, test, timeout; the DNS tests' "musl" prober (sh -c: seq, dig, test,
#                    getent hosts, echo, sleep); `/agnhost dns-suffix|dns-server-list`.
#                    porter (proxy tests) serves TLS with ./localhost.crt and ./localhost.key.
#   GlibcDnsTesting  the DNS tests' "glibc" prober: sh -c with seq, dig, test, getent, echo, sleep.
#   Nginx            EndpointsController/EndpointSlice "should create Endpoints ... for Pods matching
#                    a Service": two plain pods that only have to run.
#   Pause            "Service endpoints latency should not be very high": a Deployment of pause.
#   BusyBox          the framework's default test image (e2epod.MakePodSpec, GetDefaultTestImage);
#                    no sig-network [Conformance] test starts it directly, built because it is cheap.
#
# What the images hold, against upstream:
#   agnhost            /agnhost (ENTRYPOINT ["/agnhost"], CMD ["pause"]), /agnhost-2, /uploads,
#                      /localhost.{crt,key}; Debian's dig/nslookup/host (bind9), curl, nc
#                      (netcat-openbsd, as upstream), GNU wget (busybox 1.35's `wget -T N` segfaults),
#                      getent (libc-bin), bash and dash as /bin/sh, each with the shared libraries ldd
#                      lists and the loader; busybox-static applets in /bin for the rest (seq, sleep,
#                      timeout, hostname, cat, grep, ...);
#                      /etc/nsswitch.conf (hosts: files dns), host.conf, hosts, services, protocols,
#                      passwd/group (incl. user-defined-in-image 1000 / group-defined-in-image 50000).
#                      UPSTREAM IS ALPINE (musl libc, busybox ash as sh): the DNS tests call its prober
#                      "musl". Ours is glibc from this Debian host, so both DNS probers run glibc (the
#                      tests only check that the lookups answer), and sh is dash, not ash: Debian's
#                      busybox-static ash runs its own applets before PATH, and its nc has no -u.
#                      Not included: coredns, iperf, socat, ss/iproute2, the fake registry (used by no
#                      sig-network [Conformance] test).
#   glibc-dns-testing  upstream debian:bookworm-slim + dnsutils (no ENTRYPOINT, CMD ["bash"]): the same
#                      Debian dig/nslookup/host, getent, bash, dash as /bin/sh (as Debian), busybox
#                      applets for the rest; CMD ["bash"].
#   busybox            Debian's busybox-static (1.35, upstream 1.37) with every applet in /bin; CMD ["sh"].
#   nginx              Debian's nginx (1.22, upstream 1.27-alpine) with its libraries, a config like the
#                      upstream default (port 80, /usr/share/nginx/html), busybox applets; CMD ["nginx",
#                      "-g", "daemon off;"], STOPSIGNAL SIGQUIT, user nginx (101).
#   pause              pause.c of the same Kubernetes, gcc -static; ENTRYPOINT ["/pause"], USER 65535:65535.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
usage="usage: e2e-images.sh KUBE_BUILD OUT_DIR"
KB=${1:?$usage}
OUT=${2:?$usage}
die() { echo "e2e-images: $*" >&2; exit 1; }
log() { echo "e2e-images: $*" >&2; }
[ -x "$KB/bin/agnhost" ] || die "$KB/bin/agnhost: not found (or not executable)"
KB=$(cd "$KB" && pwd)
mkdir -p "$OUT/.work"
OUT=$(cd "$OUT" && pwd)
WORK=$OUT/.work

# --- Debian packages the images are made of -------------------------------------------------
PKGS="busybox-static bind9-dnsutils bind9-host curl wget netcat-openbsd libc-bin bash dash nginx gcc libc6-dev"
missing=""
for p in $PKGS; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
  log "installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086 # word splitting of the package list is intended
  apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; }
fi

# --- the Kubernetes source (manifest.go, pause.c, agnhost's porter certificate) ---------------
if [ -s "$KB/VERSION" ]; then VERSION=$(cat "$KB/VERSION"); else VERSION=$(bash "$HERE/kube/version.sh"); fi
[ -n "$VERSION" ] || die "cannot tell the Kubernetes version (no $KB/VERSION, kube/version.sh gave nothing)"
if [ -z "${KUBE_SRC:-}" ]; then
  GO=$(command -v go || echo /usr/local/go/bin/go)
  modcache=""
  [ -x "$GO" ] && modcache=$("$GO" env GOMODCACHE 2>/dev/null || true)
  KUBE_SRC=${modcache:-${GOPATH:-$HOME/go}/pkg/mod}/k8s.io/kubernetes@$VERSION
fi
MANIFEST=$KUBE_SRC/test/utils/image/manifest.go
PORTER=$KUBE_SRC/test/images/agnhost/porter
if [ -f "$KB/pause.c" ]; then PAUSE_C=$KB/pause.c; else PAUSE_C=$KUBE_SRC/build/pause/linux/pause.c; fi
for f in "$PAUSE_C" "$PORTER/localhost.crt" "$PORTER/localhost.key"; do
  [ -f "$f" ] || die "$f: not found (set KUBE_SRC to the Kubernetes $VERSION source tree)"
done

# --- the image names: the suite's own list, picked by repository name ------------------------
LIST=$WORK/list-images.txt
if [ -x "$KB/bin/e2e.test" ]; then
  "$KB/bin/e2e.test" --list-images >"$LIST.tmp" 2>"$WORK/list-images.err" ||
    die "$KB/bin/e2e.test --list-images failed: $(tail -5 "$WORK/list-images.err")"
  mv "$LIST.tmp" "$LIST"
  log "image names from $KB/bin/e2e.test --list-images ($(grep -c . "$LIST") images)"
else
  [ -f "$MANIFEST" ] || die "no $KB/bin/e2e.test and no $MANIFEST"
  : >"$LIST"
  log "no $KB/bin/e2e.test: image names from $MANIFEST"
fi
# ImageID (manifest.go) : repository name. A name the suite lists with several tags (agnhost:
# Agnhost 2.66.1 and AgnhostPrev 2.55; nginx: Nginx and NginxNew; busybox: BusyBox and the CSI
# manifests' 1.36.1-1) is resolved to the ImageID's own entry in manifest.go.
WANT="Agnhost:agnhost GlibcDnsTesting:glibc-dns-testing BusyBox:busybox Nginx:nginx Pause:pause"
# shellcheck disable=SC2086 # one argument per wanted image
SELECTED=$(python3 - "$MANIFEST" "$LIST" $WANT <<'PY'
import os, re, sys
manifest, listfile, want = sys.argv[1], sys.argv[2], sys.argv[3:]
expected = {}
if os.path.exists(manifest):
    src = open(manifest).read()
    block = re.search(r"initRegistry = RegistryList\{(.*?)\n\t\}", src, re.S)
    reg = dict(re.findall(r'(\w+):\s*"([^"]*)"', block.group(1))) if block else {}
    for iid, r, name, ver in re.findall(
            r'configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*"([^"]+)",\s*"([^"]+)"\}', src):
        if r in reg:
            expected[iid] = f"{reg[r]}/{name}:{ver}"
listed = [l.strip() for l in open(listfile) if re.match(r"^\S+/\S+:\S+$", l.strip())]
err = False
for w in want:
    iid, name = w.split(":")
    exp = expected.get(iid)
    if listed:
        cands = sorted({r for r in listed if r.rsplit(":", 1)[0].rsplit("/", 1)[-1] == name})
        if exp in cands:
            pick = exp
        elif len(cands) == 1:
            pick = cands[0]
            if exp:
                print(f"e2e-images: note: {iid}: manifest.go says {exp}, the suite lists {pick}", file=sys.stderr)
        else:
            print(f"e2e-images: {iid}: repository {name!r}: {cands or 'not listed'} "
                  f"(manifest.go: {exp or 'n/a'})", file=sys.stderr)
            err = True
            continue
    elif exp:
        pick = exp
    else:
        print(f"e2e-images: {iid}: not in {manifest}", file=sys.stderr)
        err = True
        continue
    print(iid, pick)
sys.exit(1 if err else 0)
PY
) || die "could not derive the image names"

# --- building blocks ---------------------------------------------------------------------------
s() { printf '%s\0' "$@"; } # one spec (may hold newlines), NUL-terminated
STD_PATH=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mapfile -t APPLETS < <(/bin/busybox --list)
# busybox and its applets as /bin/<applet> -> busybox, except names given as real binaries ($@)
busybox_specs() {
  local a x skip
  s "bin/busybox=/bin/busybox"
  for a in "${APPLETS[@]}"; do
    skip=""
    for x in busybox "$@"; do [ "$a" = "$x" ] && skip=1; done
    [ -n "$skip" ] || s "bin/$a=@busybox"
  done
}
# files glibc reads for name service lookups (getent, dig's resolv.conf is the kubelet's)
NSSWITCH=$'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n'
HOSTS=$'127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
glibc_specs() {
  s "--text=etc/nsswitch.conf=$NSSWITCH"
  s "--text=etc/host.conf=multi on"$'\n'
  s "--text=etc/hosts=$HOSTS"
  local f
  for f in services protocols; do [ -f "/etc/$f" ] && s "etc/$f=/etc/$f:0644"; done
  return 0
}
# DNS tools, getent, bash and dash from Debian, with their libraries and the loader; /bin/sh is
# dash: Debian's busybox-static ash runs its own applets before searching PATH, so its `nc`
# (no -u) and `nslookup` would shadow the real ones.
GLIBC_BINS="usr/bin/dig usr/bin/nslookup usr/bin/host usr/bin/getent bin/bash bin/dash"
glibc_bin_specs() {
  local b
  for b in $GLIBC_BINS; do s "--bin=$b=/$b"; done
  s "bin/sh=@dash"
}
GLIBC_NAMES="dig nslookup host getent bash dash sh"
NL=$'\n'
passwd_specs() { # extra lines for /etc/passwd and /etc/group after root and nobody
  s "--text=etc/passwd=root:x:0:0:root:/root:/bin/sh"$'\n'"nobody:x:65534:65534:nobody:/nonexistent:/bin/false"$'\n'"${1:+$1$NL}"
  s "--text=etc/group=root:x:0:"$'\n'"nogroup:x:65534:"$'\n'"${2:+$2$NL}"
}

# --- the pause binary ----------------------------------------------------------------------------
build_pause() { # TAG -> path of a static pause built from $PAUSE_C
  local bin=$WORK/pause-$1
  if [ ! -x "$bin" ] || [ "$PAUSE_C" -nt "$bin" ]; then
    gcc -Os -Wall -Werror -static -DVERSION="v$1-weir" -o "$bin.tmp" "$PAUSE_C"
    strip "$bin.tmp" && mv "$bin.tmp" "$bin"
  fi
  printf %s "$bin"
}

NGINX_CONF='user nginx;
worker_processes auto;
error_log /dev/stderr notice;
pid /run/nginx.pid;
events {
    worker_connections 1024;
}
http {
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log /dev/stdout;
    sendfile on;
    keepalive_timeout 65;
    server {
        listen 80;
        server_name localhost;
        location / {
            root /usr/share/nginx/html;
            index index.html index.htm;
        }
    }
}
'
NGINX_INDEX='<!DOCTYPE html>
<html><head><title>Welcome to nginx!</title></head>
<body><h1>Welcome to nginx!</h1></body></html>
'

# --- build -------------------------------------------------------------------------------------
: >"$WORK/images.txt"
keep=" "
while read -r iid ref; do
  [ -n "$iid" ] || continue
  repo=${ref%:*} tag=${ref##*:}
  name=${repo##*/}
  tar=$OUT/$name-$tag.tar
  specs=()
  case $iid in
    Agnhost)
      mapfile -d "" -t specs < <(
        s "agnhost=$KB/bin/agnhost"
        s "agnhost-2=@agnhost"
        s "localhost.crt=$PORTER/localhost.crt:0644"
        s "localhost.key=$PORTER/localhost.key:0644"
        s "--dir=uploads"
        # shellcheck disable=SC2086 # a list of names
        busybox_specs $GLIBC_NAMES nc curl wget
        glibc_bin_specs
        s "--bin=usr/bin/curl=/usr/bin/curl"
        s "--bin=usr/bin/nc=/bin/nc.openbsd"
        s "--bin=usr/bin/wget=/usr/bin/wget"
        glibc_specs
        passwd_specs "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh" \
          "user-defined-in-image:x:1000:"$'\n'"group-defined-in-image:x:50000:user-defined-in-image"
        s "--env=$STD_PATH"
        s '--cmd=["pause"]'
        for p in 80 8080 8081 9376 5000; do s "--expose=$p/tcp"; done
      )
      entry='["/agnhost"]'
      ;;
    GlibcDnsTesting)
      mapfile -d "" -t specs < <(
        # shellcheck disable=SC2086 # a list of names
        busybox_specs $GLIBC_NAMES
        glibc_bin_specs
        glibc_specs
        passwd_specs "" ""
        s "--env=$STD_PATH"
        s '--cmd=["bash"]'
      )
      entry=null
      ;;
    BusyBox)
      mapfile -d "" -t specs < <(
        busybox_specs
        passwd_specs "" ""
        s "--env=$STD_PATH"
        s '--cmd=["sh"]'
      )
      entry=null
      ;;
    Nginx)
      mapfile -d "" -t specs < <(
        s "--bin=usr/sbin/nginx=/usr/sbin/nginx"
        s "etc/nginx/mime.types=/etc/nginx/mime.types:0644"
        s "--text=etc/nginx/nginx.conf=$NGINX_CONF"
        s "--text=usr/share/nginx/html/index.html=$NGINX_INDEX"
        for d in var/lib/nginx var/log/nginx var/cache/nginx run; do s "--dir=$d"; done
        busybox_specs
        glibc_specs
        passwd_specs "nginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin" "nginx:x:101:nginx"
        s "--env=$STD_PATH"
        s '--cmd=["nginx","-g","daemon off;"]'
        s "--stop-signal=SIGQUIT"
        s "--expose=80/tcp"
      )
      entry=null
      ;;
    Pause)
      specs=("pause=$(build_pause "$tag")" "--user=65535:65535")
      entry='["/pause"]'
      ;;
    *) die "no recipe for $iid" ;;
  esac
  python3 "$HERE/mkimage.py" "$tar" "$ref" "$entry" --stamp "${specs[@]}" >&2 </dev/null
  echo "$ref" >>"$WORK/images.txt"
  keep="$keep$(basename "$tar") "
done <<<"$SELECTED"

# tarballs this script made earlier for images no longer wanted
for f in "$OUT"/*.tar; do
  [ -e "$f.stamp" ] || continue
  case $keep in *" $(basename "$f") "*) ;; *) log "removing stale $f"; rm -f "$f" "$f.stamp" ;; esac
done
if ! cmp -s "$WORK/images.txt" "$OUT/images.txt"; then mv "$WORK/images.txt" "$OUT/images.txt"; fi
log "$(grep -c . "$OUT/images.txt") images in $OUT:"
cat "$OUT/images.txt"
