#!/usr/bin/env bash
# compat.rc_pingpong: unmodified ibv_rc_pingpong over loopback, with payload validation (-c), at
# message sizes from 1 B to 1 MiB and path MTUs from 256 to 4096 (so messages of 1 to 4096
# packets, with and without segmentation).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

dev=$(compat_device 127.0.0.1)
compat_log "loopback device: $dev"

for mtu in 256 1024 4096; do
  for size in 1 4096 1048576; do
    iters=500
    ((size >= 1048576)) && iters=50
    name="rc_pingpong -s $size -m $mtu"
    port=$(compat_free_port)
    args=(ibv_rc_pingpong -d "$dev" -g 0 -c -p "$port" -s "$size" -m "$mtu" -n "$iters")
    SRV=("${args[@]}")
    CLI=("${args[@]}" 127.0.0.1)
    if compat_pair "$name" "$port"; then
      # Both sides print their totals; -c makes a side report corrupt payloads.
      if ! grep -q "$iters iters in" "$PAIR_SRV_LOG" || ! grep -q "$iters iters in" "$PAIR_CLI_LOG"; then
        compat_result "$name" 0 "no \"$iters iters in\" summary on both sides"
      elif grep -qiE "fail|error|invalid" "$PAIR_SRV_LOG" "$PAIR_CLI_LOG"; then
        compat_result "$name" 0 "a side reported an error"
      else
        compat_result "$name" 1
      fi
    else
      compat_result "$name" 0
    fi
  done
done

compat_finish
