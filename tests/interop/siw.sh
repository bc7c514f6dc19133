#!/usr/bin/env bash
# siw.sh: the Linux kernel's soft-iWARP (siw.ko) for the rxe-vm guests, built from Debian's own
# kernel source for exactly the kernel the guests boot, and loaded into a running guest.
#
#   tests/interop/siw.sh build            build (or reuse) the modules; prints the directory holding them
#   tests/interop/siw.sh load VM [VARIANT] push siw.ko into guest VM, load it, create siw0 on eth0
#   tests/interop/siw.sh unload VM         delete siw0 and remove the module from guest VM
#
# Debian's 6.1 kernel is built with "# CONFIG_RDMA_SIW is not set", so the guests ship only rdma_rxe;
# siw's dependencies (ib_core, libcrc32c) and its user-space provider (libsiw in ibverbs-providers)
# are there. The module is built out of tree against linux-headers-<guest kernel> (the exact version
# the guest boots) from linux-source-6.1 of the same package version.
#
# In 6.1 siw's MPA options (mpa_crc_required, peer_to_peer, ...) are `const bool` in siw_main.c, not
# module parameters, so the non-default behaviours are separate builds of the same source with one
# constant changed (VARIANT):
#   stock  siw.ko      as Debian would ship it: MPA rev 2, enhanced, no peer-to-peer, CRC off unless asked
#   crc    siw-crc.ko  mpa_crc_required = true: asks for CRC in its MPA request and reply
#   p2p    siw-p2p.ko  peer_to_peer = true: as initiator offers peer-to-peer with WRITE and READ RTR
#
# Needs root (apt-get, the guests). Build cache: SIW_BUILD_DIR (default $RXEVM_DIR/siw, RXEVM_DIR
# default /var/tmp/rxe-vm). The guest kernel version comes from the harness ($RXEVM_DIR/kernel).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RXEVM_TOOLS=${RXEVM_TOOLS:-$ROOT/../shared/tools/rxe-vm}
RXEVM_DIR=${RXEVM_DIR:-/var/tmp/rxe-vm}
SIW_BUILD_DIR=${SIW_BUILD_DIR:-$RXEVM_DIR/siw}
SIW_VARIANTS=(stock crc p2p)

die() { echo "siw.sh: $*" >&2; exit 1; }
say() { echo "[siw $(date +%H:%M:%S)] $*" >&2; }

siw_ko_name() { # VARIANT -> file name
  case $1 in stock) echo siw.ko ;; crc | p2p) echo "siw-$1.ko" ;; *) die "unknown variant '$1' (stock, crc, p2p)" ;; esac
}

# The guest kernel: ABI name (6.1.0-57-amd64) and Debian package version (6.1.192-3), both from
# what rxe-vm's setup.sh downloaded.
guest_kernel() {
  KVER=$(cat "$RXEVM_DIR/kernel/VERSION" 2>/dev/null) || die "no $RXEVM_DIR/kernel/VERSION: run $RXEVM_TOOLS/setup.sh first"
  local deb
  deb=$(cat "$RXEVM_DIR/kernel/DEB" 2>/dev/null) || die "no $RXEVM_DIR/kernel/DEB"
  # linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb -> 6.1.192-3
  KPKGVER=$(echo "$deb" | sed -E 's/^[^_]+_([^_]+)_[^_]+\.deb$/\1/')
  KSERIES=$(echo "$KVER" | cut -d. -f1,2) # 6.1
  [[ -n $KPKGVER && $KPKGVER != "$deb" ]] || die "cannot read the package version from '$deb'"
}

build() {
  guest_kernel
  local out=$SIW_BUILD_DIR/$KVER stamp=$SIW_BUILD_DIR/$KVER/STAMP
  if [[ -f $stamp && $(cat "$stamp") == "$KPKGVER" ]]; then
    local v ok=1
    for v in "${SIW_VARIANTS[@]}"; do [[ -f $out/$(siw_ko_name "$v") ]] || ok=0; done
    if ((ok)); then echo "$out"; return 0; fi
  fi
  mkdir -p "$out"
  local hdr=/usr/src/linux-headers-$KVER
  if [[ ! -f $hdr/Makefile ]]; then
    say "installing linux-headers-$KVER (must match the guest kernel exactly)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "linux-headers-$KVER" >"$out/apt.log" 2>&1 ||
      { tail -n 20 "$out/apt.log" >&2; die "apt-get install linux-headers-$KVER failed (log $out/apt.log)"; }
  fi
  # The headers package must be the same build as the guest's image, or vermagic/CRCs differ.
  local hver
  hver=$(dpkg-query -W -f '${Version}' "linux-headers-$KVER" 2>/dev/null || true)
  [[ $hver == "$KPKGVER" ]] || die "linux-headers-$KVER is $hver, the guest kernel is $KPKGVER"
  local src=$out/linux-source-$KSERIES
  if [[ ! -f $src/drivers/infiniband/sw/siw/Makefile ]]; then
    local dl=$out/dl
    mkdir -p "$dl"
    say "downloading linux-source-$KSERIES=$KPKGVER"
    (cd "$dl" && apt-get download "linux-source-$KSERIES=$KPKGVER") >"$out/dl.log" 2>&1 ||
      { tail -n 20 "$out/dl.log" >&2; die "apt-get download linux-source-$KSERIES=$KPKGVER failed (log $out/dl.log)"; }
    dpkg -x "$dl"/linux-source-"$KSERIES"_*.deb "$dl/x"
    tar -C "$out" -xaf "$dl/x/usr/src/linux-source-$KSERIES.tar.xz" "linux-source-$KSERIES/drivers/infiniband/sw/siw"
    rm -rf "$dl" # 140 MB .deb + 130 MB tarball; only the siw folder is kept
  fi
  local v dir name
  for v in "${SIW_VARIANTS[@]}"; do
    name=$(siw_ko_name "$v")
    dir=$out/build-$v
    rm -rf "$dir"
    cp -r "$src/drivers/infiniband/sw/siw" "$dir"
    case $v in
      crc) sed -i 's/^const bool mpa_crc_required;/const bool mpa_crc_required = true;/' "$dir/siw_main.c" ;;
      p2p) sed -i 's/^const bool peer_to_peer;/const bool peer_to_peer = true;/' "$dir/siw_main.c" ;;
    esac
    if [[ $v != stock ]] && cmp -s "$dir/siw_main.c" "$src/drivers/infiniband/sw/siw/siw_main.c"; then
      die "variant $v: the constant to change was not found in siw_main.c"
    fi
    say "building $name against $hdr"
    make -C "$hdr" M="$dir" CONFIG_RDMA_SIW=m modules >"$out/make-$v.log" 2>&1 ||
      { tail -n 20 "$out/make-$v.log" >&2; die "building $name failed (log $out/make-$v.log)"; }
    # Without the debug info the module is 0.4 MB instead of 5 MB (it goes into the guest over ssh).
    strip --strip-debug -o "$out/$name" "$dir/siw.ko"
    local vermagic
    vermagic=$(tr '\0' '\n' <"$out/$name" | sed -n 's/^vermagic=//p')
    [[ $vermagic == "$KVER "* ]] || die "$name: vermagic '$vermagic' is not $KVER"
  done
  echo "$KPKGVER" >"$stamp"
  echo "$out"
}

guest() { "$RXEVM_TOOLS/guest-run.sh" "$@"; }

load() { # VM [VARIANT]
  local vm=$1 variant=${2:-stock} dir name
  name=$(siw_ko_name "$variant")
  dir=$(build)
  guest "$vm" 'cat > /root/siw.ko' <"$dir/$name"
  # rxe and siw on one netdev would give rdma_cm two devices for one IP: no rxe while siw runs.
  guest "$vm" 'set -e
    rdma link delete rxe0 2>/dev/null || true
    rmmod rdma_rxe 2>/dev/null || true
    if lsmod | grep -q "^siw "; then rdma link delete siw0 2>/dev/null || true; rmmod siw; fi
    modprobe ib_core; modprobe libcrc32c; modprobe ib_uverbs; modprobe rdma_ucm; modprobe iw_cm
    insmod /root/siw.ko
    rdma link add siw0 type siw netdev eth0
    i=0; until ibv_devinfo -d siw0 2>/dev/null | grep -q PORT_ACTIVE; do
      i=$((i+1)); [ $i -gt 100 ] && { echo "siw0 never became active" >&2; exit 1; }; sleep 0.1
    done
    ibv_devinfo -d siw0 | grep -E "hca_id|transport|state|link_layer"' </dev/null
  say "$vm: siw0 up ($name)"
}

unload() { # VM
  guest "$1" 'rdma link delete siw0 2>/dev/null || true; rmmod siw 2>/dev/null || true' </dev/null
}

case ${1:-} in
  build) build ;;
  load) [[ $# -ge 2 ]] || die "usage: siw.sh load VM [stock|crc|p2p]"; load "$2" "${3:-stock}" ;;
  unload) [[ $# -ge 2 ]] || die "usage: siw.sh unload VM"; unload "$2" ;;
  *) die "usage: siw.sh build | load VM [stock|crc|p2p] | unload VM" ;;
esac
