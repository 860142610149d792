"""Reads checkov's JSON report (kubernetes framework) and the justification list, prints a
table of the failed checks, and exits 1 when a failed check is not justified (2 on a broken
scan). Run by scripts/scan.sh with the scan's own venv (PyYAML comes with checkov).

usage: report.py CHECKOV_JSON JUSTIFIED_TSV ROOT INPUTS_TSV [--expect CHECK_ID]
ROOT is the directory checkov scanned; INPUTS_TSV names its subdirectories as the user gave
them, one "subdir<TAB>file|dir<TAB>name" a line: a file is shown by its name, a file in a dir
as name/path. With --expect (the self-test), CHECK_ID must be among the unjustified failures,
else the scan is broken (exit 2).
"""

import fnmatch
import json
import os
import re
import sys

import yaml


def die(message):
    print(f"scan: {message}", file=sys.stderr)
    sys.exit(2)


def load_justifications(path):
    """(check id, resource glob, reason, line number) from a TSV with # comments."""
    rules = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.rstrip("\n").split("\t")
            fields = [x.strip() for x in fields if x.strip()]
            if len(fields) != 3:
                die(f"{path}:{number}: want 3 tab-separated fields (check, resource, reason)")
            rules.append((*fields, number))
    return rules


def load_inputs(root, inputs_tsv):
    """subdirectory of ROOT -> (file|dir, name); and a YAML syntax check of every file."""
    labels = {}
    with open(inputs_tsv) as f:
        for line in f:
            subdir, kind, name = line.rstrip("\n").split("\t")
            labels[subdir] = (kind, name)
    for subdir in labels:
        for dirpath, _, files in os.walk(os.path.join(root, subdir)):
            for name in files:
                if not name.endswith((".yaml", ".yml", ".json")):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    with open(path) as f:
                        list(yaml.safe_load_all(f))
                except yaml.YAMLError as e:
                    # checkov skips such a file silently: a scan must not pass because of it.
                    shown = where(root, labels, path)
                    die(f"{shown} is not valid YAML: {str(e).replace(path, shown)}")
    return labels


def where(root, labels, path):
    """The name of a scanned file as the user gave it."""
    subdir, _, rest = os.path.relpath(path, root).partition(os.sep)
    kind, name = labels[subdir]
    return name if kind == "file" else os.path.join(name, rest)


def check_order(c):
    """By resource, then by check number: CKV_K8S_8 before CKV_K8S_43."""
    return (c["resource"], [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", c["check_id"])])


def main():
    args = sys.argv[1:]
    expect = None
    if "--expect" in args:
        i = args.index("--expect")
        expect = args[i + 1]
        del args[i : i + 2]
    report_path, justified_path, root, inputs_tsv = args

    labels = load_inputs(root, inputs_tsv)
    rules = load_justifications(justified_path)
    with open(report_path) as f:
        report = json.load(f)
    # One framework gives one object; checkov gives a list when it ran several.
    reports = report if isinstance(report, list) else [report]
    passed, failed = [], []
    for r in reports:
        results = r.get("results", {})
        if results.get("parsing_errors"):
            die(f"checkov could not parse: {results['parsing_errors']}")
        passed += results.get("passed_checks", [])
        failed += results.get("failed_checks", [])

    # Every input must have been scanned: checkov says nothing of a file it did not recognise.
    seen = {os.path.relpath(c["file_abs_path"], root).split(os.sep)[0] for c in passed + failed}
    for subdir, (_, name) in labels.items():
        if subdir not in seen:
            die(f"checkov found no Kubernetes object to check in {name}")

    used = set()
    rows = []
    unjustified = []
    # The failures one justification covers, in one row when there are several (the operator's
    # pods: one per rank of each rendered job).
    grouped = {}
    for c in sorted(failed, key=check_order):
        rule = next(
            (r for r in rules if r[0] == c["check_id"] and fnmatch.fnmatchcase(c["resource"], r[1])),
            None,
        )
        place = f"{where(root, labels, c['file_abs_path'])}:{c['file_line_range'][0]}"
        if rule:
            used.add(rule[3])
            if rule[3] not in grouped:
                grouped[rule[3]] = ["justified", c["check_id"], [], [], rule[2], rule[1]]
                rows.append(grouped[rule[3]])
            grouped[rule[3]][2].append(c["resource"])
            grouped[rule[3]][3].append(place)
        else:
            unjustified.append(c["check_id"])
            rows.append(("FAILED", c["check_id"], c["resource"], place, c["check_name"]))
    for i, row in enumerate(rows):
        if row[0] == "justified":
            _, check, resources, places, reason, pattern = row
            if len(resources) == 1:
                rows[i] = ("justified", check, resources[0], places[0], reason)
            else:
                files = sorted({p.rsplit(":", 1)[0] for p in places})
                shown = files[0] if len(files) == 1 else f"{os.path.commonpath(files) or '.'}/ ({len(files)} files)"
                rows[i] = ("justified", check, f"{pattern} ({len(resources)})", shown, reason)

    if rows:
        header = ("RESULT", "CHECK", "RESOURCE", "FILE:LINE", "WHY (justification, or the check)")
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
        for row in [header] + rows:
            print("  ".join(x.ljust(w) for x, w in zip(row, widths)) + "  " + row[4])
        print()
    for check, pattern, _, number in rules:
        if number not in used and expect is None:
            print(f"warning: {justified_path}:{number}: {check} {pattern} matches no failed check "
                  "(stale? or its input was not scanned)")

    # Counts by scanned file, for docs/security-checks.md's before-and-after table.
    counts = {}
    for key, checks in (("passed", passed), ("failed", failed)):
        for c in checks:
            shown = where(root, labels, c["file_abs_path"])
            counts.setdefault(shown, {"passed": 0, "failed": 0})[key] += 1
    for shown in sorted(counts):
        print(f"  {shown}: {counts[shown]['passed']} passed, {counts[shown]['failed']} failed")
    version = reports[0].get("summary", {}).get("checkov_version", "?")
    print(f"checkov {version}: {len(passed)} passed, {len(failed)} failed "
          f"({len(failed) - len(unjustified)} justified, {len(unjustified)} not) "
          f"in {', '.join(name for _, name in labels.values())}")
    if expect is not None:
        if expect not in unjustified:
            die(f"self-test: {expect} is not among the unjustified failures: the scan cannot fail")
        print(f"self-test: the bad fixture fails {expect} and the scan exits 1, as it must")
    if unjustified:
        print(f"FAILED: {len(unjustified)} failed check(s) not justified in {justified_path}: "
              f"fix them or justify them there and in docs/security-checks.md")
        sys.exit(1)


if __name__ == "__main__":
    main()
