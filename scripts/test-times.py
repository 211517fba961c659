"""Where the test suite's time went: seconds per test file, slowest first, from the JUnit XML
``scripts/test`` writes (``.test-artefacts/junit.xml``, or the path given).

    python scripts/test-times.py [JUNIT_XML] [--top N]

Each line: the file's seconds (its tests' calls plus their fixtures' setup and teardown, as
pytest reports them), its share of the whole, how many tests it ran, and the CPU its tests
recorded (``tests/suite_costs.py``): ``cpu`` is the CPU of the test's process and the
processes it waited for, ``machine`` the whole machine's busy CPU meanwhile (the test's own
only in a one-process run on a quiet machine). A file whose CPU is near its seconds or above
is bound by the machine; one far below waits.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET  # reads our own pytest's output, never a network reply
from collections import defaultdict
from pathlib import Path


def file_of(case: ET.Element) -> str:
    """``tests/test_x.py`` of a test case (pytest writes ``tests.test_x`` as its class name)."""
    module = case.get("classname", "").split("[", 1)[0]
    parts = module.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()  # a test class inside the module
    return "/".join(parts) + ".py" if parts else "(unknown)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", nargs="?", default=".test-artefacts/junit.xml",
                        help="JUnit XML from pytest (default: .test-artefacts/junit.xml)")
    parser.add_argument("--top", type=int, default=40, help="files to list (default 40)")
    args = parser.parse_args(argv)
    path = Path(args.junit)
    if not path.is_file():
        print(f"error: no {path}: run scripts/test first (it writes it)", file=sys.stderr)
        return 2
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    cpu: dict[str, dict[str, float]] = {measure: defaultdict(float) for measure in MEASURES}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = file_of(case)
        seconds[name] += float(case.get("time", 0) or 0)
        tests[name] += 1
        for prop in case.iter("property"):
            if prop.get("name") in cpu:
                cpu[prop.get("name")][name] += float(prop.get("value", 0) or 0)
    total = sum(seconds.values())
    print(f"{total:8.0f} s in {sum(tests.values())} tests, {len(seconds)} files; CPU seconds: "
          + ", ".join(f"{sum(cpu[m].values()):.0f} {label}" for m, label in MEASURES.items()))
    print(f"{'seconds':>8}   share  tests  {'cpu':>6} {'machine':>7}  file")
    for name, secs in sorted(seconds.items(), key=lambda item: -item[1])[: args.top]:
        share = secs / total if total else 0.0
        used = " ".join(f"{cpu[m][name]:{w}.0f}" if name in cpu[m] else " " * w
                        for m, w in zip(MEASURES, (6, 7)))  # fmt: skip
        print(f"{secs:8.0f} {share:7.1%} {tests[name]:6d}  {used}  {name}")
    return 0


MEASURES = {"cpu_seconds": "cpu (test's processes)", "machine_cpu_seconds": "machine"}
"""The CPU properties ``tests/suite_costs.py`` records on each test case, and their labels."""


if __name__ == "__main__":
    sys.exit(main())
