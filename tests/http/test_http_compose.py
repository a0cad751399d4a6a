"""The Docker compose files show how to turn the HTTP API on: their commented lines, uncommented,
give a valid compose file that publishes the port and hands the server settings it accepts."""

from __future__ import annotations

import re

import pytest
import yaml
from compose_files import COMPOSE, compose_service, interpolate

from wyoming_qwen3tts.settings import ENV_PREFIX, load_settings

HTTP_LINES = re.compile(r'^(\s*)# (- "8000:8000"|WYOMING_QWEN3TTS_(?:HTTP|API_KEY): .*)$', re.M)
# ${VAR:?message}: compose refuses to start without VAR (compose_files' helper knows only :-).
REQUIRED = re.compile(r"\$\{([A-Za-z_]\w*):\?[^}]*\}")


@pytest.mark.parametrize("flavour", sorted(COMPOSE))
def test_compose_shows_how_to_enable_http(flavour: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from compose_spec import PyCompose

    text = COMPOSE[flavour].read_text()
    assert len(HTTP_LINES.findall(text)) == 3
    env = {"QWEN3TTS_API_KEY": "from-dot-env"}
    enabled = interpolate(REQUIRED.sub(lambda m: env[m[1]], HTTP_LINES.sub(r"\1\2", text)), env)
    PyCompose.from_yaml(enabled).validate()
    service = compose_service(yaml.safe_load(enabled))
    assert "8000:8000" in service["ports"]
    for name, value in service["environment"].items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(ENV_PREFIX + "CONFIG")  # the mounted file is not here
    settings = load_settings([])
    assert settings.http == "tcp://0.0.0.0:8000"
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "from-dot-env"
