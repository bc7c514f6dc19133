#!/usr/bin/env bash
# tools.conformance: tools/conformance.py against a stand-in suite laid out as rdma-core's tests/ (a
# package "tests" with args_parser.parser, test_*.py modules): each outcome lands in its column, skips
# are classified (hardware, machine, gap), a module whose process dies by a signal costs that module
# only and names the test that was running, and the exit status says whether anything failed.
set -euo pipefail
softrdma=${1:?usage: conformance_test.sh SOFTRDMA}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/softrdma-conformance-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [[ -f $work/out.md ]] && cat "$work/out.md"; exit 1; }

mkdir -p "$work/suite/tests"
: > "$work/suite/tests/__init__.py"
cat > "$work/suite/tests/run_tests.py" <<'PY'
PY
cat > "$work/suite/tests/args_parser.py" <<'PY'
import argparse
class _Parser:
    args = {}
    def parse_args(self):
        p = argparse.ArgumentParser()
        p.add_argument('--dev')
        self.args = vars(p.parse_args())
parser = _Parser()
PY
cat > "$work/suite/tests/test_alpha.py" <<'PY'
import unittest
from args_parser import parser
class Alpha(unittest.TestCase):
    def test_pass(self):
        self.assertEqual(parser.args['dev'], 'fake_dev')
    def test_skip_gap(self):
        raise unittest.SkipTest('Widget is not supported')
    def test_skip_hw(self):
        raise unittest.SkipTest('Can not run the test over non MLX5 device')
    def test_skip_machine(self):
        raise unittest.SkipTest('There are no huge pages of size 2M allocated')
    def test_fail(self):
        self.assertEqual(1, 2)
    def test_error(self):
        raise RuntimeError('boom')
PY
cat > "$work/suite/tests/test_beta.py" <<'PY'
import os, signal, unittest
class Beta(unittest.TestCase):
    def test_a_pass(self):
        pass
    def test_b_crash(self):
        os.kill(os.getpid(), signal.SIGSEGV)
    def test_c_never(self):
        pass
PY
# test_rdmacm runs twice: on --dev and again on softrdma_lo (conformance.py --lo-modules); it notes
# the device it was handed.
cat > "$work/suite/tests/test_rdmacm.py" <<PY
import unittest
from args_parser import parser
class Cm(unittest.TestCase):
    def test_dev(self):
        with open('$work/devs', 'a') as f:
            f.write(parser.args['dev'] + '\\n')
PY
cat > "$work/suite/tests/test_mlx5_gamma.py" <<'PY'
import unittest
class Gamma(unittest.TestCase):
    def test_vendor(self):
        raise unittest.SkipTest('Converting timestamp to nanoseconds is not supported')
PY

set +e
python3 "$root/tools/conformance.py" "$work/suite" --softrdma "$softrdma" --dev fake_dev --modes direct \
  --doc "$work/out.md" > "$work/stdout" 2>&1
rc=$?
set -e
cat "$work/stdout"
[[ $rc -eq 1 ]] || fail "exit status $rc, expected 1 (there are failures)"
row() { grep -E "^\| $1 \|" "$work/out.md" || fail "no row for $1"; }
[[ $(row test_alpha) == "| test_alpha | 6 | 1 | 3 "* ]] || fail "test_alpha: $(row test_alpha)"
row test_alpha | grep -q "test_fail (AssertionError: 1 != 2)" || fail "test_alpha's failure is not named"
row test_alpha | grep -q "test_error (RuntimeError: boom)" || fail "test_alpha's error is not named"
# Killed by SIGSEGV; under ASan (LD_PRELOADed by softrdma run) its handler reports and exits 1 instead.
[[ $(row test_beta) =~ ^"| test_beta | 2 | 1 | 0 | 1 — test_b_crash (process "("killed by signal 11"|"exited 1")") |"$ ]] ||
  fail "test_beta: $(row test_beta)"
[[ $(row test_mlx5_gamma) == "| test_mlx5_gamma | 1 | 0 | 1 "* ]] || fail "test_mlx5_gamma: $(row test_mlx5_gamma)"
grep -q "^| softrdma lacks it: Widget is not supported | 1 |" "$work/out.md" || fail "gap skip not classified"
grep -q "^| hardware softrdma is not: needs an mlx5 device | 2 |" "$work/out.md" || fail "mlx5 skips not classified"
grep -q "^| the machine: no huge pages allocated on the machine | 1 |" "$work/out.md" || fail "huge-page skip not classified"
[[ $(row test_rdmacm) == "| test_rdmacm | 1 | 1 | 0 | 0 |" ]] || fail "test_rdmacm: $(row test_rdmacm)"
[[ $(row "test_rdmacm on softrdma_lo") == "| test_rdmacm on softrdma_lo | 1 | 1 | 0 | 0 |" ]] ||
  fail "test_rdmacm on softrdma_lo: $(row "test_rdmacm on softrdma_lo")"
[[ $(sort "$work/devs" | tr '\n' ' ') == "fake_dev softrdma_lo " ]] || fail "test_rdmacm ran on: $(tr '\n' ' ' < "$work/devs")"
grep -q "^| \*\*total\*\* | \*\*11\*\* | \*\*4\*\* | \*\*4\*\* | \*\*3\*\* |" "$work/out.md" || fail "totals"
grep -q "tests passing 4, failing 3, skipped for features softrdma lacks 1" "$work/stdout" || fail "summary line"
echo "PASS: tools.conformance"
