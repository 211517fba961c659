"""Where the test suite's time went: seconds per test file, slowest first, from the JUnit XML
``scripts/test`` writes (``.test-artefacts/junit.xml``, or the path given).

    python scripts/test-times.py [JUNIT_XML] [--top N]

Each line: the file's seconds (its tests' calls plus their fixtures' setup and teardown, as
pytest reports them), its share of the whole, and how many tests it ran.
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
    for case in ET.parse(path).getroot().iter("testcase"):
        name = file_of(case)
        seconds[name] += float(case.get("time", 0) or 0)
        tests[name] += 1
    total = sum(seconds.values())
    print(f"{total:8.0f} s in {sum(tests.values())} tests, {len(seconds)} files")
    for name, secs in sorted(seconds.items(), key=lambda item: -item[1])[: args.top]:
        share = secs / total if total else 0.0
        count = tests[name]
        print(f"{secs:8.0f} s {share:6.1%} {count:4d} test{'s' if count != 1 else ' '}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
