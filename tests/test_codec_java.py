"""kcore's codec against the Java client itself, on a real Kafka 4.3.1 broker.

* Java -> kcore: ``tests/java/ProduceRecords.java`` sends a fixed set of records with
  KafkaProducer once per codec (one JVM for all five); kcore fetches each partition with its
  protocol layer and decodes it with ``decode_batches``, ``decode_records`` and
  ``decode_to_arrow``. The uncompressed batches Java wrote must also be byte-for-byte what
  kcore's ``RecordBatchBuilder`` writes for the same records and header fields, and the
  compressed ones must hold the same record bytes once decompressed.
* kcore -> Java: kcore-built batches of every codec go in through ProduceRequests and
  ``tests/java/ConsumeRecords.java`` (KafkaConsumer, check.crcs on; one JVM for all topics)
  must read back exactly the records kcore wrote, including from a LogAppendTime topic.
"""

from __future__ import annotations

import struct
import subprocess
import time
import uuid
from pathlib import Path

import cramjam
import pytest

from kcore.codec import (
    RecordBatch,
    RecordBatchBuilder,
    decode_batches,
    decode_records,
    decode_to_arrow,
    decompress,
)
from kcore.network.address import parse_address
from kcore.network.blocking import BlockingBrokerConnection as BrokerConnection
from kcore.protocol.messages import (
    CreateTopicsRequest,
    FetchRequest,
    MetadataRequest,
    ProduceRequest,
)
from kcore.protocol.messages.create_topics_request import CreatableTopic, CreatableTopicConfig
from kcore.protocol.messages.fetch_request import FetchPartition, FetchTopic
from kcore.protocol.messages.metadata_request import MetadataRequestTopic
from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData
from kcore.testing import jars

JAVA_DIR = Path(__file__).parent / "java"
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
HEADER_SIZE = 61
BASE_TS = 1_700_000_000_000


def make_records() -> list[tuple[bytes | None, bytes | None, int, list]]:
    """(key, value, timestamp, headers): nulls and empties everywhere, headers with null values
    and non-ASCII names, timestamps out of order, values large enough to compress."""
    out = []
    for i in range(30):
        key = None if i % 7 == 3 else b"" if i % 11 == 5 else b"key-%03d" % i
        if i % 5 == 4:
            value = None
        elif i % 9 == 8:
            value = b""
        else:
            value = b"value %d " % i + b"kafka " * (i * 7) + bytes(range(i % 17))
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers.append(("trace", b"t-%d" % i))
        if i % 4 == 1:
            headers.append(("nullable", None))
        if i % 6 == 2:
            headers += [("", b""), ("ключ", "значение".encode()), ("dup", b"1"), ("dup", b"2")]
        ts = BASE_TS + i * 37 - (500 if i % 8 == 6 else 0)  # some go back in time
        out.append((key, value, ts, headers))
    out[13] = (b"big", b"B" * 70_000, BASE_TS + 1, [("h", b"x" * 300)])  # multi-byte varints
    return out


RECORDS = make_records()
FIRST_BATCH = 12  # the Java producer flushes after this many records: two batches a topic


def expected(base_offset: int = 0) -> list[tuple]:
    return [(base_offset + i, ts, k, v, tuple(h)) for i, (k, v, ts, h) in enumerate(RECORDS)]


# -- wire format shared with the Java programs -----------------------------------------------


def enc_bytes(b: bytes | None) -> str:
    return "-" if b is None else "x" + b.hex()


def dec_bytes(s: str) -> bytes | None:
    return None if s == "-" else bytes.fromhex(s[1:])


def enc_headers(headers) -> str:
    if not headers:
        return "."
    return ",".join(f"{k.encode().hex()}:{enc_bytes(v)}" for k, v in headers)


def dec_headers(s: str) -> tuple:
    if s == ".":
        return ()
    out = []
    for pair in s.split(","):
        name, _, value = pair.partition(":")
        out.append((bytes.fromhex(name).decode(), dec_bytes(value)))
    return tuple(out)


def producer_input() -> str:
    lines = []
    for i, (k, v, ts, h) in enumerate(RECORDS):
        flush = " flush" if i == FIRST_BATCH - 1 else ""
        lines.append(f"{ts} {enc_bytes(k)} {enc_bytes(v)} {enc_headers(h)}{flush}")
    return "\n".join(lines) + "\n"


def run_java(cluster, program: str, *args: str, input: str | None = None):
    """Run ``tests/java/<program>`` in source-file mode with the broker's classpath."""
    version = cluster.kafka_version
    libs = jars.kafka_libs(version)
    cmd = [
        jars.java_executable(),
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:-UsePerfData",
        f"-Dlog4j2.configurationFile={jars.tools_log4j2_config(version)}",
        "-cp",
        f"{libs}/*",
        str(JAVA_DIR / program),
        *args,
    ]
    res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, (
        f"{program} exited with {res.returncode} (source-file mode needs a JDK, not a JRE)\n"
        f"stdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-6000:]}"
    )
    return res.stdout


# -- kcore protocol helpers --------------------------------------------------------------------


def connect(cluster) -> BrokerConnection:
    host, port = parse_address(cluster.bootstrap_servers.split(",")[0])
    return BrokerConnection(host, port, client_id="kcore-codec-java", timeout=30).open()


def create_topics(conn: BrokerConnection, names: dict[str, dict[str, str]]) -> dict[str, uuid.UUID]:
    """Create one-partition topics (name -> configs); returns name -> topic id once each
    partition has a leader."""
    response = conn.request(
        CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=name,
                    num_partitions=1,
                    replication_factor=1,
                    configs=[CreatableTopicConfig(name=k, value=v) for k, v in cfg.items()],
                )
                for name, cfg in names.items()
            ],
            timeout_ms=30_000,
        )
    )
    assert all(t.error_code == 0 for t in response.topics), response.topics
    deadline = time.monotonic() + 30
    while True:
        md = conn.request(MetadataRequest(topics=[MetadataRequestTopic(name=n) for n in names]))
        ready = {
            t.name: t.topic_id
            for t in md.topics
            if t.error_code == 0 and t.partitions and t.partitions[0].leader_id >= 0
        }
        if len(ready) == len(names):
            return ready
        assert time.monotonic() < deadline, f"no leaders for {names}: {md.topics}"
        time.sleep(0.1)


def fetch_all(conn: BrokerConnection, topics: dict[str, uuid.UUID], count: int) -> dict[str, bytes]:
    """Partition 0 of each topic from offset 0, as the raw records bytes of the Fetch response,
    once ``count`` records are there (one fetch holds them all: max bytes are ample)."""
    out: dict[str, bytes] = {}
    deadline = time.monotonic() + 30
    while len(out) < len(topics):
        pending = {n: t for n, t in topics.items() if n not in out}
        response = conn.request(
            FetchRequest(
                max_wait_ms=200,
                min_bytes=1,
                max_bytes=64 << 20,
                topics=[
                    FetchTopic(
                        topic=name,
                        topic_id=topic_id,
                        partitions=[
                            FetchPartition(
                                partition=0, fetch_offset=0, partition_max_bytes=16 << 20
                            )
                        ],
                    )
                    for name, topic_id in pending.items()
                ],
            )
        )
        assert response.error_code == 0, response
        by_id = {t: n for n, t in pending.items()}
        for topic in response.responses:
            name = topic.topic or by_id[topic.topic_id]
            [pd] = topic.partitions
            assert pd.error_code == 0, (name, pd)
            records = bytes(pd.records or b"")
            if pd.high_watermark >= count and len(decode_records(records)) >= count:
                out[name] = records
        assert time.monotonic() < deadline, f"records did not all arrive: {sorted(out)}"
    return out


def produce(conn: BrokerConnection, batches: dict[tuple[str, uuid.UUID], bytes]) -> None:
    """ProduceRequests (acks=all) with one batch per topic until every partition accepted its
    batch; a partition whose leader is not ready yet (a new topic) is retried."""
    pending = dict(batches)
    deadline = time.monotonic() + 30
    while pending:
        response = conn.request(
            ProduceRequest(
                acks=-1,
                timeout_ms=10_000,
                topic_data=[
                    TopicProduceData(
                        name=name,
                        topic_id=topic_id,
                        partition_data=[PartitionProduceData(index=0, records=batch)],
                    )
                    for (name, topic_id), batch in pending.items()
                ],
            )
        )
        by_id = {topic_id: (name, topic_id) for name, topic_id in pending}
        by_name = {name: (name, topic_id) for name, topic_id in pending}
        for topic in response.responses:
            key = by_name.get(topic.name) or by_id[topic.topic_id]
            [pr] = topic.partition_responses
            if pr.error_code == 0:
                del pending[key]
            else:  # NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID
                assert pr.error_code in (6, 3, 100), (key, pr)
        assert time.monotonic() < deadline, f"produce did not succeed: {pending.keys()}"
        if pending:
            time.sleep(0.1)


def arrow_rows(table) -> list[tuple]:
    cols = table.to_pydict()
    return [
        (
            cols["offset"][i],
            int(cols["timestamp"][i].timestamp() * 1000),
            cols["key"][i],
            cols["value"][i],
            tuple((h["key"], h["value"]) for h in cols["headers"][i]),
        )
        for i in range(table.num_rows)
    ]


def batch_bytes(buf: bytes, batch) -> bytes:
    return buf[batch.position : batch.position + batch.size_in_bytes]


# -- Java -> kcore -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def java_produced(kafka_cluster) -> dict[str, bytes]:
    """codec -> the fetched records bytes of a topic the Java producer wrote with that codec."""
    prefix = f"codec-java-{uuid.uuid4().hex[:8]}"
    with connect(kafka_cluster) as conn:
        topics = create_topics(conn, {f"{prefix}-{c}": {} for c in CODECS})
        out = run_java(
            kafka_cluster,
            "ProduceRecords.java",
            kafka_cluster.bootstrap_servers,
            prefix,
            ",".join(CODECS),
            input=producer_input(),
        )
        assert out.split() == " ".join(f"sent {prefix}-{c} {len(RECORDS)}" for c in CODECS).split()
        fetched = fetch_all(conn, topics, len(RECORDS))
    return {c: fetched[f"{prefix}-{c}"] for c in CODECS}


@pytest.mark.parametrize("codec", CODECS)
def test_kcore_decodes_java_producer_batches(java_produced, codec):
    buf = java_produced[codec]
    batches = decode_batches(buf)
    assert len(batches) == 2
    first, second = batches
    for batch in batches:
        assert isinstance(batch, RecordBatch) and batch.magic == 2
        assert batch.compression == codec
        assert batch.timestamp_type == 0 and not batch.is_transactional and not batch.is_control
        # Java producers are idempotent by default: a producer id, epoch 0, running sequences.
        assert batch.producer_id >= 0 and batch.producer_epoch == 0
        assert batch.partition_leader_epoch >= 0  # the broker stamps its leader epoch
    assert (first.base_offset, first.record_count, first.base_sequence) == (0, FIRST_BATCH, 0)
    assert (second.base_offset, second.base_sequence) == (FIRST_BATCH, FIRST_BATCH)
    assert second.record_count == len(RECORDS) - FIRST_BATCH
    assert first.producer_id == second.producer_id
    want = expected()
    for batch, part in ((first, want[:FIRST_BATCH]), (second, want[FIRST_BATCH:])):
        assert batch.records() == part
        assert batch.base_timestamp == part[0][1]  # Java: the first record's timestamp
        assert batch.max_timestamp == max(r[1] for r in part)
        assert batch.last_offset_delta == len(part) - 1
    assert decode_records(buf) == want
    assert arrow_rows(decode_to_arrow(buf)) == want
    assert decode_to_arrow(buf).column("timestampType").to_pylist() == [0] * len(want)


def xerial_blocks(payload: bytes) -> list[int]:
    """The uncompressed size of each block of a xerial snappy stream."""
    sizes, pos = [], 16
    while pos < len(payload):
        (n,) = struct.unpack_from(">i", payload, pos)
        sizes.append(cramjam.snappy.decompress_raw_len(payload[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return sizes


@pytest.mark.parametrize("codec", CODECS)
def test_java_batches_are_what_kcore_builds(java_produced, codec):
    """Rebuild each batch Java wrote with kcore, with the same header fields: the records
    section is the same bytes, and so is the whole batch where both compress alike.

    Byte-equal with Java: none, and lz4 (Java's default LZ4 level uses lz4's fast compressor
    in 64 KiB independent blocks with no checksums, as kcore does). gzip: the same 10-byte
    header, another deflate. snappy: the same xerial header and 32 KiB blocks; the blocks'
    bytes may differ (snappy-java's C++ snappy against cramjam's Rust one). zstd: zstd-jni
    streams a frame without a content size; kcore writes one frame with it."""
    buf = java_produced[codec]
    start = 0
    for batch in decode_batches(buf):
        java = batch_bytes(buf, batch)
        fields = dict(
            base_offset=batch.base_offset,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            partition_leader_epoch=batch.partition_leader_epoch,
        )
        builder = RecordBatchBuilder(codec, **fields)
        plain = RecordBatchBuilder(**fields)
        for k, v, ts, h in RECORDS[start : start + batch.record_count]:
            builder.append(k, v, ts, h)
            plain.append(k, v, ts, h)
        start += batch.record_count
        ours = builder.build()
        if codec in ("none", "lz4"):
            assert ours == java
            continue
        # Header: everything but the length (8:12) and the CRC (17:21) is the same.
        assert ours[:8] + ours[12:17] + ours[21:HEADER_SIZE] == (
            java[:8] + java[12:17] + java[21:HEADER_SIZE]
        )
        payload, java_payload = ours[HEADER_SIZE:], java[HEADER_SIZE:]
        assert decompress(codec, java_payload) == plain.build()[HEADER_SIZE:]
        if codec == "gzip":
            assert payload[:10] == java_payload[:10]
        elif codec == "snappy":
            assert payload[:16] == java_payload[:16]
            assert xerial_blocks(payload) == xerial_blocks(java_payload)
    assert start == len(RECORDS)


# -- kcore -> Java -----------------------------------------------------------------------------


def kcore_batch(codec: str, part: list, **fields) -> bytes:
    builder = RecordBatchBuilder(codec, **fields)
    for k, v, ts, h in part:
        builder.append(k, v, ts, h)
    return builder.build()


def parse_consumer(out: str) -> dict[str, list[tuple]]:
    got: dict[str, list[tuple]] = {}
    for line in out.splitlines():
        topic, offset, ts_type, ts, key, value, headers = line.split(" ")
        got.setdefault(topic, []).append(
            (int(offset), ts_type, int(ts), dec_bytes(key), dec_bytes(value), dec_headers(headers))
        )
    return got


@pytest.fixture(scope="module")
def java_consumed(kafka_cluster):
    """Topics written by kcore (two batches each, one per codec, plus a zstd one on a
    LogAppendTime topic): (names, what kcore fetched back, what the Java consumer printed)."""
    prefix = f"codec-kcore-{uuid.uuid4().hex[:8]}"
    names = {c: f"{prefix}-{c}" for c in CODECS}
    names["lat"] = f"{prefix}-lat"
    configs = {n: {} for n in names.values()}
    configs[names["lat"]] = {"message.timestamp.type": "LogAppendTime"}
    with connect(kafka_cluster) as conn:
        ids = create_topics(conn, configs)
        codec_of = {name: ("zstd" if key == "lat" else key) for key, name in names.items()}
        for part in (RECORDS[:FIRST_BATCH], RECORDS[FIRST_BATCH:]):
            produce(conn, {(n, ids[n]): kcore_batch(codec_of[n], part) for n in names.values()})
        fetched = fetch_all(conn, ids, len(RECORDS))
    out = run_java(
        kafka_cluster,
        "ConsumeRecords.java",
        kafka_cluster.bootstrap_servers,
        *(f"{n}:{len(RECORDS)}" for n in names.values()),
    )
    return names, fetched, parse_consumer(out)


@pytest.mark.parametrize("codec", CODECS)
def test_java_consumer_reads_kcore_batches(java_consumed, codec):
    names, fetched, consumed = java_consumed
    name = names[codec]
    # The broker kept kcore's batches as they were (topic compression.type=producer): only
    # the base offset and the partition leader epoch, outside the CRC, are its own.
    batches = decode_batches(fetched[name])
    assert [b.compression for b in batches] == [codec, codec]
    assert [b.record_count for b in batches] == [FIRST_BATCH, len(RECORDS) - FIRST_BATCH]
    for batch, part in zip(batches, (RECORDS[:FIRST_BATCH], RECORDS[FIRST_BATCH:]), strict=True):
        assert batch_bytes(fetched[name], batch) == kcore_batch(
            codec,
            part,
            base_offset=batch.base_offset,
            partition_leader_epoch=batch.partition_leader_epoch,
        )
    assert decode_records(fetched[name]) == expected()
    want = [(o, "CreateTime", ts, k, v, h) for o, ts, k, v, h in expected()]
    assert consumed[name] == want


def test_log_append_time_topic(java_consumed):
    """The broker stamps kcore's batches with LogAppendTime; kcore and Java both read every
    record's timestamp as its batch's max timestamp."""
    names, fetched, consumed = java_consumed
    name = names["lat"]
    batches = decode_batches(fetched[name])
    assert [b.compression for b in batches] == ["zstd", "zstd"]
    assert all(b.timestamp_type == 1 for b in batches)
    stamped = [b.max_timestamp for b in batches for _ in range(b.record_count)]
    assert all(abs(ts - time.time() * 1000) < 600_000 for ts in stamped)
    want = [(o, ts, k, v, h) for (o, _, k, v, h), ts in zip(expected(), stamped, strict=True)]
    assert decode_records(fetched[name]) == want
    assert arrow_rows(decode_to_arrow(fetched[name])) == want
    assert decode_to_arrow(fetched[name]).column("timestampType").to_pylist() == [1] * len(want)
    assert consumed[name] == [(o, "LogAppendTime", ts, k, v, h) for o, ts, k, v, h in want]
