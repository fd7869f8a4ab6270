"""The layers stay apart: server/ never imports torch, decoding/ never imports fastapi/starlette,
no import circle anywhere (imports inside functions and under ``TYPE_CHECKING`` counted), and
decoding/'s sub-packages import only downwards, in the order a request's path reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("decoding", "server")

# decoding/'s layers, lowest first: a module may import its own layer and the ones before it
DECODING_LAYERS = (
    ("decoding.outputs", "decoding.config", "decoding.telemetry"),
    ("decoding.params",),
    (
        "decoding.client_api",
        "decoding.transcripts",
        "decoding.media",
        "decoding",
    ),  # the torch-free facade the server imports
    ("decoding.structured",),
    (
        "decoding.text",
        "decoding.audio",
        "decoding.vision",
    ),  # what comes in and goes out: text, uploaded audio and images
    ("decoding.kv",),
    ("decoding.model",),
    ("decoding.sampling",),
    ("decoding.state",),
    ("decoding.strategies",),
    ("decoding.custom",),
    ("decoding.engine",),
)
# server/'s packages, lowest first, in the order a request's path reads through the front end: what every
# route shares (http), engine output to the wire (output), settings (which know the output's tool
# parsers), a body to GenerationParams (translate), the APIs and the page, then the app and the CLI
SERVER_LAYERS = (
    ("server.http",),
    ("server.output",),
    ("server.config",),
    ("server.translate",),
    ("server.api", "server.playground"),
    ("server.app", "server.cli", "server"),
)
MAX_MODULE_LINES = 400
MAX_TOP_LEVEL_MODULES = 8  # decoding/'s (and server/'s) own modules besides __init__ and its sub-packages


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def import_edges(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports, wherever the import statement stands."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base in modules:
                found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
    found.discard(own)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = DECODING_LAYERS) -> int:
    root = module.split(".")[0]
    for level, prefixes in enumerate(layers):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes if prefix != root):
            return level
        if module == root and root in prefixes:
            return level
    raise AssertionError(f"{module} is in no layer of {root}'s layers: place it there")


@pytest.mark.parametrize("path", sorted((ROOT / "server").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_server_modules_do_not_import_torch(path):
    assert not imported_modules(path) & {"torch", "transformers"}


@pytest.mark.parametrize("path", sorted((ROOT / "decoding").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_decoding_modules_do_not_import_http_frameworks(path):
    assert not imported_modules(path) & {"fastapi", "starlette", "sse_starlette", "uvicorn", "prometheus_client"}


def test_the_public_engine_api_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, decoding, server.app, server.config.settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_import_circles():
    modules = project_modules()
    graph = {name: import_edges(path, modules) for name, path in modules.items()}
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle_through_a_late_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_decoding_packages_import_only_downwards():
    modules = project_modules()
    upward = []
    for name, path in modules.items():
        if not name.startswith("decoding"):
            continue
        for target in import_edges(path, modules):
            if target.startswith("decoding") and layer_of(target) > layer_of(name):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_server_packages_import_only_downwards():
    modules = project_modules()
    upward = [
        f"{name} -> {target}"
        for name, path in modules.items()
        if name.startswith("server")
        for target in import_edges(path, modules)
        if target.startswith("server") and layer_of(target, SERVER_LAYERS) > layer_of(name, SERVER_LAYERS)
    ]
    assert upward == []


def test_modules_stay_small_and_decoding_top_level_stays_short():
    too_long = {
        str(path.relative_to(ROOT)): n
        for path in project_modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}
    for package in PACKAGES:
        top_level = [p.name for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"]
        assert len(top_level) <= MAX_TOP_LEVEL_MODULES, (package, top_level)


def test_every_module_says_what_it_owns():
    undocumented = [
        str(path.relative_to(ROOT))
        for path in project_modules().values()
        if path.read_text().strip() and ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert undocumented == []


def test_every_project_import_names_a_module_that_exists():
    """Late imports (inside functions) fail only when they run: check them all here."""
    modules = project_modules()
    missing = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            missing += [f"{name}: {t}" for t in targets if t.split(".")[0] in PACKAGES and t not in modules]
    assert missing == []
