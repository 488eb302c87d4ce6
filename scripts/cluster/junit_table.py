#!/usr/bin/env python3
"""One row per test the run was asked for, from ginkgo's JUnit report: passed, failed (with the
first line of why) or not run (with the suite's reason, or "not in the report"). The tests asked
for are those of EXPECTED (one name per line; e.g. the conformance list e2e.test prints) when
given, else every spec the report shows as run or skipped with a reason of its own (ginkgo
reports the specs outside the focus as plain "skipped": those are left out).
--skipped=REGEX=WHY gives the reason of the tests the run left out on purpose (ginkgo --skip).
usage: junit_table.py REPORT_DIR [EXPECTED] [--skipped=REGEX=WHY] [--json]"""
import glob
import json
import re
import sys
import xml.etree.ElementTree as ET

args = [a for a in sys.argv[1:] if a != "--json" and not a.startswith("--skipped=")]
skipped_on_purpose = [a[len("--skipped="):].split("=", 1) for a in sys.argv[1:] if a.startswith("--skipped=")]
report, expected = args[0], (args[1] if len(args) > 1 else None)
results = {}
for path in sorted(glob.glob(f"{report}/**/*.xml", recursive=True)):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It] "):
            continue  # suite set-up and reporting nodes
        name = name[len("[It] "):]
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            why = bad.get("message", "").strip()
            results[name] = ("failed", why.splitlines()[0] if why else "")
        elif skipped is not None:
            why = skipped.get("message", "").strip()
            if why.startswith("skipped - "):
                why = why[len("skipped - "):]
            results[name] = ("not run", "" if why == "skipped" else why.splitlines()[0])
        else:
            results[name] = ("passed", "")

def why_not_run(name, why):
    for regex, reason in skipped_on_purpose:
        if re.search(regex, name):
            return f"left out (--skip): {reason}"
    return why


results = {n: (s, why_not_run(n, w) if s == "not run" else w) for n, (s, w) in results.items()}
if expected:
    wanted = [l.strip() for l in open(expected) if l.strip()]
    rows = [(results.get(n, ("not run", "not in the report"))[0], n,
             results.get(n, ("not run", "not in the report"))[1]) for n in wanted]
else:
    rows = [(s, n, w) for n, (s, w) in results.items() if not (s == "not run" and w == "")]

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
