"""The long fuzz run: the targets of tests/reliability/test_fuzz.py for many examples each (docs/reliability.md).

    python3 bench/fuzz_long.py --examples 100000 safetensors burnpack recipe

Prints, per target, the number of inputs run, the time taken and the result; a property failure prints
Hypothesis's shrunk counterexample and exits 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {
    "safetensors": "test_fuzz_safetensors_header",
    "gguf": "test_fuzz_gguf_header",
    "burnpack": "test_fuzz_burnpack_mutated",
    "recipe": "test_fuzz_recipe",
    "safetensors-hostile": "test_fuzz_safetensors_hostile_structures",
    "index-hostile": "test_fuzz_index_hostile_structures",
    "burnpack-hostile": "test_fuzz_burnpack_hostile_metadata",
    "recipe-hostile": "test_fuzz_recipe_hostile_structures",
    "non-regular-files": "test_fuzz_non_regular_files",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=list(TARGETS), help=", ".join(TARGETS))
    parser.add_argument("--examples", type=int, default=100_000)
    args = parser.parse_args()
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {', '.join(TARGETS)}")
    os.environ["QCLI_FUZZ_EXAMPLES"] = str(args.examples)
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("fuzz_targets", REPO / "tests" / "reliability" / "test_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    failed = False
    for target in args.targets:
        start = time.perf_counter()
        before = sum(module.CALLS.values())
        try:
            getattr(module, TARGETS[target])()
            result = "no failure"
        except Exception as exc:  # noqa: BLE001 - report every kind of failure and go on to the next target
            result = f"FAILED: {type(exc).__name__}: {exc}"
            failed = True
        count = sum(module.CALLS.values()) - before
        print(f"{target}: {count} inputs in {time.perf_counter() - start:.0f} s, {result}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
