"""The real server process with its HTTP API on a free port of 127.0.0.1: reliability_support's Server (the fake
engine or a model), with a config file of one voice preset (ryan-calm), and the calls tests make of it."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import openai
from ports import free_port
from reliability_support import Server, start

PRESETS = """
[[voices]]
name = "ryan-calm"
speaker = "ryan"
language = "en"
instruct = "Speak slowly and calmly."
"""


class HttpServer:
    """A server process (reliability_support.Server) with HTTP on a free port of 127.0.0.1."""

    def __init__(self, server: Server, port: int, key: str | None = None) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{port}"
        self.key = key

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.key or "unused", max_retries=0, timeout=120)

    def get(self, path: str, key: str | None = None) -> tuple[int, str]:
        request = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metrics(self) -> str:
        status, text = self.get("/metrics", self.key)
        assert status == 200, text
        return text


def start_http(tmp: Path, args: list[str], *, fake: bool, key: str | None = None, **kw: object) -> HttpServer:
    port = free_port()
    config = tmp / "config.toml"
    config.write_text(PRESETS)
    extra = ["--api-key", key] if key else []
    server = start(tmp, [*args, "--config", str(config), "--http", f"tcp://127.0.0.1:{port}", *extra], fake=fake, **kw)  # type: ignore[arg-type]
    return HttpServer(server, port, key)
