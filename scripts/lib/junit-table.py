#!/usr/bin/env python3
"""Prints nextest's JUnit report as a table: test, result, seconds; then the total.

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
    for case in root.iter("testcase"):
        binary = case.get("classname", "").split("::")[-1]
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            result = "FAIL"
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
