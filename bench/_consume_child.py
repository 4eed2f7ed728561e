"""One round of bench/test_consumer_bench.py's alternating large-value cells, in a process of
its own (so that a round can run another tree's kcore, with ``PYTHONPATH``, beside this one's).

``python bench/_consume_child.py '<json>'`` reads a topic with one client and prints one JSON
line: ``{"wall_s": ..., "cpu_s": ..., "records": ...}``. The json names ``variant`` (``poll``,
``poll_arrow``, ``confluent``, ``floor`` or ``fetch_floor``), ``bootstrap``, ``topic``,
``partitions``, ``records`` (N), ``value_size``, the fetch settings (``fetch``:
partition_fetch, max_bytes, min_bytes, max_wait_ms, poll_records, arrow_records), ``group``
(confluent's group.id) and ``check`` (kcore's variants: read the topic once more untimed,
keeping the values, and compare them with ``expected_sha`` - a SHA-256 of the sorted values
the parent wrote).

Before the timed part the client reads ``prime`` records with a consumer of its own (imports,
warm code paths and allocator); the timed part runs from the first poll of a new consumer,
created, connected and assigned before it, to the N-th record. CPU is ``time.process_time``
(every thread of this process), ``sys_s`` the part of it spent in the kernel. ``floor`` times
one memcpy (into a buffer written once before) and one CRC32C of N x value_size bytes.
``fetch_floor`` adds the broker and the socket to it: the same Fetch requests as a client with
the same settings makes (every partition in each, from where the last answer ended; one in
flight), on one connection, each answer read from the socket straight into its frame's buffer,
then one CRC32C and one memcpy of its record bytes. Nothing is decoded: no record, no value,
no Python object per batch. No client on this broker and kernel can do less; it reads from
the bootstrap broker, so it needs a one-node cluster (another leader fails the round).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import resource
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

TIMEOUT_S = 300.0
T = TypeVar("T")


def _kernel_s() -> float:
    """The process's CPU time in the kernel so far (every thread)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _timed(read: Callable[[], T]) -> tuple[dict[str, float], T]:
    """``read()``'s wall, CPU and kernel CPU time (as the round's JSON names them), and what
    it returned."""
    wall, cpu, kernel = time.perf_counter(), time.process_time(), _kernel_s()
    out = read()
    return {
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "sys_s": _kernel_s() - kernel,
    }, out


def _kcore(spec: dict[str, Any]) -> Any:
    import kcore

    fetch = spec["fetch"]
    c = kcore.Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": fetch["partition_fetch"],
            "fetch.max.bytes": fetch["max_bytes"],
            "fetch.min.bytes": fetch["min_bytes"],
            "fetch.max.wait.ms": fetch["max_wait_ms"],
        }
    )
    c.partitions_for(spec["topic"])  # connected, the topic's metadata known
    c.assign([(spec["topic"], p) for p in range(spec["partitions"])])
    c.seek_to_beginning()
    return c


def _confluent(spec: dict[str, Any]) -> Any:
    import confluent_kafka

    fetch = spec["fetch"]
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": spec["group"],  # required; no group is joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.message.max.bytes": fetch["partition_fetch"],
            "fetch.max.bytes": fetch["max_bytes"],
            "fetch.min.bytes": fetch["min_bytes"],
            "fetch.wait.max.ms": fetch["max_wait_ms"],
        }
    )
    c.list_topics(spec["topic"], timeout=30)
    c.assign(
        [
            confluent_kafka.TopicPartition(spec["topic"], p, confluent_kafka.OFFSET_BEGINNING)
            for p in range(spec["partitions"])
        ]
    )
    return c


def _read(variant: str, c: Any, n: int, fetch: dict[str, Any]) -> int:
    total = 0
    deadline = time.monotonic() + TIMEOUT_S
    if variant == "poll":
        poll = c.poll
        while total < n and time.monotonic() < deadline:
            total += len(poll(1.0, max_records=fetch["poll_records"]))
    elif variant == "poll_arrow":
        poll_arrow = c.poll_arrow
        while total < n and time.monotonic() < deadline:
            total += poll_arrow(1.0, max_records=fetch["arrow_records"]).num_rows
    else:
        take = c.consume
        while total < n and time.monotonic() < deadline:
            # (at most what is left: consume waits for as many as it is asked for)
            for m in take(min(fetch["poll_records"], n - total), 1.0):
                if m.error() is None:
                    total += 1
                else:
                    raise RuntimeError(f"confluent-kafka: {m.error()}")
    return total


def _check(spec: dict[str, Any]) -> None:
    """Every value exactly as written (offsets in order per partition), read untimed."""
    c = _kcore(spec)
    values: list[bytes] = []
    offsets: dict[int, list[int]] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(values) < spec["records"] and time.monotonic() < deadline:
            if spec["variant"] == "poll":
                for r in c.poll(1.0, max_records=spec["fetch"]["poll_records"]):
                    offsets.setdefault(r.partition, []).append(r.offset)
                    values.append(r.value)
            else:
                rb = c.poll_arrow(1.0, max_records=spec["fetch"]["arrow_records"])
                for p, o in zip(
                    rb.column("partition").to_pylist(),
                    rb.column("offset").to_pylist(),
                    strict=True,
                ):
                    offsets.setdefault(p, []).append(o)
                values.extend(rb.column("value").to_pylist())
    finally:
        c.close()
    for p, got in offsets.items():
        assert got == list(range(len(got))), f"partition {p}: offsets not 0..n-1 in order"
    digest = hashlib.sha256(b"".join(sorted(values))).hexdigest()
    assert digest == spec["expected_sha"], "the values read are not the ones written"


def _floor(spec: dict[str, Any]) -> tuple[float, float]:
    from kcore.codec import crc32c

    size = spec["records"] * spec["value_size"]
    src = bytearray(size)
    src[:] = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    dst = bytearray(size)
    dst[:] = src  # every page written once: the timed copy pays no page faults
    dst_address = ctypes.addressof((ctypes.c_char * size).from_buffer(dst))
    src_address = ctypes.addressof((ctypes.c_char * size).from_buffer(src))
    crc32c(src)
    wall, cpu = time.perf_counter(), time.process_time()
    ctypes.memmove(dst_address, src_address, size)
    crc32c(src)
    return time.perf_counter() - wall, time.process_time() - cpu


# Fetch v12: flexible, topics by name (v13+ names them by id).
FLOOR_FETCH_VERSION = 12


def _fetch_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """One untimed pass over the topic (as the clients' priming read), then the timed one."""
    from kcore.codec import crc32c, scan_complete_batches
    from kcore.errors import ErrorCode
    from kcore.protocol.framing import KafkaProtocol
    from kcore.protocol.messages.fetch_request import FetchPartition, FetchRequest, FetchTopic

    fetch, topic, n = spec["fetch"], spec["topic"], spec["records"]
    host, _, port = spec["bootstrap"].split(",")[0].rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proto = KafkaProtocol("kcore-bench-fetch-floor")
    # Where the record bytes are copied to: one answer's at most, every page written before.
    copy_to = bytearray(fetch["max_bytes"])
    copy_to[:] = b"\x01" * len(copy_to)

    def one_pass() -> tuple[int, dict[int, int]]:
        offsets = dict.fromkeys(range(spec["partitions"]), 0)
        total = 0
        deadline = time.monotonic() + TIMEOUT_S
        while total < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetch floor: {total} of {n} records")
            request = FetchRequest(
                max_wait_ms=fetch["max_wait_ms"],
                min_bytes=fetch["min_bytes"],
                max_bytes=fetch["max_bytes"],
                topics=[
                    FetchTopic(
                        topic=topic,
                        partitions=[
                            FetchPartition(
                                partition=p,
                                fetch_offset=at,
                                partition_max_bytes=fetch["partition_fetch"],
                            )
                            for p, at in offsets.items()
                        ],
                    )
                ],
            )
            sock.sendall(proto.send_request(request, FLOOR_FETCH_VERSION)[1])
            responses: list[Any] = []
            while not responses:
                got = sock.recv_into(proto.get_buffer())
                if not got:
                    raise ConnectionError("fetch floor: the broker closed the connection")
                responses = proto.buffer_updated(got)
            at = 0
            for answer in responses[0].body.responses:
                for part in answer.partitions:
                    if part.error_code != ErrorCode.NONE:
                        raise RuntimeError(
                            f"fetch floor: partition {part.partition_index}: "
                            f"error {ErrorCode(part.error_code).name}"
                        )
                    records = part.records
                    found = scan_complete_batches(records) if records is not None else None
                    if found is None or found[0] < 0:
                        continue
                    end, used = found
                    view = records[:used]
                    crc32c(view)
                    copy_to[at : at + used] = view
                    at += used
                    total += end - offsets[part.partition_index]
                    offsets[part.partition_index] = end
        return total, offsets

    try:
        one_pass()
        times, (total, ends) = _timed(one_pass)
    finally:
        sock.close()
    return {**times, "records": total, "positions": ends}


def main() -> None:
    spec = json.loads(sys.argv[1])
    variant = spec["variant"]
    n = spec["records"]
    if variant == "floor":
        wall, cpu = _floor(spec)
        print(json.dumps({"wall_s": wall, "cpu_s": cpu, "records": n}))
        return
    if variant == "fetch_floor":
        print(json.dumps(_fetch_floor(spec)))
        return
    make = _confluent if variant == "confluent" else _kcore
    if spec.get("check") and variant != "confluent":
        _check(spec)
    prime = spec.get("prime", 0)
    if prime:
        c = make(spec)
        try:
            _read(variant, c, prime, spec["fetch"])
        finally:
            c.close()
    c = make(spec)
    try:
        times, got = _timed(lambda: _read(variant, c, n, spec["fetch"]))
        if variant == "confluent":
            ends = {tp.partition: tp.offset for tp in c.position(c.assignment())}
        else:
            ends = {p: c.position((spec["topic"], p)) for p in range(spec["partitions"])}
    finally:
        c.close()
    print(json.dumps({**times, "records": got, "positions": ends}))


if __name__ == "__main__":
    main()
