#!/usr/bin/env bash
# compat.pause: a peer process that does not run (SIGSTOP, then SIGCONT) is not a dead peer, and a
# killed one is known fast (docs/reliability.md, "Pauses and deaths"). Unmodified perftest and rping,
# and the exactness verifier (tests/faults/verifier, every byte checked), on loopback packets
# (SOFTRDMA_DIRECT=0), the direct path and between two network namespaces (root only), and iWARP
# between namespaces (root only):
#   - one side stopped for 2 s (and 10 s in some cases; 60 s with --long): both sides complete, rping
#     and the verifier with exact data; also UCX (ucx_perftest tag_bw over rc_verbs, wired up by ud_verbs);
#   - gdb attached to one side for 5 s, as a breakpoint holds it (every thread stopped), then detached
#     (on loopback packets only with --full);
#   - one side killed (SIGKILL): the other side's work requests fail or DISCONNECTED arrives, and it
#     exits. The time from the kill to its exit is printed ("survivor exited after"), never asserted;
#   - between namespaces, the process that bound the server host's UDP 4791 stopped (or killed) before
#     ibv_ud_pingpong and ib_write_bw start: they finish while it is still stopped (reliability.md,
#     "The 4791 holder").
# Usage: pause.sh [--long | --full] [--mode packets|direct|netns|iwarp]... [--only REGEX] (cases whose name
# matches). --full: on loopback too every case that runs between namespaces; --long: every program and
# side stopped 2, 10 and 60 s.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/compat_lib.sh"
compat_require_softrdma
VERIFIER=${RC_VERIFIER:-$(compat_repo_root)/build/tests/rc_verifier}

long=0
full=0
only=
modes=()
while (($#)); do
  case $1 in
    --long) long=1; shift ;;
    --full) full=1; shift ;;
    --mode) modes+=("$2"); shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "pause.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
((${#modes[@]})) || modes=(packets direct netns iwarp)
RUNARGS=(run --)
PERFTEST_CM=()
CM_READY=udp  # an rdma_cm listener over RoCE binds a UDP port; over iWARP it listens on TCP

# The program under `timeout` (an `ip netns exec` prefix and `softrdma run` exec, timeout forks).
prog_pid() {
  local i p
  for ((i = 0; i < 50; i++)); do
    p=$(pgrep -P "$1" | head -n1 || true)
    [[ -n $p ]] && { echo "$p"; return 0; }
    sleep 0.1
  done
  return 1
}

# one NAME READY PORT VICTIM ACTION: SRV and CLI (arrays) run as a pair; READY (tcp|udp) is how the
# server shows it listens on PORT. 1.5 s after the client starts, VICTIM (server|client) gets ACTION:
# stop:S (SIGSTOP, SIGCONT S seconds later: both must exit 0, then CHECK, a function, judges the logs)
# or gdb:S (gdb attaches, holds the process S seconds, detaches: the same checks as stop), or kill
# (SIGKILL: the other side must exit with an error or report the disconnect).
one() {
  local name=$1 ready=$2 port=$3 victim=$4 action=$5
  local slug=${name//[^A-Za-z0-9_.-]/_} i spid cpid vpid crc=0 src=0 t0 t1
  [[ -z $only || $name =~ $only ]] || return 0
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/$slug.server.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/$slug.client.log
  local -a sp=("${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}") cp=("${CLI_PREFIX[@]+"${CLI_PREFIX[@]}"}")
  compat_log "$name: server: ${SRV[*]}; client: ${CLI[*]}"
  "${sp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" env "${ENVS[@]}" "$SOFTRDMA" "${RUNARGS[@]}" "${SRV[@]}" >"$PAIR_SRV_LOG" 2>&1 &
  spid=$!
  for ((i = 0; i < 300; i++)); do
    if [[ $ready == udp ]]; then udp_bound "$port" "${sp[@]}" && break
    else compat_wait_listen "$port" "$spid" "${sp[@]}" && break; fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  "${cp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" env "${ENVS[@]}" "$SOFTRDMA" "${RUNARGS[@]}" "${CLI[@]}" >"$PAIR_CLI_LOG" 2>&1 &
  cpid=$!
  sleep 1.5
  local vp=$spid sv=$cpid
  [[ $victim == client ]] && { vp=$cpid; sv=$spid; }
  if ! vpid=$(prog_pid "$vp"); then
    wait "$cpid" || true
    wait "$spid" || true
    compat_result "$name" 0 "the $victim had already exited"
    return
  fi
  if [[ $action == kill ]]; then
    kill -KILL "$vpid"
    t0=$(date +%s%N)
    local rc=0
    wait "$sv" || rc=$?
    t1=$(date +%s%N)
    wait "$vp" 2>/dev/null || true
    compat_log "$name: survivor exited after $(((t1 - t0) / 1000000)) ms with status $rc"
    # perftest exits 1 on a failed completion; rping ends its run at DISCONNECTED, with status 0.
    if ((rc == 124)); then compat_result "$name" 0 "the survivor hung until the timeout"
    else compat_result "$name" 1; fi
    return
  fi
  if [[ $action == gdb:* ]]; then
    gdb -p "$vpid" -batch -nx -ex "shell sleep ${action#gdb:}" -ex detach >>"$COMPAT_LOG_DIR/$slug.gdb.log" 2>&1 ||
      compat_log "$name: gdb exited with status $?"
  else
    kill -STOP "$vpid"
    sleep "${action#stop:}"
    kill -CONT "$vpid"
  fi
  # A pair that hangs until its timeout: what both sides' contexts counted shortly before (softrdma
  # stat --qp, e.g. cm_dreq_rcvd or cm_peer_gone behind an unexpected DISCONNECTED), and where each
  # program still running waits (its threads' stacks).
  local spp cpp
  spp=$(prog_pid "$spid" || true)
  cpp=$(prog_pid "$cpid" || true)
  (sleep $((COMPAT_TIMEOUT - 5)) && {
    "$SOFTRDMA" stat --qp
    for p in $spp $cpp; do
      kill -0 "$p" 2>/dev/null || continue
      echo "=== pid $p ($(tr '\0' ' ' </proc/"$p"/cmdline)) ==="
      timeout 20 gdb -p "$p" -batch -nx -ex "thread apply all bt"
    done
  } >"$COMPAT_LOG_DIR/$slug.stat.log" 2>&1) >/dev/null 2>&1 &
  local watch=$!
  wait "$cpid" || crc=$?
  wait "$spid" || src=$?
  kill "$watch" 2>/dev/null || true
  wait "$watch" 2>/dev/null || true
  if ((crc != 0 || src != 0)); then
    local why="exit codes: server $src, client $crc"
    [[ -s $COMPAT_LOG_DIR/$slug.stat.log ]] && why+="; counters near the timeout in $slug.stat.log"
    compat_result "$name" 0 "$why"
  elif ! $CHECK; then
    compat_result "$name" 0
  else
    compat_result "$name" 1
  fi
}

check_perftest() {
  local rows
  rows=$(compat_perftest_rows "$PAIR_CLI_LOG")
  ((rows >= 1)) || { PAIR_WHY="no result row"; return 1; }
}
check_rping() {
  # rping -v exits non-zero on a data mismatch; its stdout and stderr interleave mid-line, so only
  # the last ping is looked for.
  grep -q "rdma-ping-$((RPING_COUNT - 1)): " "$PAIR_CLI_LOG" || { PAIR_WHY="the client did not reach the last ping"; return 1; }
}
check_ucx() {
  grep -q '^Final:' "$PAIR_CLI_LOG" || { PAIR_WHY="the client printed no \"Final:\" result row"; return 1; }
}
check_verifier() {
  grep -q 'exact' "$PAIR_CLI_LOG" || { PAIR_WHY="the verifier did not report exact data"; return 1; }
}

perftest() { # WHERE TOOL VICTIM ACTION
  local port
  port=$(compat_free_port)
  SRV=("$2" -d "$SDEV" -F -D 4 -p "$port" "${PERFTEST_CM[@]+"${PERFTEST_CM[@]}"}")
  CLI=("$2" -d "$CDEV" -F -D 4 -p "$port" "${PERFTEST_CM[@]+"${PERFTEST_CM[@]}"}" "$SIP")
  [[ $4 == kill ]] && { SRV[5]=20; CLI[5]=20; }
  CHECK=check_perftest one "$1 $2 $3 $4" tcp "$port" "$3" "$4"
}
rping_case() { # WHERE VICTIM ACTION
  local port
  port=$(compat_free_port)
  while udp_bound "$port" "${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}"; do port=$(compat_free_port); done
  local count=$RPING_COUNT
  [[ $3 == kill ]] && count=1000000
  SRV=(rping -s -a "$SIP" -p "$port" -v -C "$count")
  CLI=(rping -c -a "$SIP" -p "$port" -v -C "$count")
  CHECK=check_rping one "$1 rping $2 $3" "$CM_READY" "$port" "$2" "$3"
}
ucx_case() { # WHERE VICTIM ACTION: UCX_ITERS 64 KiB tagged messages, enough to outlast the stop
  local port
  port=$(compat_free_port)
  SRV=(env UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$SDEV:1" ucx_perftest -p "$port")
  CLI=(env UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES="$CDEV:1" ucx_perftest "$SIP" -p "$port" -t tag_bw -s 65536 -n "$UCX_ITERS" -w 10)
  CHECK=check_ucx one "$1 ucx tag_bw $2 $3" tcp "$port" "$2" "$3"
}
verifier_case() { # WHERE VICTIM ACTION
  local port
  port=$(compat_free_port)
  SRV=("$VERIFIER" --listen "$port" --ip "$SIP" --hang-s 120)
  CLI=("$VERIFIER" --connect "$SIP" --port "$port" --ip "$CIP" --seed 7 --rounds "$VERIFY_ROUNDS" --max-write $((1 << 20)) --hang-s 120)
  CHECK=check_verifier one "$1 verifier $2 $3" tcp "$port" "$2" "$3"
}

# holder_case WHERE KIND (ud|rc) ACTION (stop|kill): the host's UDP 4791, through which other hosts
# reach every softrdma process there (all of UD's traffic, an RC connection's first packets), is bound
# by a process that is stopped (or killed) before the client starts. The server, started while that
# process ran, took the same socket from it and reads it in its stead (docs/reliability.md, "The 4791
# holder"). The pair must complete while the holder is still stopped: nobody sends SIGCONT until it has.
holder_case() {
  local name="$1 4791-holder $3 $2" hport port h hpid spid crc=0 src=0 i n state
  [[ -z $only || $name =~ $only ]] || return 0
  local slug=${name//[^A-Za-z0-9_.-]/_}
  local -a sp=("${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}") cp=("${CLI_PREFIX[@]+"${CLI_PREFIX[@]}"}")
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/$slug.server.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/$slug.client.log
  hport=$(compat_free_port)
  # The holder: the first softrdma process of the server's host, waiting for a client that never comes.
  "${sp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- ibv_rc_pingpong -d "$SDEV" -g 0 -p "$hport" \
    >"$COMPAT_LOG_DIR/$slug.holder.log" 2>&1 &
  h=$!
  compat_wait_listen "$hport" "$h" "${sp[@]}" && udp_bound 4791 "${sp[@]}" && hpid=$(prog_pid "$h") ||
    { compat_result "$name" 0 "the holder did not start"; kill "$h" 2>/dev/null; wait "$h" 2>/dev/null; return; }
  port=$(compat_free_port)
  if [[ $2 == ud ]]; then
    SRV=(ibv_ud_pingpong -d "$SDEV" -g 0 -p "$port" -s 512 -n 2000)
    CLI=(ibv_ud_pingpong -d "$CDEV" -g 0 -p "$port" -s 512 -n 2000 "$SIP")
  else
    SRV=(ib_write_bw -d "$SDEV" -F -n 2000 -p "$port")
    CLI=(ib_write_bw -d "$CDEV" -F -n 2000 -p "$port" "$SIP")
  fi
  "${sp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" env SOFTRDMA_COUNTERS=1 "$SOFTRDMA" run -- "${SRV[@]}" >"$PAIR_SRV_LOG" 2>&1 &
  spid=$!
  compat_wait_listen "$port" "$spid" "${sp[@]}" || true
  # Two offers of 4791's socket in the server's namespace: the holder's, and the server's once it took it.
  for ((i = 0; i < 100; i++)); do
    n=$("${sp[@]}" ss -xlH 2>/dev/null | grep -c '@softrdma-share/' || true)
    ((n >= 2)) && break
    sleep 0.1
  done
  if [[ $3 == kill ]]; then kill -KILL "$hpid"; else kill -STOP "$hpid"; fi
  "${cp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- "${CLI[@]}" >"$PAIR_CLI_LOG" 2>&1 || crc=$?
  wait "$spid" || src=$?
  state=$(awk '{ print $3 }' "/proc/$hpid/stat" 2>/dev/null || echo gone)
  [[ $3 == kill ]] && state=T  # gone, as it should be
  kill -CONT "$hpid" 2>/dev/null
  kill "$hpid" 2>/dev/null
  wait "$h" 2>/dev/null || true
  if ((n < 2)); then
    compat_result "$name" 0 "the server never took 4791's socket ($n offers listed)"
  elif ((crc != 0 || src != 0)); then
    compat_result "$name" 0 "exit codes: server $src, client $crc"
  elif [[ $state != T ]]; then
    compat_result "$name" 0 "the holder was not stopped throughout (state $state)"
  elif ! grep -q 'roce_stand_in [1-9]' "$PAIR_SRV_LOG"; then
    compat_result "$name" 0 "the server's counters show no roce_stand_in"
  else
    compat_result "$name" 1
  fi
}

# iWARP rides on kernel TCP, which keeps acknowledging for a stopped process (and probes a zero
# window): perftest -R (rdma_cm, as iWARP needs) and rping between namespaces, stopped, held by gdb and
# killed.
suite_iwarp() {
  local w=$1
  perftest "$w" ib_write_bw server stop:2
  perftest "$w" ib_read_bw client stop:10
  perftest "$w" ib_send_bw server gdb:5
  rping_case "$w" client stop:2
  rping_case "$w" server stop:10
  perftest "$w" ib_write_bw server kill
  rping_case "$w" client kill
}

suite() { # WHERE
  local w=$1 s
  if ((long)); then
    for s in 2 10 60; do
      for v in server client; do
        for t in ib_write_bw ib_read_bw ib_send_bw; do perftest "$w" "$t" "$v" "stop:$s"; done
        rping_case "$w" "$v" "stop:$s"
        verifier_case "$w" "$v" "stop:$s"
        ucx_case "$w" "$v" "stop:$s"
      done
    done
    for v in server client; do perftest "$w" ib_write_bw "$v" gdb:5; done
  else
    # Every program and side once at 2 s; between namespaces (or with --full everywhere) a 10 s stop
    # of each side too, and the other sides at 2 s.
    perftest "$w" ib_write_bw server stop:2
    rping_case "$w" client stop:2
    verifier_case "$w" server stop:2
    ucx_case "$w" server stop:2
    # gdb holds the process as SIGSTOP does; loopback packets are the path it needs least.
    if [[ $w != packets ]] || ((full)); then perftest "$w" ib_write_bw client gdb:5; fi
    if ((full)) || [[ $w == netns ]]; then
      perftest "$w" ib_read_bw client stop:2
      perftest "$w" ib_send_bw server stop:10
      rping_case "$w" server stop:2
      verifier_case "$w" client stop:10
      ucx_case "$w" client stop:2
    fi
  fi
  # Only another host reaches a process through 4791.
  if [[ $w == netns ]]; then
    holder_case "$w" ud stop
    holder_case "$w" rc stop
    holder_case "$w" ud kill
  fi
  perftest "$w" ib_write_bw server kill
  perftest "$w" ib_read_bw client kill
  rping_case "$w" server kill
  rping_case "$w" client kill
}

for mode in "${modes[@]}"; do
  case $mode in
    packets | direct)
      SIP=127.0.0.1 CIP=127.0.0.1 SDEV=$(compat_device 127.0.0.1) CDEV=$SDEV
      # The direct path runs the verifier, rping and UCX many times as fast: enough rounds to outlast
      # the stop (which comes 1.5 s after the client starts). UCX's 64 KiB copies there run from
      # 5 to 40 GB/s (hot caches, and what else the 2 cores run): 3 to 30 s.
      VERIFY_ROUNDS=2500 RPING_COUNT=10000 UCX_ITERS=60000
      [[ $mode == direct ]] && VERIFY_ROUNDS=25000 RPING_COUNT=40000 UCX_ITERS=2000000
      SRV_PREFIX=() CLI_PREFIX=()
      if [[ $mode == packets ]]; then ENVS=(SOFTRDMA_DIRECT=0); else ENVS=(SOFTRDMA_DIRECT=1); fi
      suite "$mode"
      ;;
    netns)
      if [[ $(id -u) != 0 ]]; then compat_log "netns: skipped (needs root)"; continue; fi
      (
        compat_netns_setup
        compat_short_names "$nsA" "$vethA" pza "$nsB" "$vethB" pzb
        devA=$(compat_device "$ipA" "${inA[@]}")
        devB=$(compat_device "$ipB" "${inB[@]}")
        SIP=$ipA CIP=$ipB SDEV=$devA CDEV=$devB VERIFY_ROUNDS=2500 RPING_COUNT=10000 UCX_ITERS=200000 SRV_PREFIX=("${inA[@]}") CLI_PREFIX=("${inB[@]}") ENVS=(SOFTRDMA_DIRECT=1)
        suite netns
        compat_finish
      ) || COMPAT_FAILED=$((COMPAT_FAILED + 1))
      ;;
    iwarp)
      if [[ $(id -u) != 0 ]]; then compat_log "iwarp: skipped (needs root)"; continue; fi
      (
        compat_netns_setup
        compat_short_names "$nsA" "$vethA" pwa "$nsB" "$vethB" pwb
        # rping -v over iWARP between namespaces: a few thousand pings/s here, 10000 outlast the stop at 1.5 s.
        SIP=$ipA CIP=$ipB SDEV=softrdma_iw_pwa CDEV=softrdma_iw_pwb RPING_COUNT=10000 SRV_PREFIX=("${inA[@]}") CLI_PREFIX=("${inB[@]}") ENVS=(SOFTRDMA_DIRECT=1)
        RUNARGS=(run --iwarp --) PERFTEST_CM=(-R) CM_READY=tcp
        suite_iwarp iwarp
        compat_finish
      ) || COMPAT_FAILED=$((COMPAT_FAILED + 1))
      ;;
    *) echo "pause.sh: unknown mode $mode" >&2; exit 2 ;;
  esac
done
compat_finish
