"""Metadata at scale: what a 100,000-partition topic's Metadata answer costs the client, and the
warm metadata of 50 topics x 4 partitions against confluent-kafka, variants alternating round
by round in one run (this machine is shared and noisy: ratios are only meaningful so).

* ``test_decode_and_apply_100k``: no broker. One MetadataResponse v12 of a 100,000-partition
  topic (3 brokers, replication 3), built with the generated protocol classes; per round, each
  variant decodes it (the Python class, or the compiled decoder) and merges it into a cache
  (a cold cache, then a warm one that holds the same answer). Also: the longest stall of an
  event loop (a 1 ms ticker on it) while the client's own path handles the answer: the frame
  decoded off the loop when the compiled decoder is on (``PendingBody``), then merged a step
  per loop turn (``MetadataCache.update_in_steps``).
* ``test_produce_gaps_during_100k_refreshes``: a real broker, behind a proxy (a separate
  process, so that it takes no GIL from the client) that appends the same 100,000-partition
  topic to every Metadata answer (a real broker with -Xmx512m cannot hold one; the issue
  allows a made-up answer for that). A kcore Producer sends to a real 1-partition topic without
  pause, with ``metadata.max.age.ms`` = 500, so that the 100,000 partitions arrive every half
  second; the proxy notes when each Produce request arrives. Reported per decoder: the longest
  gap between two Produce requests within 0.6 s after a big answer went out, and the longest
  and the median gap outside those windows (on a loaded machine the scheduler alone makes
  gaps of tens of milliseconds: compare with those), and the longest stall of the producer's
  network thread (a 1 ms timer on its event loop). A gap also holds the time the proxy (Python)
  takes to splice and send the 2.6 MB answer, which delays the Produce answers queued behind it
  on the one connection, and with them the next requests: the proxy reports its splices'
  times. A third variant, taking turns with the two, is the baseline: the compiled decoder with
  the proxy splicing nothing (every gap of its rounds is "elsewhere").
* ``test_warm_metadata_vs_confluent``: 50 topics x 4 partitions; kcore's
  ``AdminClient.list_topics`` and confluent-kafka's, alternating call by call, 300 each.

Run: ``pytest bench/test_metadata_scale_bench.py -s`` (the tables are printed; each test also
puts its figures in ``benchmark.extra_info``-like ``record_property`` for --junitxml).
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import socket
import statistics
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_cluster_bench import TIMEOUT_S, Topics, _need, confluent_admin, topics

from kcore import AdminClient, Producer
from kcore.admin import NewTopic
from kcore.cluster.metadata import MetadataCache
from kcore.network.connection import loop_turn_pause
from kcore.protocol import framing
from kcore.protocol.messages import MetadataRequest, MetadataResponse
from kcore.protocol.messages.metadata_response import (
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from kcore.protocol.messages.response_header import ResponseHeader

__all__ = ["topics"]  # the 50 x 4 topics fixture of test_cluster_bench.py

pytestmark = [pytest.mark.broker, pytest.mark.slow]

BIG_PARTITIONS = 100_000
BIG_TOPIC = "metadata-scale-100k"
VERSION = 12
ROUNDS = 7
PRODUCE_ROUND_S = 4.0
PRODUCE_ROUNDS = 3  # per variant
WINDOW_S = 0.6
WARM_CALLS = 300
VARIANTS = ("python", "compiled")
UNSPLICED = "compiled, no big topic"  # the produce-gap test's baseline


def big_topic(partitions: int = BIG_PARTITIONS, leaders: tuple[int, ...] = (0, 1, 2)) -> Any:
    n = len(leaders)
    return MetadataResponseTopic(
        name=BIG_TOPIC,
        topic_id=uuid.UUID(int=0x100000),
        partitions=[
            MetadataResponsePartition(
                partition_index=p,
                leader_id=leaders[p % n],
                leader_epoch=3,
                replica_nodes=[leaders[(p + k) % n] for k in range(min(3, n))],
                isr_nodes=[leaders[(p + k) % n] for k in range(min(3, n))],
            )
            for p in range(partitions)
        ],
    )


def big_answer() -> bytes:
    brokers = [MetadataResponseBroker(node_id=i, host=f"b{i}", port=9092) for i in range(3)]
    return MetadataResponse(
        brokers=brokers, cluster_id="c", controller_id=0, topics=[big_topic()]
    ).encode(VERSION)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def _print_table(title: str, rows: list[tuple[str, ...]]) -> None:
    print(f"\n{title}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


# ---------------------------------------------------------------------------------------------
# Decode and merge, no broker


def _decode(variant: str, data: bytes) -> Any:
    if variant == "python":
        return MetadataResponse.decode(data, VERSION)[0]
    return framing._COMPILED_DECODERS[MetadataResponse](data, VERSION, 0)[0]


def _frame(proto: framing.KafkaProtocol, body: bytes) -> bytes:
    correlation_id, _ = proto.send_request(MetadataRequest(topics=None), VERSION)
    header = bytearray()
    ResponseHeader(correlation_id=correlation_id).encode_into(header, 1)
    frame = header + body
    return len(frame).to_bytes(4, "big") + frame


async def _client_path(variant: str, data: bytes) -> tuple[float, float]:
    """(longest loop stall, wall time) while the answer goes the way a connection and the
    cluster client take it: framing (deferred above 1 MiB when compiled), decode, merge in
    steps into a warm cache."""
    loop = asyncio.get_running_loop()
    cache = MetadataCache()
    cache.update(_decode("compiled", data), all_topics=False)
    before = framing.use_compiled_decoders(variant == "compiled")
    longest = 0.0
    running = True

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    tick = loop.create_task(ticker())
    await asyncio.sleep(0.02)
    longest = 0.0
    start = time.perf_counter()
    try:
        proto = framing.KafkaProtocol("bench", defer_decode_above=1 << 20)
        wire = _frame(proto, data)
        [response] = proto.receive_data(wire)
        body = response.body
        if type(body) is framing.PendingBody:
            body = await loop.run_in_executor(None, body.decode, loop_turn_pause(loop))
        for _ in cache.update_in_steps(body, all_topics=False):
            await asyncio.sleep(0)
        del body, response
        elapsed = time.perf_counter() - start
        await asyncio.sleep(0.01)
    finally:
        framing.use_compiled_decoders(before)
        running = False
        await tick
    assert len(cache.current.topics[BIG_TOPIC].partitions) == BIG_PARTITIONS
    return longest, elapsed


def test_decode_and_apply_100k(record_property: Callable[[str, Any], None]) -> None:
    data = big_answer()
    results: dict[str, dict[str, list[float]]] = {
        v: {"decode": [], "cold": [], "warm": [], "stall": [], "path": []} for v in VARIANTS
    }
    for r in range(ROUNDS):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            gc.collect()
            t0 = time.perf_counter()
            answer = _decode(variant, data)
            t1 = time.perf_counter()
            cache = MetadataCache()
            cache.update(answer, all_topics=True)
            t2 = time.perf_counter()
            del answer
            again = _decode(variant, data)
            t3 = time.perf_counter()
            cache.update(again, all_topics=True)
            del again  # freeing the answer is part of what the loop pays
            t4 = time.perf_counter()
            m = results[variant]
            m["decode"].append(t1 - t0)
            m["cold"].append(t2 - t1)
            m["warm"].append(t4 - t3)
            stall, elapsed = asyncio.run(_client_path(variant, data))
            m["stall"].append(stall)
            m["path"].append(elapsed)
    med = {v: {k: statistics.median(x) for k, x in m.items()} for v, m in results.items()}
    py, co = med["python"], med["compiled"]
    rows = [("decoder", "decode", "merge, cold", "merge+free, warm", "decode + warm merge")]
    for v in VARIANTS:
        m = med[v]
        rows.append(
            (v, _ms(m["decode"]), _ms(m["cold"]), _ms(m["warm"]), _ms(m["decode"] + m["warm"]))
        )
    rows.append(
        (
            "python / compiled",
            f"{py['decode'] / co['decode']:.1f}x",
            f"{py['cold'] / co['cold']:.1f}x",
            f"{py['warm'] / co['warm']:.1f}x",
            f"{(py['decode'] + py['warm']) / (co['decode'] + co['warm']):.1f}x",
        )
    )
    _print_table(f"100,000-partition Metadata v{VERSION} answer, medians of {ROUNDS}", rows)
    _print_table(
        "client path (framing, decode, merge in steps): longest event-loop stall, wall time",
        [("decoder", "median stall", "max stall", "median wall")]
        + [
            (v, _ms(med[v]["stall"]), _ms(max(results[v]["stall"])), _ms(med[v]["path"]))
            for v in VARIANTS
        ],
    )
    for v in VARIANTS:
        for k, x in med[v].items():
            record_property(f"{v}.{k}_ms", round(x * 1000, 2))


# ---------------------------------------------------------------------------------------------
# A producer's Produce requests while 100,000-partition answers arrive (real broker, proxy)


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _recv_exactly(sock, 4)
    if head is None:
        return None
    body = _recv_exactly(sock, int.from_bytes(head, "big"))
    return None if body is None else head + body


def _read_frame_or_none(sock: socket.socket) -> bytes | None:
    try:
        return _read_frame(sock)
    except OSError:  # the other direction closed the socket: the client is gone
        return None


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _proxy_main(
    upstream: tuple[str, int], ready: Any, results: Any, stop: Any, splicing: Any
) -> None:
    """Forward client connections to the broker; while ``splicing`` is set, append the big
    topic to Metadata answers; give every answer the proxy as every broker's address; note
    when Produce requests and big answers pass, and how long each splice took (the answer and
    whatever the broker sent after it on that connection wait meanwhile). Runs in its own
    process."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    encoded: dict[int, tuple[bytes, bytes]] = {}
    produce_times: list[float] = []
    big_times: list[float] = []
    splice_seconds: list[float] = []
    lock = threading.Lock()

    def splice(version: int, body: bytes, pos: int) -> bytes:
        answer, _ = MetadataResponse.decode(body, version, pos)
        for b in answer.brokers:
            b.host, b.port = "127.0.0.1", port
        if not splicing.is_set():
            return answer.encode(version)
        if version not in encoded:
            leaders = tuple(b.node_id for b in answer.brokers)
            stub = MetadataResponseTopic(name="stub-" + uuid.uuid4().hex, topic_id=uuid.uuid4())
            big = big_topic(leaders=leaders)
            encoded[version] = (stub.encode(version), big.encode(version))
        stub_bytes, big_bytes = encoded[version]
        stub, _ = MetadataResponseTopic.decode(stub_bytes, version)
        answer.topics.append(stub)
        out = answer.encode(version)
        return out.replace(stub_bytes, big_bytes, 1)

    def serve(client: socket.socket) -> None:
        broker = socket.create_connection(upstream)
        pending: dict[int, tuple[int, int]] = {}

        def upward() -> None:
            while (frame := _read_frame(client)) is not None:
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 4)
                if api_key == 0:
                    with lock:
                        produce_times.append(time.monotonic())
                pending[correlation_id] = (api_key, version)
                broker.sendall(frame)
            broker.close()

        threading.Thread(target=upward, daemon=True).start()
        while (frame := _read_frame_or_none(broker)) is not None:
            correlation_id = int.from_bytes(frame[4:8], "big")
            api_key, version = pending.pop(correlation_id, (-1, -1))
            if api_key == 3:
                header = framing.response_header_version(3, version)
                body = frame[4:]
                big = splicing.is_set()
                first = version not in encoded  # encodes the big topic: not a splice's cost
                t0 = time.monotonic()
                _, pos = ResponseHeader.decode(body, header, 0)
                new_body = body[:pos] + splice(version, body, pos)
                frame = len(new_body).to_bytes(4, "big") + new_body
                if big:
                    with lock:
                        big_times.append(time.monotonic())
                        if not first:
                            splice_seconds.append(big_times[-1] - t0)
            client.sendall(frame)
        client.close()

    ready.put(port)
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        threading.Thread(target=serve, args=(client,), daemon=True).start()
    with lock:
        results.put((produce_times, big_times, splice_seconds))


@pytest.fixture(scope="module")
def live_topic(topics: Topics) -> Iterator[str]:
    name = f"metadata-scale-live-{uuid.uuid4().hex[:6]}"
    with AdminClient({"bootstrap.servers": topics.bootstrap}) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
        admin.describe_topics([name])
    try:
        yield name
    finally:
        with AdminClient({"bootstrap.servers": topics.bootstrap}) as admin:
            admin.delete_topics([name])


async def _loop_ticker(stop: list[bool]) -> float:
    """The longest gap between ticks of a 1 ms timer: how long the loop was held up."""
    longest, last = 0.0, time.perf_counter()
    while not stop:
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    return longest


def _produce_round(bootstrap: str, topic: str, seconds: float) -> tuple[int, float]:
    """(records sent, the longest stall of the producer's network thread)."""
    config = {
        "bootstrap.servers": bootstrap,
        "metadata.max.age.ms": "500",
        "linger.ms": "0",
        "acks": "1",
    }
    sent = 0
    with Producer(config) as producer:
        producer.send(topic, b"warm-up").result(TIMEOUT_S)
        stop: list[bool] = []
        # The producer's own event loop (its network thread), observed from a timer on it.
        ticker = asyncio.run_coroutine_threadsafe(_loop_ticker(stop), producer._loop.loop)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            futures = [producer.send(topic, b"x" * 100) for _ in range(20)]
            futures[-1].result(TIMEOUT_S)
            sent += len(futures)
        stop.append(True)
        stall = ticker.result(TIMEOUT_S)
    return sent, stall


def test_produce_gaps_during_100k_refreshes(
    topics: Topics, live_topic: str, record_property: Callable[[str, Any], None]
) -> None:
    host, port = topics.bootstrap.split(",")[0].rsplit(":", 1)
    ctx = multiprocessing.get_context("spawn")
    ready, results, stop, splicing = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    args = ((host, int(port)), ready, results, stop, splicing)
    proxy = ctx.Process(target=_proxy_main, args=args)
    proxy.start()
    # Each decoder with the big topic in every answer, and the compiled one without it: the
    # gaps the same producer, proxy and machine give when no big answer comes.
    variants = (*VARIANTS, UNSPLICED)
    windows: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    sent: dict[str, int] = dict.fromkeys(variants, 0)
    stalls: dict[str, list[float]] = {v: [] for v in variants}
    try:
        proxy_port = ready.get(timeout=60)
        bootstrap = f"127.0.0.1:{proxy_port}"
        splicing.set()
        _produce_round(bootstrap, live_topic, 1.0)  # the proxy encodes the big topic once
        for r in range(PRODUCE_ROUNDS * len(variants)):
            variant = variants[r % len(variants)]
            if variant == UNSPLICED:
                splicing.clear()
            else:
                splicing.set()
            before = framing.use_compiled_decoders(variant != "python")
            try:
                start = time.monotonic()
                count, stall = _produce_round(bootstrap, live_topic, PRODUCE_ROUND_S)
                sent[variant] += count
                stalls[variant].append(stall)
                windows[variant].append((start, time.monotonic()))
            finally:
                framing.use_compiled_decoders(before)
    finally:
        stop.set()
        produce_times, big_times, splice_seconds = results.get(timeout=60)
        proxy.join(30)
    rows = [
        (
            "decoder",
            "big answers",
            "produce requests",
            "longest gap after one",
            "longest gap elsewhere",
            "median gap",
            "longest network-thread stall",
        )
    ]
    for v in variants:
        gaps_near, gaps_far, count, bigs_seen = [], [], 0, 0
        for start, end in windows[v]:  # gaps within one round (one producer) only
            times = [t for t in produce_times if start <= t <= end]
            bigs = [t for t in big_times if start <= t <= end]
            count += len(times)
            bigs_seen += len(bigs)
            for a, b in zip(times, times[1:], strict=False):
                near = any(a <= t + WINDOW_S and t <= b for t in bigs)  # overlaps [t, t + W]
                (gaps_near if near else gaps_far).append(b - a)
        longest = max(gaps_near, default=0.0)
        median = statistics.median(gaps_far) if gaps_far else 0.0
        elsewhere = max(gaps_far, default=0.0)  # what the machine itself does to the client
        rows.append(
            (
                v,
                str(bigs_seen),
                str(count),
                _ms(longest),
                _ms(elsewhere),
                _ms(median),
                _ms(max(stalls[v])),
            )
        )
        record_property(f"{v}.longest_loop_stall_ms", round(max(stalls[v]) * 1000, 2))
        record_property(f"{v}.longest_produce_gap_ms", round(longest * 1000, 2))
        assert count and (bigs_seen > 0) == (v != UNSPLICED), (v, bigs_seen, count)
    _print_table(
        "Produce requests while 100,000-partition answers arrive every 0.5 s "
        f"(gaps within {WINDOW_S} s after a big answer)",
        rows,
    )
    splices = sorted(splice_seconds)
    print(
        f"  the proxy's splice of a big answer (the connection waits meanwhile): median "
        f"{_ms(statistics.median(splices)).strip()}, longest {_ms(splices[-1]).strip()}"
    )
    record_property("proxy_longest_splice_ms", round(splices[-1] * 1000, 2))


# ---------------------------------------------------------------------------------------------
# Warm metadata, 50 topics x 4 partitions, against confluent-kafka


def test_warm_metadata_vs_confluent(
    topics: Topics, record_property: Callable[[str, Any], None]
) -> None:
    _need(confluent_admin, "confluent-kafka")
    peer = confluent_admin.AdminClient({"bootstrap.servers": topics.bootstrap})
    with AdminClient({"bootstrap.servers": topics.bootstrap}) as admin:
        calls: dict[str, Callable[[], Any]] = {
            "kcore": admin.list_topics,
            "confluent-kafka": lambda: peer.list_topics(timeout=TIMEOUT_S),
        }
        for call in calls.values():
            for _ in range(20):
                call()
        times: dict[str, list[float]] = {k: [] for k in calls}
        order = list(calls)
        for i in range(WARM_CALLS):
            for name in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - t0)
        names = set(admin.list_topics())
    assert topics.names <= names
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["confluent-kafka"] / med["kcore"]
    _print_table(
        f"warm metadata, {len(topics.names)} topics x 4 partitions, {WARM_CALLS} calls each, "
        "alternating",
        [("client", "median", "mean")]
        + [(k, _ms(med[k]), _ms(statistics.fmean(times[k]))) for k in calls]
        + [("kcore vs confluent-kafka", f"{ratio:.2f}x", "")],
    )
    record_property("warm_ratio_vs_confluent", round(ratio, 3))
