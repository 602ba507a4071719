#!/usr/bin/env python3
"""Checks that CTest ran every Catch2 test case exactly once: per Catch2 binary, the number
of CTest entries equals the number of test cases the binary lists, and the entries that
executed a test case equal the listed ones minus those reported skipped. A name CTest
splits (at ';'), a filter matching no case, or a case counted twice shows up here.

Usage: check-test-counts.py BUILD_DIR JUNIT_XML   (JUNIT_XML: ctest --output-junit)
"""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(build_dir: str, junit_path: str) -> int:
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, check=True,
                           capture_output=True, text=True).stdout
    entries = defaultdict(list)  # Catch2 binary -> CTest names of its entries
    for test in json.loads(shown)["tests"]:
        command = test.get("command", [])
        if "NoTests" in command:  # registered by pagedkv_discover_tests()
            entries[command[0]].append(test["name"])
    results = {case.get("name"): case for case in ET.parse(junit_path).getroot().iter("testcase")}
    ok = True
    for binary, names in sorted(entries.items()):
        listed = [line for line in subprocess.run(
            [binary, "--list-test-names-only"], capture_output=True,  # exit code: the count
            text=True).stdout.splitlines() if line.strip()]
        executed = skipped = 0
        for name in names:
            case = results.get(name)
            if case is None:
                continue  # not run in this ctest invocation: counted as missing below
            if case.find("skipped") is not None:
                skipped += 1
            elif re.search(r"in 1 test case|test cases: 1 \|", case.findtext("system-out", "")):
                executed += 1
        print(f"{binary}: {len(listed)} test cases listed, {len(names)} CTest entries, "
              f"{executed} executed, {skipped} skipped")
        if len(names) != len(listed) or executed != len(listed) - skipped:
            print(f"  MISMATCH: expected {len(listed)} entries and {len(listed) - skipped} "
                  "executed", file=sys.stderr)
            ok = False
    if not entries:
        print("no Catch2 entries registered", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
