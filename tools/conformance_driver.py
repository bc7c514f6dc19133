#!/usr/bin/env python3
"""Runs one module of rdma-core's Python test suite (tests/ of linux-rdma/rdma-core) in this process and
writes one JSON line per test to --out as soon as the test ends, so a crash of the process still leaves
the outcomes of the tests before it. tools/conformance.py starts it once per module, under `softrdma run`.

The suite reads its options (--dev, --port, --gid) from sys.argv through its own args_parser; this driver
hands it --dev and nothing else.
"""
import argparse
import importlib
import json
import os
import sys
import time
import unittest


class JsonResult(unittest.TextTestResult):
    """Records each test's outcome (pass, skip with its reason, fail or error with the exception's last
    line) as one JSON object per line."""

    def __init__(self, out, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._out = out
        self._started = 0.0

    def _emit(self, test, outcome, detail=''):
        rec = {'test': test.id(), 'outcome': outcome, 'detail': detail,
               'seconds': round(time.monotonic() - self._started, 3)}
        self._out.write(json.dumps(rec) + '\n')
        self._out.flush()

    def startTest(self, test):
        self._started = time.monotonic()
        # The test about to run, so a crash can be blamed on it.
        self._out.write(json.dumps({'test': test.id(), 'outcome': 'started'}) + '\n')
        self._out.flush()
        super().startTest(test)

    @staticmethod
    def _last_line(err):
        exc = err[1]
        text = f'{type(exc).__name__}: {exc}'.strip()
        return text.splitlines()[-1] if text else type(exc).__name__

    def addSuccess(self, test):
        super().addSuccess(test)
        self._emit(test, 'pass')

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._emit(test, 'skip', str(reason))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._emit(test, 'fail', self._last_line(err))

    def addError(self, test, err):
        super().addError(test, err)
        # A setUpClass/setUpModule error arrives with an _ErrorHolder in place of a test.
        self._emit(test, 'error', self._last_line(err))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._emit(test, 'pass', 'expected failure')

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._emit(test, 'fail', 'unexpected success')


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--suite', required=True, help='the rdma-core checkout (holding tests/)')
    ap.add_argument('--module', required=True, help='a module of tests/, e.g. test_mr')
    ap.add_argument('--dev', required=True, help='the RDMA device to test')
    ap.add_argument('--out', required=True, help='file receiving one JSON line per test')
    args = ap.parse_args()

    suite_root = os.path.abspath(args.suite)
    sys.path.insert(0, os.path.join(suite_root, 'tests'))  # the suite imports args_parser, utils flat
    sys.path.insert(0, suite_root)                          # ... and itself as package "tests"
    sys.argv = [sys.argv[0], '--dev', args.dev]
    from args_parser import parser  # noqa: E402 (the suite's own option parser)
    parser.parse_args()
    module = importlib.import_module('tests.' + args.module)

    tests = unittest.defaultTestLoader.loadTestsFromModule(module)
    with open(args.out, 'a', encoding='utf-8') as out:
        runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2,
                                         resultclass=lambda *a, **k: JsonResult(out, *a, **k))
        runner.run(tests)
    return 0


if __name__ == '__main__':
    sys.exit(main())
