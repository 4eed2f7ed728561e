#!/usr/bin/env bash
# The codec benchmark (bench/test_codec_bench.py) on every CPython wheels/build.sh finds, each in a
# fresh virtual environment of its own with that interpreter's wheel from wheels/dist/ (built
# first when missing) and the peers the benchmark compares against. One JSON per interpreter in
# OUT (default bench/interpreters/), then bench/report.py puts their goal rows side by side.
#   bash bench/interpreters.sh [OUT [PYTEST_ARGS...]]     e.g. bench/interpreters -k "encode"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/bench/interpreters"}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
dist="$root/wheels/dist"
ls "$dist"/kcore-*.whl >/dev/null 2>&1 || bash "$root/wheels/build.sh" "$dist"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The benchmark's peers (tests/codec-peers.txt, shared with tests/test_wheels.py), its plugin,
# and what compiles its floor row.
extra=(-r "$root/tests/codec-peers.txt" pytest-benchmark Cython setuptools)
results=()
while read -r version where; do
  if [ "$where" = missing ]; then
    echo "bench: no CPython $version on this machine: not measured" >&2
    continue
  fi
  tag="cp${version/./}"
  wheel=$(echo "$dist"/kcore-*-"$tag"-"$tag"-*.whl)
  [ -f "$wheel" ] || { echo "bench: no $tag wheel in $dist (run wheels/build.sh)" >&2; exit 1; }
  "$where" -m venv "$work/$tag"
  "$work/$tag/bin/python" -m pip install -q --disable-pip-version-check "$wheel" "${extra[@]}"
  echo "bench: CPython $version" >&2
  # From the root, not src/: the venv's installed wheel is what gets measured.
  (cd "$root" && env -u PYTHONPATH "$work/$tag/bin/python" -m pytest -q -p no:cacheprovider \
    bench/test_codec_bench.py --benchmark-json="$out/codec-$version.json" "$@" \
    >"$out/codec-$version.log" 2>&1) || {
    tail -40 "$out/codec-$version.log" >&2
    exit 1
  }
  results+=("$out/codec-$version.json")
done < <(bash "$root/wheels/build.sh" --interpreters)
python "$root/bench/report.py" "${results[@]}"
