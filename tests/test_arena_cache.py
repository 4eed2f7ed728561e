"""The cache of freed object arenas (kcore/_native/arena_cache.h): off by default, keeps what
it is allowed to, hands kept arenas out again, gives memory back when lowered or turned off,
and stays sound while threads allocate and free objects around a limit that changes.

What it keeps depends on pymalloc being the object allocator; under ``PYTHONMALLOC=malloc``
(the ASan and valgrind runs) or a free-threaded build it is only a pass-through, and the tests
that count kept arenas are skipped."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator

import pytest

from kcore.codec import (
    RecordBatchBuilder,
    arena_cache_stats,
    decode_records,
    set_arena_cache_limit,
)

MIB = 1024 * 1024
PYMALLOC = not sysconfig.get_config_var("Py_GIL_DISABLED") and os.environ.get(
    "PYTHONMALLOC", "pymalloc"
) in ("pymalloc", "pymalloc_debug", "debug")
needs_pymalloc = pytest.mark.skipif(not PYMALLOC, reason="objects do not live in pymalloc arenas")


@pytest.fixture
def arena_cache() -> Iterator[None]:
    """The test sets limits from 0; afterwards the limit is what it was (the suite may run with
    KCORE_ARENA_CACHE_MB set)."""
    before = arena_cache_stats()["limit_bytes"]
    set_arena_cache_limit(0)
    try:
        yield
    finally:
        set_arena_cache_limit(before)


def _many_records(n: int = 50_000) -> bytes:
    builder = RecordBatchBuilder()
    values = [b"v" * 90 + b"%010d" % i for i in range(n)]
    builder.append_many([b"key-%012d" % i for i in range(n)], values, [1_700_000_000_000] * n)
    return builder.build()


def test_off_by_default_in_a_fresh_interpreter() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KCORE_ARENA_CACHE_MB"}
    out = _stats_in_child(env)
    assert out["limit_bytes"] == 0 and out["cached_bytes"] == 0


def test_the_environment_sets_the_limit_at_import() -> None:
    out = _stats_in_child({**os.environ, "KCORE_ARENA_CACHE_MB": "1.5"})
    assert out["limit_bytes"] == int(1.5 * MIB)
    huge = _stats_in_child({**os.environ, "KCORE_ARENA_CACHE_MB": "1e13"})  # not an overflow
    assert huge["limit_bytes"] == sys.maxsize


@pytest.mark.parametrize("text", ["lots", "-1", "nan", "inf", "1e400"])
def test_a_bad_environment_value_warns_and_keeps_it_off(text: str) -> None:
    env = {**os.environ, "KCORE_ARENA_CACHE_MB": text}
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n    import kcore.codec\nexcept RuntimeWarning as e:\n    print('WARNED', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "WARNED KCORE_ARENA_CACHE_MB=" in out.stdout and repr(text) in out.stdout
    ok = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PRINT_STATS], env=env, capture_output=True
    )
    assert ast.literal_eval(ok.stdout.decode())["limit_bytes"] == 0


@needs_pymalloc
def test_freed_arenas_are_kept_and_handed_out_again(arena_cache: None) -> None:
    buf = _many_records()
    set_arena_cache_limit(64 * MIB)
    records = decode_records(buf)
    del records
    kept = arena_cache_stats()
    assert kept["cached_arenas"] > 0 and kept["cached_bytes"] > 0
    reuses = kept["reuses"]
    records = decode_records(buf)
    assert arena_cache_stats()["reuses"] > reuses
    assert records[-1][3] == b"v" * 90 + b"%010d" % 49_999
    del records


@needs_pymalloc
def test_the_limit_bounds_what_is_kept_and_lowering_it_gives_memory_back(
    arena_cache: None,
) -> None:
    buf = _many_records()
    set_arena_cache_limit(3 * MIB)
    del_me = decode_records(buf)
    del del_me
    assert 0 < arena_cache_stats()["cached_bytes"] <= 3 * MIB
    set_arena_cache_limit(MIB)
    assert arena_cache_stats()["cached_bytes"] <= MIB
    set_arena_cache_limit(0)
    stats = arena_cache_stats()
    assert stats["cached_bytes"] == 0 and stats["cached_arenas"] == 0
    # Off again: nothing is kept, objects are made and freed as usual.
    del_me = decode_records(buf)
    assert len(del_me) == 50_000
    del del_me
    assert arena_cache_stats()["cached_bytes"] == 0


def test_deep_recursion_passes_through(arena_cache: None) -> None:
    """The interpreter's frame stack chunks (16 KiB and up) come from the same allocator: deep
    recursion allocates and frees them through the cache, which passes them on."""
    set_arena_cache_limit(64 * MIB)

    def depth(n: int, pad: bytes) -> int:
        return 0 if n == 0 else 1 + depth(n - 1, pad)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        for _ in range(3):
            assert depth(15_000, b"x") == 15_000
    finally:
        sys.setrecursionlimit(limit)


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit_bytes must be >= 0"):
        set_arena_cache_limit(-1)


def test_threads_allocating_while_the_limit_changes(arena_cache: None) -> None:
    """Threads make and drop arenas' worth of objects while another turns the cache on, down and
    off: every object made is intact, and nothing crashes."""
    buf = _many_records(20_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                records = decode_records(buf)
                assert records[123][2] == b"key-%012d" % 123
                junk = [bytes(200) + bytes([i % 256]) for i in range(20_000)]
                assert junk[-1][-1] == 19_999 % 256
                del records, junk
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for limit in [64 * MIB, 2 * MIB, 0, 16 * MIB, 0, 32 * MIB] * 5:
            set_arena_cache_limit(limit)
            stop.wait(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert arena_cache_stats()["cached_bytes"] <= 32 * MIB


_PRINT_STATS = "import kcore.codec as c; print(c.arena_cache_stats())"


def _stats_in_child(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_STATS], env=env, capture_output=True, text=True, check=True
    )
    stats: dict[str, int] = ast.literal_eval(out.stdout)
    return stats
