# Shared helpers of the compat tests, the demo and the loopback benchmark (sourced, not run).
#
# The programs under test are unmodified Debian binaries; they load our libraries only through
# `softrdma run`. A test is a series of server/client pairs; a failing pair does not stop the
# series, so one run reports every broken case. Call compat_finish at the end for the exit code.
#
# Environment:
#   SOFTRDMA_BIN     directory holding the softrdma command (default: <repo>/build/bin)
#   COMPAT_TIMEOUT   seconds each server and client may run (default 120)
#   COMPAT_LOG_DIR   where the logs of each process go (default: a fresh temporary directory)
#   COMPAT_VERBOSE   1: print every client's output, not only failing ones
#   COMPAT_RESULTS   a file to which each case's outcome is appended as "NAME<TAB>PASS|FAIL<TAB>WHY"
#                    (bench/ecosystem.sh builds docs/ecosystem-table.md from it)

compat_repo_root() { (cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); }

SOFTRDMA_BIN=${SOFTRDMA_BIN:-$(compat_repo_root)/build/bin}
SOFTRDMA=${SOFTRDMA:-$SOFTRDMA_BIN/softrdma}
COMPAT_TIMEOUT=${COMPAT_TIMEOUT:-120}
COMPAT_VERBOSE=${COMPAT_VERBOSE:-0}
if [[ -z ${COMPAT_LOG_DIR:-} ]]; then
  COMPAT_LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-compat.XXXXXX")
fi
mkdir -p "$COMPAT_LOG_DIR"

COMPAT_PASSED=0
COMPAT_FAILED=0
COMPAT_FAILURES=()
PAIR_WHY=""
PAIR_SRV_LOG=/dev/null
PAIR_CLI_LOG=/dev/null

compat_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

compat_require_softrdma() {
  if [[ ! -x $SOFTRDMA ]]; then
    echo "FAIL: no softrdma command at $SOFTRDMA (set SOFTRDMA_BIN to <build>/bin)" >&2
    exit 1
  fi
}

# compat_device IP [NS_PREFIX...]: the name of the softrdma device bound to IP, as the library
# itself reports it (inside a network namespace when a prefix such as `ip netns exec X` is given).
compat_device() {
  local ip=$1
  shift
  local dev
  if dev=$("$@" "$SOFTRDMA" devices --ip "$ip" 2>/dev/null | head -n1) && [[ -n $dev ]]; then
    echo "$dev"
    return 0
  fi
  echo "FAIL: no softrdma device bound to $ip; \`softrdma devices\` says:" >&2
  "$@" "$SOFTRDMA" devices >&2 || true
  return 1
}

# A TCP port nobody uses now, from a random start so parallel runs rarely meet. Ports in any
# state count as used: a TIME_WAIT socket can still make bind() fail without SO_REUSEADDR.
compat_free_port() {
  local used port
  used=$(awk 'NR>1 { n=split($2, a, ":"); print a[n] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null | sort -u)
  port=$((20000 + RANDOM % 20000))
  while grep -qx "$(printf '%04X' "$port")" <<<"$used"; do port=$((port + 1)); done
  echo "$port"
}

# udp_bound PORT [NS_PREFIX...]: whether a UDP socket is bound to PORT (rdma_cm ports are UDP ports).
udp_bound() { # PORT PREFIX...
  local hex
  hex=$(printf '%04X' "$1")
  shift
  "$@" awk -v p=":$hex" 'FNR>1 && substr($2, length($2)-4)==p { f=1 } END { exit !f }' /proc/net/udp /proc/net/udp6
}

# rping_pair NAME SERVER_ADDR CLIENT_ADDR COUNT: rping -v with COUNT pings; the client must verify
# every one (rping checks the data) and the server print the last.
rping_pair() {
  local name=$1 port n
  port=$(cm_free_port)
  SRV=(rping -s -a "$2" -p "$port" -v -C "$4")
  CLI=(rping -c -a "$3" -p "$port" -v -C "$4")
  if cm_pair "$name" "$port"; then
    # rping's stdout and stderr interleave mid-line, so count the pattern, not whole lines.
    n=$(grep -o 'rdma-ping-[0-9]*: ' "$PAIR_CLI_LOG" | sort -u | wc -l)
    if ((n == $4)) && grep -q "rdma-ping-$(($4 - 1)): " "$PAIR_SRV_LOG"; then compat_result "$name" 1
    else compat_result "$name" 0 "client verified $n of $4 pings"; fi
  else
    compat_result "$name" 0
  fi
}

# An rdma_cm port is a UDP port here: a free port must be free for UDP too (other softrdma processes
# hold ephemeral UDP ports), not only for TCP as compat_free_port checks.
cm_free_port() {
  local port
  while :; do
    port=$(compat_free_port)
    udp_bound "$port" || { echo "$port"; return; }
  done
}

# mckey_pair LABEL RECEIVER_IP SENDER_IP: a receiver joins a group, then a sender joins and sends 10
# datagrams to it; the receiver must get all 10 ("data transfers complete"). The group is a random
# 239.x.y.z, or ff0e::1:<n> when the addresses are IPv6. SRV_PREFIX / CLI_PREFIX as for compat_pair.
mckey_pair() {
  local where=$1 rip=$2 sip=$3 rpid i crc=0 rrc=0 group sock procfile name="$1 mckey" g1 g2 g3
  local -a sp=("${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}") cp=("${CLI_PREFIX[@]+"${CLI_PREFIX[@]}"}")
  g1=$((RANDOM % 256)) g2=$((RANDOM % 256)) g3=$((1 + RANDOM % 254))
  # The receiver's QP is attached once its context holds a UDP socket on group:4791 (as /proc shows
  # it: IPv4 as one little-endian word, IPv6 as four).
  if [[ $rip == *:* ]]; then
    group=ff0e::1:$g3 procfile=/proc/net/udp6
    sock=$(printf '00000EFF000000000000000000%02X0100:12B7' "$g3")
  else
    group=239.$g1.$g2.$g3 procfile=/proc/net/udp
    sock=$(printf '%02X%02X%02X%02X:12B7' "$g3" "$g2" "$g1" 239)
  fi
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/${where}_mckey.receiver.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/${where}_mckey.sender.log
  compat_log "$name: receiver: mckey -m $group -b $rip -C 10"
  "${sp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- mckey -m "$group" -b "$rip" -C 10 >"$PAIR_SRV_LOG" 2>&1 &
  rpid=$!
  for ((i = 0; i < 300; i++)); do
    "${sp[@]}" awk -v s="$sock" 'NR>1 && $2==s { f=1 } END { exit !f }' "$procfile" && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
  done
  compat_log "$name: sender: mckey -m $group -b $sip -s -C 10"
  "${cp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- mckey -m "$group" -b "$sip" -s -C 10 >"$PAIR_CLI_LOG" 2>&1 || crc=$?
  wait "$rpid" || rrc=$?
  if ((crc == 0 && rrc == 0)) && grep -q 'data transfers complete' "$PAIR_SRV_LOG"; then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "exit codes: receiver $rrc, sender $crc"
  fi
}

# cm_pair NAME PORT [serving]: runs SRV, waits for its rdma_cm port (a UDP port, docs/rdmacm.md),
# runs CLI; both must exit 0. With "serving", SRV is a server that never exits: it is stopped once
# the client is done, and the client's exit code alone counts. CM_PAIR_CHECK (an array, may be
# empty) is a command run while the server is up, before the client; its failure fails the pair
# (it may set PAIR_WHY). SRV_PREFIX / CLI_PREFIX as for compat_pair.
cm_pair() {
  local name=$1 port=$2 serving=${3:-} i crc=0 src=0 ok=1
  pair_start_server "$name"
  for ((i = 0; i < 300; i++)); do
    udp_bound "$port" "${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}" && break
    kill -0 "$PAIR_SRV_PID" 2>/dev/null || break
    sleep 0.1
  done
  if ((${#CM_PAIR_CHECK[@]})); then "${CM_PAIR_CHECK[@]}" || ok=0; fi
  pair_run_client "$name" || crc=$?
  [[ -n $serving ]] && kill "$PAIR_SRV_PID" 2>/dev/null
  wait "$PAIR_SRV_PID" || src=$?
  [[ -n $serving ]] && src=0
  if ((crc != 0 || src != 0)); then
    PAIR_WHY="exit codes: server $src, client $crc"
    return 1
  fi
  return $((1 - ok))
}
CM_PAIR_CHECK=()

# compat_wait_listen PORT PID [NS_PREFIX...]: waits until something listens on TCP PORT (in the
# namespace of the prefix), without connecting to it: perftest servers accept exactly one peer.
compat_wait_listen() {
  local port=$1 pid=$2
  shift 2
  local hex i
  hex=$(printf '%04X' "$port")
  for ((i = 0; i < 300; i++)); do
    if "$@" awk -v p=":$hex" 'NR>1 && $4=="0A" && substr($2, length($2)-4)==p { f=1 } END { exit !f }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# compat_pair NAME PORT: runs the server argv in array SRV, waits for it to listen on PORT, then
# the client argv in array CLI. SRV_PREFIX / CLI_PREFIX (arrays, may be empty) go in front of
# `timeout`, e.g. (ip netns exec nsA). Both must exit 0. Sets PAIR_SRV_LOG, PAIR_CLI_LOG.
# Returns 0 on success; the caller adds its own output checks and calls compat_result.
compat_pair() {
  local name=$1 port=$2
  pair_start_server "$name"
  if ! compat_wait_listen "$port" "$PAIR_SRV_PID" "${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}"; then
    PAIR_WHY="server never listened on port $port"
    kill "$PAIR_SRV_PID" 2>/dev/null || true
    wait "$PAIR_SRV_PID" 2>/dev/null || true
    return 1
  fi
  local crc=0 src=0
  pair_run_client "$name" || crc=$?
  wait "$PAIR_SRV_PID" || src=$?
  if ((crc != 0 || src != 0)); then
    PAIR_WHY="exit codes: server $src, client $crc"
    ((crc == 124 || src == 124)) && PAIR_WHY+=" (124: killed by timeout after ${COMPAT_TIMEOUT}s)"
    return 1
  fi
  return 0
}

# pair_start_server NAME: the logs of pair NAME (PAIR_SRV_LOG, PAIR_CLI_LOG), PAIR_WHY cleared, and
# SRV started in the background (behind SRV_PREFIX), its pid in PAIR_SRV_PID.
pair_start_server() {
  local slug=${1//[^A-Za-z0-9_.-]/_}
  PAIR_SRV_LOG=$COMPAT_LOG_DIR/$slug.server.log
  PAIR_CLI_LOG=$COMPAT_LOG_DIR/$slug.client.log
  PAIR_WHY=""
  local -a sp=("${SRV_PREFIX[@]+"${SRV_PREFIX[@]}"}")
  compat_log "$1: server: ${SRV[*]}"
  "${sp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- "${SRV[@]}" >"$PAIR_SRV_LOG" 2>&1 &
  PAIR_SRV_PID=$!
}

# pair_run_client NAME: runs CLI (behind CLI_PREFIX) to its end; its exit code.
pair_run_client() {
  local -a cp=("${CLI_PREFIX[@]+"${CLI_PREFIX[@]}"}")
  compat_log "$1: client: ${CLI[*]}"
  "${cp[@]}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- "${CLI[@]}" >"$PAIR_CLI_LOG" 2>&1
}

# compat_result NAME OK [WHY]: records the outcome of one case and prints the logs of a failure.
compat_result() {
  local name=$1 ok=$2 why=${3:-$PAIR_WHY}
  if [[ -n ${COMPAT_RESULTS:-} ]]; then
    printf '%s\t%s\t%s\n' "$name" "$([[ $ok == 1 ]] && echo PASS || echo FAIL)" \
      "$([[ $ok == 1 ]] || echo "${why//$'\n'/ }")" >>"$COMPAT_RESULTS"
  fi
  if [[ $ok == 1 ]]; then
    COMPAT_PASSED=$((COMPAT_PASSED + 1))
    compat_log "PASS $name"
    if [[ $COMPAT_VERBOSE == 1 && -f $PAIR_CLI_LOG ]]; then cat "$PAIR_CLI_LOG"; fi
  else
    COMPAT_FAILED=$((COMPAT_FAILED + 1))
    COMPAT_FAILURES+=("$name: $why")
    compat_log "FAIL $name: $why"
    local f
    for f in "$PAIR_SRV_LOG" "$PAIR_CLI_LOG"; do
      [[ -f $f ]] || continue
      echo "----- $(basename "$f") (last 40 lines) -----"
      tail -n 40 "$f"
    done
    echo "-----"
  fi
}

# perftest prints one result row per message size under a "#bytes" header.
compat_perftest_rows() {
  awk '/#bytes/ { t=1; next } t && /^[[:space:]]*[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+/ { n++ } END { print n+0 }' "$1"
}

# compat_perftest NAME MIN_ROWS SERVER_ARGS... -- CLIENT_ARGS...: one perftest pair, which passes
# when both exit 0 and the client prints at least MIN_ROWS rows of its result table.
compat_perftest() {
  local name=$1 min_rows=$2 port
  shift 2
  SRV=()
  while (($#)) && [[ $1 != -- ]]; do SRV+=("$1"); shift; done
  shift
  CLI=("$@")
  port=$(compat_free_port)
  SRV+=(-p "$port")
  # The host argument of perftest goes last, after the port.
  local host=${CLI[-1]}
  unset 'CLI[-1]'
  CLI+=(-p "$port" "$host")
  if compat_pair "$name" "$port"; then
    local rows
    rows=$(compat_perftest_rows "$PAIR_CLI_LOG")
    if ((rows >= min_rows)); then
      compat_result "$name" 1
    else
      compat_result "$name" 0 "result table has $rows rows, expected at least $min_rows"
    fi
  else
    compat_result "$name" 0
  fi
}

compat_finish() {
  echo
  echo "logs: $COMPAT_LOG_DIR"
  echo "$COMPAT_PASSED passed, $COMPAT_FAILED failed"
  local f
  for f in "${COMPAT_FAILURES[@]+"${COMPAT_FAILURES[@]}"}"; do echo "  FAILED: $f"; done
  ((COMPAT_FAILED == 0 && COMPAT_PASSED > 0))
}

# compat_short_names NS_A IF_A NEW_A NS_B IF_B NEW_B: renames the two veth ends and waits for the link
# (UCX keeps 15 characters of a memory domain name, and softrdma names a device softrdma_<interface>).
compat_short_names() {
  local i
  ip -n "$1" link set "$2" down
  ip -n "$4" link set "$5" down
  ip -n "$1" link set "$2" name "$3"
  ip -n "$4" link set "$5" name "$6"
  ip -n "$1" link set "$3" up
  ip -n "$4" link set "$6" up
  for ((i = 0; i < 50; i++)); do
    ip -n "$1" link show "$3" | grep -q 'state UP' && ip -n "$4" link show "$6" | grep -q 'state UP' && return 0
    sleep 0.1
  done
  return 0
}

# compat_netns_setup: two "hosts" (network namespaces joined by a veth pair), torn down at exit.
# Sets nsA nsB ipA ipB devA devB (softrdma device of each side) and the prefixes inA/inB
# (`ip netns exec X`). Exits 77 (skip) without root or netns/veth support. COMPAT_NETNS_MTU, when
# set, is the MTU of both veth ends (default: the kernel's, 1500).
compat_netns_setup() {
  if [[ $(id -u) != 0 ]]; then
    echo "SKIP: this test needs root (to create network namespaces)"
    exit 77
  fi
  if ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: this test needs iproute2's \`ip netns\`"
    exit 77
  fi

  # Unique per run, so parallel or aborted runs never collide; veth names fit IFNAMSIZ (15).
  local i
  tag=$$$RANDOM
  nsA=softrdma-a-$tag
  nsB=softrdma-b-$tag
  vethA=srA$tag
  vethB=srB$tag
  vethA=${vethA:0:15}
  vethB=${vethB:0:15}
  ipA=10.77.0.1
  ipB=10.77.0.2

  cleanup() {
    ip netns pids "$nsA" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns pids "$nsB" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip netns del "$nsA" 2>/dev/null || true
    ip netns del "$nsB" 2>/dev/null || true
  }
  trap cleanup EXIT INT TERM

  if ! ip netns add "$nsA" || ! ip netns add "$nsB"; then
    echo "SKIP: cannot create network namespaces here (container without CAP_SYS_ADMIN?)"
    exit 77
  fi
  if ! ip link add "$vethA" netns "$nsA" type veth peer name "$vethB" netns "$nsB"; then
    echo "SKIP: cannot create a veth pair here (no veth support or CAP_NET_ADMIN)"
    exit 77
  fi
  ip -n "$nsA" addr add "$ipA/24" dev "$vethA"
  ip -n "$nsB" addr add "$ipB/24" dev "$vethB"
  if [[ -n ${COMPAT_NETNS_MTU:-} ]]; then
    ip -n "$nsA" link set "$vethA" mtu "$COMPAT_NETNS_MTU"
    ip -n "$nsB" link set "$vethB" mtu "$COMPAT_NETNS_MTU"
  fi
  for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
  ip -n "$nsA" link set "$vethA" up
  ip -n "$nsB" link set "$vethB" up
  # Wait for the veth link to come up (it needs both ends up) and its addresses to be usable.
  for ((i = 0; i < 50; i++)); do
    if ip -n "$nsA" link show "$vethA" | grep -q 'state UP' &&
      ip -n "$nsB" link show "$vethB" | grep -q 'state UP' &&
      ! ip -n "$nsA" addr show "$vethA" | grep -q tentative; then
      break
    fi
    sleep 0.1
  done

  inA=(ip netns exec "$nsA")
  inB=(ip netns exec "$nsB")
  devA=$(compat_device "$ipA" "${inA[@]}")
  devB=$(compat_device "$ipB" "${inB[@]}")
  compat_log "namespace A: $nsA $vethA $ipA device $devA"
  compat_log "namespace B: $nsB $vethB $ipB device $devB"
}
