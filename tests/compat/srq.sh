#!/usr/bin/env bash
# compat.srq: shared receive queues and many QPs per process with unmodified programs:
# ibv_srq_pingpong -q 16 (16 RC QPs on one SRQ, payload validated with -c), ib_send_bw --use-srq,
# ib_send_bw -q 8; on loopback, then across two network namespaces when root can create them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

# srq_pair NAME SRV_DEV CLI_DEV HOST ARGS...: one ibv_srq_pingpong pair; both sides must print their
# iteration summary and no error.
srq_pair() {
  local name=$1 sdev=$2 cdev=$3 host=$4 port iters=500
  shift 4
  port=$(compat_free_port)
  SRV=(ibv_srq_pingpong -d "$sdev" -g 0 -c -p "$port" -n "$iters" "$@")
  CLI=(ibv_srq_pingpong -d "$cdev" -g 0 -c -p "$port" -n "$iters" "$@" "$host")
  if compat_pair "$name" "$port"; then
    if ! grep -q "$iters iters in" "$PAIR_SRV_LOG" || ! grep -q "$iters iters in" "$PAIR_CLI_LOG"; then
      compat_result "$name" 0 "no \"$iters iters in\" summary on both sides"
    elif grep -qiE "fail|error|invalid|couldn't" "$PAIR_SRV_LOG" "$PAIR_CLI_LOG"; then
      compat_result "$name" 0 "a side reported an error"
    else
      compat_result "$name" 1
    fi
  else
    compat_result "$name" 0
  fi
}

# bw_pair NAME SRV_DEV CLI_DEV HOST ARGS...: one ib_send_bw pair with its result table.
bw_pair() {
  local name=$1 sdev=$2 cdev=$3 host=$4
  shift 4
  compat_perftest "$name" 1 ib_send_bw -d "$sdev" -F "$@" -- ib_send_bw -d "$cdev" -F "$@" "$host"
  if [[ " $* " == *" --use-srq "* ]] && ! grep -q "Using SRQ *: ON" "$PAIR_CLI_LOG"; then
    compat_result "$name: SRQ in use" 0 "perftest does not report \"Using SRQ : ON\""
  fi
}

dev=$(compat_device 127.0.0.1)
compat_log "loopback device: $dev"
SRV_PREFIX=()
CLI_PREFIX=()
srq_pair "srq_pingpong -q 16" "$dev" "$dev" 127.0.0.1 -q 16
srq_pair "srq_pingpong -q 16 -s 65536 -m 1024" "$dev" "$dev" 127.0.0.1 -q 16 -s 65536 -m 1024
bw_pair "ib_send_bw --use-srq" "$dev" "$dev" 127.0.0.1 --use-srq
bw_pair "ib_send_bw --use-srq -q 4" "$dev" "$dev" 127.0.0.1 --use-srq -q 4 -n 200
bw_pair "ib_send_bw -q 8" "$dev" "$dev" 127.0.0.1 -q 8

loop_rc=0
compat_finish || loop_rc=1

# The two-namespace part runs in a subshell: compat_netns_setup exits 77 where namespaces are
# impossible, which must not hide the loopback results above.
netns_rc=0
if [[ $(id -u) == 0 ]] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1; then
  (
    COMPAT_PASSED=0
    COMPAT_FAILED=0
    COMPAT_FAILURES=()
    compat_netns_setup  # sets nsA nsB ipA ipB devA devB inA inB
    SRV_PREFIX=("${inA[@]}")
    CLI_PREFIX=("${inB[@]}")
    srq_pair "netns srq_pingpong -q 16" "$devA" "$devB" "$ipA" -q 16
    bw_pair "netns ib_send_bw --use-srq" "$devA" "$devB" "$ipA" --use-srq
    bw_pair "netns ib_send_bw -q 8" "$devA" "$devB" "$ipA" -q 8
    compat_finish
  ) || netns_rc=$?
else
  compat_log "SKIP two-namespace part: needs root and iproute2's \`ip netns\`"
fi
((loop_rc == 0 && (netns_rc == 0 || netns_rc == 77)))
