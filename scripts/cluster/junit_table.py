#!/usr/bin/env python3
"""One row per test of a ginkgo JUnit report that the run's focus selected: passed, failed (with
the first line of why) or skipped (with the suite's reason). Specs the focus left out are not
listed. usage: junit_table.py REPORT_DIR [--json]"""
import glob
import json
import sys
import xml.etree.ElementTree as ET

rows = []
for path in sorted(glob.glob(f"{sys.argv[1]}/**/*.xml", recursive=True)):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if name.startswith("[SynchronizedBeforeSuite]") or name.startswith("[SynchronizedAfterSuite]") \
                or name.startswith("[ReportAfterSuite]") or name.startswith("[ReportBeforeSuite]"):
            continue
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None or error is not None:
            why = (failure if failure is not None else error).get("message", "")
            rows.append(("failed", name, why.strip().splitlines()[0] if why.strip() else ""))
        elif skipped is not None:
            why = skipped.get("message", "")
            # ginkgo marks specs outside the focus "skipped" with no reason of their own
            if why.startswith("skipped - ") or why == "":
                continue
            rows.append(("not run", name, why.strip().splitlines()[0]))
        else:
            rows.append(("passed", name, ""))

if "--json" in sys.argv:
    json.dump([{"status": s, "test": n, "why": w} for s, n, w in rows], sys.stdout, indent=1)
    sys.exit(0)
order = {"failed": 0, "not run": 1, "passed": 2}
rows.sort(key=lambda r: (order[r[0]], r[1]))
counts = {s: sum(1 for r in rows if r[0] == s) for s in order}
print(f"{'STATUS':<8} TEST")
for status, name, why in rows:
    print(f"{status:<8} {name}" + (f"\n{'':<8}   {why[:160]}" if why else ""))
print(f"passed {counts['passed']}, failed {counts['failed']}, not run {counts['not run']}")
