"""What the source of azqueue keeps to, read from its syntax trees: no function longer
than a screen, Azure's SDK imported by the storage package alone, the command line the
top layer, imported by no other package, and the rooms of azqueue/service importing only
the rooms below them (docs/contributing.md, "Layout")."""

from __future__ import annotations

import ast
import graphlib
import importlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import azqueue

PACKAGE = Path(azqueue.__file__).parent
# The benchmarks and tools: held to the same length as the package.
SCRIPTS = PACKAGE.parent / "scripts"
CONTRIBUTING = PACKAGE.parent / "docs" / "contributing.md"
MAX_LINES = 80
# The test kit reads what a server stored from outside, as a test would, so it talks to
# Azure itself (azqueue/testing/storage.py); the server's own code reaches Azure through
# azqueue/storage only.
OUTSIDE_THE_SERVER = (PACKAGE / "testing",)


def modules(paths: Iterator[Path] | None = None) -> Iterator[tuple[str, ast.Module]]:
    """The package's modules (or those at ``paths``), named from the checkout's root."""
    for path in sorted(PACKAGE.rglob("*.py") if paths is None else paths):
        yield path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text(), str(path))


def scripts() -> Iterator[tuple[str, ast.Module]]:
    """The Python scripts of scripts/ (the shell ones, like ``scripts/test``, aside)."""
    return modules(SCRIPTS.glob("*.py"))


def long_functions(name: str, tree: ast.Module, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` of each function in ``tree`` over ``limit`` lines,
    from its ``def`` to its last line."""
    return [f"{name}:{node.lineno} {node.name} ({length} lines)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > limit]


def azure_imports(tree: ast.Module) -> list[str]:
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0]
    return [name for name in imported if name == "azure" or name.startswith("azure.")]


def imported_modules(name: str, tree: ast.Module) -> set[str]:
    """The absolute names of the modules the module at ``name`` (``azqueue/x/y.py``)
    imports, relative imports resolved; ``from a import b`` counts as ``a`` and ``a.b``."""
    package = name.removesuffix(".py").split("/")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join([*parts, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def inside(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def test_no_function_is_longer_than_80_lines() -> None:
    """A decision reads at once: a longer function is a sequence of named steps (in the
    package and in the scripts of scripts/ alike)."""
    found = [line for name, tree in [*modules(), *scripts()]
             for line in long_functions(name, tree)]
    assert not found, f"functions over {MAX_LINES} lines: " + "; ".join(found)


def test_the_length_check_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    tree = ast.parse(f"def short():\n    pass\n\nasync def long():\n{body}\n")
    assert long_functions("m.py", tree) == [f"m.py:4 long ({MAX_LINES + 1} lines)"]


def test_only_the_storage_package_imports_azure() -> None:
    storage = PACKAGE / "storage"
    found = {name: names for name, tree in modules()
             if not (PACKAGE.parent / name).is_relative_to(storage)
             and not any((PACKAGE.parent / name).is_relative_to(p) for p in OUTSIDE_THE_SERVER)
             and (names := azure_imports(tree))}
    assert not found, f"azure.* imported outside azqueue/storage: {found}"
    assert azure_imports(ast.parse("import azure.core\nfrom azure.data import tables\n"
                                   "from .azure import x\nimport azurelike\n")) == \
        ["azure.core", "azure.data"]


def test_the_command_line_is_the_top_layer() -> None:
    """azqueue/cli/ may import any package of azqueue; no module outside it imports it:
    not the worker SDK (azqueue/worker/), which a worker installs without the command
    line's concerns, and not the server's packages."""
    cli = PACKAGE / "cli"
    found = {name: cli_names for name, tree in modules()
             if not (PACKAGE.parent / name).is_relative_to(cli)
             and (cli_names := sorted(n for n in imported_modules(name, tree)
                                      if inside(n, "azqueue.cli")))}
    assert not found, f"azqueue.cli imported outside azqueue/cli: {found}"


def test_the_worker_sdk_imports_only_itself_and_the_model() -> None:
    """A worker installs the SDK (azqueue/worker/) for the queue's HTTP API: of azqueue it
    needs the pure model, never the server's packages or the command line."""
    sdk = PACKAGE / "worker"
    found = {name: outside for name, tree in modules()
             if (PACKAGE.parent / name).is_relative_to(sdk)
             and (outside := sorted(n for n in imported_modules(name, tree)
                                    if inside(n, "azqueue") and n != "azqueue"
                                    and not inside(n, "azqueue.worker")
                                    and not inside(n, "azqueue.model")))}
    assert not found, f"the worker SDK imports beyond azqueue.worker and azqueue.model: {found}"


def test_the_import_reader_resolves_every_form() -> None:
    source = ("import azqueue.cli.parser\nfrom azqueue import cli\nfrom . import exitcodes\n"
              "from ..model import task\nfrom .follow import follow\n")
    assert imported_modules("azqueue/cli/client.py", ast.parse(source)) == {
        "azqueue.cli.parser", "azqueue", "azqueue.cli", "azqueue.cli.exitcodes",
        "azqueue.model", "azqueue.model.task", "azqueue.cli.follow", "azqueue.cli.follow.follow"}
    assert imported_modules("azqueue/worker/__init__.py", ast.parse("from . import run\n")) == {
        "azqueue.worker", "azqueue.worker.run"}


SERVICE = PACKAGE / "service"
# The paragraph of a room's docstring that names the rooms it may use:
# "May use: ``azqueue.service.common``, ``azqueue.service.dispatch``." or "May use: no
# other room."
MAY_USE = re.compile(r"^May use:(.*?)(?:\n\s*\n|\Z)", re.M | re.S)


def rooms(service: Path = SERVICE) -> dict[str, set[str]]:
    """The rooms of azqueue/service (its sub-packages), each with the rooms it may use,
    as the ``May use:`` paragraph of its ``__init__.py`` names them."""
    found = {}
    for init in sorted(service.glob("*/__init__.py")):
        said = MAY_USE.search(ast.get_docstring(ast.parse(init.read_text())) or "")
        assert said, f"{init.relative_to(PACKAGE.parent)}: no 'May use:' paragraph"
        found[init.parent.name] = set(re.findall(r"``azqueue\.service\.(\w+)``", said[1]))
    return found


def imports_out_of_order(trees: Iterable[tuple[str, ast.Module]],
                         allowed: dict[str, set[str]]) -> list[str]:
    """``path: module`` for each import, by a module of a room of azqueue/service, of a
    room it may not use (``allowed``) or of ``wiring`` (the top, which no room imports);
    and ``path: outside the rooms`` for a module of azqueue/service besides wiring.py
    that is in no room."""
    found = []
    for name, tree in trees:
        parts = name.removesuffix(".py").split("/")
        if parts[:2] != ["azqueue", "service"] or len(parts) < 3:
            continue
        if len(parts) == 3:
            if parts[2] not in ("__init__", "wiring"):
                found.append(f"{name}: outside the rooms")
            continue
        room = parts[2]
        for imported in sorted(imported_modules(name, tree)):
            target = imported.split(".")
            if (target[:2] == ["azqueue", "service"] and len(target) > 2
                    and target[2] != room and target[2] not in allowed.get(room, set())):
                found.append(f"{name}: {imported}")
    return found


def test_the_rooms_of_the_service_import_only_the_rooms_below_them() -> None:
    """Each room of azqueue/service says in its ``__init__.py`` which rooms it may use;
    those are rooms, they make an order (no room may use one that may use it, however
    far round), and no module imports beyond them."""
    allowed = rooms()
    assert {"common", "dispatch", "runs"} <= allowed.keys()
    unknown = {room: sorted(uses - allowed.keys()) for room, uses in allowed.items()
               if uses - allowed.keys()}
    assert not unknown, f"rooms that may use rooms that do not exist: {unknown}"
    order = list(graphlib.TopologicalSorter(allowed).static_order())  # CycleError if none
    found = imports_out_of_order(modules(), allowed)
    assert not found, (f"imports out of the rooms' order (from the bottom: {order}): "
                       + "; ".join(found))


def test_the_room_check_finds_an_import_from_above() -> None:
    allowed = {"common": set(), "dispatch": {"common"}, "runs": {"common", "dispatch"}}
    sources = {
        "azqueue/service/dispatch/tips.py": "from azqueue.service.common import paging\n"
                                            "from azqueue.service.dispatch.doorbell import D\n",
        "azqueue/service/dispatch/doorbell.py": "from azqueue.service.runs.changes import C\n",
        "azqueue/service/common/paging.py": "def f():\n    from ..dispatch import tips\n",
        "azqueue/service/runs/claims.py": "from azqueue.service import wiring\n",
        "azqueue/service/stray.py": "",
        "azqueue/service/wiring.py": "from azqueue.service.runs.claims import Claims\n",
        "azqueue/api/app.py": "from azqueue.service.wiring import open_services\n",
    }
    assert imports_out_of_order(((n, ast.parse(s)) for n, s in sources.items()), allowed) == [
        "azqueue/service/dispatch/doorbell.py: azqueue.service.runs.changes",
        "azqueue/service/dispatch/doorbell.py: azqueue.service.runs.changes.C",
        "azqueue/service/common/paging.py: azqueue.service.dispatch",
        "azqueue/service/common/paging.py: azqueue.service.dispatch.tips",
        "azqueue/service/runs/claims.py: azqueue.service.wiring",
        "azqueue/service/stray.py: outside the rooms"]


def test_the_room_reader_finds_what_a_room_may_use(tmp_path: Path) -> None:
    for room, doc in {"low": "Low things.\n\nMay use: no other room.\n",
                      "high": "High things.\n\nMay use: ``azqueue.service.low``,\n"
                              "``azqueue.service.mid``.\n\nNot ``azqueue.service.x``.\n"}.items():
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text(f'"""{doc}"""\n')
    assert rooms(tmp_path) == {"high": {"low", "mid"}, "low": set()}


# ``azqueue.x.y`` in double backquotes, as docstrings and comments name a module or a name.
NAMED = re.compile(r"``(azqueue(?:\.[A-Za-z_]\w*)+)``")
# Names of loggers (``logging.getLogger("azqueue.access")``), not of modules.
LOGGERS = re.compile(r"getLogger\(\"(azqueue[\w.]*)\"\)")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of azqueue or a name in one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_every_module_the_source_names_exists() -> None:
    """A docstring that points to ``azqueue.x.y`` points to something a reader can open
    (in the package and in scripts/)."""
    sources = {path: path.read_text() for path in
               [*sorted(PACKAGE.rglob("*.py")), *sorted((PACKAGE.parent / "scripts").glob("*.py"))]}
    loggers = {name for text in sources.values() for name in LOGGERS.findall(text)}
    found = sorted({f"{path.relative_to(PACKAGE.parent)}: {name}"
                    for path, text in sources.items() for name in NAMED.findall(text)
                    if name not in loggers and not resolves(name)})
    assert not found, "names of nothing: " + "; ".join(found)
    assert not resolves("azqueue.worker.runlog") and resolves("azqueue.worker.run.TaskRun")


def layout() -> list[str]:
    """The bullets of docs/contributing.md's "Layout" about the package (``- `azqueue/…``)."""
    section = CONTRIBUTING.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    return [b for b in re.split(r"\n(?=- )", section) if b.startswith("- `azqueue/")]


def unlisted(bullets: list[str], package: Path) -> list[str]:
    """The modules of ``package`` no bullet names: a module ``azqueue/a/b/c.py`` is named
    as ``c.py`` or ``b/c.py`` in the bullet of ``azqueue/a``, or as ``a/b/c.py`` or
    ``azqueue/a/b/c.py`` in any; ``__init__.py`` and ``__main__.py`` need not be."""
    named = [re.findall(r"`([\w/.]+\.py)`", b) for b in bullets]
    everywhere = {n.removeprefix("azqueue/") for names in named for n in names if "/" in n}
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if path.name in ("__init__.py", "__main__.py") or module in everywhere:
            continue
        top = module.split("/")[0]
        own = [names for b, names in zip(bullets, named) if b.startswith(f"- `azqueue/{top}")]
        if "/" not in module or not any(f"/{module}".endswith(f"/{n}")
                                        for names in own for n in names):
            found.append(f"azqueue/{module}")
    return found


def test_the_layout_names_every_module_of_the_package() -> None:
    """docs/contributing.md's "Layout" says what each module holds: a module added
    without a word there, or one named there that is gone, fails here."""
    bullets = layout()
    assert not unlisted(bullets, PACKAGE), "not in the layout: " + ", ".join(
        unlisted(bullets, PACKAGE))
    gone = [f"{b.split('`')[1]}: {n}" for b in bullets for n in re.findall(r"`([\w/.]+\.py)`", b)
            if not any(p.as_posix().endswith(f"/{n}") for p in PACKAGE.parent.glob("azqueue/**/*.py"))]
    assert not gone, "named in the layout, but no such module: " + ", ".join(gone)


def test_the_layout_check_finds_an_unlisted_module(tmp_path: Path) -> None:
    (tmp_path / "service").mkdir()
    for name in ("__init__.py", "service/__init__.py", "service/tips.py",
                 "service/doorbell.py", "release.py"):
        (tmp_path / name).write_text("")
    bullets = ["- `azqueue/service`: `tips.py` (tips)", "- `azqueue/storage`: `doorbell.py`"]
    assert unlisted(bullets, tmp_path) == ["azqueue/release.py", "azqueue/service/doorbell.py"]
