"""A real Home Assistant against the real server (issue 36): Home Assistant 2026.11.0, installed by
.ci/ha-install.sh into a venv of the Debian sid chroot (.ci/sid-chroot.sh; HA needs Python >= 3.13), runs
through .ci/sid-run with a fresh config dir, and talks to `python -m wyoming_qwen3tts` on tiny random CPU
checkpoints (CustomVoice, and Base through --extra-models for cloned voices) with its own Wyoming integration.
The test drives HA only through its public REST and websocket API, as its frontend does: onboarding, the
Wyoming config flow by host and port, the TTS entity's voices per language, speech by `tts_get_url` and
`tts.speak`, Assist pipelines (HA's own agent, and a streaming agent from tests/homeassistant/ for HA's
streaming TTS path), a restart of our server, and a voice added over our HTTP API.

Runs when Q3T_HA_PYTHON names the install's python inside the chroot (.ci/ha-install.sh prints it; .ci/run
exports it); skips otherwise, and fails instead when Q3T_REQUIRE_HA=1 (CI). The screenshots test drives the
real frontend in headless Chromium and writes its PNGs to Q3T_SCREENSHOT_DIR (default: a temporary folder)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import pytest
from browser import browser  # noqa: F401  (a fixture: Debian's chromium through selenium)
from ports import free_port
from prometheus_text import metric_value
from tiny_server import tiny_args
from voice_clip import write_clip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
CUSTOM_COMPONENT = Path(__file__).resolve().parent / "custom_components" / "q3t_streaming_agent"
HA_VERSION = "2026.11.0"
ENGINE = "tts.qwen3_tts"
AGENT = "conversation.streaming_test_agent"
SPEAKER = "media_player.recording_speaker"
SPEAKERS = ["aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian"]
LANGUAGES = ["de", "en", "es", "fr", "it", "ja", "ko", "pt", "ru", "zh"]
PRESETS = """
[[voices]]
name = "ryan-calm"
speaker = "ryan"
language = "en"
instruct = "Speak slowly and calmly."
description = "Ryan, calm"

[[voices]]
name = "anna"
reference_audio = "{clip}"
reference_text = "Hello there, this is Anna."
"""


def _ha_python() -> str:
    python = os.environ.get("Q3T_HA_PYTHON", "")
    if not python:
        reason = (
            "no Home Assistant install: build one with `.ci/sid-chroot.sh /var/tmp/q3t-sid && .ci/ha-install.sh` "
            "and set Q3T_HA_PYTHON to the python it prints"
        )
        if os.environ.get("Q3T_REQUIRE_HA") == "1":
            pytest.fail(f"Q3T_REQUIRE_HA=1 but {reason}")
        pytest.skip(reason)
    return python


# -- our server ------------------------------------------------------------------------------------


class Qwen3Server:
    """`python -m wyoming_qwen3tts` with Wyoming and HTTP on fixed ports of 127.0.0.1 (kept across restarts)."""

    def __init__(self, tmp: Path, args: list[str]) -> None:
        self.port, self.http_port = free_port(), free_port()
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.args = [
            sys.executable,
            "-m",
            "wyoming_qwen3tts",
            *args,
            "--uri",
            f"tcp://127.0.0.1:{self.port}",
            "--http",
            f"tcp://127.0.0.1:{self.http_port}",
        ]
        self.tmp = tmp
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.tmp / f"qwen3-{self.starts}.log"

    def start(self, timeout: float = 180) -> None:
        self.starts += 1
        # One torch thread: the tiny model's many small ops only lose time to thread hand-offs on 2 busy cores.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while "INFO:wyoming_qwen3tts:Ready" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"our server did not get ready:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=10) as response:
            return response.read().decode()

    def answered(self) -> float:
        """Wyoming speech requests answered without error so far (this process)."""
        return metric_value(self.metrics(), "qwen3tts_speech_requests_total", protocol="wyoming", outcome="ok")


# -- Home Assistant ----------------------------------------------------------------------------------


class HomeAssistant:
    """Home Assistant in the sid chroot on a free port, a fresh config dir under tmp (which .ci/sid-run shows
    inside the chroot at the same path), talked to over REST and the websocket API with a user's token."""

    def __init__(self, python: str, config: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = config
        self.token = ""
        self.refresh_token = ""
        self.wyoming_entry = ""  # the config entry of our server
        config.mkdir(parents=True)
        (config / "configuration.yaml").write_text(
            "http:\n"
            "  server_host: 127.0.0.1\n"
            f"  server_port: {self.port}\n"
            # What Settings and the Assist pipeline need, without default_config's discovery and cloud parts.
            "frontend:\nconfig:\napi:\nmedia_source:\ntts:\nconversation:\nassist_pipeline:\n"
            "logger:\n  default: warning\n"
        )
        shutil.copytree(CUSTOM_COMPONENT, config / "custom_components" / CUSTOM_COMPONENT.name)
        self.log = config.parent / "homeassistant.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(REPO / ".ci" / "sid-run"), python, "-m", "homeassistant", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_up(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"Home Assistant exited with {self.proc.returncode}:\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/api/onboarding", timeout=5) as response,
            ):
                if response.status == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"Home Assistant did not answer in {timeout} s:\n{self.log_tail()}")
            time.sleep(1)

    def stop(self) -> None:
        # .ci/sid-run execs (unshare, chroot, env, sh): the process is Home Assistant's python itself.
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[aiohttp.ClientSession]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(self.url, headers=headers, timeout=timeout) as session:
            yield session

    async def rest(self, method: str, path: str, body: dict[str, Any] | None = None, status: int = 200) -> Any:
        async with self.session() as session, session.request(method, path, json=body) as response:
            text = await response.text()
            assert response.status == status, f"{method} {path}: {response.status} {text}\n{self.log_tail()}"
            return json.loads(text) if text and response.content_type == "application/json" else text

    async def audio(self, path: str) -> tuple[bytes, str]:
        async with self.session() as session, session.get(path) as response:
            body = await response.read()
            assert response.status == 200, f"GET {path}: {response.status} {body[:200]!r}\n{self.log_tail()}"
            return body, response.content_type

    @contextlib.asynccontextmanager
    async def websocket(self) -> AsyncIterator[Websocket]:
        async with self.session() as session, session.ws_connect("/api/websocket") as ws:
            assert (await ws.receive_json())["type"] == "auth_required"
            await ws.send_json({"type": "auth", "access_token": self.token})
            assert (await ws.receive_json())["type"] == "auth_ok"
            yield Websocket(ws)

    async def onboard(self) -> None:
        """The onboarding the frontend walks a new user through: owner, location, analytics, integrations."""
        assert await self.rest("GET", "/api/onboarding") == [
            {"step": "user", "done": False},
            {"step": "core_config", "done": False},
            {"step": "analytics", "done": False},
            {"step": "integration", "done": False},
        ]
        client_id = f"{self.url}/"
        user = {
            "client_id": client_id,
            "name": "Test",
            "username": "test",
            "password": "test-password",
            "language": "en",
        }
        code = (await self.rest("POST", "/api/onboarding/users", user))["auth_code"]
        async with self.session() as session:
            form = {"grant_type": "authorization_code", "code": code, "client_id": client_id}
            async with session.post("/auth/token", data=form) as response:
                assert response.status == 200, await response.text()
                tokens = await response.json()
        self.token, self.refresh_token = tokens["access_token"], tokens["refresh_token"]
        await self.rest("POST", "/api/onboarding/core_config", {})
        await self.rest("POST", "/api/onboarding/analytics", {})
        await self.rest(
            "POST",
            "/api/onboarding/integration",
            {"client_id": client_id, "redirect_uri": f"{self.url}/?auth_callback=1"},
        )
        assert all(step["done"] for step in await self.rest("GET", "/api/onboarding"))
        # HA 2026.11 moves configuration.yaml's http settings into its storage as a trial that reverts (with a
        # restart) in five minutes unless confirmed: confirmed as the dialog in the frontend does.
        async with self.websocket() as ws:
            assert (await ws.call("http/config"))["active_config_type"] == "pending"
            await ws.call("http/config/promote")

    async def add_entry(self, handler: str, answers: dict[str, Any] | None) -> dict[str, Any]:
        """A config flow as the Add integration dialog runs it: the form (if answers), then the entry."""
        flow = await self.rest(
            "POST", "/api/config/config_entries/flow", {"handler": handler, "show_advanced_options": False}
        )
        if answers is not None:
            assert flow["type"] == "form" and flow["step_id"] == "user", flow
            assert {field["name"] for field in flow["data_schema"]} >= set(answers), flow
            flow = await self.rest("POST", f"/api/config/config_entries/flow/{flow['flow_id']}", answers)
        assert flow["type"] == "create_entry", flow
        return flow["result"]


class Websocket:
    """HA's websocket API: numbered commands; a message for another command than the one awaited is kept for it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 1
        self.kept: list[dict[str, Any]] = []

    async def send(self, kind: str, **fields: Any) -> int:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "type": kind, **fields})
        return self.next_id

    async def receive(self, msg_id: int, timeout: float = 120) -> dict[str, Any]:
        for i, msg in enumerate(self.kept):
            if msg.get("id") == msg_id:
                return self.kept.pop(i)
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), timeout)
            if msg.get("id") == msg_id:
                return msg
            self.kept.append(msg)

    async def call(self, kind: str, **fields: Any) -> Any:
        msg = await self.receive(await self.send(kind, **fields))
        assert msg["type"] == "result" and msg["success"], msg
        return msg["result"]


def decode(audio: bytes) -> tuple[float, int]:
    """Seconds and sample rate of an audio file HA made (MP3 through its ffmpeg, or WAV)."""
    with av.open(io.BytesIO(audio)) as container:
        samples, rate = 0, 0
        for frame in container.decode(audio=0):
            samples += frame.samples
            rate = frame.sample_rate
    assert rate > 0, "no audio frames"
    return samples / rate, rate


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Qwen3Server]:
    _ha_python()  # no checkpoints and no server without a Home Assistant to talk to them
    tiny_checkpoint: Path = request.getfixturevalue("tiny_checkpoint")
    tiny_base_checkpoint: Path = request.getfixturevalue("tiny_base_checkpoint")
    tmp = tmp_path_factory.mktemp("qwen3")
    config = tmp / "config.toml"
    config.write_text(PRESETS.format(clip=write_clip(tmp / "anna.wav")))
    models = ["--extra-models", str(tiny_base_checkpoint), "--config", str(config), "--data-dir", str(tmp / "data")]
    frames = ["--max-frames", "6", "--first-chunk-frames", "1", "--chunk-frames", "2", "--seed", "1"]
    server = Qwen3Server(tmp, tiny_args(tiny_checkpoint, *models, *frames))
    server.start()
    yield server
    assert server.stop() == 0
    for log in sorted(tmp.glob("qwen3-*.log")):  # one per start
        assert "Traceback" not in log.read_text(errors="replace"), log


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory, qwen3: Qwen3Server) -> Iterator[HomeAssistant]:
    """A running, onboarded Home Assistant with our server added through the Wyoming config flow, and the
    custom component's agent and speaker."""
    python = _ha_python()
    version = subprocess.run(
        [
            str(REPO / ".ci" / "sid-run"),
            python,
            "-c",
            "from homeassistant.const import __version__; print(__version__)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert version.returncode == 0, f"{python} in the sid chroot: {version.stderr}"
    assert version.stdout.strip() == HA_VERSION
    home = HomeAssistant(python, tmp_path_factory.mktemp("homeassistant") / "config")
    try:
        home.wait_up()

        async def setup() -> None:
            await home.onboard()
            entry = await home.add_entry("wyoming", {"host": "127.0.0.1", "port": qwen3.port})
            assert entry["title"] == "qwen3-tts" and entry["state"] == "loaded", entry
            home.wyoming_entry = entry["entry_id"]
            await home.add_entry("q3t_streaming_agent", None)

        asyncio.run(setup())
        yield home
    finally:
        home.stop()
    # Records (a timestamped line and what follows it) with a traceback through the code under test. Others
    # are the machine's: onboarding adds Radio Browser, which cannot reach the internet here.
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", home.log.read_text(errors="replace"))
    ours = ("components/wyoming/", "components/tts/", "components/assist_pipeline/", "q3t_streaming_agent")
    bad = [r for r in records if "Traceback" in r and any(path in r for path in ours)]
    assert not bad, "\n".join(bad)


# -- the cases -----------------------------------------------------------------------------------------


async def test_the_entry_and_its_entity(ha: HomeAssistant) -> None:
    entries = await ha.rest("GET", "/api/config/config_entries/entry?domain=wyoming")
    assert [(e["title"], e["state"]) for e in entries] == [("qwen3-tts", "loaded")]
    async with ha.websocket() as ws:
        entities = [e for e in await ws.call("config/entity_registry/list") if e["config_entry_id"] == ha.wyoming_entry]
        assert [e["entity_id"] for e in entities] == [ENGINE]
        engine = (await ws.call("tts/engine/get", engine_id=ENGINE))["provider"]
    assert sorted(engine["supported_languages"]) == LANGUAGES


async def test_voices_per_language(ha: HomeAssistant) -> None:
    """The voice picker's questions for an assistant in each locale: which of the engine's languages fit the
    locale (`tts/engine/list`), then the voices of that language (`tts/engine/voices`): the nine speakers and
    the cloned voice in every language, the English preset in English only, each under its description."""
    locales = ["de-DE", "en-US", "es-ES", "fr-FR", "it-IT", "ja-JP", "ko-KR", "pt-BR", "ru-RU", "zh-CN"]
    async with ha.websocket() as ws:
        for locale in locales:
            providers = (await ws.call("tts/engine/list", language=locale))["providers"]
            (ours,) = [p for p in providers if p["engine_id"] == ENGINE]
            (language,) = ours["supported_languages"]
            assert language == locale.split("-")[0], (locale, ours)
            voices = (await ws.call("tts/engine/voices", engine_id=ENGINE, language=language))["voices"]
            ids = sorted(v["voice_id"] for v in voices)
            assert ids == sorted([*SPEAKERS, "anna", *(["ryan-calm"] if language == "en" else [])]), (locale, ids)
            names = {v["voice_id"]: v["name"] for v in voices}
            assert names["ryan"] == "ryan (English; dynamic male)" and names["anna"] == "anna (cloned from anna.wav)"
            assert names.get("ryan-calm", "Ryan, calm") == "Ryan, calm"


@pytest.mark.parametrize("voice", ["ryan", "ryan-calm", "anna"])
async def test_tts_get_url(ha: HomeAssistant, qwen3: Qwen3Server, voice: str) -> None:
    """A speaker, a preset (CustomVoice) and a cloned voice (the Base model): HA's MP3 of our speech."""
    before = qwen3.answered()
    body = {
        "engine_id": ENGINE,
        "message": f"Good morning, {voice} speaking.",
        "options": {"voice": voice},
        "cache": False,
    }
    url = await ha.rest("POST", "/api/tts_get_url", body)
    audio, mime = await ha.audio(url["path"])
    seconds, _rate = decode(audio)
    assert mime == "audio/mpeg" and 0.05 < seconds < 2, (mime, seconds)
    assert qwen3.answered() == before + 1


async def test_an_unknown_voice_fails_at_once(ha: HomeAssistant, qwen3: Qwen3Server) -> None:
    """A voice HA still has but our server no longer offers (a cloned voice deleted, say): HA's request ends
    at once with an error, and HA's log carries our server's reason (HA 2026.11 reads Wyoming error events)."""
    body = {"engine_id": ENGINE, "message": "Is anybody there?", "options": {"voice": "nobody"}, "cache": False}
    async with ha.session() as session, session.post("/api/tts_get_url", json=body) as response:
        if response.status == 200:  # the URL is handed out before the speech is made; fetching it fails
            path = (await response.json())["path"]
            started = time.monotonic()
            async with session.get(path, timeout=aiohttp.ClientTimeout(total=30)) as audio:
                assert audio.status >= 400, audio.status
            assert time.monotonic() - started < 10
        else:
            assert response.status >= 400
    assert "Unknown voice 'nobody'" in qwen3.log.read_text(errors="replace")
    # HA writes its log from a queue of its own: the line may land a moment after the response (CI saw it missing).
    want = "Error from Wyoming service: Unknown voice 'nobody' (code: unknown-voice)"
    deadline = time.monotonic() + 10
    while want not in ha.log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"HA's log lacks {want!r} 10 s after the response\n{ha.log_tail()}"
        await asyncio.sleep(0.1)


async def test_tts_speak(ha: HomeAssistant, qwen3: Qwen3Server) -> None:
    """The tts.speak action to a media player: the player gets a media-source id that resolves to our speech."""
    before = qwen3.answered()
    await ha.rest(
        "POST",
        "/api/services/tts/speak",
        {
            "entity_id": ENGINE,
            "media_player_entity_id": SPEAKER,
            "message": "The kettle has boiled.",
            "options": {"voice": "vivian"},
            "cache": False,
        },
    )
    state = await ha.rest("GET", f"/api/states/{SPEAKER}")
    media_id = state["attributes"]["media_content_id"]
    assert state["state"] == "playing" and media_id.startswith("media-source://tts/"), state
    async with ha.websocket() as ws:
        resolved = await ws.call("media_source/resolve_media", media_content_id=media_id)
    audio, _mime = await ha.audio(resolved["url"])
    assert 0.05 < decode(audio)[0] < 2
    assert qwen3.answered() == before + 1


async def _create_pipeline(ws: Websocket, name: str, agent: str, voice: str) -> str:
    pipeline = await ws.call(
        "assist_pipeline/pipeline/create",
        name=name,
        language="en",
        conversation_engine=agent,
        conversation_language="en",
        stt_engine=None,
        stt_language=None,
        tts_engine=ENGINE,
        tts_language="en",
        tts_voice=voice,
        wake_word_entity=None,
        wake_word_id=None,
    )
    return str(pipeline["id"])


async def _run_pipeline(ws: Websocket, pipeline: str, text: str) -> AsyncIterator[dict[str, Any]]:
    """The events of an Assist run from text (intent) to speech (tts), as the frontend's Assist dialog runs it."""
    msg_id = await ws.send(
        "assist_pipeline/run", start_stage="intent", end_stage="tts", input={"text": text}, pipeline=pipeline
    )
    result = await ws.receive(msg_id)
    assert result["type"] == "result" and result["success"], result
    while True:
        event = (await ws.receive(msg_id))["event"]
        assert event["type"] != "error", event
        yield event
        if event["type"] == "run-end":
            return


async def test_assist_pipeline(ha: HomeAssistant, qwen3: Qwen3Server) -> None:
    """HA's own conversation agent answers, our engine speaks the answer in the pipeline's voice."""
    before = qwen3.answered()
    async with ha.websocket() as ws:
        pipeline = await _create_pipeline(ws, "Qwen3 test", "conversation.home_assistant", "serena")
        events = [e async for e in _run_pipeline(ws, pipeline, "what is the weather like on mars")]
    types = [e["type"] for e in events if e["type"] != "intent-progress"]
    assert types == ["run-start", "intent-start", "intent-end", "tts-start", "tts-end", "run-end"], types
    tts_start = next(e["data"] for e in events if e["type"] == "tts-start")
    assert tts_start["engine"] == ENGINE and tts_start["voice"] == "serena" and tts_start["tts_input"], tts_start
    output = next(e["data"] for e in events if e["type"] == "tts-end")["tts_output"]
    audio, _mime = await ha.audio(output["url"])
    assert 0.05 < decode(audio)[0] < 10
    assert qwen3.answered() == before + 1


async def test_streamed_answer_is_spoken_while_it_is_written(ha: HomeAssistant, qwen3: Qwen3Server) -> None:
    """HA's streaming TTS path: the agent streams its reply; once it is past 60 characters HA streams the text
    into our engine. The agent holds its last delta back until the test sees our server's first audio of the
    request go out (its time-to-first-audio count grows while the request is still open), so the audio
    demonstrably left before the last chunk was sent. Then the whole reply is spoken."""
    first = "Here is a long answer, written the way a language model writes it. "
    second = "It arrives in pieces, "
    last = "and this last sentence comes only after the first audio."
    metrics = qwen3.metrics()
    ttfa_before = metric_value(metrics, "qwen3tts_time_to_first_audio_seconds_count", protocol="wyoming")
    async with ha.websocket() as ws:
        pipeline = await _create_pipeline(ws, "Qwen3 streaming", AGENT, "aiden")
        holding = await ws.send("subscribe_events", event_type="q3t_streaming_agent_holding")
        assert (await ws.receive(holding))["success"]
        events: list[dict[str, Any]] = []
        run = _run_pipeline(ws, pipeline, "|".join([first[:30], first[30:], second, last]))
        async for event in run:
            events.append(event)
            if event["type"] == "intent-progress" and event["data"].get("tts_start_streaming"):
                break
        run_start = events[0]["data"]
        assert run_start["tts_output"]["stream_response"] is True, run_start
        held = (await ws.receive(holding))["event"]["data"]
        assert held == {"sent": 3, "held": last}, held
        deadline = time.monotonic() + 120
        while True:
            metrics = qwen3.metrics()
            if metric_value(metrics, "qwen3tts_time_to_first_audio_seconds_count", protocol="wyoming") > ttfa_before:
                break
            assert time.monotonic() < deadline, (
                f"no audio from our server while the reply was still being written\n{ha.log_tail()}"
            )
            await asyncio.sleep(0.1)
        assert (
            metric_value(metrics, "qwen3tts_active_streams", protocol="wyoming") == 1
        )  # the streamed request, still open
        await ha.rest("POST", "/api/events/q3t_streaming_agent_release", {})
        events += [e async for e in run]
    types = [e["type"] for e in events]
    assert types[-3:] == ["tts-start", "tts-end", "run-end"], types
    spoken = next(e["data"] for e in events if e["type"] == "intent-end")["intent_output"]["response"]["speech"][
        "plain"
    ]["speech"]
    assert spoken == first + second + last
    audio, _mime = await ha.audio(events[-2]["data"]["tts_output"]["url"])
    assert 0.2 < decode(audio)[0] < 10  # three sentences of up to 6 frames each


async def test_our_server_restarted_under_home_assistant(ha: HomeAssistant, qwen3: Qwen3Server) -> None:
    """Our server goes away and comes back on the same port while HA holds the entry: a request meanwhile fails
    (it does not hang), and the next one after the restart is spoken."""
    assert qwen3.stop() == 0
    body = {"engine_id": ENGINE, "message": "Nobody is listening.", "options": {"voice": "ryan"}, "cache": False}
    async with ha.session() as session, session.post("/api/tts_get_url", json=body) as response:
        if response.status == 200:  # the URL is handed out before the speech is made; fetching it fails
            path = (await response.json())["path"]
            async with session.get(path) as audio:
                assert audio.status >= 400
    qwen3.start()
    body["message"] = "Back again."
    url = await ha.rest("POST", "/api/tts_get_url", body)
    audio, _mime = await ha.audio(url["path"])
    assert 0.05 < decode(audio)[0] < 2
    entries = await ha.rest("GET", "/api/config/config_entries/entry?domain=wyoming")
    assert [e["state"] for e in entries] == ["loaded"]
    assert (await ha.rest("GET", f"/api/states/{ENGINE}"))["state"] != "unavailable"


async def _add_voice(qwen3: Qwen3Server, tmp: Path, name: str, seed: int) -> None:
    """A cloned voice added over our HTTP API (what the voices page does)."""
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("name", name)
    form.add_field("text", f"Hello there, this is {name}.")
    form.add_field(
        "audio",
        write_clip(tmp / f"{name}.wav", seed=seed).read_bytes(),
        filename=f"{name}.wav",
        content_type="audio/wav",
    )
    async with aiohttp.ClientSession() as session, session.post(f"{qwen3.http}/v1/audio/voices", data=form) as response:
        assert response.status == 201, await response.text()


async def _voice_ids(ws: Websocket, language: str) -> list[str]:
    return [v["voice_id"] for v in (await ws.call("tts/engine/voices", engine_id=ENGINE, language=language))["voices"]]


async def test_a_voice_added_over_http_shows_up_after_a_reload(
    ha: HomeAssistant, qwen3: Qwen3Server, tmp_path: Path
) -> None:
    await _add_voice(qwen3, tmp_path, "bob", seed=5)
    result = await ha.rest("POST", f"/api/config/config_entries/entry/{ha.wyoming_entry}/reload")
    assert result == {"require_restart": False}
    async with ha.websocket() as ws:
        for language in ("en", "de"):
            assert "bob" in await _voice_ids(ws, language), language
    url = await ha.rest(
        "POST",
        "/api/tts_get_url",
        {"engine_id": ENGINE, "message": "Bob here.", "options": {"voice": "bob"}, "cache": False},
    )
    assert 0.05 < decode((await ha.audio(url["path"]))[0])[0] < 2


async def test_a_voice_added_over_http_shows_up_by_itself(
    ha: HomeAssistant, qwen3: Qwen3Server, tmp_path: Path
) -> None:
    """Without a reload too: HA 2026.11's Wyoming integration asks for the server's info every 30 s."""
    await _add_voice(qwen3, tmp_path, "carl", seed=6)
    deadline = time.monotonic() + 45
    async with ha.websocket() as ws:
        while "carl" not in await _voice_ids(ws, "en"):
            assert time.monotonic() < deadline, "voice carl not listed 45 s after it was added"
            await asyncio.sleep(1)


# -- the frontend ------------------------------------------------------------------------------------

# Text of a page, shadow roots included (HA's frontend is web components all the way down).
DEEP_TEXT = """
const walk = (node) => {
  let text = node.nodeType === Node.TEXT_NODE ? node.textContent : "";
  if (node.shadowRoot) text += walk(node.shadowRoot);
  for (const child of node.childNodes) text += walk(child);
  return text;
};
return walk(document.documentElement);
"""
# The elements matching a selector, shadow roots included.
DEEP_ALL = """
const found = [];
const walk = (root) => {
  found.push(...root.querySelectorAll(arguments[0]));
  for (const el of root.querySelectorAll("*")) if (el.shadowRoot) walk(el.shadowRoot);
};
walk(document);
return found;
"""


def _wait_text(driver: Any, text: str, timeout: float = 60) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: text in d.execute_script(DEEP_TEXT))


def _click_text(driver: Any, selector: str, text: str) -> None:
    """Click the first element matching selector (shadow roots included) whose text is text. Found and
    clicked in one script: the frontend re-renders, and an element found in one call may be gone by the next."""
    from selenium.webdriver.support.ui import WebDriverWait

    click = DEEP_ALL.replace(
        "return found;",
        "const hit = found.find((el) => el.textContent.trim() === arguments[1]);\n"
        "if (hit) hit.click();\nreturn Boolean(hit);",
    )
    WebDriverWait(driver, 60, poll_frequency=0.2).until(lambda d: d.execute_script(click, selector, text))


def test_screenshots(ha: HomeAssistant, browser: Any) -> None:
    """The Wyoming entry in Settings, and the Assist pipeline's voice picker listing our voices, from HA's own
    frontend in headless Chromium (PNGs in Q3T_SCREENSHOT_DIR, for README's Home Assistant section)."""
    out = Path(os.environ.get("Q3T_SCREENSHOT_DIR") or ha.config.parent / "screenshots")
    out.mkdir(parents=True, exist_ok=True)

    async def pipeline() -> None:
        async with ha.websocket() as ws:
            await _create_pipeline(ws, "Qwen3-TTS", "conversation.home_assistant", "ryan")

    asyncio.run(pipeline())
    # Logged in as the onboarded user: the frontend keeps its tokens in localStorage.
    browser.get(f"{ha.url}/")
    tokens = {
        "hassUrl": ha.url,
        "clientId": f"{ha.url}/",
        "access_token": ha.token,
        "refresh_token": ha.refresh_token,
        "token_type": "Bearer",
        "expires_in": 1800,
        "expires": int(time.time() * 1000) + 1_800_000,
    }
    browser.execute_script("localStorage.setItem('hassTokens', arguments[0]);", json.dumps(tokens))

    try:
        _take_screenshots(ha, browser, out)
    except BaseException:
        browser.save_screenshot(str(out / "failed.png"))
        raise


def _take_screenshots(ha: HomeAssistant, browser: Any, out: Path) -> None:
    from selenium.common.exceptions import ElementClickInterceptedException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(1200, 520)
    browser.get(f"{ha.url}/config/integrations/integration/wyoming")
    _wait_text(browser, "qwen3-tts")
    _wait_text(browser, "1 entity")
    time.sleep(1)  # icons and fonts
    entry_png = out / "home-assistant-wyoming-entry.png"
    browser.save_screenshot(str(entry_png))

    browser.set_window_size(1200, 1000)
    browser.get(f"{ha.url}/config/voice-assistants/assistants")
    # The assistant's row opens its settings dialog; a click before the page wired up its handlers is lost.
    for attempt in range(5):
        _click_text(browser, "span", "Qwen3-TTS")
        try:
            _wait_text(browser, "Text-to-speech", timeout=10)
            break
        except TimeoutException:
            if attempt == 4:
                raise
    # The dialog shows its "Text-to-speech" heading before its voice picker renders (it lists the engine's voices
    # first): wait for the picker itself (CI, once: found none right after the heading).
    WebDriverWait(browser, 60, poll_frequency=0.2).until(lambda d: d.execute_script(DEEP_ALL, "ha-tts-voice-picker"))
    (picker,) = browser.execute_script(DEEP_ALL, "ha-tts-voice-picker")
    select = browser.execute_script("return arguments[0].shadowRoot.querySelector('ha-select')", picker)
    # The voice select to the middle of the dialog's scroll area: scrolled to its end, the dialog's sticky footer
    # covered it and took the click (CI, once); while the dialog still settles a click may land on it again.
    for attempt in range(5):
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", select)
        try:
            select.click()
            break
        except ElementClickInterceptedException:
            if attempt == 4:
                raise
            time.sleep(0.5)
    _wait_text(browser, "vivian (Chinese; bright")
    time.sleep(1)  # the menu's opening animation
    picker_png = out / "home-assistant-voice-picker.png"
    browser.save_screenshot(str(picker_png))
    for png in (entry_png, picker_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000, png
