#!/usr/bin/env bash
# The softrdma demo: installs what is missing, builds, then runs the unmodified Debian perftest
# binaries ib_write_bw and ib_write_lat between two processes on loopback over softrdma, and
# prints their results. No RDMA hardware, kernel module or root needed (root only to install
# missing packages).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SOFTRDMA_BUILD:-$root/build}

"$root/tools/setup-deps.sh"
echo "=== building softrdma in $build ==="
blog=$(mktemp "${TMPDIR:-/tmp}/softrdma-demo-build.XXXXXX")
if ! { cmake -S "$root" -B "$build" -G Ninja && ninja -C "$build"; } >"$blog" 2>&1; then
  tail -n 60 "$blog"
  echo "demo: build failed (full log: $blog)" >&2
  exit 1
fi

export SOFTRDMA_BIN=$build/bin
. "$root/tests/compat/compat_lib.sh"
compat_require_softrdma

echo "=== devices ==="
"$SOFTRDMA" devices
dev=$(compat_device 127.0.0.1)

# Server on CPU 0, client on CPU 1, as the benchmark does, so the two do not fight for a core.
if (($(nproc) >= 2)); then
  SRV_PREFIX=(taskset -c 0)
  CLI_PREFIX=(taskset -c 1)
fi

show() { # TITLE
  echo
  echo "=== $1 (client side; server log: $PAIR_SRV_LOG) ==="
  cat "$PAIR_CLI_LOG"
}

ok=1
for tool in ib_write_bw ib_write_lat; do
  port=$(compat_free_port)
  SRV=("$tool" -d "$dev" -F -p "$port")
  CLI=("$tool" -d "$dev" -F -p "$port" 127.0.0.1)
  if compat_pair "$tool" "$port"; then
    show "$tool -d $dev"
  else
    ok=0
    compat_result "$tool" 0
  fi
done
((ok)) && echo && echo "demo: both runs completed over softrdma ($dev)"
((ok))
