#!/bin/sh
# The node image's root file system, made inside the Containerfile's `tools` stage (Debian with
# the packages below installed): only the programs weir and the CNI install step run, the
# shared libraries they load (ldd), iptables' extension modules, and busybox for the install
# step's shell and utilities. The final stage copies ROOT onto `scratch`, as kube-proxy's
# distroless image holds only the iptables/nft tools its modes call.
#
#   image-rootfs.sh ROOT
set -eu
root=${1:?usage: image-rootfs.sh ROOT}
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

# nft: nftables mode, NetworkPolicy, weir-cni's masquerade. iptables and ip6tables in both
# back ends (by name, as the proxy's iptables mode calls them). ipset: ipvs mode. conntrack:
# operators' `conntrack -L`. curl and jq: the CNI install step reads this Node's pod CIDR.
tools="/usr/sbin/nft /usr/sbin/ipset /usr/sbin/conntrack /usr/bin/curl /usr/bin/jq /usr/bin/busybox"
for family in iptables ip6tables; do
  for backend in "" -nft -legacy; do
    for suffix in "" -save -restore; do
      tools="$tools /usr/sbin/$family$backend$suffix"
    done
  done
done

# Merged /usr, as Debian's: /bin, /sbin, /lib and /lib64 are links into /usr.
mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib/$arch" "$root/usr/lib64" \
  "$root/etc/ssl/certs" "$root/tmp" "$root/run" "$root/var"
for d in bin sbin lib lib64; do ln -sfn "usr/$d" "$root/$d"; done
ln -sfn ../run "$root/var/run"
chmod 1777 "$root/tmp"

# A file at its own path; a symlink as a link straight to its final target, which is copied.
copy() {
  if [ -L "$1" ]; then
    target=$(readlink -f "$1")
    copy "$target"
    mkdir -p "$root$(dirname "$1")"
    ln -sfn "$target" "$root$1"
  elif [ ! -e "$root$1" ]; then
    mkdir -p "$root$(dirname "$1")"
    cp -p "$1" "$root$1"
  fi
}

# Every shared library a program loads, and the loader.
libraries() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
}

for t in $tools; do
  [ -e "$t" ] || { echo "image-rootfs.sh: $t is not installed" >&2; exit 1; }
  copy "$t"
  for lib in $(libraries "$(readlink -f "$t")"); do copy "$lib"; done
done
# iptables loads its match and target extensions at run time.
for ext in /usr/lib/"$arch"/xtables/*.so; do
  copy "$ext"
  for lib in $(libraries "$ext"); do copy "$lib"; done
done
# weir and weir-cni (copied in by the final stage) need glibc, libm and libgcc_s.
for lib in /usr/lib/"$arch"/libgcc_s.so.1 /usr/lib/"$arch"/libm.so.6; do copy "$lib"; done
for f in /etc/ssl/certs/ca-certificates.crt /etc/protocols /etc/services /etc/nsswitch.conf; do
  copy "$f"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# busybox: the shell and the utilities the install step uses, where no real tool of that name
# was copied.
for applet in $(busybox --list); do
  [ -e "$root/usr/bin/$applet" ] || [ -e "$root/usr/sbin/$applet" ] || ln -s busybox "$root/usr/bin/$applet"
done
