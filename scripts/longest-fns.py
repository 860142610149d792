#!/usr/bin/env python3
"""Prints the longest non-test functions of the given crates (default: every crate's src/, the
list of operator/tests/support/source.rs: api, launch, operator, trainer, kubectl, e2e, fuzz).

A function runs from its `fn` line to the closing brace at the same indentation (rustfmt
layout). Test code is skipped: tests.rs files, tests/ directories and `mod tests` blocks.
Usage: scripts/longest-fns.py [--max N] [DIR...]; exits 1 when one is longer than --max.
"""
import pathlib
import re
import sys

FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def functions(path):
    lines = path.read_text().splitlines()
    test_mod_indent = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if test_mod_indent is None and re.match(r"^\s*mod tests\s*\{", line):
            test_mod_indent = len(line) - len(line.lstrip())
        elif test_mod_indent is not None and line == " " * test_mod_indent + "}":
            test_mod_indent = None
        m = FN.match(line)
        if m and test_mod_indent is None and not line.rstrip().endswith(";"):
            indent = m.group(1)
            end = i
            while end < len(lines) and lines[end] != indent + "}":
                end += 1
            yield (end - i + 1, m.group(7), f"{path}:{i + 1}")
        i += 1


def main(argv):
    limit = None
    if argv[:1] == ["--max"]:
        limit, argv = int(argv[1]), argv[2:]
    roots = argv or [
        "api/src",
        "launch/src",
        "operator/src",
        "trainer/src",
        "kubectl/src",
        "e2e/src",
        "fuzz/src",
    ]
    found = []
    for root in roots:
        for path in sorted(pathlib.Path(root).rglob("*.rs")):
            if path.name == "tests.rs" or "tests" in path.parts[:-1]:
                continue
            found.extend(functions(path))
    found.sort(reverse=True)
    for n, name, where in found[:10]:
        print(f"{n:5} {name} {where}")
    if limit is not None and found and found[0][0] > limit:
        print(f"longest function is {found[0][0]} lines (max {limit})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
