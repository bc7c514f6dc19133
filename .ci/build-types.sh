#!/usr/bin/env bash
# Builds what is installed (libraries, the softrdma command; BUILD_TESTING=OFF) once per CMake build
# type, in unity batches (CMAKE_UNITY_BUILD), warnings as errors, or (type dpkg) as a Debian packager
# would: build type None with dpkg-buildflags' hardening flags (fortify, stack protector, relro) and no
# -Werror of ours, only Debian's own -Werror=format-security; CI builds that one in .ci/deb.sh, which
# packages it.
# tools/test.sh builds the whole tree, tests included, as RelWithDebInfo (the default) and with
# sanitizers, with -Werror and -Wformat-security; the tests are three quarters of the compile time,
# so they are not built again here.
#   .ci/build-types.sh [TYPE...]    default: Debug Release MinSizeRel
#   BUILD_TYPES_DIR=DIR ...         build in DIR/<type> and keep it (.ci/deb.sh packages DIR/dpkg)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
types=("$@")
((${#types[@]})) || types=(Debug Release MinSizeRel)
out=${BUILD_TYPES_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/softrdma-types.XXXXXX")}
status=0
for t in "${types[@]}"; do
  dir="$out/$t"
  if [[ $t == dpkg ]]; then
    command -v dpkg-buildflags >/dev/null || { echo "build-types: dpkg-buildflags missing (dpkg-dev)" >&2; exit 1; }
    args=(-DCMAKE_BUILD_TYPE=None -DBUILD_TESTING=OFF -DCMAKE_UNITY_BUILD=ON)
    env_flags=(CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
      CXXFLAGS="$(dpkg-buildflags --get CXXFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
      LDFLAGS="$(dpkg-buildflags --get LDFLAGS)")
  else
    # Unity batches (CMakeLists.txt), here and for dpkg: the same code and flags in about half the
    # time; the plain build of tools/test.sh compiles every file alone.
    args=(-DCMAKE_BUILD_TYPE="$t" -DSOFTRDMA_WERROR=ON -DBUILD_TESTING=OFF -DCMAKE_UNITY_BUILD=ON)
    env_flags=()
  fi
  echo "=== build type $t ==="
  if env "${env_flags[@]}" cmake -S "$root" -B "$dir" -G Ninja "${args[@]}" >"$dir.log" 2>&1 &&
    ninja -C "$dir" -j "$(nproc)" >>"$dir.log" 2>&1; then
    echo "=== build type $t: ok ==="
  else
    grep -E -B2 -A8 'error|FAILED' "$dir.log" | tail -n 60
    echo "=== build type $t: FAILED (log: $dir.log) ==="
    status=1
  fi
  [[ -n ${BUILD_TYPES_DIR:-} ]] || rm -rf "$dir"  # only the verdict is kept
done
exit $status
