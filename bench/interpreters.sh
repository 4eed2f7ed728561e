#!/usr/bin/env bash
# A benchmark on every CPython wheels/build.sh finds, each in a fresh virtual environment of its
# own with that interpreter's wheel from wheels/dist/ (built first when missing) and the peers the
# benchmark compares against. One JSON per interpreter in OUT (default bench/interpreters/), then
# bench/report.py prints them (and puts their goal rows side by side).
#   bash bench/interpreters.sh [OUT [PYTEST_ARGS...]]     e.g. bench/interpreters -k "encode"
# KCORE_BENCH_SUITE picks the benchmark: codec (bench/test_codec_bench.py, the default) or matrix
# (bench/test_matrix_bench.py against a broker of its own, its cells picked as in a run of its
# own, e.g. KCORE_BENCH_MATRIX_CELLS='produce:main,consume:java:main').
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
suite=${KCORE_BENCH_SUITE:-codec}
case "$suite" in
  codec) bench=(bench/test_codec_bench.py) ;;
  # (-s: the matrix prints each round as it goes; its tables are in the JSON too)
  matrix) bench=(bench/test_matrix_bench.py -s -p no:randomly); extra+=("confluent-kafka>=2.4") ;;
  *) echo "bench: KCORE_BENCH_SUITE is codec or matrix, not '$suite'" >&2; exit 2 ;;
esac
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
    "${bench[@]}" --benchmark-json="$out/$suite-$version.json" "$@" \
    >"$out/$suite-$version.log" 2>&1) || {
    tail -40 "$out/$suite-$version.log" >&2
    exit 1
  }
  results+=("$out/$suite-$version.json")
done < <(bash "$root/wheels/build.sh" --interpreters)
python "$root/bench/report.py" "${results[@]}"
