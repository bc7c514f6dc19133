#!/usr/bin/env bash
# The whole test run: packages, two builds (plain in build/, ASan+UBSan in build-asan/), ctest in
# both. Exits non-zero on any failure and ends with "N passed, N failed" over both runs.
#
#   tools/test.sh               everything
#   SOFTRDMA_SKIP_ASAN=1 ...    only the plain build (quick local iteration)
#   CTEST_ARGS="-R compat" ...  extra ctest arguments for both runs
#
# The ASan run leaves out the long perftest and netns suites (label perftest|netns): they cover
# the same library code paths as rc_pingpong, which it does run, at several times the cost. The
# consumer suites (label consumers: UCX, libfabric, Open MPI) run once, in the plain build: their
# two-namespace cases already go by packets, and those programs are not built for ASan.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

"$root/tools/setup-deps.sh"

jobs=$(nproc)
passed=0
failed=0
logs=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-test.XXXXXX")
read -r -a extra <<<"${CTEST_ARGS:-}"

# count LOG: adds a ctest log's results to the totals. ctest prints one line per test, ending in
# "Passed", or "***Failed", "***Timeout", "***Exception: ...", "***Not Run"; skipped tests
# (exit 77, "***Skipped") and disabled ones ("***Not Run (Disabled)": gtest's DISABLED_ cases, e.g.
# the attacker role a hostile test re-executes itself as) count as neither.
count() {
  local p f
  p=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed +[0-9.]+ sec' "$1" || true)
  f=$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$1" | grep -F '***' | grep -vF '***Skipped' | grep -vcF '***Not Run (Disabled)' || true)
  passed=$((passed + p))
  failed=$((failed + f))
}

# run_build DIR COMPAT_LABEL_EXCLUDE CMAKE_ARGS...
run_build() {
  local dir=$1 compat_exclude=$2
  shift 2
  local name
  name=$(basename "$dir")
  echo "=== $name: configure and build ==="
  # BUILD_TESTING=ON: a build directory tools/demo.sh configured has it off.
  if ! cmake -S "$root" -B "$dir" -G Ninja -DSOFTRDMA_WERROR=ON -DBUILD_TESTING=ON "$@" >"$logs/$name.cmake.log" 2>&1; then
    tail -n 50 "$logs/$name.cmake.log"
    echo "=== $name: configure FAILED ==="
    failed=$((failed + 1))
    return
  fi
  if ! ninja -C "$dir" -j "$jobs" >"$logs/$name.build.log" 2>&1; then
    grep -E -B2 -A8 'error|FAILED' "$logs/$name.build.log" | tail -n 80
    echo "=== $name: build FAILED (log: $logs/$name.build.log) ==="
    failed=$((failed + 1))
    return
  fi
  # Unit, verbs and tools tests are independent and run in parallel; compat tests one at a time,
  # since each already runs two spinning processes on a 2-core machine.
  echo "=== $name: ctest (unit, verbs, tools) (built at $((SECONDS / 60)) min) ==="
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -LE "compat|interop" "${extra[@]}" \
    2>&1 | tee "$logs/$name.ctest1.log" || true
  count "$logs/$name.ctest1.log"
  echo "=== $name: ctest (compat) (at $((SECONDS / 60)) min) ==="
  local -a ex=()
  [[ -n $compat_exclude ]] && ex=(-LE "$compat_exclude")
  ctest --test-dir "$dir" --output-on-failure -L compat "${ex[@]}" "${extra[@]}" \
    2>&1 | tee "$logs/$name.ctest2.log" || true
  count "$logs/$name.ctest2.log"
}

run_build "$root/build" ""
# The intra-host direct path is on by default; the verbs programs and the unmodified binaries must
# pass with it off too (every operation by packets, as between hosts). The parametrized verbs suites
# (test names Paths/...) choose their path themselves: each RC body runs over the direct path,
# packets and iWARP as its instantiation lists (VT_INSTANTIATE_PATHS, tests/verbs/helpers.h), so only
# the others run again here.
echo "=== build: ctest with SOFTRDMA_DIRECT=0 (verbs not by path, rdmacm, hostile, compat) ==="
SOFTRDMA_DIRECT=0 ctest --test-dir "$root/build" --output-on-failure -j "$jobs" -L "verbs|rdmacm|hostile" -LE compat -E "^Paths/" "${extra[@]}" \
  2>&1 | tee "$logs/build.direct-off1.log" || true
count "$logs/build.direct-off1.log"
# The loopback perftest groups (label perftest) are left out here: compat.netns runs the same
# binaries between two namespaces, where every operation goes by packets anyway; the iwarp group
# (label iwarp) runs both ways by itself, and compat.pause (label pause) sets the path of each case.
# compat.rsocket (label rsocket) runs its packet cases between namespaces: over loopback packets
# rstream takes 30-70 s a case and -T n once hung (docs/rdmacm.md, "rsockets"). Neither can the
# path change the tests between namespaces (label netns: two addresses never share it) or those that
# move no data or only UD/UC traffic (label pathfree).
SOFTRDMA_DIRECT=0 ctest --test-dir "$root/build" --output-on-failure -L compat -LE "perftest|consumers|iwarp|pause|rsocket|pathfree|netns" "${extra[@]}" \
  2>&1 | tee "$logs/build.direct-off2.log" || true
count "$logs/build.direct-off2.log"
if [[ ${SOFTRDMA_SKIP_ASAN:-0} != 1 ]]; then
  # The mixed-traffic fault test moves 1 GiB in the plain build, and the RC model checks 2000 seeds;
  # an eighth of each under ASan (which runs them ten times slower): the plain run covers the seeds,
  # this one the memory errors.
  # Its libraries build in unity batches (CMakeLists.txt; the tests one file at a time): the plain
  # build above has already compiled every file alone.
  # Export-table checks (label exports) read the same tables in both builds.
  FAULT_MIXED_MIB=128 RC_MODEL_SEEDS=250 run_build "$root/build-asan" 'perftest|netns|consumers|exports' -DSOFTRDMA_SANITIZE=ON \
    -DCMAKE_UNITY_BUILD=ON
fi

echo "logs: $logs ($((SECONDS / 60)) min)"
echo "$passed passed, $failed failed"
((failed == 0 && passed > 0))
