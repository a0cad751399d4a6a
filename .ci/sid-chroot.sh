#!/usr/bin/env bash
# Builds a Debian sid chroot holding hipcc 7 (clang 21, ROCm device libraries) in DIR, for the AMD
# build gate (kernels/amd_gate.py, run through .ci/sid-run): `.ci/sid-chroot.sh DIR`. Debian
# bookworm's hipcc (ROCm 5.2) knows neither RDNA3, RDNA4 nor MI300; sid's does. About 200 MB from
# the Debian mirror (Q3T_SID_MIRROR), 1-2 minutes. A DIR holding a finished chroot is kept as it is;
# DIR must otherwise be absent, empty, or an unfinished chroot of this script. Needs root.
set -euo pipefail
DIR=${1:?usage: .ci/sid-chroot.sh DIR}
MIRROR=${Q3T_SID_MIRROR:-http://deb.debian.org/debian}
READY="$DIR/.q3t-ready"     # written last: the chroot is complete
PARTIAL="$DIR/.q3t-partial"  # written first: DIR is this script's to wipe
fail() {
    echo "sid chroot: $*" >&2
    exit 1
}

if [ -f "$READY" ]; then
    echo "sid chroot: keeping $DIR ($(cat "$READY"))"
    exit 0
fi
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot)"
case "$DIR" in /*) ;; *) fail "DIR must be an absolute path, got $DIR" ;; esac
[ "$DIR" != / ] || fail "refusing to build into /"
if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR")" ]; then
    [ -f "$PARTIAL" ] || fail "$DIR exists, is not empty and was not made by this script"
    rm -rf --one-file-system "$DIR"
fi

# The mirror first, so that an unreachable one says so instead of failing somewhere in debootstrap.
if ! python3 - "$MIRROR/dists/sid/Release" <<'PY'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1], timeout=30).read(64)
except Exception as err:  # noqa: BLE001 - any failure means the same to the caller
    print(f"  {sys.argv[1]}: {err}", file=sys.stderr)
    sys.exit(1)
PY
then
    fail "cannot reach the Debian mirror $MIRROR; the AMD build (hipcc 7 for gfx1201, gfx1100, gfx942, ...)
needs Debian sid's hipcc from it. Check the network, or set Q3T_SID_MIRROR to another Debian mirror."
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

mkdir -p "$DIR"
touch "$PARTIAL"
LOG=$(mktemp /tmp/q3t-sid-chroot.XXXXXX.log)
echo "sid chroot: debootstrap --variant=minbase sid $DIR $MIRROR (log: $LOG)"
debootstrap --variant=minbase sid "$DIR" "$MIRROR" >"$LOG" 2>&1 || {
    tail -n 20 "$LOG" >&2
    fail "debootstrap failed (full log: $LOG)"
}
touch "$PARTIAL"
# sid's Release file may be past its Valid-Until date on a mirror that lags.
APT=(apt-get -o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -y -qq)
echo "sid chroot: apt-get install hipcc"
{
    chroot "$DIR" "${APT[@]}" update && chroot "$DIR" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install hipcc
} >>"$LOG" 2>&1 || {
    tail -n 20 "$LOG" >&2
    fail "apt-get install hipcc in the chroot failed (full log: $LOG)"
}
chroot "$DIR" dpkg-query -W -f='${Package} ${Version}  ' hipcc clang-21 rocm-device-libs-21 >"$READY"
rm -f "$PARTIAL" "$LOG"
echo "sid chroot: ready at $DIR ($(cat "$READY"))"
