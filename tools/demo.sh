#!/usr/bin/env bash
# The softrdma demo: installs what is missing (only what the demo needs: tools/setup-deps.sh --demo),
# builds the libraries and the softrdma command (not the tests), then runs the unmodified Debian
# perftest binaries ib_write_bw and ib_write_lat between two processes on loopback over softrdma,
# and prints their results (tools/demo-run.sh). No RDMA hardware, kernel module or root needed (root
# only to install missing packages).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SOFTRDMA_BUILD:-$root/build}

"$root/tools/setup-deps.sh" --demo
echo "=== building softrdma in $build ==="
# A fresh build directory is configured without the tests (their packages are not installed); one
# tools/test.sh configured keeps them, and only the demo's targets are built either way.
testing=()
[[ -f $build/CMakeCache.txt ]] || testing=(-DBUILD_TESTING=OFF)
blog=$(mktemp "${TMPDIR:-/tmp}/softrdma-demo-build.XXXXXX")
if ! { cmake -S "$root" -B "$build" -G Ninja "${testing[@]}" && ninja -C "$build" -j "$(nproc)" softrdma rdmacm mlx5 efa; } \
  >"$blog" 2>&1; then
  tail -n 60 "$blog"
  echo "demo: build failed (full log: $blog)" >&2
  exit 1
fi

exec "$root/tools/demo-run.sh" "$build/bin/softrdma"
