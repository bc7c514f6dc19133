#!/usr/bin/env bash
# tools.cli: `softrdma run` gives an unmodified program the loader environment it needs, and
# passes its arguments and exit status through untouched; `config` lists the environment variables.
# Runs against a scratch lib dir, so it checks the command itself, not the library.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/lib"
: >"$scratch/lib/libibverbs.so.1"
PAIR_SRV_LOG=/dev/null
PAIR_CLI_LOG=$scratch/out

expect() { # NAME WANT GOT
  if [[ $2 == "$3" ]]; then compat_result "$1" 1; else compat_result "$1" 0 "want [$2], got [$3]"; fi
}

# Lib dir first in LD_LIBRARY_PATH, ahead of what the caller had.
got=$(SOFTRDMA_LIB_DIR=$scratch/lib LD_LIBRARY_PATH=/x/y "$SOFTRDMA" run printenv LD_LIBRARY_PATH)
expect "run prepends the lib dir to LD_LIBRARY_PATH" "$scratch/lib:/x/y" "$got"

# Not sanitized: no preload, no ASan options.
got=$(SOFTRDMA_LIB_DIR=$scratch/lib "$SOFTRDMA" run sh -c 'echo "[${LD_PRELOAD-unset}][${ASAN_OPTIONS-unset}]"')
expect "run sets no LD_PRELOAD for plain libraries" "[unset][unset]" "$got"

# Sanitized (marker with the runtimes): they are preloaded first, and leak checks are off.
printf '/rt/libasan.so.8\n/rt/libubsan.so.1\n' >"$scratch/lib/SANITIZED"
got=$(SOFTRDMA_LIB_DIR=$scratch/lib LD_PRELOAD=/mine.so ASAN_OPTIONS=abort_on_error=1 \
  "$SOFTRDMA" run -- sh -c 'echo "$ASAN_OPTIONS"; echo "$LD_PRELOAD"' 2>/dev/null || true)
expect "run preloads sanitizer runtimes before the caller's" \
  "detect_leaks=0:abort_on_error=1"$'\n'"/rt/libasan.so.8:/rt/libubsan.so.1:/mine.so" "$got"
rm "$scratch/lib/SANITIZED"

# Open MPI's pml ucx needs to be told that a device whose driver is not mlx* will do.
got=$(SOFTRDMA_LIB_DIR=$scratch/lib "$SOFTRDMA" run printenv OMPI_MCA_opal_common_ucx_devices)
expect "run sets OMPI_MCA_opal_common_ucx_devices=any" any "$got"

# --iwarp: the program is offered the iWARP devices (SOFTRDMA_TRANSPORT=iwarp); without it the
# caller's choice stands.
got=$(SOFTRDMA_LIB_DIR=$scratch/lib "$SOFTRDMA" run --iwarp printenv SOFTRDMA_TRANSPORT)
expect "run --iwarp sets SOFTRDMA_TRANSPORT=iwarp" iwarp "$got"
got=$(SOFTRDMA_LIB_DIR=$scratch/lib SOFTRDMA_TRANSPORT=both "$SOFTRDMA" run printenv SOFTRDMA_TRANSPORT)
expect "run keeps the caller's SOFTRDMA_TRANSPORT" both "$got"

# Arguments, dashes included, reach the program unchanged; so does its exit status.
got=$(SOFTRDMA_LIB_DIR=$scratch/lib "$SOFTRDMA" run -- printf '%s|' -a --b 'c d' -- -v)
expect "run passes arguments through" "-a|--b|c d|--|-v|" "$got"
rc=0
SOFTRDMA_LIB_DIR=$scratch/lib "$SOFTRDMA" run sh -c 'exit 7' || rc=$?
expect "run passes the exit status through" 7 "$rc"
rc=0
SOFTRDMA_LIB_DIR=$scratch/lib "$SOFTRDMA" run no-such-program-softrdma 2>/dev/null || rc=$?
expect "run of a missing program exits 127" 127 "$rc"
rc=0
SOFTRDMA_LIB_DIR=$scratch/nolib "$SOFTRDMA" run true 2>/dev/null || rc=$?
expect "run refuses a lib dir without libibverbs.so.1" 127 "$rc"

# Without SOFTRDMA_LIB_DIR the lib dir is <exe dir>/../lib.
got=$("$SOFTRDMA" version | sed -n 's/^lib dir for `softrdma run`: //p')
expect "lib dir defaults to <bin>/../lib" "$(realpath -m "$SOFTRDMA_BIN/../lib")" "$got"

# `devices --iwarp` lists the iWARP devices (the real library: the command's own), loopback last.
got=$("$SOFTRDMA" devices --iwarp | sed -n 's/^hca_id:\t//p' | tail -1)
expect "devices --iwarp lists softrdma_iw_lo last" softrdma_iw_lo "$got"
got=$("$SOFTRDMA" devices --iwarp --ip 127.0.0.1)
expect "devices --iwarp --ip 127.0.0.1 names softrdma_iw_lo" softrdma_iw_lo "$got"
got=$("$SOFTRDMA" devices | grep -c '^hca_id:.softrdma_iw_' || true)
expect "devices without a selection lists no iWARP device" 0 "$got"

# `config` lists every variable of the table: its value here (or unset), its default and its help.
got=$(env -u SOFTRDMA_SPIN_US "$SOFTRDMA" config | grep '^SOFTRDMA_SPIN_US ' || true)
expect "config shows an unset variable and its default" "SOFTRDMA_SPIN_US unset (default: 200)" "$got"
got=$(SOFTRDMA_SPIN_US=7 "$SOFTRDMA" config | grep '^SOFTRDMA_SPIN_US ' || true)
expect "config shows the value from the environment" "SOFTRDMA_SPIN_US = 7 (default: 200)" "$got"
got=$("$SOFTRDMA" config | grep -A1 '^SOFTRDMA_MPA_CRC ' | tail -1 || true)
expect "config shows type, readers and help" \
  '    bool, read by librdmacm: `1`: ask for MPA CRCs on every FPDU (docs/iwarp.md)' "$got"
got=$("$SOFTRDMA" config | grep -c '^SOFTRDMA_' || true)
expect "config lists as many variables as --markdown" "$("$SOFTRDMA" config --markdown | grep -c '^| `SOFTRDMA_')" "$got"
# The direct path's switch as every library reads it: off under SOFTRDMA_IMPAIR unless asked for.
got=$(env -u SOFTRDMA_DIRECT SOFTRDMA_IMPAIR=seed=1 "$SOFTRDMA" config | tail -1)
expect "config: no direct path under SOFTRDMA_IMPAIR" "direct path: off" "$got"
got=$(SOFTRDMA_DIRECT=1 SOFTRDMA_IMPAIR=seed=1 "$SOFTRDMA" config | tail -1)
expect "config: SOFTRDMA_DIRECT=1 wins over SOFTRDMA_IMPAIR" "direct path: on" "$got"
got=$(env -u SOFTRDMA_DIRECT -u SOFTRDMA_IMPAIR "$SOFTRDMA" config | tail -1)
expect "config: the direct path is on by default" "direct path: on" "$got"

compat_finish
