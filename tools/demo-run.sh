#!/usr/bin/env bash
# The demo's programs: the unmodified Debian perftest binaries ib_write_bw and ib_write_lat between
# two processes on loopback over softrdma, with their results. tools/demo.sh runs it after building;
# the install test and CI run it with an installed command.
#   tools/demo-run.sh [SOFTRDMA]    SOFTRDMA: the softrdma command (default: build/bin/softrdma,
#                                   or $SOFTRDMA_BUILD/bin/softrdma)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOFTRDMA=${1:-${SOFTRDMA_BUILD:-$root/build}/bin/softrdma}
. "$root/tests/compat/compat_lib.sh"
compat_require_softrdma

echo "=== devices ($SOFTRDMA) ==="
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
