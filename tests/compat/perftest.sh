#!/usr/bin/env bash
# compat.perftest.<group>: unmodified perftest tools over loopback, at their defaults and with -a
# (every size from 2 B to 8 MiB). Groups keep each ctest test short: write, read, send, atomic.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

group=${1:?usage: perftest.sh write|read|send|atomic|all}
dev=$(compat_device 127.0.0.1)
compat_log "loopback device: $dev"

# perftest -a runs 2^1 .. 2^23 bytes: 23 rows.
ALL_ROWS=23
# -F: no failure on cpufreq warnings, which say nothing about us.
common=(-d "$dev" -F)

pair() { # TOOL MIN_ROWS ARGS...
  local tool=$1 rows=$2
  shift 2
  compat_perftest "$tool${*:+ $*}" "$rows" "$tool" "${common[@]}" "$@" -- "$tool" "${common[@]}" "$@" 127.0.0.1
}

run_group() {
  case $1 in
    write)
      pair ib_write_bw 1
      pair ib_write_bw "$ALL_ROWS" -a -n 100
      pair ib_write_lat 1
      pair ib_write_lat "$ALL_ROWS" -a -n 100
      ;;
    read)
      pair ib_read_bw 1
      pair ib_read_bw "$ALL_ROWS" -a -n 100
      pair ib_read_lat 1
      pair ib_read_lat "$ALL_ROWS" -a -n 100
      ;;
    send)
      pair ib_send_bw 1
      pair ib_send_bw "$ALL_ROWS" -a -n 100
      pair ib_send_lat 1
      pair ib_send_lat "$ALL_ROWS" -a -n 100
      ;;
    atomic)
      # Atomics have one size (8 B), so perftest refuses -a; both atomic verbs instead.
      pair ib_atomic_bw 1
      pair ib_atomic_bw 1 -A CMP_AND_SWAP -n 1000
      pair ib_atomic_lat 1
      pair ib_atomic_lat 1 -A CMP_AND_SWAP -n 1000
      ;;
    *)
      echo "unknown group $1" >&2
      exit 2
      ;;
  esac
}

if [[ $group == all ]]; then
  for g in write read send atomic; do run_group "$g"; done
else
  run_group "$group"
fi

compat_finish
