"""The package's layers only point down: a module imports modules of its own layer or lower ones.

Every module of ``pytest_kvcache`` is parsed with ``ast`` (no import runs), every ``import`` in it — at the
top or inside a function — is an edge of the import graph, and each edge is checked against the declared
layer order below. A new module is placed by its longest matching prefix in :data:`LAYERS`; a module that
matches none fails the test, so the order stays declared for all of them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest_kvcache

PACKAGE = Path(pytest_kvcache.__file__).parent

#: bottom first. A module may import its own layer and the ones listed before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "bottom: plain data, files and numbers",
        (
            "model",
            "jsonio",
            "datafiles",
            "stats",
            "crossing",
            "metrics",
            "periodic",
            "interrupt",
            # names → engine kinds: the kinds register into it from above, the settings look them up
            "kind_registry",
            # the probes' specs as data (axis, depths, fits, points): the stock ones and a user's register here; the
            # settings check depths and gate points against them, the plugin parametrizes by them
            "probes.registry",
            # finds and converts the trained GGUF: plain Python over the machine's cache, no package import
            "engines.trained_model",
            "engines.llamacpp_build",
            # the converted tokenizer checked against llama-tokenize: the converter's child, like trained_model
            "engines.tokenizer_check",
        ),
    ),
    ("configuration", ("config",)),
    (
        "engines, the client and the machine",
        (
            "engines",
            "client",
            "sample",
            "gpu",
            "selfcheck",
            "fanout",
            "fanout_plan",
            "fanout_worker",
            # ArmClient and Server: the running engine and the client a probe measures with
            "run.measure",
        ),
    ),
    ("probes", ("probes",)),
    ("the report", ("report",)),
    ("the run and the run store", ("run", "store")),
    ("after the report", ("finish", "stored")),
    (
        "top: pytest and the command line",
        ("plugin", "session", "distributed", "hookspecs", "suite", "testing", "cli", ""),
    ),
]

#: (importer, imported) edges that point up, by module prefix, each with the work that removes it: none left.
KNOWN: dict[tuple[str, str], str] = {}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or (prefix != "" and module.startswith(prefix + "."))


def _known(module: str, target: str) -> bool:
    return any(_within(module, a) and _within(target, b) for a, b in KNOWN)


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The package modules ``path`` imports (relative to the package), with the line of each import."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}"[15:] in known else node.module
                for a in node.names
            ]
        else:
            continue
        found += [(_strip(n), node.lineno) for n in names if _within(n, "pytest_kvcache")]
    return found


def _strip(name: str) -> str:
    return name.removeprefix("pytest_kvcache").removeprefix(".")


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _within(module, prefix) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def test_every_module_has_a_layer() -> None:
    assert modules(), PACKAGE
    assert all(layer_of(m) >= 0 for m in modules())


def test_imports_only_point_down() -> None:
    known = set(modules())
    upward: list[str] = []
    for module, path in modules().items():
        for target, line in imports(path, known):
            here, there = layer_of(module), layer_of(target)
            if there > here and not _known(module, target):
                upward.append(f"{module}:{line} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_known_exceptions_still_exist() -> None:
    """An exception whose import is gone is removed from KNOWN, so the list stays the work left to do."""
    known = set(modules())
    edges = [(m, t) for m, p in modules().items() for t, _ in imports(p, known)]
    gone = [k for k in KNOWN if not any(_within(m, k[0]) and _within(t, k[1]) for m, t in edges)]
    assert not gone, f"no longer imported, remove from KNOWN: {gone}"


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The graph reads imports inside functions and ``from pytest_kvcache import module`` alike."""
    probe = tmp_path / "probe.py"
    probe.write_text("from pytest_kvcache import session\n\ndef f():\n    import pytest_kvcache.report.build\n")
    found = imports(probe, set(modules()))
    assert found == [("session", 1), ("report.build", 4)]
    assert layer_of("model.report") < layer_of("report.build") < layer_of("session")


# ---- import cycles, imports inside functions and module sizes (issue 43) ---------------------------------------

#: Why a module imports package modules inside functions, and how many such imports it may have: every other
#: module imports at its top, where the import graph is plain to read. Each count may only shrink.
STARTUP = "pytest's start-up stays free of pandas, numpy and docker: the report, store and self-check load when used"
CONVERTER = "the trained model's converter and llama.cpp's tools (gguf, transformers, a build) load only when used"
LAZY_IMPORTS: dict[str, tuple[int, str]] = {
    "plugin": (1, STARTUP),
    "session": (7, STARTUP),
    "stored": (5, STARTUP),
    "run.run": (2, STARTUP + "; the docker SDK only for --kv-launcher=docker"),
    "run.rounds": (3, STARTUP),
    "run.agreement": (1, STARTUP),
    "selfcheck": (1, "the package loads its numpy-based check on first use (PEP 562 __getattr__)"),
    "report.outputs": (2, "the package loads its output modules, which import it, on first use"),
    "store": (3, "the backends (sqlite, postgres) import the package: opened on first use"),
    "engines": (2, CONVERTER + "; the docker SDK only for --kv-launcher=docker"),
    "datafiles": (1, CONVERTER),
    "engines.kinds.folder": (1, CONVERTER),
    "engines.kinds.llamacpp": (4, CONVERTER),
    "engines.trained_model": (2, CONVERTER),
}


def imports_inside_functions(path: Path) -> int:
    """How many package imports ``path`` makes inside functions (nested ones counted once)."""
    found: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.ImportFrom) and sub.level == 0 and _within(sub.module or "", "pytest_kvcache")
                ) or (isinstance(sub, ast.Import) and any(_within(a.name, "pytest_kvcache") for a in sub.names)):
                    found.add(id(sub))
    return len(found)


def test_imports_inside_functions_are_capped_with_their_reason() -> None:
    counts = {m: imports_inside_functions(p) for m, p in modules().items()}
    over = {m: n for m, n in counts.items() if n > LAZY_IMPORTS.get(m, (0, ""))[0]}
    assert not over, f"imports inside functions beyond LAZY_IMPORTS (import at the top, or give the reason): {over}"
    fewer = {m: counts.get(m, 0) for m, (cap, _) in LAZY_IMPORTS.items() if counts.get(m, 0) < cap}
    assert not fewer, f"fewer imports inside functions now, lower their cap in LAZY_IMPORTS: {fewer}"


def test_the_start_up_imports_no_heavy_library() -> None:
    """What the lazy imports above are for: loading the plugin (every pytest run, every pytest-xdist worker)
    imports neither pandas, numpy, matplotlib nor docker."""
    code = (
        "import sys, pytest_kvcache.plugin; "
        "print(sorted(m for m in ('pandas', 'numpy', 'matplotlib', 'scipy', 'docker') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


#: The modules that re-export names (``from x import Name as Name``), each for the readers named: the package's
#: other modules import every name from the module that defines it.
PUBLIC_SURFACES: dict[str, str] = {
    "model": "the typed run model, for those who read report.json and the records (docs/records.md, docs/report.md)",
    "engines.kinds": "what a new engine kind's module imports (docs/engines.md)",
    "metrics": "the metric catalogue and the /metrics parser, as one name",
    "selfcheck.stream": "the calibrated stream a user's tests serve (docs/testing.md)",
}


def reexports(path: Path) -> set[str]:
    return {
        a.name
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
        if a.asname == a.name
    }


def test_no_re_export_outside_the_public_surfaces_and_none_used_inside() -> None:
    mods = modules()
    shims = {m: sorted(reexports(p)) for m, p in mods.items() if m not in PUBLIC_SURFACES and reexports(p)}
    assert not shims, f"re-exports (import each name from where it lives): {shims}"
    through: list[str] = []
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                surface = _strip(node.module)
                if surface in PUBLIC_SURFACES and surface != module:
                    # a submodule imported from its package (``from pytest_kvcache.metrics import catalogue``): no shim
                    names = {n for n in reexports(mods[surface]) if f"{surface}.{n}" not in mods}
                    names &= {a.name for a in node.names}
                    through += [f"{module}:{node.lineno} imports {n} through {surface}" for n in sorted(names)]
    assert not through, "the package imports through a public surface:\n" + "\n".join(through)


#: No module is longer: past it, a module holds more than one thing to read at once (split it by what it holds).
MAX_LINES = 600


def graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (a ``from x import name`` resolved to the module ``name`` lives in)."""
    mods = modules()
    known = set(mods)
    out: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for target, _ in imports(path, known):
            while target and target not in mods:
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target in mods and target != module:
                out[module].add(target)
    return out


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_cycle() -> None:
    """No two modules import each other, directly or around a circle, counting imports inside functions and
    under TYPE_CHECKING."""
    found = cycles(graph())
    assert not found, f"import cycles: {[sorted(c) for c in found]}"


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_the_line_cap() -> None:
    lengths = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in modules().items()}
    over = {m: n for m, n in lengths.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
