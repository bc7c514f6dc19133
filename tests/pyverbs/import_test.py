#!/usr/bin/python3
"""Imports every module of the installed pyverbs package, the provider ones (mlx5dv, efadv...)
included: they link libmlx5.so.1 and libefa.so.1, so an incomplete provider stub fails here.

pyverbs/providers/ and its subdirectories have no __init__.py (namespace packages), which
pkgutil.walk_packages does not descend into; this walks each directory with pkgutil.iter_modules
and recurses into subdirectories itself. Every compiled module file found on disk must also have
been imported, so a module the walk misses is a failure too.

Exits 0 when all imported; prints each failure (module: error) and exits 1 otherwise.
"""

import importlib
import importlib.machinery
import os
import pkgutil
import sys


def walk(path, prefix):
    """Yields module names under directory `path`, namespace subpackages included."""
    for info in pkgutil.iter_modules([path], prefix):
        yield info.name
        if info.ispkg:
            yield from walk(os.path.join(path, info.name.rsplit('.', 1)[1]), info.name + '.')
    for entry in sorted(os.listdir(path)):
        sub = os.path.join(path, entry)
        if (entry.isidentifier() and os.path.isdir(sub) and
                not os.path.exists(os.path.join(sub, '__init__.py'))):
            yield prefix + entry
            yield from walk(sub, prefix + entry + '.')


def compiled_on_disk(root, prefix):
    """Module names of the extension files (.so) under root, from their paths."""
    names = set()
    for dirpath, _, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        pkg = prefix if rel == '.' else prefix + rel.replace(os.sep, '.') + '.'
        for f in files:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                if f.endswith(suffix):
                    names.add(pkg + f[:-len(suffix)])
                    break
    return names


def main():
    import pyverbs
    root = list(pyverbs.__path__)[0]
    names = list(walk(root, 'pyverbs.'))
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError (missing symbol/version) or anything else
            failed.append('%s: %s: %s' % (name, type(exc).__name__, exc))
    missed = compiled_on_disk(root, 'pyverbs.') - set(names)
    for name in sorted(missed):
        failed.append('%s: on disk but not found by the walk' % name)
    compiled = len(compiled_on_disk(root, 'pyverbs.'))
    if compiled == 0:
        failed.append('no compiled modules under %s' % root)
    for f in failed:
        print('FAIL: %s' % f, flush=True)
    if failed:
        print('%d of %d modules failed (%s)' % (len(failed), len(names), root))
        return 1
    print('PASS: all %d modules of %s imported (%d compiled)' % (len(names), root, compiled))
    return 0


if __name__ == '__main__':
    sys.exit(main())
