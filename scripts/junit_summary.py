"""Add up pytest JUnit XML reports into one closing line: 'N passed, N failed, N skipped'.

Usage: python scripts/junit_summary.py results/junit-*.xml
Exit 1 when a report is missing or unreadable, when anything failed or errored,
or when nothing ran at all.
"""
import sys
import xml.etree.ElementTree as ET


def main(paths):
    passed = failed = skipped = 0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            print("unreadable JUnit report %s: %s" % (path, exc))
            return 1
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        for suite in suites:
            tests = int(suite.get("tests", 0))
            bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skip = int(suite.get("skipped", 0))
            passed += tests - bad - skip
            failed += bad
            skipped += skip
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
