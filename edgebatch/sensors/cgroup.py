"""The memory limit this process lives under: cgroup v1 or v2, read from plain files.

No psutil, no TensorFlow: only `<proc_root>/self/cgroup` and the files under `<cgroup_root>`, both
parameters, so tests feed fake directory trees. `edgebatch.sensors.host` re-exports everything here.

Why a cgroup limit matters more than RAM: under a cgroup limit the kernel SIGKILLs the process
(exit 137) with no Python exception (docs/tensorflow-memory.md#cgroup-limits-kill), so the limit is the
real ceiling a probe must stay under, and it is often far below the machine's RAM that psutil
reports.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# cgroup v1 shows "no limit" as PAGE_COUNTER_MAX pages, 9223372036854771712 (2**63 - 4096) on
# x86-64 with 4 KiB pages and other values with other page sizes; no real machine has 2**60 bytes.
V1_UNLIMITED_THRESHOLD_BYTES = 2**60


@dataclass(frozen=True)
class CgroupMemory:
    """A cgroup's memory limit and usage.

    `limit_bytes` is the smallest limit on the path from this process's cgroup up to the hierarchy
    root (a parent's limit binds the children too); None means unlimited. `usage_bytes` is the usage
    of the cgroup that sets that limit (it counts every process below it), so `limit - usage` is the
    headroom left before the kernel acts. Usage includes page cache; `inactive_file_bytes` is the
    part of it the kernel reclaims first, when it could be read (None otherwise).
    """

    version: int
    limit_bytes: int | None
    usage_bytes: int | None
    inactive_file_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"cgroup version must be 1 or 2, got {self.version!r}")
        for name in ("limit_bytes", "usage_bytes", "inactive_file_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"cgroup {name} must be >= 0 or None, got {value!r}")

    @property
    def working_set_bytes(self) -> int | None:
        """Usage minus inactive page cache: what the kernel cannot simply drop (as kubelet counts it)."""
        if self.usage_bytes is None:
            return None
        return max(0, self.usage_bytes - (self.inactive_file_bytes or 0))


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """Split `/proc/<pid>/cgroup` into (v2 path, v1 memory-controller path); None where absent.

    Lines are `hierarchy-id:controllers:path`; the v2 line is `0::/path`, a v1 memory line is like
    `4:memory:/docker/abc` (the controller list may hold several, comma-separated).
    """
    v2_path: str | None = None
    v1_memory_path: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        fields = line.split(":", 2)
        if len(fields) != 3:
            raise ValueError(f"cannot read cgroup line {line!r}: expected 'id:controllers:path'")
        hierarchy_id, controllers, path = fields
        if hierarchy_id == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_memory_path = path
    return v2_path, v1_memory_path


def parse_limit_v2(text: str) -> int | None:
    """`memory.max`: a byte count, or `max` for unlimited (None)."""
    value = text.strip()
    if value == "max":
        return None
    return _parse_byte_count(value, "memory.max")


def parse_limit_v1(text: str) -> int | None:
    """`memory.limit_in_bytes`: a byte count; the huge sentinel (or -1) means unlimited (None)."""
    value = text.strip()
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"cannot read memory.limit_in_bytes {text!r}: expected an integer") from None
    if number < 0 or number >= V1_UNLIMITED_THRESHOLD_BYTES:
        return None
    return number


def parse_memory_stat(text: str) -> dict[str, int]:
    """`memory.stat` as {key: value}; lines that are not `key integer` are skipped."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2:
            try:
                stats[fields[0]] = int(fields[1])
            except ValueError:
                continue
    return stats


def read_cgroup_memory(
    proc_root: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup"
) -> CgroupMemory | None:
    """This process's cgroup memory limit and usage; None when there is no cgroup filesystem.

    cgroup v1's memory controller is preferred when it is mounted (hybrid hosts mount both, and v2
    then carries no memory controller); otherwise v2. A file that exists but cannot be parsed is
    skipped with a warning naming it.
    """
    try:
        text = (Path(proc_root) / "self" / "cgroup").read_text()
    except OSError:
        return None
    try:
        v2_path, v1_memory_path = parse_proc_cgroup(text)
    except ValueError as exc:
        warnings.warn(f"edgebatch: ignoring {Path(proc_root) / 'self' / 'cgroup'}: {exc}", RuntimeWarning, stacklevel=2)
        return None
    root = Path(cgroup_root)
    if v1_memory_path is not None and (root / "memory").is_dir():
        reading = _read_hierarchy(root / "memory", v1_memory_path, version=1)
        if reading is not None:
            return reading
    if v2_path is not None and root.is_dir():
        reading = _read_hierarchy(root, v2_path, version=2)
        if reading is not None:
            return reading
        # A v2 mount without memory files (the process sits in the real root cgroup, or the
        # memory controller is not enabled): a cgroup fs exists but sets no limit.
        if (root / "cgroup.controllers").is_file():
            return CgroupMemory(version=2, limit_bytes=None, usage_bytes=None)
    return None


_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", parse_limit_v1),
    2: ("memory.max", "memory.current", parse_limit_v2),
}
# v1's memory.stat has both the cgroup's own and the hierarchical ("total_") counter; usage counts
# the whole subtree, so the hierarchical one matches it.
_INACTIVE_FILE_KEYS = {1: ("total_inactive_file", "inactive_file"), 2: ("inactive_file",)}


def _read_hierarchy(hierarchy_root: Path, cgroup_path: str, version: int) -> CgroupMemory | None:
    limit_name, usage_name, parse_limit = _FILES[version]
    chain = _cgroup_chain(hierarchy_root, cgroup_path)
    found_any = False
    binding_dir: Path | None = None
    binding_limit: int | None = None
    for directory in chain:
        limit_text = _read_text(directory / limit_name)
        if limit_text is None:
            continue
        found_any = True
        limit = _parse_or_warn(parse_limit, limit_text, directory / limit_name)
        if limit is not None and (binding_limit is None or limit < binding_limit):
            binding_dir, binding_limit = directory, limit
    # With no limit anywhere, report the usage of the process's own cgroup (the nearest that has it).
    usage_dirs = [binding_dir] if binding_dir is not None else chain
    usage: int | None = None
    inactive_file: int | None = None
    for directory in usage_dirs:
        usage_text = _read_text(directory / usage_name)
        if usage_text is None:
            continue
        found_any = True
        usage = _parse_or_warn(_parse_usage, usage_text, directory / usage_name)
        inactive_file = _read_inactive_file(directory / "memory.stat", version)
        break
    if not found_any:
        return None
    return CgroupMemory(
        version=version, limit_bytes=binding_limit, usage_bytes=usage, inactive_file_bytes=inactive_file
    )


def _cgroup_chain(hierarchy_root: Path, cgroup_path: str) -> list[Path]:
    """The process's cgroup directory, then each parent, ending at the hierarchy root.

    Inside a container /proc/self/cgroup often names the host's path (/docker/<id>) while the
    container's own cgroup is mounted at the root: when the named path does not exist, use the root.
    """
    parts = PurePosixPath(cgroup_path.strip() or "/").parts[1:]
    if ".." in parts or not (hierarchy_root.joinpath(*parts)).is_dir():
        parts = ()
    return [hierarchy_root.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_inactive_file(path: Path, version: int) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    stats = parse_memory_stat(text)
    for key in _INACTIVE_FILE_KEYS[version]:
        if key in stats:
            return stats[key]
    return None


def _parse_usage(text: str) -> int:
    return _parse_byte_count(text.strip(), "memory usage")


def _parse_byte_count(value: str, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"cannot read {what} {value!r}: expected an integer byte count") from None
    if number < 0:
        raise ValueError(f"{what} must be >= 0 bytes, got {value!r}")
    return number


def _parse_or_warn(parse, text: str, path: Path) -> int | None:
    try:
        return parse(text)
    except ValueError as exc:
        warnings.warn(f"edgebatch: ignoring {path}: {exc}", RuntimeWarning, stacklevel=3)
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
