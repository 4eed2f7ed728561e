#!/usr/bin/env bash
# Fuzz kcore's codec with atheris against an instrumented copy of the extensions.
#
#   fuzz/run_fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#
# The repo's working tree is copied to $KCORE_FUZZ_DIR (default /tmp/kcore-fuzz-build) and the
# extension is built there with clang, -fsanitize=fuzzer-no-link,address: the shared in-place
# build in src/kcore/ is never touched. Then every target runs under atheris' ASan+libFuzzer
# runtime (LD_PRELOAD). Corpora and findings go to $KCORE_FUZZ_DIR/out/TARGET/; the summary line
# of each run (executions, coverage) is printed at the end. Set KCORE_FUZZ_NO_BUILD=1 to reuse
# the last build, KCORE_FUZZ_ARGS for extra harness/libFuzzer flags.
set -euo pipefail

SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(decode sealed records legacy decompress varint roundtrip responses)
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${KCORE_FUZZ_DIR:-/tmp/kcore-fuzz-build}

python -c "import atheris" 2>/dev/null || python -m pip install -q atheris
command -v clang >/dev/null || { echo "needs clang (apt-get install clang)" >&2; exit 1; }

if [ "${KCORE_FUZZ_NO_BUILD:-0}" != 1 ]; then
  rm -rf "$WORK/repo"
  mkdir -p "$WORK"
  cp -r "$REPO" "$WORK/repo"
  # Every compiled module (the codec, the producer's send path that cimports it, the protocol's
  # decoders, the metadata merge) is rebuilt instrumented: a plain -O3 copy left in the tree
  # would be loaded instead.
  rm -rf "$WORK/repo/build" "$WORK/repo"/src/kcore/_codec*.so "$WORK/repo/src/kcore/_codec.c" \
    "$WORK/repo"/src/kcore/producer/_sendpath*.so "$WORK/repo/src/kcore/producer/_sendpath.c" \
    "$WORK/repo"/src/kcore/protocol/_decoders*.so "$WORK/repo/src/kcore/protocol/_decoders.c" \
    "$WORK/repo"/src/kcore/cluster/_metadata_apply*.so \
    "$WORK/repo/src/kcore/cluster/_metadata_apply.c"
  (cd "$WORK/repo" &&
    CC=clang LDSHARED="clang -shared" \
      CFLAGS="-fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -g" \
      LDFLAGS="-fsanitize=fuzzer-no-link,address" \
      python setup.py -q build_ext --inplace >"$WORK/build.log" 2>&1) ||
    { tail -30 "$WORK/build.log"; exit 1; }
fi

RUNTIME=$(python -c "import atheris, os; print(os.path.join(atheris.path(), 'asan_with_fuzzer.so'))")
export PYTHONPATH="$WORK/repo/src"
export LD_PRELOAD="$RUNTIME"
# Python itself leaks by design; huge allocations are reported by libFuzzer's malloc limit.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
export PYTHONMALLOC=malloc # every Python allocation through ASan's allocator

cd "$WORK/repo"
python fuzz/fuzz_codec.py --write-seeds="$WORK/seeds"
for target in "${TARGETS[@]}"; do
  out="$WORK/out/$target"
  mkdir -p "$out/corpus" "$out/findings"
  # shellcheck disable=SC2086
  python fuzz/fuzz_codec.py --target="$target" ${KCORE_FUZZ_ARGS:-} \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 -malloc_limit_mb=1024 \
    -timeout=20 -print_final_stats=1 -artifact_prefix="$out/findings/" \
    "$out/corpus" "$WORK/seeds" >"$out/log" 2>&1 || echo "$target: FINDING, see $out/log"
  echo "$target: $(grep -E '^(#[0-9]+.*DONE|Done)' "$out/log" | tr '\n' ' ')"
done
