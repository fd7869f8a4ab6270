"""The layers stay apart: server/ never imports torch, decoding/ never imports fastapi/starlette."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "server").glob("*.py")), ids=lambda p: p.name)
def test_server_modules_do_not_import_torch(path):
    assert not imported_modules(path) & {"torch", "transformers"}


@pytest.mark.parametrize("path", sorted((ROOT / "decoding").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_decoding_modules_do_not_import_http_frameworks(path):
    assert not imported_modules(path) & {"fastapi", "starlette", "sse_starlette", "uvicorn", "prometheus_client"}


def test_the_public_engine_api_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, decoding, server.protocol, server.routes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
