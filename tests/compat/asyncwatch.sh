#!/usr/bin/env bash
# compat.asyncwatch: unmodified ibv_asyncwatch (ibverbs-utils) prints the port events of a softrdma
# device while its network interface is taken down and up and loses and regains its address:
# IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_GID_CHANGE, each for port 1. Async events
# are per context, so ibv_asyncwatch, a process of its own, sees only port events; `ip` is the
# second process that provokes them. Then an unmodified perftest pair (which refuses a port that is
# not ACTIVE) runs over the port that came back.
# One machine: lo of a fresh network namespace (the host's lo is never touched). Two namespaces:
# the veth pair of compat_netns_setup, both ends watched (the peer of a downed end loses carrier).
# Needs root and `ip netns`; exits 77 (skip) without them.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
  echo "SKIP: this test needs root and iproute2's \`ip netns\`"
  exit 77
fi
if ! command -v ibv_asyncwatch >/dev/null; then
  echo "SKIP: ibv_asyncwatch (ibverbs-utils) is not installed"
  exit 77
fi

# ibv_asyncwatch printf()s to a file, fully buffered: stdbuf makes its stdout line-buffered so each
# event is in the log when it happens (the binary itself is unchanged).
STDBUF=()
command -v stdbuf >/dev/null && STDBUF=(stdbuf -oL)

# watch_start LABEL DEV PREFIX...: starts ibv_asyncwatch -d DEV (in the namespace of the prefix)
# and waits until it has opened the device. Sets WATCH_PID_<LABEL> and WATCH_LOG_<LABEL>.
watch_start() {
  local label=$1 dev=$2 log i
  shift 2
  log=$COMPAT_LOG_DIR/asyncwatch.$label.log
  compat_log "$label: ibv_asyncwatch -d $dev"
  # Emptied here, not by the background job's redirection, which may come after the first grep
  # below: a log of an earlier run would then say the watcher is ready before it is.
  : >"$log"
  "$@" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- "${STDBUF[@]}" ibv_asyncwatch -d "$dev" >"$log" 2>&1 &
  printf -v "WATCH_PID_$label" '%s' $!
  printf -v "WATCH_LOG_$label" '%s' "$log"
  for ((i = 0; i < 100; i++)); do
    grep -q "^$dev: async event FD" "$log" && return 0
    sleep 0.1
  done
  compat_result "$label: ibv_asyncwatch starts on $dev" 0 "no \"$dev: async event FD\" line: $(head -c 300 "$log")"
  return 1
}

# The events a log shows, one "NAME port" a line.
watch_events() { sed -nE 's/^[[:space:]]*event_type (IBV_EVENT_[A-Z_]+) \([0-9]+\), port ([0-9]+).*/\1 port \2/p' "$1"; }

# STEP_BASE[label]: how many events each log had before the current step.
declare -A STEP_BASE
step_begin() {
  local label log
  for label in "$@"; do
    log=WATCH_LOG_$label
    STEP_BASE[$label]=$(watch_events "${!log}" | wc -l)
  done
}

# step_expect NAME LABEL EVENT...: the events LABEL's watcher printed since step_begin are exactly
# EVENT... (any order), each for port 1. Waits up to 20 s for them.
step_expect() {
  local name=$1 label=$2 i got want log
  shift 2
  log=WATCH_LOG_$label
  want=""
  (($#)) && want=$(printf '%s port 1\n' "$@" | sort)
  for ((i = 0; i < 200; i++)); do
    got=$(watch_events "${!log}" | tail -n +$((STEP_BASE[$label] + 1)) | sort)
    (($(grep -c . <<<"$got" || true) >= $#)) && break
    sleep 0.1
  done
  sleep 0.2  # an extra, wrong event would show up now
  got=$(watch_events "${!log}" | tail -n +$((STEP_BASE[$label] + 1)) | sort)
  if [[ $got == "$want" ]]; then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "expected [${want//$'\n'/, }], ibv_asyncwatch printed [${got//$'\n'/, }]"
  fi
}

watch_stop() {
  local label=$1 pid
  pid=WATCH_PID_$label
  kill "${!pid}" 2>/dev/null || true
  wait "${!pid}" 2>/dev/null || true
}

# devinfo_expect NAME DEV STATE PHYS PREFIX...: ibv_devinfo -v (another process) shows the port so.
devinfo_expect() {
  local name=$1 dev=$2 state=$3 phys=$4 out
  shift 4
  out=$("$@" timeout -k 5 60 "$SOFTRDMA" run -- ibv_devinfo -v -d "$dev" 2>&1 || true)
  if grep -qE "state:[[:space:]]+$state" <<<"$out" && grep -qE "phys_state:[[:space:]]+$phys" <<<"$out"; then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "ibv_devinfo -v: $(grep -E 'state' <<<"$out" | tr -s ' \t' ' ')"
  fi
}

# ---- One machine: lo of a fresh namespace --------------------------------------------------------
tag=$$$RANDOM
nsL=softrdma-l-$tag
cleanup_lo() {
  ip netns pids "$nsL" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$nsL" 2>/dev/null || true
}
trap cleanup_lo EXIT INT TERM
if ! ip netns add "$nsL"; then
  echo "SKIP: cannot create network namespaces here (container without CAP_SYS_ADMIN?)"
  exit 77
fi
inL=(ip netns exec "$nsL")
ip -n "$nsL" link set lo up
devL=$(compat_device 127.0.0.1 "${inL[@]}")
compat_log "namespace $nsL: lo 127.0.0.1 device $devL"

lo_rc=0
if watch_start L "$devL" "${inL[@]}"; then
  step_begin L
  ip -n "$nsL" link set lo down
  step_expect "lo down: PORT_ERR" L IBV_EVENT_PORT_ERR
  step_begin L
  ip -n "$nsL" link set lo up
  step_expect "lo up: PORT_ACTIVE" L IBV_EVENT_PORT_ACTIVE
  step_begin L
  ip -n "$nsL" addr del 127.0.0.1/8 dev lo
  step_expect "lo loses 127.0.0.1: PORT_ERR, GID_CHANGE" L IBV_EVENT_PORT_ERR IBV_EVENT_GID_CHANGE
  step_begin L
  ip -n "$nsL" addr add 127.0.0.1/8 dev lo
  step_expect "lo regains 127.0.0.1: GID_CHANGE, PORT_ACTIVE" L IBV_EVENT_GID_CHANGE IBV_EVENT_PORT_ACTIVE
  # The port that came back carries traffic (ib_write_lat refuses a port that is not ACTIVE).
  SRV_PREFIX=("${inL[@]}")
  CLI_PREFIX=("${inL[@]}")
  compat_perftest "lo: ib_write_lat after the port returned" 1 \
    ib_write_lat -d "$devL" -F -n 200 -- ib_write_lat -d "$devL" -F -n 200 127.0.0.1
  step_begin L
  step_expect "lo: no events from traffic" L
  watch_stop L
  grep -q "^$devL: async event FD" "$WATCH_LOG_L" || compat_result "lo: watcher named $devL" 0 "log: $(head -n 3 "$WATCH_LOG_L")"
fi
compat_finish || lo_rc=1
cleanup_lo
trap - EXIT INT TERM

# ---- Two namespaces joined by a veth pair --------------------------------------------------------
# In a subshell: compat_netns_setup exits 77 where namespaces are impossible, which must not hide
# the results above.
netns_rc=0
(
  COMPAT_PASSED=0
  COMPAT_FAILED=0
  COMPAT_FAILURES=()
  compat_netns_setup  # sets nsA nsB vethA vethB ipA ipB devA devB inA inB
  watch_start A "$devA" "${inA[@]}" || exit 1
  watch_start B "$devB" "${inB[@]}" || exit 1

  step_begin A B
  ip -n "$nsA" link set "$vethA" down
  step_expect "netns: $vethA down: PORT_ERR on A" A IBV_EVENT_PORT_ERR
  step_expect "netns: $vethA down: PORT_ERR on B (carrier lost)" B IBV_EVENT_PORT_ERR
  # B's interface is still up, without carrier: its port is DOWN and its link Polling.
  devinfo_expect "netns: ibv_devinfo on B while A is down" "$devB" "PORT_DOWN" "POLLING" "${inB[@]}"

  step_begin A B
  ip -n "$nsA" link set "$vethA" up
  step_expect "netns: $vethA up: PORT_ACTIVE on A" A IBV_EVENT_PORT_ACTIVE
  step_expect "netns: $vethA up: PORT_ACTIVE on B" B IBV_EVENT_PORT_ACTIVE
  devinfo_expect "netns: ibv_devinfo on B with the link back" "$devB" "PORT_ACTIVE" "LINK_UP" "${inB[@]}"

  step_begin A B
  ip -n "$nsA" addr del "$ipA/24" dev "$vethA"
  step_expect "netns: A loses $ipA: PORT_ERR, GID_CHANGE" A IBV_EVENT_PORT_ERR IBV_EVENT_GID_CHANGE
  step_expect "netns: B unaffected by A's address" B
  step_begin A B
  ip -n "$nsA" addr add "$ipA/24" dev "$vethA"
  step_expect "netns: A regains $ipA: GID_CHANGE, PORT_ACTIVE" A IBV_EVENT_GID_CHANGE IBV_EVENT_PORT_ACTIVE

  SRV_PREFIX=("${inA[@]}")
  CLI_PREFIX=("${inB[@]}")
  compat_perftest "netns: ib_write_lat after the ports returned" 1 \
    ib_write_lat -d "$devA" -F -n 200 -- ib_write_lat -d "$devB" -F -n 200 "$ipA"
  watch_stop A
  watch_stop B
  compat_finish
) || netns_rc=$?
((lo_rc == 0 && (netns_rc == 0 || netns_rc == 77)))
