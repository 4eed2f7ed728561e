"""The compiled ProduceResponse decoder (kcore.protocol._decoders, generated with the
MetadataResponse one) against the Python class, on the same bytes, by the contract of
tests/test_protocol_compiled_decoders.py: equal objects and end positions for good input, the
same kcore error class for bad input. Every field a version carries is set, the tagged ones
too (a partition's current leader, the top-level node endpoints). No broker needed.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_protocol_compiled_decoders import (
    CUTS,
    EDITS,
    check_damaged,
    check_decoders_agree,
    check_every_flipped_byte,
    check_every_truncation,
)

from kcore.protocol._decoders import DECODERS, decode_produce_response
from kcore.protocol.messages import ProduceResponse
from kcore.protocol.messages.produce_response import (
    BatchIndexAndErrorMessage,
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionProduceResponse,
    TopicProduceResponse,
)

VERSIONS = range(ProduceResponse.VALID_VERSIONS[0], ProduceResponse.VALID_VERSIONS[1] + 1)
FLEXIBLE = ProduceResponse.FLEXIBLE_VERSIONS


def response(version: int, rng: random.Random, topics: int = 2, partitions: int = 3) -> Any:
    """A ProduceResponse with a varied value in every field ``version`` carries."""
    listed = []
    for t in range(topics):
        parts = []
        for p in range(partitions):
            failed = rng.random() < 0.3
            part = PartitionProduceResponse(
                index=p,
                error_code=rng.choice([6, 10, 87]) if failed else 0,
                base_offset=-1 if failed else rng.randrange(0, 2**40),
                log_append_time_ms=rng.choice([-1, 1_700_000_000_000]) if version >= 2 else -1,
                log_start_offset=rng.randrange(0, 2**33) if version >= 5 else -1,
            )
            if version >= 8 and failed:
                part.record_errors = [
                    BatchIndexAndErrorMessage(
                        batch_index=rng.randrange(0, 500),
                        batch_index_error_message=rng.choice([None, "bad r\u00e9cord"]),
                    )
                    for _ in range(rng.randrange(0, 3))
                ]
                part.error_message = rng.choice([None, "", "records are invalid"])
            if version >= 10 and failed:
                part.current_leader = LeaderIdAndEpoch(
                    leader_id=rng.randrange(0, 5), leader_epoch=rng.randrange(0, 2**31)
                )
            parts.append(part)
        topic = TopicProduceResponse(partition_responses=parts)
        if version >= 13:
            topic.topic_id = uuid.UUID(int=rng.getrandbits(128))
        else:
            topic.name = f"topic-{t}-\u00e9"
        listed.append(topic)
    out = ProduceResponse(responses=listed, throttle_time_ms=rng.randrange(0, 1000))
    if version >= 10:
        out.node_endpoints = [
            NodeEndpoint(
                node_id=i,
                host=f"broker-{i}.example",
                port=9092 + i,
                rack=rng.choice([None, f"rack-{i}"]),
            )
            for i in range(rng.randrange(0, 3))
        ]
    return out


def encodings() -> list[tuple[int, bytes]]:
    rng = random.Random(2)
    out = []
    for version in VERSIONS:
        out.append((version, response(version, rng).encode(version)))
        if version >= FLEXIBLE:
            obj = response(version, rng)
            obj._unknown_tagged_fields = [(7, b"top"), (300, b"\x00" * 20)]
            obj.responses[0].partition_responses[0]._unknown_tagged_fields = [(9, b"pp")]
            out.append((version, obj.encode(version)))
    return out


ENCODINGS = encodings()


def test_the_compiled_decoder_is_registered_for_its_class() -> None:
    assert DECODERS[ProduceResponse] is decode_produce_response


@pytest.mark.parametrize("version", VERSIONS)
def test_equal_objects_for_every_version(version: int) -> None:
    rng = random.Random(version)
    for shape in ((0, 0), (1, 1), (2, 3), (3, 200)):
        obj = response(version, rng, *shape)
        data = obj.encode(version)
        for buf in (data, bytearray(data), memoryview(bytearray(data))):
            compiled, end = decode_produce_response(buf, version)
            python, python_end = ProduceResponse.decode(buf, version)
            assert type(compiled) is ProduceResponse
            assert compiled == python == obj
            assert end == python_end == len(data)
            assert compiled.encode(version) == data
        framed = b"\xaa" * 5 + data + b"\xbb"
        assert decode_produce_response(framed, version, 5) == (obj, 5 + len(data))


@pytest.mark.parametrize(("version", "data"), ENCODINGS, ids=lambda x: str(x)[:8])
def test_truncations_fail_alike(version: int, data: bytes) -> None:
    check_every_truncation(ProduceResponse, data, version)


@pytest.mark.parametrize(("version", "data"), ENCODINGS, ids=lambda x: str(x)[:8])
def test_flipped_bytes_fail_or_succeed_alike(version: int, data: bytes) -> None:
    check_every_flipped_byte(ProduceResponse, data, version)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.sampled_from(list(VERSIONS)), data=st.binary(max_size=200))
def test_random_bytes_fail_or_succeed_alike(version: int, data: bytes) -> None:
    check_decoders_agree(ProduceResponse, data, version)


@settings(max_examples=300, deadline=None)
@given(pick=st.integers(min_value=0, max_value=len(ENCODINGS) - 1), edits=EDITS, cut=CUTS)
def test_damaged_encodings_fail_or_succeed_alike(pick: int, edits: list[Any], cut: int) -> None:
    version, data = ENCODINGS[pick]
    check_damaged(ProduceResponse, data, version, edits, cut)


def test_bad_versions_fail_alike() -> None:
    data = response(12, random.Random(5)).encode(12)
    for version in (-1, 2, 14, 2**15):
        check_decoders_agree(ProduceResponse, data, version)
