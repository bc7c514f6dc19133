#!/usr/bin/env python3
"""Generates the C++ source of a provider stub library (libmlx5.so.1, libefa.so.1).

Input: the library's version script (src/stubs/lib*.map: every exported symbol in its version
node) and the installed prototype header. Output: one definition per symbol with the header's
exact prototype, failing the way rdma-core fails for a device the provider does not drive:

  pointer -> NULL, errno EOPNOTSUPP      int     -> EOPNOTSUPP, errno EOPNOTSUPP
  ssize_t -> -1, errno EOPNOTSUPP        bool    -> false           void -> nothing

A `/* stub: VALUE */` comment after a symbol in the map overrides the value (errno is still set).
A symbol listed in several nodes gets its default version from the newest node and a compat
version (.symver NAME@NODE) from each older one, with the same prototype.

The generated file includes the header, so the compiler rejects any definition whose type differs
from the header's declaration; static_asserts pin the compat versions to it as well.

usage: gen_stubs.py --map libmlx5.map --header infiniband/mlx5dv.h --cc cc --out mlx5_stubs.cpp
"""

import argparse
import re
import subprocess
import sys

IDENT = r"[A-Za-z_]\w*"


class StubError(Exception):
    pass


def parse_map(text):
    """Returns [(node, parent or None, [symbol, ...])] in file order, and {symbol: stub value}."""
    overrides = {}
    for m in re.finditer(rf"({IDENT})\s*;[ \t]*/\*\s*stub:\s*(\S+)", text):
        if m.group(1) in overrides and overrides[m.group(1)] != m.group(2):
            raise StubError(f"{m.group(1)}: two different stub values")
        overrides[m.group(1)] = m.group(2)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    nodes = []
    pos = 0
    node_re = re.compile(rf"\s*({IDENT}(?:\.\w+)*)\s*\{{(.*?)\}}\s*({IDENT}(?:\.\w+)*)?\s*;", re.S)
    while text[pos:].strip():
        m = node_re.match(text, pos)
        if not m:
            raise StubError(f"cannot parse the version script near: {text[pos:pos + 60].strip()!r}")
        name, body, parent = m.group(1), m.group(2), m.group(3)
        if any(name == n for n, _, _ in nodes):
            raise StubError(f"version node {name} defined twice")
        if parent and not any(parent == n for n, _, _ in nodes):
            raise StubError(f"{name} inherits {parent}, which is not defined before it")
        symbols = []
        section = None
        for tok in re.findall(r"\w+:|[^\s;]+(?=\s*;)", body):
            if tok.endswith(":"):
                section = tok[:-1]
                if section not in ("global", "local"):
                    raise StubError(f"{name}: unknown section {tok}")
            elif section == "global":
                if not re.fullmatch(IDENT, tok):
                    raise StubError(f"{name}: {tok!r} is a pattern; list each symbol by name")
                if tok in symbols:
                    raise StubError(f"{name}: {tok} listed twice")
                symbols.append(tok)
            elif section == "local":
                if tok != "*":
                    raise StubError(f"{name}: only `local: *;` is supported")
            else:
                raise StubError(f"{name}: {tok} outside global:/local:")
        nodes.append((name, parent, symbols))
        pos = m.end()
    if not nodes:
        raise StubError("the version script has no version node")
    listed = {s for _, _, syms in nodes for s in syms}
    for s in overrides:
        if s not in listed:
            raise StubError(f"stub value for {s}, which no node exports")
    return nodes, overrides


def preprocess(cc, header):
    """The header as the C compiler sees it: no comments, conditionals or macros left."""
    try:
        out = subprocess.run([cc, "-E", "-P", "-x", "c", "-"], input=f"#include <{header}>\n",
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise StubError(f"preprocessing <{header}> with {cc} failed: {getattr(e, 'stderr', e)}")
    return out.stdout


def top_level_statements(text):
    """Splits C source into top-level declarations (ending in ';') and function definitions."""
    out, start, depth, brace = [], 0, 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                brace = i
            depth += 1
        elif ch == "}":
            depth -= 1
            # A function body ends the statement; a struct, union, enum or initializer does not.
            if depth == 0 and strip_attributes(text[start:brace]).rstrip().endswith(")"):
                out.append(("definition", text[start:i + 1]))
                start = i + 1
        elif ch == ";" and depth == 0:
            out.append(("declaration", text[start:i]))
            start = i + 1
    return out


def strip_attributes(s):
    while True:
        m = re.search(r"__attribute__\s*\(\(", s)
        if not m:
            return s
        depth, i = 0, m.end() - 2
        while True:
            depth += {"(": 1, ")": -1}.get(s[i], 0)
            i += 1
            if depth == 0:
                break
        s = s[:m.start()] + " " + s[i:]


def pointer_style(type_text):
    """`struct x * *` -> `struct x **`, so the generated code reads like the header."""
    return re.sub(r"\s*(\*[\s*]*)", lambda m: " " + re.sub(r"\s", "", m.group(1)), type_text).strip()


def prototypes(text, wanted):
    """{name: (return type, parameter list)} for each wanted function declared in text."""
    found, defined = {}, set()
    for kind, stmt in top_level_statements(text):
        flat = " ".join(strip_attributes(stmt).split())
        m = re.match(rf"^(?:extern )?(.*?)\b({IDENT}) ?\((.*)\)$" if kind == "declaration"
                     else rf"^(?:static |inline |extern )*(.*?)\b({IDENT}) ?\((.*?)\) ?\{{", flat, re.S)
        if not m or m.group(2) not in wanted:
            continue
        if kind == "definition":
            defined.add(m.group(2))
            continue
        ret, name, params = pointer_style(m.group(1)), m.group(2), m.group(3).strip()
        if not ret or "(" in ret or re.search(r"\b(typedef|static)\b", ret):
            continue  # a typedef, a function pointer, a static function: not an export
        if re.search(r"\b__asm(__)?\b", flat):
            raise StubError(f"{name} is declared with an asm label; the generator cannot stub it")
        # Preprocessed as C; the stubs are C++, where the header's bool is bool.
        ret = re.sub(r"\b_Bool\b", "bool", ret)
        params = re.sub(r"\b_Bool\b", "bool", params)
        if name in found and found[name] != (ret, params):
            raise StubError(f"{name} is declared twice, differently: {found[name]} and {(ret, params)}")
        found[name] = (ret, params)
    for name in wanted:
        if name in defined:
            raise StubError(f"{name} is defined inline in the header; a library cannot export it")
    return found


def failure(name, ret, overrides):
    """The statements of the stub's body."""
    value = overrides.get(name)
    pointer = ret.endswith("*")
    if ret == "void" and not pointer:  # (void * is a pointer)
        if value:
            raise StubError(f"{name} returns void; it cannot have a stub value")
        return []
    if value is None:
        if pointer:
            value = "nullptr"
        elif ret == "bool":
            return ["return false;"]
        elif ret == "int":
            value = "EOPNOTSUPP"
        elif ret == "ssize_t":
            value = "-1"
        else:
            raise StubError(f"{name} returns {ret}: no default failure; give it a stub value in the map")
    return ["errno = EOPNOTSUPP;", f"return {value};"]


def decl(ret, name):
    return f"{ret}{name}" if ret.endswith("*") else f"{ret} {name}"


def generate(map_path, map_text, header, cc):
    nodes, overrides = parse_map(map_text)
    order = [s for _, _, syms in nodes for s in syms]
    names = sorted(set(order))
    protos = prototypes(preprocess(cc, header), set(names))
    missing = [n for n in names if n not in protos]
    if missing:
        raise StubError(f"not declared in <{header}>: {', '.join(missing)}")

    # The nodes listing each symbol, oldest first (file order: every parent precedes its child);
    # the last holds the default version.
    versions = {}
    for node, _, syms in nodes:
        for s in syms:
            versions.setdefault(s, []).append(node)

    lines = [
        f"// Generated by src/stubs/gen_stubs.py from {map_path} and <{header}>. Do not edit.",
        f"// {len(names)} functions; every call fails as for a device this provider does not drive.",
        "",
        f"#include <{header}>",
        "",
        "#include <cerrno>",
        "#include <cstddef>",
        "#include <type_traits>",
        "",
        "// The prototypes are the header's, parameter names included; the stubs use none of them.",
        "#pragma GCC diagnostic ignored \"-Wunused-parameter\"",
        "",
        "#pragma GCC visibility push(default)",
        'extern "C" {',
    ]
    for node, _, syms in nodes:
        lines += ["", f"// {node}"]
        for s in syms:
            ret, params = protos[s]
            body = failure(s, ret, overrides)
            if len(versions[s]) == 1:
                fn = s
            else:
                # Each version is its own function, bound to its node by .symver; the default's
                # "@@" keeps the version script from binding the plain name to an older node.
                fn = f"softrdma_stub_{s}_{node.replace('.', '_')}"
                at = "@@" if versions[s][-1] == node else "@"
                lines.append(f"{decl(ret, fn)}({params});")
                lines.append(f"static_assert(std::is_same_v<decltype({fn}), decltype({s})>);")
                lines.append(f'__asm__(".symver {fn}, {s}{at}{node}");')
            lines.append(f"{decl(ret, fn)}({params}) {{")
            lines += [f"  {b}" for b in body]
            lines.append("}")
    lines += ["", '}  // extern "C"', "#pragma GCC visibility pop", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--map", required=True, help="the library's version script")
    ap.add_argument("--header", required=True, help="the prototype header, as #include names it")
    ap.add_argument("--cc", default="cc", help="C compiler used to preprocess the header")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        with open(args.map) as f:
            src = generate(args.map.split("/")[-1], f.read(), args.header, args.cc)
    except StubError as e:
        sys.exit(f"gen_stubs.py: {args.map}: {e}")
    # Rewrite only on change, so a re-run does not force a rebuild.
    try:
        with open(args.out) as f:
            if f.read() == src:
                return
    except OSError:
        pass
    with open(args.out, "w") as f:
        f.write(src)


if __name__ == "__main__":
    main()
