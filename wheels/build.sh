#!/usr/bin/env bash
# Build kcore's installable wheel, its compiled modules included (kcore._codec and
# kcore.producer._sendpath), and its Spark bundle (a zip that spark-submit --py-files accepts:
# kcore plus cramjam, compiled modules as data; see README.md) into wheels/dist/ (or "$1").
#   bash wheels/build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/wheels/dist"}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python -m pip wheel --no-deps --wheel-dir "$work/wheel" "$root"
wheel=$(echo "$work"/wheel/kcore-*.whl)
cp "$wheel" "$out/"

# cramjam (kcore's one runtime dependency, compiled) as the wheel requires it, for this Python
# and platform, from pip's cache or the index.
python -m pip download --quiet --only-binary=:all: --dest "$work/deps" "$wheel"
# -I: the builder runs from the source tree without kcore installed, its directory off sys.path.
python -I "$root/src/kcore/spark/bundle.py" -o "$out" \
    --kcore-wheel "$wheel" --cramjam-wheel "$(echo "$work"/deps/cramjam-*.whl)"
ls -1 "$out"/kcore-*.whl "$out"/kcore-*-spark-*.zip
