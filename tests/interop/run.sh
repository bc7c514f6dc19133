#!/usr/bin/env bash
# interop.rxe: softrdma against the Linux kernel's Soft-RoCE (rdma_rxe), on the wire, both ways.
#
#   sudo tests/interop/run.sh            (from the repository root; needs root)
#
# Boots one Debian 12 guest with rdma_rxe (../shared/tools/rxe-vm, netdev MTU 9000 so rxe's active
# MTU is 4096), runs every case below between the guest's kernel rxe (10.77.0.11) and softrdma on
# the host side of the bridge (10.77.0.1, inside netns rxevm, unmodified Debian binaries through
# `softrdma run`), stops the guest, and prints one PASS/FAIL line per case and "N passed, N failed".
# Cases ("host-server" = softrdma is the server, the guest's rxe the client; "host-client" the
# reverse):
#   pingpong.*      ibv_rc_pingpong -c (payload checked) at path MTU 1024 and 4096, 1 B .. 1 MiB
#   perftest.*      ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw, ib_write_lat
#   impair.*        longer transfers while softrdma drops 2 % of the packets it sends
#                   (SOFTRDMA_IMPAIR=seed=1,tx_drop=0.02), so rxe's NAK/retransmit logic meets ours
#   rdmacm.*        rping -v -C 100 and udaddy -C 10 between softrdma's librdmacm and the kernel's
#                   rdma_cm (IBTA CM and SIDR MADs on QP1)
#   rsocket.*       rstream -S 65536 -C 100 -T v between softrdma's rsockets and rdma-core's over rxe
#   holder.*        ib_write_bw -D 14 while the process that bound the host's UDP 4791 is stopped
#                   10 s: the pair's host process reads the shared socket in its stead
#   ipv6.*          pingpong and perftest over IPv6 GIDs both ways (the guest's global address, and
#                   its link-local one against our global one); rping -v and rstream -T v with IPv6
#                   addresses both ways (rdma_cm's version-6 header, rsockets)
#   capture.*       tshark on the bridge during SEND/WRITE/READ/ATOMIC traffic both ways: softrdma's
#                   packets decode as InfiniBand BTH/RETH/AETH/AtomicETH over UDP 4791 with no
#                   malformed or warning expert info, and every ICRC of both stacks recomputes
#                   (icrc_check.py, written from the spec)
# Exit: 0 all passed, 1 a case failed, 77 skipped (not root, harness not set up, VM cannot boot,
# or the VMs are already in use).
#
# Environment:
#   SOFTRDMA_BIN      directory with the softrdma command (default <repo>/build/bin)
#   RXEVM_TOOLS       the harness (default <repo>/../shared/tools/rxe-vm)
#   INTEROP_LOG_DIR   where process logs and the capture go (default: a fresh temporary directory)
#   INTEROP_TIMEOUT   seconds any one process may run (default 180)
#   INTEROP_DEADLINE  seconds for the whole suite; cases not started by then FAIL (default 2400)
#   INTEROP_REUSE=1   use a guest that is already running and leave it running (for development)
#   INTEROP_ONLY      regular expression: run only the cases whose name matches
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/interop
RXEVM_TOOLS=${RXEVM_TOOLS:-$ROOT/../shared/tools/rxe-vm}
SOFTRDMA_BIN=${SOFTRDMA_BIN:-$ROOT/build/bin}
SOFTRDMA=$SOFTRDMA_BIN/softrdma
INTEROP_TIMEOUT=${INTEROP_TIMEOUT:-180}
INTEROP_DEADLINE=${INTEROP_DEADLINE:-2400}
INTEROP_REUSE=${INTEROP_REUSE:-0}
INTEROP_ONLY=${INTEROP_ONLY:-}
if [[ -z ${INTEROP_LOG_DIR:-} ]]; then
  INTEROP_LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-interop.XXXXXX")
fi
mkdir -p "$INTEROP_LOG_DIR"

NS=rxevm
VM=vm1
GUEST_IP=10.77.0.11
HOST_IP=10.77.0.1
T_START=$(date +%s)

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
skip() {
  echo "SKIP: $*"
  exit 77
}
elapsed() { echo $(($(date +%s) - $1)); }

# ---------------------------------------------------------------- preconditions (skip, not fail)
[[ $(id -u) == 0 ]] || skip "needs root (network namespace, qemu taps)"
[[ -x $RXEVM_TOOLS/start.sh ]] || skip "no rxe-vm harness at $RXEVM_TOOLS"
[[ -f /var/tmp/rxe-vm/rootfs.img.stamp ]] || skip "rxe-vm not set up (run $RXEVM_TOOLS/setup.sh)"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not installed"
for tool in tshark ibv_rc_pingpong ib_write_bw python3; do
  command -v $tool >/dev/null || skip "$tool not installed"
done
if [[ ! -x $SOFTRDMA ]]; then
  echo "FAIL: no softrdma command at $SOFTRDMA (set SOFTRDMA_BIN to <build>/bin)"
  exit 1
fi

# ---------------------------------------------------------------- guest up (and always down)
STARTED=0
stop_vms() {
  if ((STARTED)); then
    local t0
    t0=$(date +%s)
    "$RXEVM_TOOLS/stop.sh" >"$INTEROP_LOG_DIR/stop.log" 2>&1
    log "guest stopped ($(elapsed "$t0")s)"
  fi
}
on_exit() {
  local rc=$?
  [[ -n ${CAPTURE_PID:-} ]] && kill "$CAPTURE_PID" 2>/dev/null
  stop_vms
  exit $rc
}
trap on_exit EXIT
trap 'exit 130' INT TERM

running=$(ip netns list 2>/dev/null | grep -c "^$NS\b" || true)
if ((running)); then
  if [[ $INTEROP_REUSE != 1 ]]; then
    skip "netns $NS already exists: the rxe VMs are in use (INTEROP_REUSE=1 to run against them)"
  fi
  log "reusing the running guest (INTEROP_REUSE=1)"
else
  log "starting the guest (RXEVM_MTU=9000, one VM; TCG emulation takes a minute or two)"
  t0=$(date +%s)
  STARTED=1
  if ! RXEVM_MTU=9000 "$RXEVM_TOOLS/start.sh" 1 >"$INTEROP_LOG_DIR/start.log" 2>&1; then
    tail -n 20 "$INTEROP_LOG_DIR/start.log"
    skip "the guest could not be started (log: $INTEROP_LOG_DIR/start.log)"
  fi
  log "guest up in $(elapsed "$t0")s"
fi

guest() { "$RXEVM_TOOLS/guest-run.sh" "$VM" "$@" </dev/null; }
nsx() { ip netns exec "$NS" "$@"; }

GID_GUEST=$(guest rxevm-gid-index) || skip "cannot reach $VM over ssh"
DEV=$(nsx "$SOFTRDMA" devices --ip "$HOST_IP" 2>/dev/null | head -n1)
if [[ -z $DEV ]]; then
  echo "FAIL: no softrdma device bound to $HOST_IP in netns $NS"
  nsx "$SOFTRDMA" devices
  exit 1
fi
GID_HOST=0
log "host: softrdma device $DEV ($HOST_IP, GID index $GID_HOST); guest: rxe0 ($GUEST_IP, GID index $GID_GUEST)"
guest 'uname -r; ibv_devinfo -d rxe0 | grep -E "active_mtu|max_mtu"' | sed 's/^/[guest] /'
RXE_STATS_BEFORE=$(guest 'rdma statistic show link rxe0/1')
# The guest kernel verifies the UDP checksum of every datagram before rxe sees it (softrdma's are
# non-zero, computed by the host kernel); /proc/net/snmp counts the failures.
guest_udp() { guest 'grep Udp: /proc/net/snmp | tail -n1' | awk '{ print $2, $8 }'; } # InDatagrams InCsumErrors
read -r UDP_IN_BEFORE UDP_CSUMERR_BEFORE <<<"$(guest_udp)"

# ---------------------------------------------------------------- case machinery
PASSED=0
FAILED=0
FAILURES=()
PORT=19000
WHY=""
SRV_LOG=/dev/null
CLI_LOG=/dev/null

case_wanted() { [[ -z $INTEROP_ONLY || $1 =~ $INTEROP_ONLY ]]; }

result() { # NAME OK T0
  local name=$1 ok=$2 t0=$3
  if ((ok)); then
    PASSED=$((PASSED + 1))
    log "PASS $name ($(elapsed "$t0")s)"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("$name: $WHY")
    log "FAIL $name: $WHY ($(elapsed "$t0")s)"
    local f
    for f in "$SRV_LOG" "$CLI_LOG"; do
      [[ -f $f ]] || continue
      echo "----- $(basename "$f") (last 25 lines) -----"
      tail -n 25 "$f"
    done
    echo "-----"
  fi
}

deadline_passed() { (($(date +%s) - T_START > INTEROP_DEADLINE)); }

# reap_after SECONDS PID: waits up to SECONDS for PID to exit, then sends it SIGTERM.
reap_after() {
  local i
  for ((i = 0; i < $1 * 10; i++)); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.1; done
  kill "$2" 2>/dev/null
}

# pair NAME ROLE IMPAIR -- ARGV...: runs ARGV (a tool and its arguments, without the device, GID,
# port or server address) as server on one side and client on the other. ROLE host-server: the
# server is softrdma on the host; host-client: the server is rxe in the guest. IMPAIR, if not "-",
# goes into SOFTRDMA_IMPAIR of the host process. Sets WHY, SRV_LOG, CLI_LOG; returns 0 when both
# exit 0.
pair() {
  local name=$1 role=$2 impair=$3
  shift 4
  local -a argv=("$@")
  local tool=${argv[0]} port=$((PORT++))
  local slug=${name//[^A-Za-z0-9_.-]/_}
  SRV_LOG=$INTEROP_LOG_DIR/$slug.server.log
  CLI_LOG=$INTEROP_LOG_DIR/$slug.client.log
  WHY=""
  # Device and GID flags differ between the tools: ibv_rc_pingpong -g, perftest -x.
  local gflag=-x
  [[ $tool == ibv_rc_pingpong ]] && gflag=-g
  # perftest -u 16 (268 ms) on the host side: perftest's default 14 (67 ms x retry_cnt 7 = 0.5 s)
  # is shorter than the stalls of a TCG guest on a loaded host, and softrdma, unlike rxe, does stop
  # after 7 retries as IBTA says (rxe treats 7 as "forever"). ibv_rc_pingpong has no such option.
  local -a extra=()
  [[ $tool == ib_* ]] && extra=(-u 16)
  local -a host_cmd=(timeout -k 5 "$INTEROP_TIMEOUT" "$SOFTRDMA" run -- "${argv[@]}" "${extra[@]}" -d "$DEV" "$gflag" "$GID_HOST" -p "$port")
  local guest_cmd="timeout -k 5 $INTEROP_TIMEOUT ${argv[*]} -d rxe0 $gflag $GID_GUEST -p $port"
  local -a env_cmd=(env)
  # SOFTRDMA_COUNTERS=1: the host process prints its drops, retransmits and NAKs at exit (the log).
  [[ $impair != - ]] && env_cmd+=("SOFTRDMA_IMPAIR=$impair" SOFTRDMA_COUNTERS=1)
  [[ ${PAIR_COUNTERS:-0} == 1 ]] && env_cmd+=(SOFTRDMA_COUNTERS=1)

  local spid crc=0 src=0 i
  if [[ $role == host-server ]]; then
    # ip netns exec execs the command: $! is the process itself, so it can be signalled.
    ip netns exec "$NS" "${env_cmd[@]}" "${host_cmd[@]}" >"$SRV_LOG" 2>&1 &
    spid=$!
    local hex
    hex=$(printf '%04X' "$port")
    for ((i = 0; i < 600; i++)); do
      nsx awk -v p=":$hex" 'NR>1 && $4=="0A" && substr($2, length($2)-4)==p { f=1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.1
    done
    if ((i == 600)) || ! kill -0 "$spid" 2>/dev/null; then
      WHY="host server never listened on port $port"
      kill "$spid" 2>/dev/null
      wait "$spid" 2>/dev/null
      return 1
    fi
    guest "$guest_cmd $HOST_IP" >"$CLI_LOG" 2>&1 || crc=$?
    # A failed client leaves the server waiting forever: give it a moment, then stop it.
    ((crc != 0)) && reap_after 15 "$spid"
    wait "$spid" || src=$?
  else
    # The guest server signals readiness once its TCP port listens (one ssh round trip, not a poll).
    guest "$guest_cmd & p=\$!; echo \$p > /tmp/interop-$port.pid; until ss -Hltn 'sport = :$port' | grep -q .; do kill -0 \$p 2>/dev/null || break; sleep 0.1; done; echo INTEROP-READY; wait \$p" >"$SRV_LOG" 2>&1 &
    spid=$!
    for ((i = 0; i < 1200; i++)); do
      grep -q INTEROP-READY "$SRV_LOG" 2>/dev/null && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q INTEROP-READY "$SRV_LOG" 2>/dev/null; then
      WHY="guest server never listened on port $port"
      kill "$spid" 2>/dev/null
      wait "$spid" 2>/dev/null
      return 1
    fi
    nsx "${env_cmd[@]}" "${host_cmd[@]}" "$GUEST_IP" >"$CLI_LOG" 2>&1 || crc=$?
    if ((crc != 0)); then
      # rxe retries forever (retry_cnt 7): stop the guest server by its recorded PID.
      for ((i = 0; i < 150; i++)); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$spid" 2>/dev/null && guest "kill \$(cat /tmp/interop-$port.pid)" >/dev/null 2>&1
    fi
    wait "$spid" || src=$?
  fi
  if ((crc != 0 || src != 0)); then
    WHY="exit codes: server $src, client $crc"
    ((crc == 124 || src == 124)) && WHY+=" (124: killed by timeout after ${INTEROP_TIMEOUT}s)"
    return 1
  fi
  return 0
}

run_pingpong() { # NAME ROLE IMPAIR MTU SIZE ITERS
  local name=$1 role=$2 impair=$3 mtu=$4 size=$5 iters=$6 t0
  case_wanted "$name" || return 0
  t0=$(date +%s)
  if deadline_passed; then
    WHY="not run: suite deadline (${INTEROP_DEADLINE}s) passed"
    result "$name" 0 "$t0"
    return
  fi
  local ok=0
  if pair "$name" "$role" "$impair" -- ibv_rc_pingpong -c -m "$mtu" -s "$size" -n "$iters"; then
    local want="$iters iters in"
    if ! grep -q "$want" "$SRV_LOG" || ! grep -q "$want" "$CLI_LOG"; then
      WHY="a side did not report '$want'"
    elif grep -qiE "fail|error|invalid" "$SRV_LOG" "$CLI_LOG"; then
      WHY="a side reported an error or corrupt payload"
    else
      ok=1
    fi
  fi
  result "$name" "$ok" "$t0"
}

# perftest prints one result row per message size under its "#bytes" header.
perftest_rows() {
  awk '/#bytes/ { t=1; next } t && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+/ { n++ } END { print n+0 }' "$1"
}

run_perftest() { # NAME ROLE IMPAIR TOOL ARGS...
  local name=$1 role=$2 impair=$3 t0
  shift 3
  case_wanted "$name" || return 0
  t0=$(date +%s)
  if deadline_passed; then
    WHY="not run: suite deadline (${INTEROP_DEADLINE}s) passed"
    result "$name" 0 "$t0"
    return
  fi
  local ok=0
  # -F: no failure on cpufreq warnings, which say nothing about the wire.
  if pair "$name" "$role" "$impair" -- "$@" -F; then
    local rows
    rows=$(perftest_rows "$CLI_LOG")
    if ((rows >= 1)); then ok=1; else WHY="client printed no result row"; fi
  fi
  result "$name" "$ok" "$t0"
}

# ---------------------------------------------------------------- the cases
log "logs: $INTEROP_LOG_DIR"

# Payload-checked SEND/RECV at both path MTUs, sizes from 1 B to 1 MiB, both roles.
for role in host-server host-client; do
  for mtu in 1024 4096; do
    for spec in 1:20 4096:20 65536:10 1048576:3; do
      size=${spec%%:*} iters=${spec##*:}
      run_pingpong "pingpong.$role.mtu$mtu.${size}B" "$role" - "$mtu" "$size" "$iters"
    done
  done
done

# perftest both ways (default sizes: 64 KiB for _bw, 2 B for _lat, 8 B atomics).
for role in host-server host-client; do
  run_perftest "perftest.$role.ib_write_bw" "$role" - ib_write_bw -n 100
  run_perftest "perftest.$role.ib_read_bw" "$role" - ib_read_bw -n 100
  run_perftest "perftest.$role.ib_send_bw" "$role" - ib_send_bw -n 100
  run_perftest "perftest.$role.ib_atomic_bw" "$role" - ib_atomic_bw -n 100
  run_perftest "perftest.$role.ib_atomic_bw.cmp_and_swap" "$role" - ib_atomic_bw -A CMP_AND_SWAP -n 100
  run_perftest "perftest.$role.ib_write_lat" "$role" - ib_write_lat -n 100
done

# softrdma loses 2 % of what it sends: as requester (rxe sees PSN gaps and NAKs, or stays silent and
# our retransmit timer fires) and as responder (lost ACKs and READ responses: rxe retransmits).
IMPAIR="seed=1,tx_drop=0.02"
for role in host-server host-client; do
  run_pingpong "impair.$role.pingpong.mtu1024.1MiB" "$role" "$IMPAIR" 1024 1048576 8
  run_perftest "impair.$role.ib_write_bw" "$role" "$IMPAIR" ib_write_bw -n 200
  run_perftest "impair.$role.ib_read_bw" "$role" "$IMPAIR" ib_read_bw -n 200
  run_perftest "impair.$role.ib_send_bw" "$role" "$IMPAIR" ib_send_bw -n 200
done

# The host's UDP 4791, through which rxe reaches every softrdma process of the host, is bound by
# another process (an ibv_rc_pingpong server that waits for nobody), stopped for 10 s while the pair
# runs; the pair's host process took the same socket from it and reads it meanwhile
# (docs/reliability.md, "The 4791 holder"). Each must finish its whole run, the host side's counters
# must show it stood in, and the holder must have been stopped when the pair began to move data.
run_holder() { # NAME ROLE
  local name=$1 role=$2 t0 hport h hpid stopper i n ok=0
  case_wanted "$name" || return 0
  t0=$(date +%s)
  hport=$((PORT++))
  nsx timeout -k 5 "$INTEROP_TIMEOUT" "$SOFTRDMA" run -- ibv_rc_pingpong -d "$DEV" -g "$GID_HOST" -p "$hport" \
    >"$INTEROP_LOG_DIR/$name.holder.log" 2>&1 &
  h=$!
  for ((i = 0; i < 100; i++)); do
    nsx ss -xlH 2>/dev/null | grep -q '@softrdma-share/' && break
    sleep 0.1
  done
  hpid=$(pgrep -P "$h" | head -n1 || true)
  [[ -n $hpid ]] || hpid=$h
  # Once the pair's host process has taken the socket (a second offer), the holder stops for 10 s.
  (
    for ((i = 0; i < 600; i++)); do
      n=$(nsx ss -xlH 2>/dev/null | grep -c '@softrdma-share/' || true)
      ((n >= 2)) && break
      sleep 0.1
    done
    kill -STOP "$hpid"
    echo "holder stopped" >>"$INTEROP_LOG_DIR/$name.holder.log"
    sleep 10
    kill -CONT "$hpid"
  ) &
  stopper=$!
  if PAIR_COUNTERS=1 pair "$name" "$role" - -- ib_write_bw -F -D 14; then
    if (($(perftest_rows "$CLI_LOG") < 1)); then WHY="client printed no result row"
    elif ! grep -q 'holder stopped' "$INTEROP_LOG_DIR/$name.holder.log"; then WHY="the holder was never stopped"
    elif ! grep -hq 'roce_stand_in [1-9]' "$SRV_LOG" "$CLI_LOG"; then WHY="the host side never stood in (roce_stand_in)"
    else ok=1; fi
  fi
  wait "$stopper" 2>/dev/null
  kill -CONT "$hpid" 2>/dev/null
  kill "$hpid" 2>/dev/null
  wait "$h" 2>/dev/null
  result "$name" "$ok" "$t0"
}
run_holder holder.host-server.ib_write_bw host-server
run_holder holder.host-client.ib_write_bw host-client

# Capture: a little of every operation both ways, then tshark and the ICRC check on the pcap.
run_capture() {
  local name=capture t0
  case_wanted "$name" || return 0
  t0=$(date +%s)
  local pcap=$INTEROP_LOG_DIR/capture.pcap
  rm -f "$pcap"
  # -F pcap: icrc_check.py reads libpcap; tshark runs as root in the namespace.
  ip netns exec "$NS" tshark -q -i rxebr0 -f 'udp port 4791' -F pcap -w "$pcap" >"$INTEROP_LOG_DIR/tshark-capture.log" 2>&1 &
  CAPTURE_PID=$!
  local i
  for ((i = 0; i < 300; i++)); do
    grep -q "Capturing on" "$INTEROP_LOG_DIR/tshark-capture.log" 2>/dev/null && break
    sleep 0.1
  done
  local sub_ok=1 sub
  local -a subs=()
  for role in host-server host-client; do
    pair "capture.$role.pingpong" "$role" - -- ibv_rc_pingpong -c -m 1024 -s 3000 -n 2 || { sub_ok=0; subs+=("pingpong.$role: $WHY"); }
    pair "capture.$role.ib_write_bw" "$role" - -- ib_write_bw -F -m 1024 -s 2500 -n 5 || { sub_ok=0; subs+=("ib_write_bw.$role: $WHY"); }
    pair "capture.$role.ib_read_bw" "$role" - -- ib_read_bw -F -m 1024 -s 2500 -n 5 || { sub_ok=0; subs+=("ib_read_bw.$role: $WHY"); }
    pair "capture.$role.ib_atomic_bw" "$role" - -- ib_atomic_bw -F -n 5 || { sub_ok=0; subs+=("ib_atomic_bw.$role: $WHY"); }
    pair "capture.$role.ib_send_bw" "$role" - -- ib_send_bw -F -m 1024 -s 10 -n 5 || { sub_ok=0; subs+=("ib_send_bw.$role: $WHY"); }
  done
  sleep 1
  kill -TERM "$CAPTURE_PID" 2>/dev/null  # background jobs ignore SIGINT; tshark ends cleanly on TERM
  wait "$CAPTURE_PID" 2>/dev/null
  CAPTURE_PID=""
  SRV_LOG=/dev/null
  CLI_LOG=/dev/null
  if ((!sub_ok)); then
    WHY="traffic failed: ${subs[*]}"
    result "$name.traffic" 0 "$t0"
  else
    PASSED=$((PASSED + 1))
    log "PASS $name.traffic ($(elapsed "$t0")s)"
  fi

  # Decode: every softrdma packet to UDP 4791 is InfiniBand, none malformed, no warnings/errors.
  local ts=(tshark -r "$pcap" --disable-protocol rpcordma -o ip.check_checksum:TRUE)
  local ours="ip.src==$HOST_IP && udp.dstport==4791"
  local n_ours n_ib n_bad n_malformed
  n_ours=$("${ts[@]}" -Y "$ours" 2>/dev/null | wc -l)
  n_ib=$("${ts[@]}" -Y "$ours && infiniband.bth" 2>/dev/null | wc -l)
  n_malformed=$("${ts[@]}" -Y "$ours && _ws.malformed" 2>/dev/null | wc -l)
  n_bad=$("${ts[@]}" -Y "$ours && (_ws.expert.severity >= 0x00600000)" 2>/dev/null | wc -l)
  "${ts[@]}" -Y "$ours" -T fields -e _ws.col.Info 2>/dev/null | sed -E 's/ QP=.*//' | sort | uniq -c | sort -rn \
    >"$INTEROP_LOG_DIR/capture-opcodes.txt"
  "${ts[@]}" -q -z expert,note 2>/dev/null >"$INTEROP_LOG_DIR/capture-expert.txt"
  echo "capture: $n_ours softrdma packets, $n_ib decoded as InfiniBand, $n_malformed malformed, $n_bad with warning/error expert info"
  echo "capture: softrdma's packets by kind:"
  sed 's/^/    /' "$INTEROP_LOG_DIR/capture-opcodes.txt"
  t0=$(date +%s)
  WHY=""
  if ((n_ours == 0)); then
    WHY="no softrdma packets captured"
  elif ((n_ib != n_ours || n_malformed != 0 || n_bad != 0)); then
    WHY="$((n_ours - n_ib)) not decoded as InfiniBand, $n_malformed malformed, $n_bad with warnings (see capture-expert.txt)"
  else
    # The headers each operation needs must be there, from softrdma.
    local f
    # RC opcodes: 0x00/0x02 SEND First/Last, 0x04 SEND Only, 0x06 WRITE First, 0x0c READ Request,
    # 0x0d/0x0f READ Response First/Last, 0x11 Acknowledge, 0x12 Atomic Acknowledge, 0x14 FetchAdd.
    local op
    for op in 0x00 0x02 0x04 0x06 0x0c 0x0d 0x0f 0x11 0x12 0x14; do
      [[ $("${ts[@]}" -Y "$ours && infiniband.bth.opcode==$op" 2>/dev/null | wc -l) -gt 0 ]] || WHY+="no softrdma packet with opcode $op; "
    done
    for f in "infiniband.reth" "infiniband.aeth" "infiniband.atomiceth" "infiniband.atomicacketh" \
      "infiniband.reth.dmalen==2500" "infiniband.aeth.syndrome.opcode==0"; do
      if [[ $("${ts[@]}" -Y "$ours && $f" 2>/dev/null | wc -l) -eq 0 ]]; then
        WHY+="no softrdma packet with $f; "
      fi
    done
  fi
  [[ -z $WHY ]] && result "$name.tshark-decode" 1 "$t0" || result "$name.tshark-decode" 0 "$t0"

  # ICRC of every packet, both stacks, recomputed from the spec.
  t0=$(date +%s)
  python3 "$HERE/icrc_check.py" "$pcap" | tee "$INTEROP_LOG_DIR/capture-icrc.txt"
  if ((PIPESTATUS[0] == 0)) && grep -q "^icrc: $HOST_IP: [1-9]" "$INTEROP_LOG_DIR/capture-icrc.txt" &&
    grep -q "^icrc: $GUEST_IP: [1-9]" "$INTEROP_LOG_DIR/capture-icrc.txt"; then
    result "$name.icrc" 1 "$t0"
  else
    WHY="ICRC mismatch, or no packets from one side (capture-icrc.txt)"
    result "$name.icrc" 0 "$t0"
  fi
}
run_capture

# cm_roles ROLE PORT HOST_SERVER GUEST_CLIENT GUEST_SERVER HOST_CLIENT: one rdma_cm program pair in
# ROLE (commands as words; the host's run under softrdma in the namespace), the server first and
# ready: the host's after a second, the guest's once its kernel lists the id listening on PORT. Sets
# CRC and SRC, the client's and the server's exit codes.
cm_roles() {
  local role=$1 port=$2 hs=$3 gc=$4 gs=$5 hc=$6 spid i
  CRC=0 SRC=0
  if [[ $role == host-server ]]; then
    # shellcheck disable=SC2086 # the command's words
    nsx timeout -k 5 "$INTEROP_TIMEOUT" "$SOFTRDMA" run -- $hs >"$SRV_LOG" 2>&1 &
    spid=$!
    sleep 1
    guest "timeout -k 5 $INTEROP_TIMEOUT $gc" >"$CLI_LOG" 2>&1 || CRC=$?
    ((CRC != 0)) && reap_after 15 "$spid"
    wait "$spid" || SRC=$?
  else
    guest "timeout -k 5 $INTEROP_TIMEOUT $gs & p=\$!; until rdma res show cm_id | grep -q 'LISTEN.*:$port '; do kill -0 \$p 2>/dev/null || break; sleep 0.1; done; echo INTEROP-READY; wait \$p" >"$SRV_LOG" 2>&1 &
    spid=$!
    for ((i = 0; i < 600; i++)); do
      grep -q INTEROP-READY "$SRV_LOG" 2>/dev/null && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    nsx timeout -k 5 "$INTEROP_TIMEOUT" "$SOFTRDMA" run -- $hc >"$CLI_LOG" 2>&1 || CRC=$?
    wait "$spid" || SRC=$?
  fi
}

# cm_case NAME: starts a case (its logs, its time); false when INTEROP_ONLY leaves it out.
cm_case() {
  case_wanted "$1" || return 1
  T0=$(date +%s)
  SRV_LOG=$INTEROP_LOG_DIR/$1.server.log
  CLI_LOG=$INTEROP_LOG_DIR/$1.client.log
  WHY=""
}

# rdma_cm: rping -v (payload verified by rping) between softrdma's librdmacm and the kernel's rdma_cm,
# both ways: IBTA CM MADs (REQ/REP/RTU/DREQ/DREP) to QP1 on the wire (docs/rdmacm.md).
run_rping() { # NAME ROLE
  local name=$1 port=$((PORT++)) n o="-v -C 100"
  cm_case "$name" || return 0
  cm_roles "$2" "$port" "rping -s -a $HOST_IP -p $port $o" "rping -c -a $HOST_IP -p $port $o" \
    "rping -s -a $GUEST_IP -p $port $o" "rping -c -a $GUEST_IP -p $port $o"
  n=$(grep -o 'rdma-ping-[0-9]*: ' "$CLI_LOG" | sort -u | wc -l)
  if ((CRC == 0 && SRC == 0 && n == 100)); then
    result "$name" 1 "$T0"
  else
    WHY="exit codes: server $SRC, client $CRC; client verified $n of 100 pings"
    result "$name" 0 "$T0"
  fi
}
run_rping rdmacm.rping.host-server host-server
run_rping rdmacm.rping.host-client host-client

# UD ids: udaddy (SIDR_REQ/SIDR_REP, then 10 datagrams each way) on its fixed port 7174, both ways.
run_udaddy() { # NAME ROLE
  local name=$1
  cm_case "$name" || return 0
  cm_roles "$2" 7174 "udaddy -b $HOST_IP -C 10" "udaddy -s $HOST_IP -C 10" "udaddy -b $GUEST_IP -C 10" \
    "udaddy -s $GUEST_IP -C 10"
  if ((CRC == 0 && SRC == 0)) && grep -q 'return status 0' "$CLI_LOG" && grep -q 'data transfers complete' "$SRV_LOG"; then
    result "$name" 1 "$T0"
  else
    WHY="exit codes: server $SRC, client $CRC"
    result "$name" 0 "$T0"
  fi
}
run_udaddy rdmacm.udaddy.host-server host-server
run_udaddy rdmacm.udaddy.host-client host-client

# rsockets: rstream -T v (every byte verified by rstream) between softrdma's rsockets (librdmacm.so.1,
# src/rdmacm/rsocket.cpp) and rdma-core's over the kernel's rxe, both ways: rs_conn_data in the CM
# REQ/REP, data as RDMA WRITE WITH IMMEDIATE into the granted ring, SGL updates and credits.
run_rstream() { # NAME ROLE
  local name=$1 port=$((PORT++)) o="-S 65536 -C 100 -T v"
  cm_case "$name" || return 0
  cm_roles "$2" "$port" "rstream -b $HOST_IP -p $port $o" "rstream -s $HOST_IP -p $port $o" \
    "rstream -b $GUEST_IP -p $port $o" "rstream -s $GUEST_IP -p $port $o"
  if ((CRC == 0 && SRC == 0)) && grep -qE '^custom ' "$CLI_LOG"; then
    result "$name" 1 "$T0"
  else
    WHY="exit codes: server $SRC, client $CRC (no custom row, or a verify failure, in the client log)"
    result "$name" 0 "$T0"
  fi
}
run_rstream rsocket.rstream.host-server host-server
run_rstream rsocket.rstream.host-client host-client

# RoCEv2 over UDP/IPv6 (issue 29): a global IPv6 address on the bridge and on the guest's eth0; the
# host side runs on softrdma6_<bridge> (GID 0, the address), rxe on the GID of the guest's global
# address, then on its link-local one (rxe's default GID, index 0). The programs' own TCP connection
# stays IPv4 (ibv_rc_pingpong and Debian 12's perftest resolve their peer in AF_INET).
HOST_IP6=fd77:77::1
GUEST_IP6=fd77:77::11
ipv6_wanted=0
for c in ipv6.pingpong.host-server ipv6.pingpong.host-client; do case_wanted "$c" && ipv6_wanted=1; done
case_wanted ipv6.perftest.host-server.ib_write_bw && ipv6_wanted=1
for c in ipv6.rdmacm.rping.host-server ipv6.rsocket.rstream.host-server; do case_wanted "$c" && ipv6_wanted=1; done
if ((ipv6_wanted)); then
  nsx ip -6 addr replace "$HOST_IP6/64" dev rxebr0 nodad
  guest "ip -6 addr replace $GUEST_IP6/64 dev eth0 nodad" >/dev/null 2>&1
  # rxe's GID of an address, by its sysfs form (full hex groups).
  gid_of() { # PATTERN: the index of the first rxe0 GID that matches
    guest "d=/sys/class/infiniband/rxe0/ports/1; g=0; while [ -e \$d/gids/\$g ]; do read -r x < \$d/gids/\$g; case \$x in $1) echo \$g; exit 0;; esac; g=\$((g+1)); done; exit 1"
  }
  G6=""
  for ((i = 0; i < 50; i++)); do
    G6=$(gid_of 'fd77:0077:0000:0000:0000:0000:0000:0011') && break
    sleep 0.2
  done
  GLL=$(gid_of 'fe80:*' || true)
  DEV6=$(nsx "$SOFTRDMA" devices --ip "$HOST_IP6" 2>/dev/null | head -n1)
  log "IPv6: host $DEV6 ($HOST_IP6, GID 0); guest rxe0 GID $G6 ($GUEST_IP6), link-local GID $GLL"
  if [[ -n $DEV6 && -n $G6 ]]; then
    SAVED=("$DEV" "$GID_GUEST")
    DEV=$DEV6
    for role in host-server host-client; do
      GID_GUEST=$G6
      run_pingpong "ipv6.pingpong.$role.mtu1024.65536B" "$role" - 1024 65536 10
      run_perftest "ipv6.perftest.$role.ib_write_bw" "$role" - ib_write_bw -n 100
      run_perftest "ipv6.perftest.$role.ib_read_bw" "$role" - ib_read_bw -n 100
      [[ -n $GLL ]] && GID_GUEST=$GLL && run_pingpong "ipv6.linklocal.pingpong.$role.mtu1024.4096B" "$role" - 1024 4096 20
    done
    DEV=${SAVED[0]}
    GID_GUEST=${SAVED[1]}
    # rdma_cm and rsockets over IPv6: the CM's MADs over UDP/IPv6 with the version-6 rdma_cm header,
    # then rping's and rstream's verified data (both addresses IPv6 here, the TCP of neither program).
    SAVED=("$HOST_IP" "$GUEST_IP")
    HOST_IP=$HOST_IP6 GUEST_IP=$GUEST_IP6
    for role in host-server host-client; do
      run_rping "ipv6.rdmacm.rping.$role" "$role"
      run_rstream "ipv6.rsocket.rstream.$role" "$role"
    done
    HOST_IP=${SAVED[0]} GUEST_IP=${SAVED[1]}
  else
    t0=$(date +%s)
    WHY="no IPv6 device on the host ($DEV6) or no rxe GID for $GUEST_IP6 ($G6)"
    result ipv6.setup 0 "$t0"
  fi
fi

# Every datagram the guest received during the suite passed its UDP checksum check (IPv4's: not
# checked when INTEROP_ONLY leaves it out).
case_wanted guest.udp-checksums && {
t0=$(date +%s)
read -r UDP_IN_AFTER UDP_CSUMERR_AFTER <<<"$(guest_udp)"
echo "guest UDP: $((UDP_IN_AFTER - UDP_IN_BEFORE)) datagrams received, $((UDP_CSUMERR_AFTER - UDP_CSUMERR_BEFORE)) checksum errors"
SRV_LOG=/dev/null
CLI_LOG=/dev/null
if ((UDP_IN_AFTER > UDP_IN_BEFORE && UDP_CSUMERR_AFTER == UDP_CSUMERR_BEFORE)); then
  result guest.udp-checksums 1 "$t0"
else
  WHY="guest UdpInCsumErrors went from $UDP_CSUMERR_BEFORE to $UDP_CSUMERR_AFTER"
  result guest.udp-checksums 0 "$t0"
fi
}

# ---------------------------------------------------------------- summary
echo
echo "rxe counters before: $RXE_STATS_BEFORE"
echo "rxe counters after:  $(guest 'rdma statistic show link rxe0/1')"
echo "logs: $INTEROP_LOG_DIR"
echo "suite time: $(elapsed "$T_START")s (guest start/stop included)"
echo "$PASSED passed, $FAILED failed"
for f in "${FAILURES[@]+"${FAILURES[@]}"}"; do echo "  FAILED: $f"; done
((FAILED == 0 && PASSED > 0))
