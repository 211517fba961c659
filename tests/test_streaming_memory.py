"""A site streams an image folder larger than the memory limit of its process tree.

Real parts throughout: noise PNGs on disk (dropped from the page cache), a child Python
process in a fresh memory cgroup (v2, or v1 where the memory controller lives there) with
swap off, fedweave's image reader, a DataLoader with two worker processes, one epoch of
training. The work is ``bench/bench_streaming_memory.py`` at a small scale (the bench runs the
issue's 3 GB under 2 GB); skipped with the reason where no cgroup can be made.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_streaming_memory.py"
MB = 1024 * 1024
LIMIT_MB = 450
"""The site's limit when torch's own footprint leaves room (it is about 290 MiB on CPU)."""


def _bench(images: Path, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(BENCH), *args, "--dir", str(images), "--json"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    if result.returncode == 3:
        pytest.skip(f"no memory cgroup: {result.stderr.strip()}")
    assert result.stdout.strip(), result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["exit"] = result.returncode
    return report


def _limit_mb() -> int:
    """450 MiB, or torch's own footprint plus 160 MiB where that is more (a CUDA build)."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "baseline"], capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    torch_rss = json.loads(done.stdout)["maxrss"] // MB
    return max(LIMIT_MB, torch_rss + 160)


@pytest.fixture(scope="module")
def limit_mb() -> int:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("memory cgroups need Linux and root")
    return _limit_mb()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for both tests: the bench reuses what it wrote (and drops it from the page
    cache again), which saves writing the images twice."""
    return tmp_path_factory.mktemp("streamed") / "images"


def test_a_site_trains_on_more_image_bytes_than_its_memory_limit(images, limit_mb):
    image_mb = limit_mb * 4 // 3
    r = _bench(images, "--image-mb", str(image_mb), "--limit-mb", str(limit_mb))
    limit = limit_mb * MB
    assert r["exit"] == 0 and r["oom_kills"] == 0, r
    assert r["image_bytes"] >= image_mb * MB > limit
    assert r["examples"] == r["images"] > 0  # one whole epoch over every image
    assert 0 < r["peak_bytes"] <= limit
    assert r["anon_peak_bytes"] < 0.9 * limit, r  # the rest was page cache, reclaimed


def test_the_same_site_holding_its_files_in_memory_is_killed(images, limit_mb):
    """The contrast: the limit bites, so the test above passed by streaming."""
    image_mb = limit_mb * 4 // 3
    r = _bench(images, "--image-mb", str(image_mb), "--limit-mb", str(limit_mb), "--in-memory")
    assert r["exit"] == 1 and r["oom_kills"] >= 1 and r["examples"] == 0, r
