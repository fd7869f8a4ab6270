"""Every tensor the engine makes lives on the engine's device.

The worker is meant to run on a GPU too (``--device cuda``); a bare ``torch.zeros(n)`` next to CUDA
tensors fails there (or silently copies every step). This walks ``decoding/`` and fails on any
tensor factory call that names no ``device=`` (``*_like`` and ``tensor.new_*`` inherit one).
"""

from __future__ import annotations

import ast
from pathlib import Path

FACTORIES = {
    "tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "linspace", "logspace", "eye",
    "rand", "randn", "randint", "randperm", "scalar_tensor", "empty_strided",
}  # fmt: skip

ROOT = Path(__file__).resolve().parent.parent / "decoding"


def _bare_factory_calls(path: Path, root: Path = ROOT.parent) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if not (isinstance(func.value, ast.Name) and func.value.id == "torch" and func.attr in FACTORIES):
            continue
        if any(keyword.arg == "device" for keyword in node.keywords):
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno}: torch.{func.attr}(...) without device=")
    return found


def test_no_tensor_factory_without_a_device():
    offenders = [line for path in sorted(ROOT.rglob("*.py")) for line in _bare_factory_calls(path)]
    assert not offenders, "\n".join(offenders)


def test_the_walker_sees_a_bare_factory(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("import torch\nx = torch.zeros(3)\ny = torch.zeros(3, device=d)\nz = torch.zeros_like(x)\n")
    assert _bare_factory_calls(fake, tmp_path) == ["fake.py:2: torch.zeros(...) without device="]
