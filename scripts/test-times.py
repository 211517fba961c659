"""Where the test suite's time went: seconds per test file, slowest first, from the JUnit XML
``scripts/test`` writes (``.test-artefacts/junit.xml`` and, after a run in two phases,
``junit-alone.xml`` beside it; or the paths given).

    python scripts/test-times.py [JUNIT_XML ...] [--top N]
    python scripts/test-times.py --totals [JUNIT_XML ...]    one line: passed, failed, skipped
    python scripts/test-times.py --workers [JUNIT_XML ...]   each worker's busy span and
        the seconds it waited at the end of its phase for the other
    python scripts/test-times.py --save-seconds tests/file_seconds.json [JUNIT_XML ...]
        seconds per file, for the order in which two workers take the files where no JUnit
        XML of an earlier run is at hand (a fresh clone: CI)

Each line: the file's seconds (its tests' calls plus their fixtures' setup and teardown, as
pytest reports them), its share of the whole, how many tests it ran, and the CPU its tests
recorded (``tests/suite_costs.py``): ``cpu`` is the CPU of the test's process and the
processes it waited for, ``machine`` the whole machine's busy CPU meanwhile (the test's own
only in a one-process run on a quiet machine). A file whose CPU is near its seconds or above
is bound by the machine; one far below waits.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("junit", nargs="*", type=Path,
                        help="JUnit XML from pytest (default: .test-artefacts/junit.xml and "
                             "junit-alone.xml beside it, where it exists)")  # fmt: skip
    parser.add_argument("--top", type=int, default=40, help="files to list (default 40)")
    parser.add_argument(
        "--totals",
        action="store_true",
        help="print only the tests passed, failed and skipped, summed",
    )
    parser.add_argument(
        "--workers",
        action="store_true",
        help="print each worker's busy span and idle tail, phase by phase",
    )
    parser.add_argument(
        "--save-seconds",
        type=Path,
        metavar="JSON",
        help="write each file's seconds (5 s or more) to JSON and print nothing",
    )
    args = parser.parse_args(argv)
    paths = args.junit or [path for path in DEFAULT_PATHS if path.is_file()] or DEFAULT_PATHS[:1]
    for path in paths:
        if not path.is_file():
            print(f"error: no {path}: run scripts/test first (it writes it)", file=sys.stderr)
            return 2
    if args.workers:
        for path in paths:
            print(f"{path}:")
            print("\n".join(worker_lines(list(ET.parse(path).getroot().iter("testcase")))))
        return 0
    cases = [case for path in paths for case in ET.parse(path).getroot().iter("testcase")]
    if args.totals:
        print(totals_line(cases))
        return 0
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    cpu: dict[str, dict[str, float]] = {measure: defaultdict(float) for measure in MEASURES}
    for case in cases:
        name = file_of(case)
        seconds[name] += float(case.get("time", 0) or 0)
        tests[name] += 1
        for prop in case.iter("property"):
            if prop.get("name") in cpu:
                cpu[prop.get("name")][name] += float(prop.get("value", 0) or 0)
    if args.save_seconds:
        slow = {name: round(secs, 1) for name, secs in sorted(seconds.items()) if secs >= 5}
        args.save_seconds.write_text(json.dumps(
            {"about": "seconds per test file in one run of scripts/test, written by "
                      "`python scripts/test-times.py --save-seconds`; only the order in which "
                      "pytest-xdist workers take the files reads it (tests/conftest.py)",
             "seconds": slow}, indent=1) + "\n")  # fmt: skip
        return 0
    total = sum(seconds.values())
    print(
        f"{total:8.0f} s in {sum(tests.values())} tests, {len(seconds)} files; CPU seconds: "
        + ", ".join(f"{sum(cpu[m].values()):.0f} {label}" for m, label in MEASURES.items())
    )
    print(f"{'seconds':>8}   share  tests  {'cpu':>6} {'machine':>7}  file")
    for name, secs in sorted(seconds.items(), key=lambda item: -item[1])[: args.top]:
        share = secs / total if total else 0.0
        used = " ".join(f"{cpu[m][name]:{w}.0f}" if name in cpu[m] else " " * w
                        for m, w in zip(MEASURES, (6, 7)))  # fmt: skip
        print(f"{secs:8.0f} {share:7.1%} {tests[name]:6d}  {used}  {name}")
    return 0


def totals_line(cases: list[ET.Element]) -> str:
    """``totals: N passed, N failed, N skipped`` over test cases of one or more JUnit files
    (a case with a failure or an error counts as failed, so does an error in its teardown)."""
    failed = skipped = passed = 0
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return f"totals: {passed} passed, {failed} failed, {skipped} skipped"


def worker_lines(cases: list[ET.Element]) -> list[str]:
    """One line a worker of one phase: its tests, first start to last end, its seconds in
    tests, and how long before the phase's last test ended it had nothing left (from the
    ``started`` and ``worker`` properties; ``tests/suite_costs.py``)."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "started" in props:
            start = float(props["started"])
            spans[props.get("worker") or "main"].append(
                (start, start + float(case.get("time", 0) or 0))
            )
    if not spans:
        return ["  no start times in this file (written before tests/suite_costs.py kept them)"]
    first = min(s for runs in spans.values() for s, _ in runs)
    last = max(e for runs in spans.values() for _, e in runs)
    lines = [f"  phase: {last - first:.0f} s"]
    for worker, runs in sorted(spans.items()):
        end = max(e for _, e in runs)
        busy = sum(e - s for s, e in runs)
        lines.append(f"  {worker}: {len(runs)} tests, {busy:.0f} s in tests, done "
                     f"{end - first:.0f} s in, then idle {last - end:.0f} s")  # fmt: skip
    return lines


DEFAULT_PATHS = [Path(".test-artefacts/junit.xml"), Path(".test-artefacts/junit-alone.xml")]
"""What ``scripts/test`` writes: every test of a one-phase run, or phase 1's; phase 2's."""

MEASURES = {"cpu_seconds": "cpu (test's processes)", "machine_cpu_seconds": "machine"}
"""The CPU properties ``tests/suite_costs.py`` records on each test case, and their labels."""


if __name__ == "__main__":
    sys.exit(main())
