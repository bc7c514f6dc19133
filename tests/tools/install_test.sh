#!/usr/bin/env bash
# tools.install: `cmake --install` to a temporary prefix gives a working softrdma. The libraries land
# in the private directory only (no libibverbs where the system's loader looks), the prefix still
# works after it is moved (the command finds them relative to itself), `softrdma run` enters the
# same device view as the build tree's command, a program it runs loads the installed libraries, and
# the README's demo (ib_write_bw + ib_write_lat on loopback, tools/demo-run.sh) runs from it. The
# opt-in ld.so.conf.d snippet puts the private directory first in a loader cache built with it.
#   tests/tools/install_test.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: install_test.sh BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
command -v ib_write_bw >/dev/null || { echo "SKIP: perftest is not installed"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$tmp/first" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
# The opt-in loader snippet names the private directory, and ld.so.conf.d's order puts it before the
# system's libibverbs (checked on a private cache: ldconfig -C, nothing of the host's changes).
snippet=$tmp/first/share/softrdma/00-softrdma.conf
grep -qx "$tmp/first/lib/softrdma" "$snippet" || grep -qx "$tmp/first/lib/[^/]*/softrdma" "$snippet" \
  || fail "$snippet does not name the private directory: $(grep -v '^#' "$snippet")"
ldconfig=$(PATH=$PATH:/sbin:/usr/sbin command -v ldconfig || true)
if [[ -n $ldconfig && -d /etc/ld.so.conf.d ]]; then
  mkdir "$tmp/conf.d"
  cp /etc/ld.so.conf.d/*.conf "$snippet" "$tmp/conf.d/" 2>/dev/null || true
  echo "include $tmp/conf.d/*.conf" >"$tmp/ld.so.conf"
  "$ldconfig" -X -f "$tmp/ld.so.conf" -C "$tmp/ld.so.cache" 2>/dev/null  # -X: no symlinks made
  first=$("$ldconfig" -p -C "$tmp/ld.so.cache" | awk '$1 == "libibverbs.so.1" { print $NF; exit }')
  [[ $first == "$tmp/first/"* ]] || fail "with the snippet, the loader's first libibverbs.so.1 is $first"
fi
mv "$tmp/first" "$tmp/moved"
prefix=$tmp/moved
softrdma=$prefix/bin/softrdma
[[ -x $softrdma ]] || fail "no bin/softrdma installed"

libdir=$("$softrdma" version | sed -n 's/^lib dir for `softrdma run`: //p')
[[ $libdir == "$prefix"/* && $libdir != "$prefix/lib" ]] || fail "lib dir $libdir is not a private directory under $prefix"
for so in libibverbs.so.1 librdmacm.so.1 libmlx5.so.1 libefa.so.1; do
  [[ -e $libdir/$so ]] || fail "$libdir lacks $so"
done
stray=$(find "$prefix" -name 'lib*.so*' ! -path "$libdir/*")
[[ -z $stray ]] || fail "libraries outside $libdir: $stray"
bound=$(realpath "$("$softrdma" version | sed -n 's/^libibverbs: //p')")
[[ $bound == "$(realpath "$libdir/libibverbs.so.1")" ]] || fail "the command bound to $bound, not the installed libibverbs"

# A program run by the installed command loads the installed libraries, in the same view.
loaded=$("$softrdma" run -- sh -c 'ldd "$(command -v ib_write_bw)"')
grep -qE "libibverbs.so.1 => $libdir/libibverbs.so.1" <<<"$loaded" || { echo "$loaded"; fail "ib_write_bw would not load $libdir/libibverbs.so.1"; }
view() { "$1" run --print-env -- true 2>&1 | grep -E 'device view' | sed 's/(.*)//'; }
want=$(view "$build/bin/softrdma")
got=$(view "$softrdma")
[[ $got == "$want" ]] || fail "device view: installed '$got', build tree '$want'"
if [[ $want == *"mount namespace"* || $want == *"view:"* ]]; then
  "$softrdma" run -- ls /sys/class/infiniband | grep -q softrdma_lo || fail "the device view shows no softrdma_lo"
fi

COMPAT_LOG_DIR=${COMPAT_LOG_DIR:-$tmp/logs} "$root/tools/demo-run.sh" "$softrdma"
echo "PASS: installed to a temporary prefix, moved, and ran the demo from it"
