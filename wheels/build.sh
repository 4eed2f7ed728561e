#!/usr/bin/env bash
# Build kcore's installable wheel, compiled codec included, into wheels/dist/ (or "$1").
#   bash wheels/build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/wheels/dist"}
mkdir -p "$out"
python -m pip wheel --no-deps --wheel-dir "$out" "$root"
ls -1 "$out"/kcore-*.whl
