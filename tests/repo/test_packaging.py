"""A built wheel, installed non-editable into a fresh virtual environment, carries the kernel sources
(setup.py copies kernels/src and kernels/include into the package as wyoming_qwen3tts/_kernels), so
backends/kernels/build.py finds and can build them there, with the same cache key as the checkout's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.backends.kernels import build

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json
from wyoming_qwen3tts.backends.kernels import build
tc = build.Toolchain("nvcc", "nvcc", "", ("sm_90",))
print(json.dumps({"dir": str(build.KERNEL_DIR), "sources": [p.name for p in build.sources()],
                  "headers": [p.name for p in build._headers()], "key": build.cache_key(tc)}))
"""


def test_package_list_leaves_the_benchmarks_out() -> None:
    """The packages setuptools finds with pyproject's include list: the server and its tools, never benchmarks/."""
    import tomllib

    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(str(ROOT), include=include)
    assert "wyoming_qwen3tts" in found and "wyoming_qwen3tts.tools" in found
    assert not [name for name in found if name.split(".")[0] != "wyoming_qwen3tts"], found


@pytest.mark.slow
def test_wheel_installed_non_editable_finds_the_kernel_sources(tmp_path: Path) -> None:
    # Build from a copy, so the checkout gets no build/ or egg-info of the test's making.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("wyoming_qwen3tts", "benchmarks"):  # benchmarks/ too: the wheel must leave it out
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("src", "include"):
        shutil.copytree(ROOT / "kernels" / part, src / "kernels" / part)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("wyoming_qwen3tts-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    assert "wyoming_qwen3tts" in tops and "benchmarks" not in tops, sorted(tops)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The new environment runs without PYTHONPATH: a checkout on it (as when testing a worktree) would shadow
    # the installed copy, and its egg-info would make pip take the wheel as installed already.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        cwd=tmp_path,
        env=clean_env,
    )
    # the package needs numpy, which --no-index cannot install: this environment's numpy alone is linked
    # in (a folder holding only numpy, on the new venv's path), so nothing else of ours leaks in.
    numpy_dir = Path(np.__file__).resolve().parent
    only_numpy = tmp_path / "only-numpy"
    only_numpy.mkdir()
    for name in (numpy_dir.name, numpy_dir.name + ".libs"):
        if (numpy_dir.parent / name).exists():
            (only_numpy / name).symlink_to(numpy_dir.parent / name)
    (site_packages,) = env_dir.glob("lib/python*/site-packages")
    (site_packages / "only_numpy.pth").write_text(f"{only_numpy}\n")
    out = subprocess.run(
        [str(python), "-c", PROBE], check=True, capture_output=True, text=True, cwd=tmp_path, env=clean_env
    )
    found = json.loads(out.stdout)

    site = Path(found["dir"]).parent
    assert Path(found["dir"]) == site / "_kernels" and site.name == "wyoming_qwen3tts"
    assert str(env_dir) in found["dir"]  # the installed copy, not the checkout
    assert found["sources"] == [p.name for p in build.sources()] and "gemv.cu" in found["sources"]
    assert found["headers"] == [p.name for p in build._headers()] and "q3t.h" in found["headers"]
    # Same sources, same key: a library built from the checkout is the installed package's too.
    assert found["key"] == build.cache_key(build.Toolchain("nvcc", "nvcc", "", ("sm_90",)))
