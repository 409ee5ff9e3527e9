"""This process's resident memory, as the kernel counts it (Linux `/proc/self/status`).

A run reports its peak from it, and tells the runtime's part (Python, torch) from the tensors'."""

from __future__ import annotations

import re
import resource
import sys


def resident_bytes() -> int:
    """Bytes of this process in memory now (VmRSS: anonymous and file-backed pages alike)."""
    return _status("VmRSS") or peak_resident_bytes()


def peak_resident_bytes() -> int:
    """The most bytes this process has had in memory at once (VmHWM, or getrusage where there is no /proc).
    Linux folds each thread's page counts into VmHWM only now and then, so VmHWM can trail VmRSS by a few
    pages: the peak is never less than what is resident now."""
    peak = _status("VmHWM")
    if peak:
        return max(peak, _status("VmRSS"))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # macOS counts bytes, Linux KiB


def _status(field: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            found = re.search(rf"^{field}:\s+(\d+) kB$", status.read(), re.MULTILINE)
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0
