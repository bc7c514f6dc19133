#!/usr/bin/env bash
# compat.pyverbs: Debian's python3-pyverbs over softrdma. Every pyverbs module imports (the
# provider modules need complete libmlx5/libefa stubs), and tests/pyverbs/rc_test.py (an RC QP pair:
# SEND both ways, RDMA WRITE, RDMA READ, data and completions checked) passes: both QPs in one
# process and in two processes, on the intra-host direct path (default) and on the wire path
# (SOFTRDMA_DIRECT=0), on the loopback device; as root also between two network namespaces. And
# rdma-core's own tests/test_rdmacm.py (from python3-pyverbs) passes on softrdma_lo, both paths.
# The counters of `softrdma stat`, read by rc_test.py before it exits, show which path was taken.
# Skips (77) only when python3-pyverbs is not installed.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/compat_lib.sh"
compat_require_softrdma

PY=${PYVERBS_PYTHON:-/usr/bin/python3} # Debian's interpreter: pyverbs is built for it
if [[ ! -x $PY ]] || ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("pyverbs") is None)'; then
  echo "SKIP: python3-pyverbs is not installed for $PY (apt-get install python3-pyverbs)"
  exit 77
fi
tests=$(compat_repo_root)/tests/pyverbs
dev=$(compat_device 127.0.0.1)
# rc_test.py runs this once its checks passed, while its QPs still exist: our pid's counter lines.
stat_hook="$(printf '%q' "$SOFTRDMA") stat -q | grep '^pid {pid} '"

# run_one NAME LOG ENV... -- ARGV...: one program under `softrdma run`, output in LOG; 0 if it
# exited 0.
run_one() {
  local name=$1 log=$2
  shift 2
  local -a envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  compat_log "$name: ${envs[*]+${envs[*]} }$*"
  env "${envs[@]+"${envs[@]}"}" timeout -k 5 "$COMPAT_TIMEOUT" "$SOFTRDMA" run -- "$@" >"$log" 2>&1
}

# Sum of one counter over the QP lines of the logs (rc_test.py printed them via stat_hook).
qp_counter() { # COUNTER LOG...
  local c=$1
  shift
  awk -v c="$c" '/^pid [0-9]+ link .* qpn / { for (i = 1; i < NF; i++) if ($i == c) s += $(i + 1) }
    END { print s + 0 }' "$@"
}

# check_rc NAME PATH LOG...: every log says PASS, and the counters match the path (direct|wire).
check_rc() {
  local name=$1 path=$2
  shift 2
  local log
  for log in "$@"; do
    if ! grep -q '^PASS: RC' "$log"; then
      compat_result "$name" 0 "no PASS line in $(basename "$log"): $(grep -m3 FAIL "$log" | tr '\n' ' ')"
      return
    fi
  done
  local direct tx
  direct=$(qp_counter direct_ops "$@")
  tx=$(qp_counter tx_packets "$@")
  if ! grep -q '^pid [0-9]* link .* qpn ' "$@"; then
    compat_result "$name" 0 "softrdma stat showed no QP line for the test's pid"
  elif [[ $path == direct ]] && ((direct == 0)); then
    compat_result "$name" 0 "passed, but not on the direct path: direct_ops 0 (tx_packets $tx)"
  elif [[ $path == wire ]] && ((direct != 0 || tx == 0)); then
    compat_result "$name" 0 "passed, but not by packets: direct_ops $direct, tx_packets $tx"
  else
    compat_log "$name: direct_ops $direct, tx_packets $tx"
    compat_result "$name" 1
  fi
}

# 1. Every module imports.
log=$COMPAT_LOG_DIR/import.log
PAIR_SRV_LOG=/dev/null PAIR_CLI_LOG=$log
if run_one "import all pyverbs modules" "$log" -- "$PY" "$tests/import_test.py" &&
  grep -q '^PASS' "$log"; then
  compat_result "pyverbs imports every module" 1
  grep '^PASS' "$log"
else
  failed=$(sed -n 's/^FAIL: \(pyverbs[^:]*\): \([A-Za-z]*\).*/\1/p' "$log" | tr '\n' ' ')
  compat_result "pyverbs imports every module" 0 \
    "$(grep -c '^FAIL' "$log" || true) failed: ${failed:-$(tail -n 3 "$log" | tr '\n' ' ')}(see $log)"
fi

# The paths to try: both, unless the caller forces packets for everything (tools/test.sh's second
# pass sets SOFTRDMA_DIRECT=0), which the direct cases would then contradict.
paths=(direct wire)
if [[ ${SOFTRDMA_DIRECT:-} == 0 ]]; then
  paths=(wire)
  compat_log "SOFTRDMA_DIRECT=0 is set: the direct-path cases are left out"
fi

# 2. Both QPs in one process; SENDs up to 64 KiB take the direct path, larger ones go by packets.
for path in "${paths[@]}"; do
  envs=()
  [[ $path == wire ]] && envs=(SOFTRDMA_DIRECT=0)
  for size in 60000 300000; do
    name="rc one process $path $size B"
    log=$COMPAT_LOG_DIR/rc_1p_${path}_$size.log
    PAIR_CLI_LOG=$log
    if run_one "$name" "$log" "${envs[@]+"${envs[@]}"}" -- "$PY" "$tests/rc_test.py" -d "$dev" \
      -s "$size" --before-exit "$stat_hook"; then
      check_rc "$name" "$path" "$log"
    else
      compat_result "$name" 0 "exit code $?"
    fi
  done
done

# 3. Two processes (server/client over TCP for the QP exchange).
for path in "${paths[@]}"; do
  SRV_PREFIX=() CLI_PREFIX=()
  [[ $path == wire ]] && SRV_PREFIX=(env SOFTRDMA_DIRECT=0) CLI_PREFIX=(env SOFTRDMA_DIRECT=0)
  for size in 60000 300000; do
    name="rc two processes $path $size B"
    port=$(compat_free_port)
    SRV=("$PY" "$tests/rc_test.py" -d "$dev" -s "$size" --server "$port" --before-exit "$stat_hook")
    CLI=("$PY" "$tests/rc_test.py" -d "$dev" -s "$size" --client 127.0.0.1 "$port"
      --before-exit "$stat_hook")
    if compat_pair "$name" "$port"; then
      check_rc "$name" "$path" "$PAIR_SRV_LOG" "$PAIR_CLI_LOG"
    else
      compat_result "$name" 0
    fi
  done
done

# 4. rdma-core's own rdma_cm tests (tests/test_rdmacm.py, shipped by python3-pyverbs under
# /usr/share/doc/rdma-core/tests, some files gzipped) on softrdma_lo: they bind the device's address,
# 127.0.0.1, and build their objects on the device that bind attached (docs/rdmacm.md). One process
# per path through tools/conformance_driver.py, which records each test's outcome; every test must pass.
suite_src=${RDMA_CORE_TESTS:-/usr/share/doc/rdma-core/tests}
if [[ -f $suite_src/test_rdmacm.py ]]; then
  suite=$(mktemp -d /tmp/softrdma-pyverbs-suite.XXXXXX)
  cp -r "$suite_src" "$suite/tests"
  find "$suite/tests" -name '*.gz' -exec gunzip -f {} +
  for path in "${paths[@]}"; do
    envs=()
    [[ $path == wire ]] && envs=(SOFTRDMA_DIRECT=0)
    name="rdma-core test_rdmacm on $dev, $path"
    log=$COMPAT_LOG_DIR/test_rdmacm_$path.log
    out=$COMPAT_LOG_DIR/test_rdmacm_$path.jsonl
    rm -f "$out"
    PAIR_CLI_LOG=$log
    run_one "$name" "$log" "${envs[@]+"${envs[@]}"}" -- "$PY" "$(compat_repo_root)/tools/conformance_driver.py" \
      --suite "$suite" --module test_rdmacm --dev "$dev" --out "$out" || true
    ran=$(grep -vc '"outcome": "started"' "$out" 2>/dev/null || true)
    passed=$(grep -c '"outcome": "pass"' "$out" 2>/dev/null || true)
    if ((${ran:-0} > 0 && ${ran:-0} == ${passed:-0})); then
      compat_log "$name: $passed of $ran passed"
      compat_result "$name" 1
    else
      compat_result "$name" 0 "$passed of $ran passed: $(grep -v '"outcome": "\(started\|pass\)"' "$out" 2>/dev/null |
        sed 's/.*"test": "[^"]*\.\([^".]*\)".*"detail": "\([^"]*\)".*/\1 (\2)/' | tr '\n' ' ')"
    fi
  done
  rm -rf "$suite"
else
  compat_log "no rdma-core test suite at $suite_src: the test_rdmacm cases are left out"
fi

# 5. Two "hosts": network namespaces joined by a veth (root only; the wire path, necessarily).
probe=softrdma-pyverbs-probe-$$
if [[ $(id -u) == 0 ]] && command -v ip >/dev/null && ip netns add "$probe" 2>/dev/null; then
  ip netns del "$probe"
  compat_netns_setup
  SRV_PREFIX=("${inA[@]}") CLI_PREFIX=("${inB[@]}")
  name="rc two namespaces"
  port=$(compat_free_port)
  SRV=("$PY" "$tests/rc_test.py" -d "$devA" --server "$port")
  CLI=("$PY" "$tests/rc_test.py" -d "$devB" --client "$ipA" "$port")
  if compat_pair "$name" "$port" && grep -q '^PASS: RC' "$PAIR_SRV_LOG" &&
    grep -q '^PASS: RC' "$PAIR_CLI_LOG"; then
    compat_result "$name" 1
  else
    compat_result "$name" 0 "${PAIR_WHY:-no PASS line}"
  fi
else
  compat_log "not root or no network namespaces here: the two-namespace case is left out"
fi

compat_finish
