"""The image's promises, read from the Dockerfile (no Docker engine here): non-root, health check,
the model converted at build time where the non-root pod can read it, a CUDA base as a build
argument, and a build context that carries everything ``pip install .`` needs."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parent.parent


def instructions() -> list[dict]:
    return DockerfileParser(str(ROOT / "Dockerfile")).structure


def of(kind: str) -> list[str]:
    return [i["value"] for i in instructions() if i["instruction"] == kind]


def envs() -> dict[str, str]:
    parser = DockerfileParser(str(ROOT / "Dockerfile"))
    return parser.envs


def test_the_base_image_and_torch_wheel_are_build_arguments_defaulting_to_cpu():
    structure = instructions()
    first_from = next(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    args_before = [ins["value"] for ins in structure[:first_from] if ins["instruction"] == "ARG"]
    assert any(a.startswith("BASE_IMAGE=python:3") for a in args_before)
    assert structure[first_from]["value"] == "${BASE_IMAGE}"
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in of("ARG")
    (install,) = [run for run in of("RUN") if "--index-url" in run]
    assert "${TORCH_INDEX}" in install and "torch==${TORCH_VERSION}" in install


def test_it_runs_as_the_non_root_user_the_kubernetes_pod_expects():
    (user,) = of("USER")
    uid, _, gid = user.partition(":")
    assert int(uid) > 0 and int(gid) > 0
    pod = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid) and pod["securityContext"]["runAsGroup"] == int(gid)
    assert any(f"--uid {uid}" in run for run in of("RUN"))  # the user exists in /etc/passwd
    structure = instructions()
    user_at = next(i for i, ins in enumerate(structure) if ins["instruction"] == "USER")
    assert not [ins for ins in structure[user_at:] if ins["instruction"] == "RUN"], "nothing runs as root after USER"


def test_the_embedded_model_is_converted_at_build_time_into_a_cache_everyone_can_read():
    cache = envs()["DECODA_CACHE_DIR"]
    (convert,) = [run for run in of("RUN") if "load_model(" in run]
    assert "smollm2-135m-instruct" in convert and f"cache_dir='{cache}'" in convert
    assert "chmod -R a+rX" in convert  # built as root, read by uid 10001


def test_the_health_check_asks_ready_on_the_serving_port():
    (check,) = of("HEALTHCHECK")
    assert "/ready" in check and "DECODA_PORT" in check and "--start-period" in check
    command = json.loads(check[check.index("CMD") + 3 :])
    assert command[:2] == ["python", "-c"]
    assert json.loads(of("CMD")[0]) == ["decoda", "serve"]  # exec form: PID 1 gets SIGTERM and drains


def test_the_build_context_carries_every_package_and_leaves_local_state_out():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]  # fmt: skip

    def is_ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern) or path.split("/")[0] == pattern for pattern in ignored)

    assert {".venv", ".git"} <= set(ignored)
    sources = {part for value in of("COPY") for part in value.split()[:-1]}
    assert not [s for s in sources if is_ignored(s)], "a COPY source is excluded by .dockerignore"
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in setuptools["packages"]:
        folder = setuptools.get("package-dir", {}).get(package, package.replace(".", "/"))
        assert folder.split("/")[0] in sources, f"{package} ({folder}) is not copied into the image"


def test_both_native_kernels_are_built_at_build_time_and_the_compilers_leave():
    """The paged-attention kernel (C) and the block kernel of gguf/int4 weights (C++, against the
    image's torch) are built once, portably, where uid 10001 may read them; no compiler ships."""
    assert envs()["DECODA_KERNEL_DIR"] == "/opt/decoda/kernels"
    assert envs()["DECODA_KERNEL_MARCH"] == "x86-64-v3"  # the ARG's default: AVX2 and FMA, portable
    (build,) = [run for run in of("RUN") if "native_available" in run]
    assert "block_matrix import isa" in build  # the block kernel, built by the same step
    assert "install -y --no-install-recommends gcc g++" in build  # installed for the build
    assert "chmod -R a+rX /opt/decoda/kernels" in build
    assert "apt-get purge -y gcc g++" in build  # and gone again
