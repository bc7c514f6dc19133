#!/usr/bin/env bash
# The Debian package, end to end (root, a disposable machine: it installs into /usr): builds the tree
# as a Debian packager would (build type None, dpkg-buildflags' hardening flags, no -Werror of ours,
# BUILD_TESTING=OFF), packs softrdma_<version>_amd64.deb (CPack, packaging/CMakeLists.txt), checks it
# with lintian (errors fail), installs it with apt-get, runs the README demo's programs from the
# installed /usr/bin/softrdma (tools/demo-run.sh), then purges it and checks that none of its files
# is left. About 3 minutes on 2 cores, most of it the build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
export DEBIAN_FRONTEND=noninteractive
for tool in lintian cpack; do
  command -v "$tool" >/dev/null || { echo "deb: $tool missing (tools/setup-deps.sh)" >&2; exit 1; }
done
if dpkg-query -W -f='${Status}' softrdma 2>/dev/null | grep -q "install ok installed"; then
  echo "deb: a softrdma package is already installed; remove it first" >&2
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-deb.XXXXXX")

BUILD_TYPES_DIR=$out "$root/.ci/build-types.sh" dpkg
build=$out/dpkg

echo "=== deb: package ==="
(cd "$build" && cpack -G DEB -B "$out/pkg") >"$out/cpack.log" 2>&1 || { cat "$out/cpack.log"; exit 1; }
deb=$(ls "$out"/pkg/softrdma_*_"$(dpkg --print-architecture)".deb)
dpkg-deb --info "$deb" | grep -E '^ (Package|Version|Depends):'
echo "=== deb: lintian $(basename "$deb") ==="
lintian --fail-on error "$deb"

echo "=== deb: apt-get install ==="
apt-get install -y -q "$deb" </dev/null
files=$(dpkg -L softrdma)
status=0
man -w softrdma >/dev/null 2>&1 || [[ -f /usr/share/man/man1/softrdma.1.gz ]] || { echo "deb: no manual page installed"; status=1; }
COMPAT_LOG_DIR=$out/demo "$root/tools/demo-run.sh" /usr/bin/softrdma || status=1

echo "=== deb: apt-get remove --purge ==="
apt-get remove --purge -y -q softrdma </dev/null
if dpkg-query -W -f='${Status}' softrdma 2>/dev/null | grep -q "installed"; then
  echo "deb: softrdma is still known to dpkg after the purge"
  status=1
fi
# Every file and private directory of the package is gone (shared ones such as /usr/bin stay).
left=$(while read -r f; do
  if [[ -L $f || -f $f ]] || [[ -d $f && $f == */softrdma ]]; then echo "$f"; fi
done <<<"$files")
if [[ -n $left ]]; then
  echo "deb: left after the purge:"
  echo "$left"
  status=1
fi
((status == 0)) && echo "=== deb: built, lintian-clean, installed, ran the demo, purged ==="
rm -rf "$out"
exit $status
