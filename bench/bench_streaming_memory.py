"""An image-folder site trains on more image bytes than the memory limit of its process tree.

Issue 20: "a site trains on a folder larger than the memory limit the test sets for its process
tree (e.g. 3 GB of generated images under a 2 GB cgroup limit), and its peak memory stays under
that limit". This writes random-noise PNGs (incompressible: the bytes on disk are the pixels),
drops them from the page cache, then trains one epoch over them with fedweave's image-folder
reader (``fedweave.learning.images``) through a ``DataLoader`` with worker processes, in a
child process placed in a fresh memory cgroup before it runs anything: cgroup v2
(``memory.max``, ``memory.swap.max`` 0, ``memory.peak``) or, where the memory controller is
bound to cgroup v1, v1 (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``,
``memory.max_usage_in_bytes``). The cgroup charges the page cache the site's reads bring in
as well as its processes' own memory, and the kernel kills the tree if reclaim cannot keep it
under the limit; so the figures are: the run finished with no OOM kill, the cgroup's peak (all
charged memory) and the peak of its anonymous memory (the processes' own, sampled every
20 ms), each over the limit, next to the image bytes over the limit.

``--in-memory`` is the contrast: the child first reads every file into memory, as a reader
that returns the site's data as arrays must, and is killed.

    python bench/bench_streaming_memory.py                     # 3 GB of images, 2 GB limit
    python bench/bench_streaming_memory.py --image-mb 600 --limit-mb 450 --json

Exit status: 0 trained under the limit, 1 it did not (killed or failed), 3 cgroups are not
usable here (the reason on stderr; tests skip on it). Needs root for the cgroup.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

MB = 1024 * 1024
NOT_USABLE = 3
CLASSES = ("a", "b", "c", "d")


class CgroupUnavailable(Exception):
    """Why no memory cgroup can be made here."""


# --- images -------------------------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(pixels: bytes, side: int) -> bytes:
    """An RGB ``side`` x ``side`` PNG of raw ``pixels``, stored without compression (noise does
    not compress), written directly: Pillow's encoder spends its time choosing row filters."""
    row = side * 3
    raw = b"".join(b"\x00" + pixels[i * row : (i + 1) * row] for i in range(side))
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 0))
        + _chunk(b"IEND", b"")
    )


def write_images(root: Path, total_bytes: int, side: int) -> tuple[int, int]:
    """Noise PNGs in one sub-folder per class until ``total_bytes`` are on disk, each dropped
    from the page cache (fsync, then ``POSIX_FADV_DONTNEED``) so that the child's reads are
    charged to the child. A folder this wrote before with the same figures is reused."""
    marker = root / ".written"
    wanted = f"{total_bytes} {side}"
    if marker.is_file() and marker.read_text() == wanted:
        paths = sorted(root.glob("*/*.png"))
        for path in paths:
            with path.open("rb") as handle:
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return len(paths), sum(p.stat().st_size for p in paths)
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)
    count = written = 0
    while written < total_bytes:
        data = png_bytes(os.urandom(side * side * 3), side)
        path = root / CLASSES[count % len(CLASSES)] / f"{count:06d}.png"
        with path.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        count += 1
        written += len(data)
    marker.write_text(wanted)
    return count, written


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it)."""
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


# --- cgroups ------------------------------------------------------------------------------


class MemoryCgroup:
    """A fresh memory cgroup with a hard limit and no swap; removed by ``remove()``."""

    version = 0

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def stat(self, key: str) -> int:
        for line in self.read("memory.stat").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
        return 0

    def enter(self) -> None:
        """Move the calling process in (run in the child before exec)."""
        self.write("cgroup.procs", str(os.getpid()))

    def anon(self) -> int:
        raise NotImplementedError

    def current(self) -> int:
        raise NotImplementedError

    def peak(self) -> int:
        raise NotImplementedError

    def oom_kills(self) -> int:
        raise NotImplementedError

    def remove(self) -> None:
        for _ in range(50):  # the kernel frees a just-exited tree's cgroup a moment later
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        self.path.rmdir()


class CgroupV2(MemoryCgroup):
    version = 2

    def limit(self, limit: int) -> None:
        self.write("memory.max", str(limit))
        if (self.path / "memory.swap.max").exists():
            self.write("memory.swap.max", "0")
        if (self.path / "memory.oom.group").exists():
            self.write("memory.oom.group", "1")  # an OOM ends the whole site, not one worker

    def anon(self) -> int:
        return self.stat("anon")

    def current(self) -> int:
        return int(self.read("memory.current"))

    def peak(self) -> int:
        return int(self.read("memory.peak")) if (self.path / "memory.peak").exists() else 0

    def oom_kills(self) -> int:
        for line in self.read("memory.events").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0


class CgroupV1(MemoryCgroup):
    version = 1

    def limit(self, limit: int) -> None:
        self.write("memory.limit_in_bytes", str(limit))
        if (self.path / "memory.memsw.limit_in_bytes").exists():  # memory + swap = memory
            self.write("memory.memsw.limit_in_bytes", str(limit))

    def anon(self) -> int:
        return self.stat("rss")  # anonymous memory, transparent huge pages included

    def current(self) -> int:
        return int(self.read("memory.usage_in_bytes"))

    def peak(self) -> int:
        return int(self.read("memory.max_usage_in_bytes"))

    def oom_kills(self) -> int:
        for line in self.read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0  # a kernel before 4.13 does not count them


def _mounts() -> list[tuple[str, str, str]]:
    rows = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        rows.append((fields[1], fields[2], fields[3]))
    return rows


def _own_path(hierarchy: str) -> str:
    """This process's cgroup path in a hierarchy: ``0::`` (v2) or ``N:memory:`` (v1)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == hierarchy or hierarchy in controllers.split(","):
            return path
    raise CgroupUnavailable(f"this process is in no '{hierarchy or 'v2'}' cgroup")


def _try_v2(name: str) -> CgroupV2 | None:
    for mount, kind, _ in _mounts():
        if kind != "cgroup2":
            continue
        root = Path(mount)
        try:
            own = root / _own_path("").lstrip("/")
        except CgroupUnavailable:
            own = root
        for parent in dict.fromkeys([own, root]):
            try:
                if "memory" not in (parent / "cgroup.controllers").read_text().split():
                    continue
                if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                    (parent / "cgroup.subtree_control").write_text("+memory")
                (parent / name).mkdir()
            except OSError:
                continue
            return CgroupV2(parent / name)
    return None


def _try_v1(name: str) -> CgroupV1 | None:
    for mount, kind, options in _mounts():
        if kind != "cgroup" or "memory" not in options.split(","):
            continue
        parent = Path(mount) / _own_path("memory").lstrip("/")
        try:
            (parent / name).mkdir()
        except OSError:
            continue
        return CgroupV1(parent / name)
    return None


def make_memory_cgroup(limit: int) -> MemoryCgroup:
    """A child memory cgroup with ``limit`` bytes and no swap, v2 if its memory controller
    is usable here, else v1; ``CgroupUnavailable`` with the reason if neither."""
    if os.geteuid() != 0:
        raise CgroupUnavailable("making a cgroup needs root")
    name = f"fedweave-stream-{os.getpid()}-{time.monotonic_ns()}"
    group = _try_v2(name) or _try_v1(name)
    if group is None:
        raise CgroupUnavailable(
            "no writable cgroup v2 with the memory controller and no cgroup v1 memory hierarchy"
        )
    try:
        group.limit(limit)
    except OSError as exc:
        group.remove()
        raise CgroupUnavailable(f"cannot set a memory limit on {group.path} ({exc})") from None
    return group


# --- the site (child) ---------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """One epoch of the site's training over the folder; prints a JSON line."""
    import torch
    from torch.utils.data import DataLoader

    from fedweave.learning.images import SmallCNN, read_images

    torch.set_num_threads(1)
    started = time.perf_counter()
    data = read_images(args.dir, (args.size, args.size), 3, CLASSES)
    held = 0
    if args.in_memory:  # the contrast: the site's data in memory before training
        kept = [Path(p).read_bytes() for p in data.paths]
        held = sum(len(b) for b in kept)
    torch.manual_seed(0)
    model = SmallCNN(3, len(CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    examples = 0
    for xb, yb in loader:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        examples += len(yb)
    out = {
        "examples": examples,
        "seconds": round(time.perf_counter() - started, 2),
        "loss": float(loss),
        "held_bytes": held,
        "maxrss_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    print(json.dumps(out), flush=True)


def baseline(args: argparse.Namespace) -> None:
    """torch, the reader and one training step, no data: the site's fixed cost."""
    import torch

    from fedweave.learning.images import SmallCNN

    torch.set_num_threads(1)
    model = SmallCNN(3, len(CLASSES))
    x = torch.rand(args.batch_size, 3, args.size, args.size)
    torch.nn.functional.cross_entropy(model(x), torch.zeros(len(x), dtype=torch.long)).backward()
    print(json.dumps({"maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def _child_argv(args: argparse.Namespace, mode: str) -> list[str]:
    argv = [sys.executable, __file__, mode, "--dir", str(args.dir), "--size", str(args.size)]
    argv += ["--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    return argv + (["--in-memory"] if args.in_memory else [])


# --- the bench ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    limit = args.limit_mb * MB
    try:
        probe = make_memory_cgroup(limit)
    except CgroupUnavailable as exc:
        print(f"cgroups not usable here: {exc}", file=sys.stderr)
        return NOT_USABLE
    try:  # a process can be moved in (v2 refuses some cgroups that it lets one make)
        subprocess.run(["true"], preexec_fn=probe.enter, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"cgroups not usable here: cannot move a process into {probe.path} ({exc})",
              file=sys.stderr)  # fmt: skip
        return NOT_USABLE
    finally:
        probe.remove()
    made_dir = args.dir is None
    args.dir = Path(tempfile.mkdtemp(prefix="fedweave-stream-")) if made_dir else args.dir
    try:
        kind = filesystem_type(args.dir)
        if kind in ("tmpfs", "ramfs"):
            print(f"{args.dir} is on {kind}: its files are memory; use --dir on a disk",
                  file=sys.stderr)  # fmt: skip
            return NOT_USABLE
        started = time.perf_counter()
        count, image_bytes = write_images(args.dir, args.image_mb * MB, args.side)
        wrote = time.perf_counter() - started
        base = json.loads(
            subprocess.run(
                _child_argv(args, "baseline"), capture_output=True, text=True, check=True
            ).stdout  # fmt: skip
        )["maxrss"]
        result = _run_limited(args, limit)
    finally:
        if made_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    result.update(
        images=count, image_bytes=image_bytes, limit_bytes=limit, baseline_rss=base,
        write_seconds=round(wrote, 1),
    )  # fmt: skip
    ok = result["returncode"] == 0 and result["oom_kills"] == 0
    ok = ok and result["examples"] == count
    if args.json:
        print(json.dumps(result))
    else:
        _print(result, args)
    return 0 if ok else 1


def _run_limited(args: argparse.Namespace, limit: int) -> dict:
    group = make_memory_cgroup(limit)
    try:
        proc = subprocess.Popen(
            _child_argv(args, "child"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=group.enter,
        )  # fmt: skip
        anon_peak = current_peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal anon_peak, current_peak
            while not done.wait(0.02):
                try:
                    anon_peak = max(anon_peak, group.anon())
                    current_peak = max(current_peak, group.current())
                except (OSError, ValueError):
                    pass

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = proc.communicate()
        done.set()
        sampler.join()
        peak = group.peak() or current_peak
        oom = group.oom_kills()
        cache = group.stat("file" if group.version == 2 else "cache")
    finally:
        group.remove()
    last = out.strip().splitlines()[-1] if out.strip() else "{}"
    try:
        trained = json.loads(last)
    except json.JSONDecodeError:
        trained = {}
    return {
        "cgroup": f"v{group.version}",
        "returncode": proc.returncode,
        "oom_kills": oom,
        "peak_bytes": peak,
        "anon_peak_bytes": anon_peak,
        "page_cache_at_end": cache,
        "examples": trained.get("examples", 0),
        "seconds": trained.get("seconds"),
        "held_bytes": trained.get("held_bytes", 0),
        "stderr_tail": err.strip().splitlines()[-1] if err.strip() and proc.returncode else "",
    }


def _print(r: dict, args: argparse.Namespace) -> None:
    limit = r["limit_bytes"]
    print(
        f"images: {r['images']} noise PNGs {args.side}x{args.side}, "
        f"{r['image_bytes'] / MB:.0f} MiB on disk (written in {r['write_seconds']} s)"
    )
    print(
        f"memory limit (cgroup {r['cgroup']}, no swap): {limit / MB:.0f} MiB; "
        f"image bytes / limit = {r['image_bytes'] / limit:.2f}"
    )
    print(
        f"site's fixed cost (torch + model, one process, maxrss): {r['baseline_rss'] / MB:.0f} MiB"
    )
    mode = "read every file into memory first" if args.in_memory else "streamed"
    print(
        f"trained ({mode}, {args.workers} DataLoader workers, {args.size}x{args.size}): "
        f"{r['examples']} of {r['images']} examples in {r['seconds']} s, exit {r['returncode']}, "
        f"OOM kills {r['oom_kills']}"
    )
    print(
        f"peak, all charged memory incl. page cache (memory.peak / max_usage_in_bytes): "
        f"{r['peak_bytes']} B = {r['peak_bytes'] / limit:.3f} of the limit ({limit} B)"
    )
    print(
        f"peak anonymous memory (the processes' own, sampled): "
        f"{r['anon_peak_bytes'] / MB:.0f} MiB = {r['anon_peak_bytes'] / limit:.3f} of the limit"
    )
    if r["stderr_tail"]:
        print(f"child: {r['stderr_tail']}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=("bench", "child", "baseline"))
    parser.add_argument("--image-mb", type=int, default=3072, help="image bytes to write (MiB)")
    parser.add_argument("--limit-mb", type=int, default=2048, help="memory.max of the site (MiB)")
    parser.add_argument("--side", type=int, default=512, help="generated image side (pixels)")
    parser.add_argument("--size", type=int, default=64, help="the task's image size")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--dir", type=Path, help="write the images here (default: a temp dir)")
    parser.add_argument("--in-memory", action="store_true", help="contrast: hold every file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.mode == "child":
        child(args)
        return 0
    if args.mode == "baseline":
        baseline(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
