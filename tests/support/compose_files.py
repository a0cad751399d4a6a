"""The Docker compose files (docker/compose.yaml, docker/compose.nvidia.yaml) as tests read them: interpolated as
`docker compose config` does, and their one service."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = {"rocm": DOCKER / "compose.yaml", "cuda": DOCKER / "compose.nvidia.yaml"}

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR} / ${VAR:-default} substitution (the forms our files use)."""
    assert "$$" not in text, "escaped dollars are not handled by this helper"
    return _VAR.sub(lambda m: env.get(m[1]) or (m[2] or ""), text)


def compose_service(data: dict[str, Any]) -> dict[str, Any]:
    services = data["services"]
    assert list(services) == ["qwen3tts"]
    service = services["qwen3tts"]
    assert isinstance(service, dict)
    return service
