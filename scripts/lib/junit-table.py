#!/usr/bin/env python3
"""Prints nextest's JUnit report as a table: test, result, seconds; then the total, and for
each failed test the lines that say why (its panic message and what the test printed just
before it), so that the tail of a long log is enough to start from.

    junit-table.py JUNIT_XML TITLE WALL_SECONDS
"""
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    path, title, wall = sys.argv[1], sys.argv[2], sys.argv[3]
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{title}: no JUnit report ({e})")
        return 1
    rows = []
    failures = []
    for case in root.iter("testcase"):
        binary = case.get("classname", "").split("::")[-1]
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            result = "FAIL"
            failures.append((name, why(case)))
        elif case.find("skipped") is not None:
            result = "skip"
        else:
            result = "pass"
        flaky = len(case.findall("flakyFailure")) + len(case.findall("rerunFailure"))
        if flaky:
            result += f" (after {flaky} failed tries)"
        rows.append((f"{binary}::{name}", result, float(case.get("time", "0"))))
    rows.sort()
    width = max([len(r[0]) for r in rows] + [4])
    print(f"\n{title}")
    print(f"| {'test'.ljust(width)} | result | seconds |")
    print(f"|{'-' * (width + 2)}|--------|---------|")
    for name, result, seconds in rows:
        print(f"| {name.ljust(width)} | {result} | {seconds:7.1f} |")
    passed = sum(1 for r in rows if r[1] == "pass")
    print(f"{passed} of {len(rows)} passed; {wall} s wall (tests run two at a time)\n")
    for name, lines in failures:
        print(f"why {name} failed:")
        for line in lines or ["(no panic message in the report)"]:
            print(f"    {line}")
    return 0


def why(case: ET.Element, before: int = 6, after: int = 3) -> list[str]:
    """The test's panic message with the lines printed just before it (its own eprintln!s),
    from the report's failure text or captured output; the namespace dump is left out."""
    text = "\n".join(
        (e.text or "") for e in case if e.tag in ("failure", "error", "system-out", "system-err")
    )
    lines = [l.rstrip() for l in text.splitlines()]
    picked: list[str] = []
    for i, line in enumerate(lines):
        if "panicked at" in line:
            start = max(0, i - before)
            context = [l for l in lines[start:i] if l.strip() and not l.startswith("====")]
            rest = [l for l in lines[i + 1 : i + 1 + after] if not l.startswith(("====", "note:"))]
            picked += context + [line] + rest
    return picked


if __name__ == "__main__":
    sys.exit(main())
