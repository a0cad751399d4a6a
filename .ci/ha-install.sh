#!/usr/bin/env bash
# Installs Home Assistant into a venv of the Debian sid chroot that .ci/sid-chroot.sh builds
# (Q3T_SID_ROOT, default /var/tmp/q3t-sid), for tests/homeassistant/test_homeassistant.py: `.ci/ha-install.sh`.
# Home Assistant 2026.11 needs Python >= 3.13; sid has 3.14 (bookworm, the CI machine, has 3.11).
# Installs homeassistant==2026.11.0 (the version the test expects) with uv, and up front the requirements of
# the integrations the test loads (the frontend, the Wyoming integration, the Assist pipeline...), read
# from their manifests, so that Home Assistant finds them installed instead of fetching them at start.
# From Debian: ffmpeg (HA's TTS converts audio with it), libturbojpeg0 (HA's camera code logs a
# traceback without it) and g++ (pymicro-vad and pyspeex-noise, two of the Assist pipeline's
# requirements, have no wheels for Python 3.14). 40 s to 2.5 minutes from a fresh chroot on a 2-core
# machine (most of it downloads) and 1.2 GB. A chroot holding this version already is kept. Prints the
# venv's python (inside the chroot) last: `.ci/sid-run /opt/homeassistant/bin/python -m homeassistant`.
# Needs root and the network (Debian's mirror, PyPI).
set -euo pipefail
ROOT=${Q3T_SID_ROOT:-/var/tmp/q3t-sid}
HA_VERSION=2026.11.0
VENV=/opt/homeassistant
READY="$ROOT$VENV/.q3t-ready"
HERE=$(cd "$(dirname "$0")" && pwd)
fail() {
    echo "ha install: $*" >&2
    exit 1
}

if [ -f "$READY" ] && [ "$(cat "$READY")" = "homeassistant $HA_VERSION" ]; then
    echo "ha install: keeping $ROOT$VENV (homeassistant $HA_VERSION)" >&2
    echo "$VENV/bin/python"
    exit 0
fi
[ "$(id -u)" = 0 ] || fail "needs root (chroot)"
[ -x "$ROOT/usr/bin/hipcc" ] || fail "no sid chroot at $ROOT: build it with .ci/sid-chroot.sh $ROOT"
rm -f "$READY"
LOG=$(mktemp /tmp/q3t-ha-install.XXXXXX.log)
run() {
    "$@" >>"$LOG" 2>&1 || {
        tail -n 30 "$LOG" >&2
        fail "$* failed (full log: $LOG)"
    }
}

# sid's Release file may be past its Valid-Until date on a mirror that lags.
APT=(apt-get -o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -y -qq)
echo "ha install: apt-get install python3 python3-venv python3-dev g++ ffmpeg libturbojpeg0 in $ROOT (log: $LOG)" >&2
run chroot "$ROOT" "${APT[@]}" update
run chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install python3 python3-venv python3-dev g++ ffmpeg libturbojpeg0 ca-certificates

# The host's way to PyPI: its CA bundle (a proxy's certificate may be in it; it replaces the chroot's
# own, which ca-certificates wrote just now), its pip.conf and its PIP_* settings (passed on below).
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$ROOT/etc/pip.conf"; fi
# uv (below, and Home Assistant's own for a requirement it finds missing) reads neither pip's settings
# nor, unless told, the system's certificates: the same index, through the same CA bundle.
mkdir -p "$ROOT/etc/uv"
{
    echo "native-tls = true"
    index=${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}
    if [ -n "$index" ]; then echo "index-url = \"$index\""; fi
} >"$ROOT/etc/uv/uv.toml"
mapfile -t PIP_ENV < <(env | grep '^PIP_' || true)
# uv (the version Home Assistant pins) installs the few hundred packages in parallel: minutes faster than pip.
UV_VERSION=0.13.6
uv() {
    run "$HERE/sid-run" env "${PIP_ENV[@]}" "$VENV/bin/uv" pip install --python "$VENV/bin/python" "$@"
}

start=$SECONDS
echo "ha install: uv pip install homeassistant==$HA_VERSION into $VENV" >&2
run chroot "$ROOT" python3 -m venv --clear "$VENV"
run "$HERE/sid-run" env "${PIP_ENV[@]}" "$VENV/bin/python" -m pip install --no-input -q "uv==$UV_VERSION"
uv "homeassistant==$HA_VERSION"
# The requirements (pinned by Home Assistant) of the integrations the test's configuration.yaml
# loads, of those Home Assistant always loads, and of everything they depend on.
REQS=$(mktemp /tmp/q3t-ha-requirements.XXXXXX.txt)  # sid-run shows the host's /tmp inside
chroot "$ROOT" "$VENV/bin/python" - >"$REQS" <<'PY'
import json
import pathlib

from homeassistant import bootstrap, components

folder = pathlib.Path(components.__file__).parent
wanted = {"frontend", "config", "api", "media_source", "tts", "assist_pipeline", "conversation", "ffmpeg", "wyoming"}
# Onboarding's location step sets these up.
wanted |= {"google_translate", "met", "radio_browser", "shopping_list"}
for name in dir(bootstrap):
    value = getattr(bootstrap, name)
    if name.isupper() and name.endswith("INTEGRATIONS") and isinstance(value, (set, frozenset)):
        wanted |= set(value)
seen: set[str] = set()
requirements: set[str] = set()
while wanted:
    domain = wanted.pop()
    manifest = folder / domain / "manifest.json"
    if domain in seen or not manifest.is_file():
        continue
    seen.add(domain)
    data = json.loads(manifest.read_text())
    requirements.update(data.get("requirements", []))
    wanted.update(data.get("dependencies", []))
print("\n".join(sorted(requirements)))
PY
echo "ha install: $(wc -l <"$REQS") requirements of the integrations" >&2
# Within Home Assistant's constraints, as it installs requirements itself.
constraints=$(chroot "$ROOT" "$VENV/bin/python" -c "import homeassistant, pathlib; print(pathlib.Path(homeassistant.__file__).parent / 'package_constraints.txt')")
uv -r "$REQS" -c "$constraints"
rm -f "$REQS"
version=$(chroot "$ROOT" "$VENV/bin/python" -c "from homeassistant.const import __version__; print(__version__)")
[ "$version" = "$HA_VERSION" ] || fail "installed homeassistant $version, wanted $HA_VERSION"
echo "homeassistant $HA_VERSION" >"$READY"
rm -f "$LOG"
echo "ha install: homeassistant $HA_VERSION ready in $ROOT$VENV ($((SECONDS - start)) s of installing)" >&2
echo "$VENV/bin/python"
