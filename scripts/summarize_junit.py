"""Sum the JUnit reports of all test runs into one closing line, after the runs' times and the slowest tests.

Usage: python scripts/summarize_junit.py DIR  -- prints each report's wall time, the
15 slowest test cases and the 15 slowest test modules of all runs (a module's time
includes its fixtures' setup and teardown: spawns and stops), then
"tests: N passed, N failed, N skipped".
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

passed = failed = skipped = 0
slowest: list[tuple[float, str]] = []
modules: dict[str, float] = {}
for report in sorted(Path(sys.argv[1]).glob("*.xml")):
    seconds = 0.0
    for suite in ET.parse(report).getroot().iter("testsuite"):
        tests = int(suite.get("tests", 0))
        bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skip = int(suite.get("skipped", 0))
        passed += tests - bad - skip
        failed += bad
        skipped += skip
        seconds += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            name = f"{report.stem}: {case.get('classname', '')}::{case.get('name', '')}"
            slowest.append((float(case.get("time", 0)), name))
            module = f"{report.stem}: {case.get('classname', '')}"
            modules[module] = modules.get(module, 0.0) + float(case.get("time", 0))
    print(f"{report.stem}: {seconds:.0f} s")
print("slowest tests:")
for seconds, name in sorted(slowest, reverse=True)[:15]:
    print(f"  {seconds:7.1f} s  {name}")
print("slowest modules:")
for name, seconds in sorted(modules.items(), key=lambda item: item[1], reverse=True)[:15]:
    print(f"  {seconds:7.1f} s  {name}")
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
