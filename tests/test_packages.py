"""How qcli is laid out as packages: the kernels folder installs as qcli.kernels, and no import cycles.

The import graph is read from the source (module-level and function-level imports alike), not from what
happens to be imported at run time.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each import name's files are: qcli.kernels is the top-level kernels/ folder.
PACKAGE_ROOTS = {"qcli": ROOT / "qcli", "qcli.kernels": ROOT / "kernels"}
# The layers from the top: the command line (and `python -m qcli`), the commands it calls, and the rest,
# which imports neither.
COMMAND_LINE = ("qcli.__main__", "qcli.cli")
COMMANDS = "qcli.commands"
# What the commands share (`collector_paused`, quantize's options); anything else one command needs of another's
# (the plan by name) belongs in a layer below both.
COMMANDS_SHARED = (COMMANDS, f"{COMMANDS}.options")
# The vocabulary every reader and command shares, each name in its one home: no reader is imported for it.
HOMES = {
    "qcli.io.source": ("TensorInfo", "Source", "Names", "in_row_order"),
    "qcli.io.readers": ("READERS", "Reader", "open_source"),
    "qcli.io.files": ("open_regular", "read_into", "FileEnded", "NotRegularFile", "not_regular_problem",
                      "NOT_REGULAR_HINT", "unreadable", "read_json"),
    "qcli.io.hf_index": ("read_weight_map", "check_weight_map"),
    "qcli.text": ("printable", "shown", "quoted"),
}
# The readers' registry: only it picks a reader (`qcli.io.readers.READERS`).
REGISTRY = "qcli.io.readers"
# Modules that are part of a reader's own row (the GGUF row's `--names hf`), or read a file of its format that is
# no checkpoint (an importance matrix is a GGUF file, read by the same checked reader).
READER_HELPERS = {"qcli.io.gguf_names", "qcli.io.imatrix"}


def modules() -> dict[str, Path]:
    """Every module by its import name: the Python files, and the C extensions (a `.c` source builds the
    module of its name), which import no qcli module."""
    found = {}
    for package, folder in PACKAGE_ROOTS.items():
        for path in [*folder.rglob("*.py"), *folder.rglob("*.c")]:
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The qcli modules `name` imports anywhere in its source; `from package import submodule` is an
    import of the submodule (the package's own __init__ runs first in any case)."""
    if path.suffix == ".c":
        return set()
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            named.update(submodules)
            if not all(s in known for s in submodules):
                named.add(module)
    resolved = set()
    for target in named:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def test_qcli_kernels_is_the_top_level_kernels_folder() -> None:
    spec = importlib.util.find_spec("qcli.kernels")
    assert spec is not None and Path(spec.origin) == ROOT / "kernels" / "__init__.py"
    assert not (ROOT / "qcli" / "kernels").exists()


def test_nothing_imports_kernels_as_a_top_level_name() -> None:
    # `kernels` is another PyPI distribution's import name.
    for folder in (ROOT / "qcli", ROOT / "kernels", ROOT / "tests", ROOT / "bench"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                assert not [n for n in names if n == "kernels" or n.startswith("kernels.")], path


def test_the_import_graph_has_no_cycle_and_no_upward_import() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            assert state.get(target) != "open", " -> ".join([*trail, name, target])
            if target not in state:
                visit(target, [*trail, name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert any(name.startswith(f"{COMMANDS}.") for name in graph)
    for name, targets in graph.items():
        if not name.startswith(COMMAND_LINE):
            assert not [t for t in targets if t.startswith(COMMAND_LINE)], name
            if not name.startswith(COMMANDS):
                assert not [t for t in targets if t.startswith(COMMANDS)], name


def test_a_wheel_holds_the_kernels_as_qcli_kernels(tmp_path: Path) -> None:
    # Built from a copy, so that setuptools' build folder is not left in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("qcli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"qcli/kernels/__init__.py", "qcli/kernels/launch.py", "qcli/pipeline/gpu.py"} <= set(names)
    assert {f"qcli/{path.relative_to(ROOT / 'qcli')}" for path in (ROOT / "qcli").rglob("*.py")} <= set(names)
    assert not [n for n in names if n.startswith("kernels/")]
    from qcli.codec import search_loop

    if search_loop.BUILT:  # where this checkout's build compiled the search loop, the wheel's does too
        assert [n for n in names if n.startswith("qcli/codec/_search.") and n.endswith(".so")], names


def test_no_command_imports_another() -> None:
    known = modules()
    commands = [n for n in known if n.startswith(f"{COMMANDS}.") and n not in COMMANDS_SHARED]
    assert commands
    for name in commands:
        assert not [t for t in imports(name, known[name], known) if t in commands], name


def test_the_formats_match_names_without_the_recipe_parser() -> None:
    known = modules()
    for name, path in known.items():
        if name.startswith("qcli.formats"):
            assert "qcli.recipe" not in imports(name, path, known), name


def test_no_module_imports_another_projects_private_module() -> None:
    """`re._parser`, `typer._completion_shared`: another project's private modules change between its
    releases without notice."""
    for folder in (ROOT / "qcli", ROOT / "kernels"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [f"{node.module}.{a.name}" for a in node.names]
                         if isinstance(node, ast.ImportFrom) and not node.level else [])
                for module in names:
                    if module.split(".")[0] not in ("qcli", "__future__"):
                        assert not any(part.startswith("_") for part in module.split(".")), (path, module)


def test_no_module_takes_another_modules_private_names() -> None:
    """A name that starts with `_` stays in its module: no other module imports it or reads it as an attribute
    of the imported module (`K._kernel`), nor does a benchmark. A private module (`qcli.kernels._quantize`) is
    its package's: its own package's modules import it, and its names are public to them."""
    known = modules()
    benchmarks = {f"bench.{path.stem}": path for path in (ROOT / "bench").glob("*.py")}
    for name, path in {**known, **benchmarks}.items():
        if path.suffix == ".c":
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("qcli"):
                if any(private(part) for part in node.module.split(".")):
                    assert node.module.rsplit(".", 1)[0] == package, (path, node.module)
                for alias in node.names:
                    imported.add(alias.asname or alias.name)
                    own_private_module = node.module == package and f"{node.module}.{alias.name}" in known
                    assert not (private(alias.name) and not own_private_module), (path, node.module, alias.name)
            elif isinstance(node, ast.Import):
                imported.update(alias.asname or alias.name.split(".")[0] for alias in node.names
                                if alias.name.startswith("qcli"))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported:
                assert not private(node.attr), (path, f"{node.value.id}.{node.attr}")


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_shared_vocabulary_is_imported_from_its_home() -> None:
    """`TensorInfo`, the text helpers, the file helpers: from where they are defined, never through a reader (which
    re-exports none of them)."""
    home = {name: module for module, names in HOMES.items() for name in names}
    for module, names in HOMES.items():
        defined = importlib.import_module(module)
        for name in names:
            value = getattr(defined, name)
            assert getattr(value, "__module__", module) == module, (module, name)
    for folder in (ROOT / "qcli", ROOT / "kernels", ROOT / "tests", ROOT / "bench"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("qcli"):
                    wrong = [a.name for a in node.names if home.get(a.name, node.module) != node.module]
                    assert not wrong, (path, node.module, wrong)


def test_only_the_registry_picks_a_reader() -> None:
    """A reader is picked by its row in `qcli.io.readers`: no other module of qcli imports a row's source class
    or sniff (the tests and benchmarks may), nor, for a reader module that holds nothing else, the module."""
    from qcli.io.readers import READERS

    picked = {pair for row in READERS
              for pair in ((row.open.__module__, row.open.__qualname__.split(".")[0]), (row.sniff.__module__,
                                                                                       row.sniff.__name__))
              if pair[0] == row.open.__module__}
    assert {module for module, _ in picked} == {"qcli.io.gguf", "qcli.io.safetensors"}
    for path in [*(ROOT / "qcli").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).replace("kernels", "qcli.kernels", 1)
        if name.removesuffix(".__init__") in {REGISTRY, *READER_HELPERS, *(m for m, _ in picked)}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                taken = {(node.module, alias.name) for alias in node.names} & picked
                assert not taken, f"{path.relative_to(ROOT)} picks a reader itself: {sorted(taken)}"
    known = modules()
    for name, path in known.items():
        if name != REGISTRY:
            assert "qcli.io.safetensors" not in imports(name, path, known), name


DESIGN = ROOT / "docs" / "design.md"


def design_groups() -> dict[str, int]:
    """Each module docs/design.md's "Modules" section names, by the rank of its group (0: the command line, on
    top), as its bold group headings and their tables of `path` rows give them."""
    text = DESIGN.read_text().split("\n## Modules\n", 1)[1].split("\n### What the tests hold\n", 1)[0]
    groups: dict[str, int] = {}
    rank = -1
    for line in text.splitlines():
        if line.startswith("**"):
            rank += 1
        elif line.startswith("| `"):
            for path in re.findall(r"`([^`]+)`", line.split(" |")[0]):
                path = path.removeprefix("qcli/")
                package = "qcli.kernels" if path.startswith("kernels/") else "qcli"
                parts = [p for p in Path(path.removeprefix("kernels/")).with_suffix("").parts if p != "__init__"]
                groups[".".join([package, *parts])] = rank
    # A package's __init__ that only gathers its modules sits in their group.
    for name in modules():
        inside = {rank for module, rank in groups.items() if module.startswith(name + ".")}
        if name not in groups and len(inside) == 1:
            groups[name] = inside.pop()
    return groups


def test_design_names_every_module_in_one_group() -> None:
    groups = design_groups()
    assert len(set(groups.values())) == 8
    assert sorted(set(modules()) - set(groups)) == [], "name each module in docs/design.md's Modules section"
    assert sorted(set(groups) - set(modules())) == [], "docs/design.md names modules that are not there"


def test_every_import_goes_to_its_own_group_or_one_below() -> None:
    """docs/design.md's order of the eight groups, held for every import (function-local ones too): nothing
    imports a group above its own, and the codec and io/ do not import each other."""
    groups, known = design_groups(), modules()
    codec, io = ("qcli.codec", "qcli.kernels"), ("qcli.io",)
    for name, path in known.items():
        for target in imports(name, path, known):
            assert groups[target] >= groups[name], f"{name} (group {groups[name]}) imports {target} ({groups[target]})"
            # The element types' rows are the one thing of io/ the kernels read: which source dtypes they take.
            assert not (name.startswith(codec) and target.startswith(io) and target != "qcli.io.dtypes"), \
                f"{name} imports {target}"
            assert not (name.startswith(io) and target.startswith(codec)), f"{name} imports {target}"
