# Sourced by the carry scripts (kernels/device/carry.sh, benchmarks/peers_carry.sh, benchmarks/qwentts_cpp_carry.sh):
# device_wheels DIR SPEC... downloads binary wheels, without their dependencies, for the device image's Python
# (CPython 3.12, manylinux x86_64; it has no internet, so what it installs travels as these files). PY: the Python
# whose pip downloads them (default python3).
device_wheels() {
  local dir=$1; shift
  "${PY:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "$@"
}
