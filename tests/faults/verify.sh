#!/usr/bin/env bash
# tests/faults/verify.sh: runs the RC exactness verifier (tests/faults/verifier/rc_verifier.cpp) as
# consecutive runs under packet faults in both processes, over loopback packets (SOFTRDMA_DIRECT=0) and
# across two network namespaces joined by a veth (MTU 1500). Reports every run; exits 1 if any failed.
#
#   verify.sh                      20 runs x 200 rounds, loopback then netns (the full, opt-in check)
#   verify.sh --ci                 2 runs x 30 rounds, writes up to 256 KiB, loopback (ctest faults.verifier)
#   verify.sh --mode loopback|netns|both --runs N --rounds R --max-write BYTES --first-seed S
#             --impair 'tx_drop=...,...' (the faults; seed=<run> is put in front) --hang-s S
#
# Run k uses SOFTRDMA_IMPAIR="seed=k,<faults>" and verifier seed k (from --first-seed on).
# Environment: SOFTRDMA_BIN (default <repo>/build/bin), RC_VERIFIER (default <repo>/build/tests/rc_verifier),
# VERIFY_LOG_DIR (default a fresh temporary directory; each run keeps its two logs there).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
COMPAT_LOG_DIR=${VERIFY_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/softrdma-verify.XXXXXX")}
. "$repo/tests/compat/compat_lib.sh"
LOG_DIR=$COMPAT_LOG_DIR
VERIFIER=${RC_VERIFIER:-$repo/build/tests/rc_verifier}

mode=both runs=20 rounds=200 max_write=$((4 << 20)) first_seed=1 hang_s=60
faults="tx_drop=0.05,tx_dup=0.05,tx_corrupt=0.01,tx_hold=0.05"
while (($#)); do
  case $1 in
    --ci) mode=loopback runs=2 rounds=30 max_write=$((256 << 10)) hang_s=30; shift ;;
    --mode) mode=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --max-write) max_write=$2; shift 2 ;;
    --first-seed) first_seed=$2; shift 2 ;;
    --impair) faults=$2; shift 2 ;;
    --hang-s) hang_s=$2; shift 2 ;;
    *) echo "verify.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $mode in loopback | netns | both) ;; *) echo "verify.sh: --mode loopback|netns|both" >&2; exit 2 ;; esac
compat_require_softrdma
[[ -x $VERIFIER ]] || { echo "verify.sh: no verifier at $VERIFIER (set RC_VERIFIER)" >&2; exit 1; }

# A process may take this long: every round can wait out timeouts, and a hang is the verifier's to
# report (after --hang-s), not this script's.
run_limit=$((60 + rounds * 2 + hang_s * 2))
passed=0 failed=0
failures=()

# one_run WHERE K TARGET_PREFIX INITIATOR_PREFIX TARGET_OPTS INITIATOR_OPTS HOST
one_run() {
  local where=$1 k=$2 host=$7
  local -a tp=() ip=() topts=() iopts=()
  [[ -n $3 ]] && read -ra tp <<<"$3"
  [[ -n $4 ]] && read -ra ip <<<"$4"
  [[ -n $5 ]] && read -ra topts <<<"$5"
  [[ -n $6 ]] && read -ra iopts <<<"$6"
  local seed=$((first_seed + k - 1)) port tlog ilog trc=0 irc=0 t0
  local impair="seed=$seed,$faults"
  port=$(compat_free_port)
  tlog=$LOG_DIR/$where.run$k.target.log
  ilog=$LOG_DIR/$where.run$k.initiator.log
  local -a tcmd=("$VERIFIER" --listen "$port" "${topts[@]+"${topts[@]}"}" --hang-s "$hang_s")
  local -a icmd=("$VERIFIER" --connect "$host" --port "$port" --seed "$seed" --rounds "$rounds"
    --max-write "$max_write" "${iopts[@]+"${iopts[@]}"}" --hang-s "$hang_s")
  t0=$SECONDS
  "${tp[@]+"${tp[@]}"}" env SOFTRDMA_DIRECT=0 SOFTRDMA_IMPAIR="$impair" \
    timeout -k 5 "$run_limit" "$SOFTRDMA" run -- "${tcmd[@]}" >"$tlog" 2>&1 &
  local tpid=$!
  if ! compat_wait_listen "$port" "$tpid" "${tp[@]+"${tp[@]}"}"; then
    wait "$tpid" || trc=$?
    irc=-1
  else
    "${ip[@]+"${ip[@]}"}" env SOFTRDMA_DIRECT=0 SOFTRDMA_IMPAIR="$impair" \
      timeout -k 5 "$run_limit" "$SOFTRDMA" run -- "${icmd[@]}" >"$ilog" 2>&1 || irc=$?
    wait "$tpid" || trc=$?
  fi
  local took=$((SECONDS - t0))
  if ((trc == 0 && irc == 0)); then
    passed=$((passed + 1))
    compat_log "PASS $where run $k/$runs seed $seed (${took}s): $(grep -o 'exact ([^)]*) in [0-9.]* s' "$ilog" || true)"
    return
  fi
  failed=$((failed + 1))
  local why="target exit $trc, initiator exit $irc"
  ((trc == 124 || irc == 124)) && why+=" (124: killed after ${run_limit}s)"
  failures+=("$where run $k seed $seed: $why")
  compat_log "FAIL $where run $k/$runs seed $seed (${took}s): $why"
  local f
  for f in "$tlog" "$ilog"; do
    [[ -f $f ]] || continue
    echo "----- $(basename "$f") -----"
    grep -v '^softrdma impair port' "$f" | tail -n 40
  done
  echo "----- reproduce -----"
  echo "  ${tp[*]+${tp[*]} }env SOFTRDMA_DIRECT=0 SOFTRDMA_IMPAIR='$impair' $SOFTRDMA run -- ${tcmd[*]} &"
  echo "  ${ip[*]+${ip[*]} }env SOFTRDMA_DIRECT=0 SOFTRDMA_IMPAIR='$impair' $SOFTRDMA run -- ${icmd[*]}"
  echo "  or: $here/verify.sh --mode $where --runs 1 --first-seed $seed --rounds $rounds --max-write $max_write" \
    "--impair '$faults' --hang-s $hang_s"
  echo "-----"
}

series() { # WHERE TARGET_PREFIX INITIATOR_PREFIX TARGET_OPTS INITIATOR_OPTS HOST
  local k p0=$passed f0=$failed
  compat_log "$1: $runs runs x $rounds rounds, writes up to $max_write B, faults seed=<run>,$faults"
  for ((k = 1; k <= runs; k++)); do one_run "$1" "$k" "$2" "$3" "$4" "$5" "$6"; done
  compat_log "$1: $((passed - p0)) passed, $((failed - f0)) failed"
}

if [[ $mode != netns ]]; then
  series loopback "" "" "" "" 127.0.0.1
fi
if [[ $mode != loopback ]]; then
  if [[ $(id -u) == 0 ]] && command -v ip >/dev/null && ip netns list >/dev/null 2>&1; then
    compat_netns_setup # sets nsA nsB ipA ipB devA devB inA inB; tears them down at exit
    series netns "${inA[*]}" "${inB[*]}" "--ip $ipA" "--ip $ipB" "$ipA"
  else
    compat_log "SKIP netns: needs root and iproute2's ip netns"
    [[ $mode == netns ]] && exit 77
  fi
fi

compat_log "logs in $LOG_DIR"
if ((failed)); then
  compat_log "$passed passed, $failed FAILED:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
compat_log "all $passed runs passed"
