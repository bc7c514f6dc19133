#!/usr/bin/env bash
# Fuzz check: builds the libFuzzer targets of fuzz/ with clang-14 (+ASan/UBSan) in build-fuzz/, runs
# them side by side for a bounded time, each on a scratch copy of its seed corpus
# (fuzz/corpus/<target>/), prints the executions, and fails on any crash, sanitizer report, leak,
# timeout or OOM.
#   .ci/fuzz.sh [seconds per target]      (default 60; FUZZ_TARGETS="fuzz_parser" to pick targets)
# Crash inputs are kept in build-fuzz/fuzz-out/<target>/ (crash-*, leak-*, timeout-*, oom-*).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
targets="${FUZZ_TARGETS:-fuzz_parser fuzz_responder fuzz_iwarp}"
build=build-fuzz

# libFuzzer ships in Debian's libclang-rt-14-dev.
if ! command -v clang++-14 >/dev/null || ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
     >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq </dev/null
  apt-get install -y -qq clang-14 libclang-rt-14-dev </dev/null
fi

# Without the tests (BUILD_TESTING=OFF): the libraries and the softrdma command must build with
# clang -Werror too, besides the targets; the tests are built (with g++) by tools/test.sh.
# In unity batches (CMakeLists.txt), which halve the build.
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DSOFTRDMA_WERROR=ON -DSOFTRDMA_FUZZ=ON -DSOFTRDMA_SANITIZE=ON \
  -DBUILD_TESTING=OFF -DCMAKE_UNITY_BUILD=ON >/dev/null
ninja -C "$build"

# The targets run side by side (one libFuzzer process each, one core each at most), each for the
# whole time; the verdicts are read in order afterwards.
declare -A pid
for t in $targets; do
  work="$build/fuzz-out/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  cp fuzz/corpus/"$t"/* "$work/corpus/"
  echo "== $t: ${seconds}s"
  # -fork would survive crashes but hide them from the exit status; one process, stop at the first.
  (cd "$work" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    exec "../../fuzz/$t" corpus -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix=./ >log 2>&1) &
  pid[$t]=$!
done
status=0
for t in $targets; do
  work="$build/fuzz-out/$t"
  if ! wait "${pid[$t]}"; then
    status=1
    echo "FAIL: $t (artifacts and log in $work)"
    grep -m1 -A30 -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|invariant violated|property violated" \
      "$work/log" || tail -30 "$work/log"
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/log" | sed "s/^/  $t /" || true
  grep -E "^#[0-9]+[[:space:]]+DONE" "$work/log" | tail -1 | sed "s/^/  $t /" || true
done
exit $status
