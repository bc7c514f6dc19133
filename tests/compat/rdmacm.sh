#!/usr/bin/env bash
# compat.rdmacm: unmodified rdmacm-utils and perftest -R binaries over softrdma's librdmacm, on
# loopback and across two network namespaces (the second part needs root; skipped without it),
# rping also with its server on "::" and its client at the server's IPv4-mapped address.
# An rdma_cm port is a UDP socket of the listening process (docs/rdmacm.md), so "listening" here
# means that UDP port is bound.
# Not covered (docs/rdmacm.md, "Status"): qperf ud_lat/ud_bw (qperf 0.4.11 does not use rdma_cm for
# UD and gives a LID-only address handle, which no RoCE device accepts).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma
export SOFTRDMA_CM_TIMEOUT_MS=${SOFTRDMA_CM_TIMEOUT_MS:-200}

SRV_PREFIX=()
CLI_PREFIX=()

# qperf_cm LABEL SERVER_IP: one qperf server (it serves until killed; its rdma_cm ids bind ephemeral
# ports on the wildcard address), one client running the RC tests with -cm1. Every test must print
# its result.
qperf_cm() {
  local where=$1 ip=$2 port spid crc=0 n name="$1 qperf -cm1"
  local -a sp=("${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}") cp=("${CLI_PREFIX[@]+"${CLI_PREFIX[@]}"}")
  local -a tests=(rc_rdma_write_lat rc_rdma_write_bw rc_rdma_read_bw rc_bw rc_lat)
  port=$(cm_free_port)
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/${where}_qperf.server.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/${where}_qperf.client.log
  compat_log "$name: server: qperf -lp $port"
  "${sp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- qperf -lp "$port" >"$PAIR_SRV_LOG" 2>&1 &
  spid=$!
  if ! compat_wait_listen "$port" "$spid" "${sp[@]}"; then
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    compat_result "$name" 0 "qperf server never listened on $port"
    return
  fi
  compat_log "$name: client: qperf -lp $port -cm1 $ip -t 1 ${tests[*]}"
  "${cp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- qperf -lp "$port" -cm1 "$ip" -t 1 "${tests[@]}" \
    >"$PAIR_CLI_LOG" 2>&1 || crc=$?
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  n=$(grep -cE '^ +(latency|bw) += +[0-9.]+ ' "$PAIR_CLI_LOG" || true)
  if ((crc == 0 && n == ${#tests[@]})); then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "client exit $crc, $n of ${#tests[@]} results"
  fi
}

suite() { # LABEL SERVER_IP CLIENT_IP
  local where=$1 ip=$2 port n
  rping_pair "$where rping" "$ip" "$ip" 1000
  # AF_INET6 as far as softrdma carries it: the server binds "::" (dual-stack, as rping does for
  # "-a ::"), the client names the server by its IPv4-mapped address (docs/rdmacm.md).
  rping_pair "$where rping :: / ::ffff:$ip" :: "::ffff:$ip" 100

  # The server listens on the wildcard address (its CM must hear every device).
  port=$(cm_free_port)
  SRV=(ucmatose -p "$port" -c 4)
  CLI=(ucmatose -s "$ip" -p "$port" -c 4)
  if cm_pair "$where ucmatose" "$port" && grep -q 'return status 0' "$PAIR_CLI_LOG"; then
    compat_result "$where ucmatose" 1
  else
    compat_result "$where ucmatose" 0
  fi

  qperf_cm "$where" "$ip"

  # udaddy: UD ids through SIDR_REQ/REP; its port is fixed (7174), -p is its port space.
  if [[ $where == loopback ]] && udp_bound 7174; then
    compat_result "$where udaddy" 0 "UDP port 7174 (udaddy's) is taken on this host"
  else
    SRV=(udaddy -c 2 -C 10)
    CLI=(udaddy -s "$ip" -c 2 -C 10)
    if cm_pair "$where udaddy" 7174 && grep -q 'return status 0' "$PAIR_CLI_LOG" &&
      grep -q 'data transfers complete' "$PAIR_SRV_LOG"; then
      compat_result "$where udaddy" 1
    else
      compat_result "$where udaddy" 0
    fi
  fi

  mckey_pair "$where" "$ip" "$3"

  local t
  for t in ib_write_bw ib_send_lat ib_read_bw; do
    port=$(cm_free_port)
    SRV=("$t" -R -n 500 -p "$port")
    CLI=("$t" -R -n 500 -p "$port" "$ip")
    if cm_pair "$where $t -R" "$port" && (($(compat_perftest_rows "$PAIR_CLI_LOG") >= 1)); then
      compat_result "$where $t -R" 1
    else
      compat_result "$where $t -R" 0 "${PAIR_WHY:-no result table}"
    fi
  done
}

# peer_death_netns: a connected peer on the other "host" is SIGKILLed; the survivor must get
# DISCONNECTED (its probes are answered by the dead peer's host, docs/rdmacm.md). Uses the project's own
# rdmacm_peer program (tests/rdmacm/peer); another softrdma process on the victim's side holds 4791 there.
peer_death_netns() {
  local peer=${RDMACM_PEER:-$SOFTRDMA_BIN/../tests/rdmacm_peer} side port hpid vpid spid vt st i
  if [[ ! -x $peer ]]; then
    compat_log "peer death: skipped, no $peer"
    return
  fi
  for side in passive active; do
    local name="netns peer death ($side survivor)"
    # Start from namespaces with no process of an earlier case still exiting: a dying process can
    # still hold UDP 4791 for a moment, and REQs that reach it then are refused.
    for ((i = 0; i < 50; i++)); do
      [[ -z $(ip netns pids "$nsA"; ip netns pids "$nsB") ]] && break
      sleep 0.1
    done
    local -a sv vv
    PAIR_SRV_LOG=$COMPAT_LOG_DIR/peer_death_$side.survivor.log
    PAIR_CLI_LOG=$COMPAT_LOG_DIR/peer_death_$side.victim.log
    # Empty before anything starts: the port is read from the log as soon as it is non-empty, and a
    # log of an earlier run in the same directory (ctest's) must not be taken for it.
    : >"$PAIR_SRV_LOG"
    : >"$PAIR_CLI_LOG"
    if [[ $side == passive ]]; then sv=("${inA[@]}"); vv=("${inB[@]}"); else sv=("${inB[@]}"); vv=("${inA[@]}"); fi
    local vip=$ipB
    [[ $side == active ]] && vip=$ipA
    "${vv[@]}" timeout 60 "$peer" accept "$vip" >"$COMPAT_LOG_DIR/peer_death_$side.holder.log" 2>&1 &
    hpid=$!
    sleep 0.5
    if [[ $side == passive ]]; then
      "${sv[@]}" timeout 60 "$peer" accept "$ipA" >"$PAIR_SRV_LOG" 2>&1 &
      spid=$!
      for ((i = 0; i < 100; i++)); do [[ -s $PAIR_SRV_LOG ]] && break; sleep 0.1; done
      port=$(head -n1 "$PAIR_SRV_LOG")
      "${vv[@]}" timeout 60 "$peer" connect "$ipA" "$port" wait >"$PAIR_CLI_LOG" 2>&1 &
      vt=$!
    else
      "${vv[@]}" timeout 60 "$peer" accept "$ipA" >"$PAIR_CLI_LOG" 2>&1 &
      vt=$!
      for ((i = 0; i < 100; i++)); do [[ -s $PAIR_CLI_LOG ]] && break; sleep 0.1; done
      port=$(head -n1 "$PAIR_CLI_LOG")
      "${sv[@]}" timeout 60 "$peer" connect "$ipA" "$port" wait >"$PAIR_SRV_LOG" 2>&1 &
      spid=$!
    fi
    for ((i = 0; i < 200; i++)); do grep -q '^up' "$PAIR_SRV_LOG" && break; sleep 0.1; done
    vpid=$(pgrep -P "$vt" | head -n1 || true)  # timeout's child: the victim itself
    st=1
    if grep -q '^up' "$PAIR_SRV_LOG" && [[ -n $vpid ]]; then
      kill -9 "$vpid"
      wait "$spid" && grep -q '^disconnected' "$PAIR_SRV_LOG" && st=0
    fi
    kill "$hpid" "$spid" "$vt" 2>/dev/null || true
    wait "$hpid" "$spid" "$vt" 2>/dev/null || true
    if ((st == 0)); then compat_result "$name" 1; else compat_result "$name" 0 "survivor saw no DISCONNECTED"; fi
  done
}

suite loopback 127.0.0.1 127.0.0.1

if [[ $(id -u) == 0 ]] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1; then
  compat_netns_setup
  SRV_PREFIX=("${inA[@]}")
  CLI_PREFIX=("${inB[@]}")
  suite netns "$ipA" "$ipB"
  peer_death_netns
else
  compat_log "two-namespace part skipped: needs root and ip netns"
fi

compat_finish
