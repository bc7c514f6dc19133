#!/usr/bin/env bash
# compat.netns: two "hosts" (network namespaces joined by a veth pair), so traffic really crosses
# an Ethernet link as RoCEv2 over UDP instead of the same-host path. Server in namespace A, client
# in namespace B, each on the softrdma device bound to its veth address.
# Needs root and `ip netns`; exits 77 (skip) without them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

compat_netns_setup  # sets nsA nsB ipA ipB devA devB inA inB (exits 77 where impossible)

SRV_PREFIX=("${inA[@]}")
CLI_PREFIX=("${inB[@]}")

netns_pair() { # TOOL ARGS...
  local tool=$1 port name
  shift
  name="netns $tool${*:+ $*}"
  port=$(compat_free_port)
  SRV=("$tool" -d "$devA" -F -p "$port" "$@")
  CLI=("$tool" -d "$devB" -F -p "$port" "$@" "$ipA")
  if compat_pair "$name" "$port"; then
    local rows
    rows=$(compat_perftest_rows "$PAIR_CLI_LOG")
    if ((rows >= 1)); then compat_result "$name" 1; else compat_result "$name" 0 "no result table"; fi
  else
    compat_result "$name" 0
  fi
}

netns_pair ib_write_bw
netns_pair ib_read_bw
netns_pair ib_send_bw
netns_pair ib_atomic_bw
netns_pair ib_write_lat

# Two processes in namespace A: the first to open the device holds UDP 4791 for its address, so
# packets from B for the second one's QP arrive at the first and are handed over (docs/architecture.md, "Devices and addressing").
squat_port=$(compat_free_port)
"${inA[@]}" timeout -k 5 120 "$SOFTRDMA" run ib_write_bw -d "$devA" -p "$squat_port" \
  >"$COMPAT_LOG_DIR/squatter.log" 2>&1 &
squatter=$!
compat_wait_listen "$squat_port" "$squatter" "${inA[@]}"
if "${inA[@]}" ss -uln | grep -q ":4791 "; then
  netns_pair ib_write_bw -n 2000
  netns_pair ib_read_bw -n 2000
  netns_pair ib_send_lat -n 500
  # UD through the holder: the original source address travels with the handed-over datagram.
  netns_pair ib_send_lat -c UD -n 500
  netns_pair ib_send_bw -c UD -n 2000
else
  compat_result "a second process in A holds UDP 4791" 0 "nobody bound 4791 in namespace A"
fi
kill "$squatter" 2>/dev/null || true
wait "$squatter" 2>/dev/null || true
# With the holder gone, the next process takes the port over.
netns_pair ib_write_bw -n 2000

compat_finish
