// The web page: speak a text with a chosen voice, hear it while it is made, list the voices.
// Plain JavaScript, no build step.  Speech is fetched as raw PCM (24 kHz, 16-bit, mono) and played
// chunk by chunk through the Web Audio API as the response streams in; when it ends, the whole
// clip becomes a WAV file in the <audio> element, to replay or download.
"use strict";

const SAMPLE_RATE = 24000;
const KEY_STORAGE = "qwen3tts-api-key";
const $ = (id) => document.getElementById(id);

let voices = [];
let speaking = null; // {controller, player} of the request in progress

// -- API calls: the key (if any) and OpenAI-shaped errors --------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = localStorage.getItem(KEY_STORAGE);
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (response.ok) return response;
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) { /* not JSON */ }
  if (response.status === 401) $("key-panel").hidden = false;
  throw new ApiError(response.status, message);
}

// -- model state and voices ---------------------------------------------------------------------

async function watchHealth() {
  const badge = $("model-status");
  let status = "unreachable";
  try {
    const response = await fetch("/healthz");
    status = (await response.json()).status;
  } catch (_) { /* server gone: say so and retry */ }
  badge.textContent = { ready: "ready", loading: "loading the model…", failed: "model failed to load",
    "shutting-down": "shutting down" }[status] || "unreachable";
  badge.dataset.state = status;
  if (status !== "ready") setTimeout(watchHealth, 2000);
  else if (!voices.length) loadVoices();
}

async function loadVoices() {
  let listing;
  try {
    listing = await (await api("/v1/audio/voices")).json();
  } catch (err) {
    $("voice-info").textContent = `Could not list the voices: ${err.message}`;
    return;
  }
  voices = listing.data;
  const select = $("voice");
  const previous = select.value || listing.default_voice;
  select.replaceChildren();
  for (const [kind, label] of [["speaker", "Speakers"], ["preset", "Presets"], ["cloned", "Cloned voices"], ["designed", "Designed voices"]]) {
    const members = voices.filter((v) => v.kind === kind);
    if (!members.length) continue;
    const group = document.createElement("optgroup");
    group.label = label;
    for (const voice of members) group.append(new Option(voice.name, voice.id));
    select.append(group);
  }
  if (voices.some((v) => v.id === previous)) select.value = previous;

  const language = $("language");
  language.replaceChildren(...listing.languages.map((code) => new Option(code === "auto" ? "auto-detect" : code, code)));
  $("instructions").disabled = !listing.supports_instructions;
  $("instructions-note").hidden = listing.supports_instructions;
  showVoice();
  fillVoiceTable();
  $("voice-admin").hidden = !listing.can_add_voices;
}

function showVoice() {
  const voice = voices.find((v) => v.id === $("voice").value);
  if (!voice) return;
  const parts = [voice.description, `languages: ${voice.languages.join(", ")}`];
  if (voice.instruct) parts.push(`style: “${voice.instruct}”`);
  $("voice-info").textContent = parts.filter(Boolean).join(" · ");
}

function fillVoiceTable() {
  const rows = voices.map((voice) => {
    const row = document.createElement("tr");
    for (const text of [voice.name, voice.kind, voice.languages.join(", "), voice.description || ""]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    const actions = document.createElement("td");
    if (voice.removable) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "Remove";
      button.className = "remove-voice";
      button.dataset.voice = voice.id;
      button.addEventListener("click", () => removeVoice(voice.id));
      actions.append(button);
    }
    row.append(actions);
    return row;
  });
  document.querySelector("#voice-table tbody").replaceChildren(...rows);
}

// -- your own voices: upload a clip (the server clones it), remove one ---------------------------

async function addVoice(event) {
  event.preventDefault();
  const status = $("voice-admin-status");
  const file = $("new-voice-audio").files[0];
  const form = new FormData();
  form.append("name", $("new-voice-name").value.trim());
  form.append("text", $("new-voice-text").value.trim());
  form.append("x_vector_only", $("new-voice-xvector").checked ? "true" : "false");
  if (file) form.append("audio", file, "clip");
  $("new-voice-button").disabled = true;
  status.textContent = "Cloning the voice…";
  try {
    const added = await (await api("/v1/audio/voices", { method: "POST", body: form })).json();
    status.textContent = `Added “${added.name}” (${added.seconds} s clip).`;
    $("voice-admin").reset();
    await loadVoices();
  } catch (err) {
    status.textContent = `Could not add the voice: ${err.message}`;
  } finally {
    $("new-voice-button").disabled = false;
  }
}

async function removeVoice(name) {
  const status = $("voice-admin-status");
  try {
    await api(`/v1/audio/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
    status.textContent = `Removed “${name}”.`;
    await loadVoices();
  } catch (err) {
    status.textContent = `Could not remove the voice: ${err.message}`;
  }
}

// -- speaking: stream PCM into Web Audio, keep it for the <audio> element -----------------------

class StreamPlayer {
  // Plays s16le PCM chunks back to back as they arrive.  Without an audio device (or with Web
  // Audio refused) it only collects them.
  constructor() {
    this.chunks = [];
    this.bytes = 0;
    this.scheduled = 0; // buffers handed to Web Audio
    this.carry = null; // an odd byte left from the previous network chunk
    try {
      this.context = new AudioContext({ sampleRate: SAMPLE_RATE });
      this.next = this.context.currentTime + 0.05;
    } catch (_) {
      this.context = null;
    }
  }

  push(data) {
    if (this.carry) {
      const joined = new Uint8Array(this.carry.length + data.length);
      joined.set(this.carry);
      joined.set(data, this.carry.length);
      data = joined;
      this.carry = null;
    }
    if (data.length % 2) {
      this.carry = data.slice(-1);
      data = data.slice(0, -1);
    }
    if (!data.length) return;
    this.chunks.push(data);
    this.bytes += data.length;
    if (!this.context) return;
    const samples = new Int16Array(data.buffer, data.byteOffset, data.length / 2);
    const buffer = this.context.createBuffer(1, samples.length, SAMPLE_RATE);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    this.next = Math.max(this.next, this.context.currentTime + 0.02);
    source.start(this.next);
    this.next += buffer.duration;
    this.scheduled += 1;
  }

  seconds() {
    return this.bytes / 2 / SAMPLE_RATE;
  }

  wav() {
    const header = new DataView(new ArrayBuffer(44));
    const text = (offset, s) => [...s].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
    text(0, "RIFF");
    header.setUint32(4, 36 + this.bytes, true);
    text(8, "WAVE");
    text(12, "fmt ");
    header.setUint32(16, 16, true);
    header.setUint16(20, 1, true); // PCM
    header.setUint16(22, 1, true); // mono
    header.setUint32(24, SAMPLE_RATE, true);
    header.setUint32(28, SAMPLE_RATE * 2, true);
    header.setUint16(32, 2, true);
    header.setUint16(34, 16, true);
    text(36, "data");
    header.setUint32(40, this.bytes, true);
    return new Blob([header, ...this.chunks], { type: "audio/wav" });
  }

  stop() {
    if (this.context) this.context.close();
  }
}

async function speak(event) {
  event.preventDefault();
  if (speaking) return;
  const status = $("speak-status");
  const body = {
    model: "qwen3-tts",
    input: $("text").value,
    voice: $("voice").value,
    response_format: "pcm",
    stream_format: "audio",
  };
  const instructions = $("instructions").value.trim();
  if (instructions && !$("instructions").disabled) body.instructions = instructions;
  if ($("language").value && $("language").value !== "auto") body.language = $("language").value;

  const controller = new AbortController();
  const player = new StreamPlayer();
  speaking = { controller, player };
  setBusy(true);
  status.textContent = "Speaking…";
  status.dataset.state = "speaking";
  const started = performance.now();
  let firstAudio = null;
  try {
    const response = await api("/v1/audio/speech", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (firstAudio === null) {
        firstAudio = performance.now() - started;
        status.textContent = `Playing… (first audio after ${Math.round(firstAudio)} ms)`;
      }
      player.push(value);
    }
    const total = (performance.now() - started) / 1000;
    status.textContent = `${player.seconds().toFixed(2)} s of audio in ${total.toFixed(2)} s` +
      (firstAudio === null ? "" : `, first audio after ${Math.round(firstAudio)} ms`);
    status.dataset.state = "done";
    status.dataset.liveBuffers = player.scheduled;
    showClip(player);
  } catch (err) {
    status.dataset.state = "error";
    status.textContent = err.name === "AbortError" ? "Stopped." : `Error: ${err.message}`;
    player.stop();
    if (err.name === "AbortError" && player.bytes) showClip(player);
  } finally {
    speaking = null;
    setBusy(false);
  }
}

function showClip(player) {
  const audio = $("player");
  const link = $("download");
  if (audio.src) URL.revokeObjectURL(audio.src);
  const url = URL.createObjectURL(player.wav());
  audio.src = url;
  link.href = url;
  audio.hidden = false;
  link.hidden = false;
}

function setBusy(busy) {
  $("speak-button").disabled = busy;
  $("stop-button").disabled = !busy;
}

function stop() {
  if (speaking) {
    speaking.controller.abort();
    speaking.player.stop();
  }
}

// -- page wiring ----------------------------------------------------------------------------------

function showPanel(name) {
  for (const link of document.querySelectorAll("nav a")) {
    const active = link.dataset.panel === name;
    link.classList.toggle("active", active);
    $(link.dataset.panel).hidden = !active;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("speak-form").addEventListener("submit", speak);
  $("stop-button").addEventListener("click", stop);
  $("voice").addEventListener("change", showVoice);
  $("voice-admin").addEventListener("submit", addVoice);
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
    $("key-panel").hidden = true;
    loadVoices();
  });
  for (const link of document.querySelectorAll("nav a")) {
    link.addEventListener("click", (event) => {
      event.preventDefault();
      history.replaceState(null, "", `#${link.dataset.panel}`);
      showPanel(link.dataset.panel);
    });
  }
  showPanel(location.hash === "#voices" ? "voices" : "speak");
  watchHealth();
});
