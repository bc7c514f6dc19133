#!/usr/bin/env python3
"""Runs rdma-core's own Python test suite (tests/ of linux-rdma/rdma-core, on python3-pyverbs) against a
softrdma build, module by module, and writes the results as a table (docs/conformance.md).

    tools/conformance.py SUITE [--softrdma build/bin/softrdma] [--modes direct,packets] [--hugepages 64]
                               [--modules test_mr,test_cq] [--doc docs/conformance.md]

SUITE is a checkout holding tests/ (`git archive v44.0 tests` of linux-rdma/rdma-core matches Debian 12's
python3-pyverbs 44). The suite is not part of this repository: fetch it, point this at it.

Each module runs in its own process (tools/conformance_driver.py under `softrdma run`), so a crash costs
that module only and is reported as such. As root, the run happens in a private network namespace with
a veth pair, on the device of the veth (the suite wants a device whose interface has an IP address, as a
NIC has; rdma_cm tests bind it). Without root, pass --dev. The modules of --lo-modules (default
test_rdmacm) run a second time on softrdma_lo (their rows say "on softrdma_lo"): a bind to 127.0.0.1
attaches the loopback device as the kernel attaches the device holding an address. Each mode is one pass over the modules:
"direct" is softrdma's default (the intra-host direct path between contexts), "packets" sets
SOFTRDMA_DIRECT=0 so that everything goes through RoCEv2 packets.
"""
import argparse
import collections
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DRIVER = os.path.join(HERE, 'conformance_driver.py')
HUGEPAGES = '/proc/sys/vm/nr_hugepages'
LO_DEV = 'softrdma_lo'  # the loopback device, present in every namespace

# Why a skip is legitimate: the test needs hardware or software softrdma is not (a vendor's device, a
# GPU), or the machine lacks something the run can provide (huge pages). Anything else is a gap.
HARDWARE_SKIPS = [
    (re.compile(r'mlx5|MLX5|PCI device must be passed|DevX'), 'needs an mlx5 device'),
    (re.compile(r'EFA|efa'), 'needs an EFA device'),
    (re.compile(r'cuda|CUDA|dmabuf|/dev/dri'), 'needs a GPU (dmabuf)'),
]
MACHINE_SKIPS = [(re.compile(r'huge pages'), 'no huge pages allocated on the machine')]


# Modules that exercise one vendor's device or a GPU, whatever reason their tests give for skipping.
HARDWARE_MODULES = [(re.compile(r'^test_mlx5_cuda|^test_cuda'), 'needs a GPU (dmabuf)'),
                    (re.compile(r'^test_mlx5'), 'needs an mlx5 device'),
                    (re.compile(r'^test_efa'), 'needs an EFA device')]


def classify_skip(module, reason):
    for pattern, label in HARDWARE_MODULES:
        if pattern.search(module):
            return 'hardware', label
    for pattern, label in HARDWARE_SKIPS:
        if pattern.search(reason):
            return 'hardware', label
    for pattern, label in MACHINE_SKIPS:
        if pattern.search(reason):
            return 'machine', label
    return 'gap', reason


def huge_page_tests(suite):
    """The suite's tests that need 2 MiB huge pages (decorated with requires_huge_pages)."""
    found = []
    tests_dir = os.path.join(suite, 'tests')
    for fn in sorted(os.listdir(tests_dir)):
        if not (fn.startswith('test_') and fn.endswith('.py')):
            continue
        pending = False
        with open(os.path.join(tests_dir, fn), encoding='utf-8') as f:
            for line in f:
                if 'requires_huge_pages' in line and line.strip().startswith('@'):
                    pending = True
                elif pending and line.strip().startswith('def '):
                    found.append(f'{fn[:-3]}.{line.split()[1].split("(")[0]}')
                    pending = False
    return found


def sh(cmd, check=True):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Netns:
    """A namespace for the run and one for the veth's far end, torn down on exit."""

    def __init__(self):
        tag = f'{os.getpid() % 100000}'
        self.ns, self.peer = f'softrdma-conf-{tag}', f'softrdma-confp-{tag}'
        self.ifname = f'scf{tag}'
        self.dev = f'softrdma_{self.ifname}'

    def __enter__(self):
        sh(['ip', 'netns', 'add', self.ns])
        sh(['ip', 'netns', 'add', self.peer])
        sh(['ip', 'link', 'add', self.ifname, 'netns', self.ns, 'type', 'veth',
            'peer', 'name', self.ifname + 'p', 'netns', self.peer])
        for ns, ifn, ip in ((self.ns, self.ifname, '10.79.0.1/24'),
                            (self.peer, self.ifname + 'p', '10.79.0.2/24')):
            sh(['ip', '-n', ns, 'addr', 'add', ip, 'dev', ifn])
            sh(['ip', '-n', ns, 'link', 'set', ifn, 'up'])
            sh(['ip', '-n', ns, 'link', 'set', 'lo', 'up'])
        return self

    def prefix(self):
        return ['ip', 'netns', 'exec', self.ns]

    def __exit__(self, *exc):
        sh(['ip', 'netns', 'del', self.ns], check=False)
        sh(['ip', 'netns', 'del', self.peer], check=False)


def list_modules(suite, wanted):
    names = sorted(f[:-3] for f in os.listdir(os.path.join(suite, 'tests'))
                   if f.startswith('test_') and f.endswith('.py'))
    if wanted:
        unknown = set(wanted) - set(names)
        if unknown:
            sys.exit(f'conformance: no such module in {suite}/tests: {", ".join(sorted(unknown))}')
        names = [n for n in names if n in wanted]
    return names


def run_module(args, module, mode, prefix, dev, workdir):
    """Runs one module; returns (records, note) where note says how the process ended abnormally."""
    out = os.path.join(workdir, f'{mode}-{module}-{dev}.jsonl')
    log = os.path.join(workdir, f'{mode}-{module}-{dev}.log')
    env = dict(os.environ)
    env.pop('SOFTRDMA_DIRECT', None)
    if mode == 'packets':
        env['SOFTRDMA_DIRECT'] = '0'
    cmd = prefix + [args.softrdma, 'run', args.python, DRIVER, '--suite', args.suite,
                    '--module', module, '--dev', dev, '--out', out]
    note = ''
    if os.path.exists(out):
        os.unlink(out)
    with open(log, 'w', encoding='utf-8') as logf:
        try:
            proc = subprocess.run(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                  timeout=args.timeout, cwd=args.suite)
            if proc.returncode < 0:
                note = f'process killed by signal {-proc.returncode}'
            elif proc.returncode not in (0,):
                note = f'process exited {proc.returncode}'
        except subprocess.TimeoutExpired:
            note = f'timed out after {args.timeout} s'
    records, started = [], None
    if os.path.exists(out):
        with open(out, encoding='utf-8') as f:
            for line in f:
                rec = json.loads(line)
                if rec['outcome'] == 'started':
                    started = rec['test']
                else:
                    records.append(rec)
                    started = None
    if started:  # the test that was running when the process died
        records.append({'test': started, 'outcome': 'error', 'detail': note or 'did not finish'})
    if note and not records:
        records.append({'test': f'tests.{module}', 'outcome': 'error', 'detail': note})
    # A clean exit that printed a traceback before any test ran (an import error) also counts.
    if not records and not note:
        with open(log, encoding='utf-8') as f:
            tail = f.read().strip().splitlines()[-1:] or ['']
        if 'Error' in tail[0]:
            records.append({'test': f'tests.{module}', 'outcome': 'error', 'detail': tail[0]})
    return records, note


def summarize(records):
    s = {'ran': 0, 'pass': 0, 'skip': collections.Counter(), 'fail': []}
    for r in records:
        s['ran'] += 1
        if r['outcome'] == 'pass':
            s['pass'] += 1
        elif r['outcome'] == 'skip':
            s['skip'][r['detail']] += 1
        else:
            name = r['test'].split('.')[-1]
            s['fail'].append(f'{name} ({r["detail"][:140]})')
    return s


def md_escape(text):
    return text.replace('|', '\\|').replace('\n', ' ')


def render(args, dev, modes, results, meta):
    lines = ['# Conformance: rdma-core\'s own test suite', '',
             'One run of `tools/conformance.py` (this page is its output; do not edit by hand). It runs '
             'rdma-core\'s Python test suite (`tests/` of linux-rdma/rdma-core, on python3-pyverbs) module '
             'by module against softrdma, once per mode: **direct** is softrdma\'s default (contexts of one '
             'host reach each other through the intra-host direct path), **packets** sets '
             '`SOFTRDMA_DIRECT=0` (every operation is RoCEv2 packets over UDP).', '',
             '| | |', '|---|---|']
    for k, v in meta:
        lines.append(f'| {k} | {md_escape(str(v))} |')
    lines.append('')
    lines.append('Reproduce: `tools/conformance.py /path/to/rdma-core` (as root: it creates its own network '
                 'namespace and veth; `--hugepages N` reserves 2 MiB huge pages for the run and restores the '
                 'previous count after).')
    lines.append('')
    lines.append('The rows "on softrdma_lo" run their module a second time on the loopback device (`--lo-modules`): '
                 'the suite\'s rdma_cm tests bind the device\'s address, 127.0.0.1 there, and pyverbs\' '
                 '`CMID` uses the device attached by that bind (docs/rdmacm.md).')
    lines.append('')
    for mode in modes:
        per_module = results[mode]
        total = {'ran': 0, 'pass': 0, 'skip': 0, 'fail': 0}
        skip_kinds = collections.Counter()
        gaps = collections.Counter()
        lines += [f'## Mode: {mode}', '',
                  '| module | ran | passed | skipped (reason: count) | failed |',
                  '|---|---:|---:|---|---|']
        for module, s in per_module.items():
            nskip = sum(s['skip'].values())
            total['ran'] += s['ran']
            total['pass'] += s['pass']
            total['skip'] += nskip
            total['fail'] += len(s['fail'])
            for reason, n in s['skip'].items():
                kind, label = classify_skip(module, reason)
                skip_kinds[(kind, label)] += n
                if kind == 'gap':
                    gaps[reason] += n
            skips = '; '.join(f'{md_escape(r)}: {n}' for r, n in sorted(s['skip'].items(), key=lambda x: -x[1]))
            fails = '; '.join(md_escape(f) for f in s['fail'])
            lines.append(f'| {module} | {s["ran"]} | {s["pass"]} | {nskip}{" — " + skips if skips else ""} '
                         f'| {len(s["fail"])}{" — " + fails if fails else ""} |')
        lines.append(f'| **total** | **{total["ran"]}** | **{total["pass"]}** | **{total["skip"]}** '
                     f'| **{total["fail"]}** |')
        lines += ['', f'Skips of mode {mode}, by why:', '', '| why | tests |', '|---|---:|']
        for (kind, label), n in sorted(skip_kinds.items(), key=lambda x: (x[0][0], -x[1])):
            why = {'hardware': 'hardware softrdma is not', 'machine': 'the machine',
                   'gap': 'softrdma lacks it'}[kind]
            lines.append(f'| {why}: {md_escape(label)} | {n} |')
        lines.append('')
    return '\n'.join(lines) + '\n'


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('suite', help='rdma-core checkout holding tests/ (e.g. `git archive v44.0 tests`)')
    ap.add_argument('--softrdma', default=os.path.join(ROOT, 'build', 'bin', 'softrdma'))
    ap.add_argument('--python', default='/usr/bin/python3',
                    help='the Python that has pyverbs (Debian\'s python3-pyverbs is for /usr/bin/python3)')
    ap.add_argument('--dev', help='device to test (default, as root: the veth of a private namespace)')
    ap.add_argument('--modes', default='direct,packets')
    ap.add_argument('--modules', default='', help='comma-separated subset, e.g. test_mr,test_cq')
    ap.add_argument('--lo-modules', default='test_rdmacm',
                    help='comma-separated modules to run a second time on softrdma_lo ("" for none)')
    ap.add_argument('--hugepages', type=int, default=0,
                    help='reserve this many 2 MiB huge pages for the run (root), restored after')
    ap.add_argument('--timeout', type=int, default=600, help='seconds per module')
    ap.add_argument('--doc', default=os.path.join(ROOT, 'docs', 'conformance.md'),
                    help='where the table goes ("-" for stdout only)')
    ap.add_argument('--keep', help='keep each module\'s log and results in this directory')
    args = ap.parse_args()
    args.suite = os.path.abspath(args.suite)
    args.softrdma = os.path.abspath(args.softrdma)
    if not os.path.isfile(os.path.join(args.suite, 'tests', 'run_tests.py')):
        sys.exit(f'conformance: {args.suite} holds no tests/run_tests.py (an rdma-core checkout?)')
    if not os.access(args.softrdma, os.X_OK):
        sys.exit(f'conformance: no softrdma at {args.softrdma} (build first)')
    modes = [m for m in args.modes.split(',') if m]
    if set(modes) - {'direct', 'packets'}:
        sys.exit('conformance: --modes takes direct and/or packets')
    modules = list_modules(args.suite, [m for m in args.modules.split(',') if m])
    lo_modules = [m for m in args.lo_modules.split(',') if m in modules]
    root = os.geteuid() == 0
    if not args.dev and not root:
        sys.exit('conformance: not root, so no namespace of its own: pass --dev (a device with an IP address)')

    workdir = args.keep or tempfile.mkdtemp(prefix='softrdma-conformance.')
    os.makedirs(workdir, exist_ok=True)
    saved_hugepages = None
    if args.hugepages:
        with open(HUGEPAGES) as f:
            saved_hugepages = f.read().strip()
        with open(HUGEPAGES, 'w') as f:
            f.write(str(args.hugepages))
    try:
        with open(HUGEPAGES) as f:
            hugepages_now = f.read().strip()
        netns = Netns() if not args.dev else None
        results = {}
        ctx = netns if netns else open(os.devnull)
        with ctx:
            prefix = netns.prefix() if netns else []
            dev = netns.dev if netns else args.dev
            for mode in modes:
                results[mode] = {}
                runs = [(m, dev, m) for m in modules]
                if dev != LO_DEV:
                    runs += [(m, LO_DEV, f'{m} on {LO_DEV}') for m in lo_modules]
                for module, on, row in runs:
                    records, note = run_module(args, module, mode, prefix, on, workdir)
                    s = summarize(records)
                    results[mode][row] = s
                    print(f'{mode:7} {row:28} ran {s["ran"]:3}  passed {s["pass"]:3}  '
                          f'skipped {sum(s["skip"].values()):3}  failed {len(s["fail"]):2}'
                          f'{"  (" + note + ")" if note else ""}', flush=True)
    finally:
        if saved_hugepages is not None:
            with open(HUGEPAGES, 'w') as f:
                f.write(saved_hugepages)
    commit = sh(['git', '-C', ROOT, 'describe', '--always', '--dirty'], check=False).stdout.strip()
    pyverbs = sh(['dpkg-query', '-W', '-f', '${Version}', 'python3-pyverbs'], check=False).stdout.strip()
    meta = [('date', datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')),
            ('softrdma', commit),
            ('suite', f'rdma-core tests/ ({os.path.basename(args.suite)}), python3-pyverbs {pyverbs}'),
            ('device', f'{dev}' + (' (veth in a private network namespace, 10.79.0.1/24)' if not args.dev else '')),
            ('2 MiB huge pages', f'{hugepages_now} allocated during the run'
             + (' (reserved by --hugepages)' if args.hugepages else '')),
            ('tests that need huge pages', ', '.join(huge_page_tests(args.suite)) or 'none'),
            ('machine', f'{os.cpu_count()} CPUs, {os.uname().release}')]
    doc = render(args, dev, modes, results, meta)
    if args.doc != '-':
        with open(args.doc, 'w', encoding='utf-8') as f:
            f.write(doc)
        print(f'conformance: wrote {args.doc}')
    else:
        sys.stdout.write(doc)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    failed = sum(len(s['fail']) for m in results.values() for s in m.values())
    gaps = sum(n for m in results.values() for mod, s in m.items() for r, n in s['skip'].items()
               if classify_skip(mod, r)[0] == 'gap')
    passed = sum(s['pass'] for m in results.values() for s in m.values())
    print(f'conformance: tests passing {passed}, failing {failed}, skipped for features softrdma lacks {gaps}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
