"""Totals and failing tests from the JUnit XML reports of a test run (scripts/test-matrix.sh, scripts/test-pgbouncer.sh).

    python3 scripts/junit-summary.py REPORTS_DIR LABEL [SUMMARY_FILE [FAILED_FILE]]

Reads every REPORTS_DIR/LEG.xml (pytest --junitxml; the file name is the leg's
name), prints "failing tests:" with one "LEG NODE-ID" line per failure or
error, then "LABEL: P passed, F failed, S skipped". A non-empty SUMMARY_FILE
gets "P F S" appended (.ci/run adds up its steps), a non-empty FAILED_FILE one
"LEG NODE-ID" line per failing test (.ci/run lists them again at its end).
Standard library only: it runs with the system python3.
"""

import glob
import os
import sys
import xml.etree.ElementTree as ET


def node_id(classname: str, name: str) -> str:
    """``tests.worker.test_x.TestY`` + ``test_z`` -> ``tests/worker/test_x.py::TestY::test_z``."""
    parts = classname.split(".") if classname else []
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if os.path.exists(path):
            return "::".join([path, *parts[cut:], name])
    return "::".join([p for p in (classname, name) if p])


def main(reports: str, label: str, summary_file: str = "", failed_file: str = "") -> None:
    passed = failed = skipped = 0
    failures = []
    for path in sorted(glob.glob(reports + "/*.xml")):
        leg = os.path.basename(path)[: -len(".xml")]
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            failures.append((leg, "(its JUnit report could not be read)"))
            continue
        suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
        for s in suites:
            t, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
            passed += t - f - e - sk
            failed += f + e
            skipped += sk
            for case in s.iter("testcase"):
                for kind in ("failure", "error"):
                    if case.find(kind) is not None:
                        label_ = node_id(case.get("classname", ""), case.get("name", ""))
                        failures.append((leg, label_ + (" (error)" if kind == "error" else "")))
    if failures:
        print("failing tests:")
        for leg, name in failures:
            print(f"  {leg:<14} {name}")
    print(f"{label}: {passed} passed, {failed} failed, {skipped} skipped")
    if summary_file:
        with open(summary_file, "a") as fh:
            fh.write(f"{passed} {failed} {skipped}\n")
    if failed_file:
        with open(failed_file, "a") as fh:
            fh.writelines(f"{leg} {name}\n" for leg, name in failures)


if __name__ == "__main__":
    main(*sys.argv[1:5])
