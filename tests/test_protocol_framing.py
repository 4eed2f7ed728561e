"""The sans-IO framing layer: request frames, response matching and version negotiation.
Frames are written out by hand from the protocol guide; no broker needed."""

from __future__ import annotations

import struct
import uuid

import pytest

from kcore.errors import ProtocolError, UnsupportedVersionError
from kcore.protocol import (
    KafkaProtocol,
    Response,
    broker_versions,
    choose_version,
    negotiate_versions,
    request_header_version,
    response_header_version,
)
from kcore.protocol import messages as m


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def api_versions_response_v3(correlation_id: int) -> bytes:
    """ApiVersionsResponse v3 listing Metadata 0-12 and ApiVersions 0-3, behind header v0."""
    body = (
        b"\x00\x00"  # ErrorCode
        + b"\x03"  # ApiKeys: 2 elements (compact)
        + b"\x00\x03\x00\x00\x00\x0c\x00"  # Metadata 0-12, no tags
        + b"\x00\x12\x00\x00\x00\x03\x00"  # ApiVersions 0-3, no tags
        + b"\x00\x00\x00\x00"  # ThrottleTimeMs
        + b"\x00"  # no tagged fields
    )
    return frame(struct.pack(">i", correlation_id) + body)  # header v0: no tagged fields


# ---------------------------------------------------------------------------------------------
# Sending


def test_request_frame_header_v1() -> None:
    proto = KafkaProtocol("cli")
    corr, data = proto.send_request(m.MetadataRequest(topics=None), 1)
    assert corr == 0
    payload = (
        b"\x00\x03"  # api key 3
        + b"\x00\x01"  # version 1
        + b"\x00\x00\x00\x00"  # correlation id
        + b"\x00\x03cli"  # client id (STRING)
        + b"\xff\xff\xff\xff"  # topics: null
    )
    assert data == frame(payload)
    assert proto.in_flight[0].api_key == 3


@pytest.mark.parametrize("version", [3, 9, 13])  # non-flexible, flexible, topic ids
def test_a_produce_request_s_large_batches_are_spliced_not_copied(version: int) -> None:
    """send_request_segments: the same bytes as send_request, with each records field of at
    least SPLICE_MIN bytes listed as the very object the request holds (no copy), smaller ones
    copied into the frame. A batch filled to Java's default 16 KiB batch.size ends a little
    under it, and is spliced too."""
    from kcore.protocol.messages.produce_request import PartitionProduceData, TopicProduceData

    big, other, small, near = b"a" * 20000, bytes(range(256)) * 100, b"s" * 100, b"n" * 16000
    topics = [
        TopicProduceData(
            name="t",
            topic_id=uuid.UUID(int=7),
            partition_data=[
                PartitionProduceData(index=0, records=big),
                PartitionProduceData(index=1, records=small),
                PartitionProduceData(index=2, records=other),
                PartitionProduceData(index=3, records=near),
            ],
        )
    ]
    request = m.ProduceRequest(acks=-1, timeout_ms=1000, topic_data=topics)
    _, whole = KafkaProtocol("c").send_request(request, version)
    corr, segments = KafkaProtocol("c").send_request_segments(request, version)
    assert b"".join(segments) == whole
    assert [s for s in segments if s is big or s is other or s is near] == [big, other, near]
    assert len(segments) == 7
    _, plain = KafkaProtocol("c").send_request_segments(m.MetadataRequest(topics=None), 1)
    assert len(plain) == 1
    # A bytearray may be changed by its owner before the frame is written: copied, not spliced.
    mutable = m.ProduceRequest(
        acks=-1,
        timeout_ms=1000,
        topic_data=[
            TopicProduceData(
                name="t", partition_data=[PartitionProduceData(index=0, records=bytearray(big))]
            )
        ],
    )
    _, copied = KafkaProtocol("c").send_request_segments(mutable, 9)
    assert len(copied) == 1 and b"".join(copied) == KafkaProtocol("c").send_request(mutable, 9)[1]


def test_a_failed_encode_leaves_no_splice_behind() -> None:
    from kcore.protocol.types import FrameBuffer, run_encoder, write_records

    out = FrameBuffer(4)

    def encode(obj, out, version):
        out += b"head"
        write_records(out, b"r" * 20000)
        assert out.splices
        raise ValueError("bad field")

    with pytest.raises(ValueError, match="bad field"):
        run_encoder(m.ApiVersionsRequest(), encode, out, 0)
    assert bytes(out) == bytes(4) and out.splices == []


def test_request_frame_header_v2_keeps_client_id_non_compact() -> None:
    proto = KafkaProtocol("cli")
    proto.send_request(m.MetadataRequest(), 1)
    corr, data = proto.send_request(
        m.ApiVersionsRequest(client_software_name="k", client_software_version="1"), 3
    )
    assert corr == 1
    payload = (
        b"\x00\x12\x00\x03\x00\x00\x00\x01"
        + b"\x00\x03cli"  # never compact, even in header v2
        + b"\x00"  # header tagged fields
        + b"\x02k\x021\x00"  # body: two compact strings and its tagged fields
    )
    assert data == frame(payload)


def test_request_header_matches_the_generated_header_class() -> None:
    for client_id in ("my-client", None, ""):
        proto = KafkaProtocol(client_id)
        proto._next_correlation_id = 77
        for version in (1, 12):
            corr, data = proto.send_request(m.MetadataRequest(), version)
            header_version = request_header_version(3, version)
            header = m.RequestHeader(
                request_api_key=3,
                request_api_version=version,
                correlation_id=corr,
                client_id=client_id,
            )
            expected = header.encode(header_version) + m.MetadataRequest().encode(version)
            assert data[4:] == expected


def test_null_client_id() -> None:
    _, data = KafkaProtocol(None).send_request(m.ApiVersionsRequest(), 0)
    assert data == frame(b"\x00\x12\x00\x00\x00\x00\x00\x00\xff\xff")


def test_correlation_ids_wrap_at_int32_max() -> None:
    proto = KafkaProtocol("c")
    proto._next_correlation_id = 0x7FFFFFFF
    assert proto.send_request(m.ApiVersionsRequest(), 0)[0] == 0x7FFFFFFF
    assert proto.send_request(m.ApiVersionsRequest(), 0)[0] == 0


def test_unsupported_request_version_changes_nothing() -> None:
    proto = KafkaProtocol("c")
    with pytest.raises(UnsupportedVersionError):
        proto.send_request(m.MetadataRequest(), 99)
    with pytest.raises(UnsupportedVersionError):
        proto.send_request(m.MetadataRequest(), 100000)
    with pytest.raises(UnsupportedVersionError):  # a non-ignorable field v0 lacks
        proto.send_request(m.MetadataRequest(allow_auto_topic_creation=False), 0)
    assert proto.send_request(m.MetadataRequest(), 0)[0] == 0
    assert list(proto.in_flight) == [0]


def test_produce_with_acks_0_expects_no_response() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.ProduceRequest(acks=0), 9)
    assert corr not in proto.in_flight
    corr, _ = proto.send_request(m.ProduceRequest(acks=1), 9)
    assert corr in proto.in_flight
    corr, _ = proto.send_request(m.MetadataRequest(), 4, expect_response=False)
    assert corr not in proto.in_flight


def test_only_requests_can_be_sent() -> None:
    with pytest.raises(TypeError):
        KafkaProtocol("c").send_request(m.MetadataResponse(), 1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Receiving


def test_api_versions_response_uses_header_v0_even_when_flexible() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    [resp] = proto.receive_data(api_versions_response_v3(corr))
    assert isinstance(resp, Response)
    assert (resp.correlation_id, resp.api_key, resp.api_version) == (corr, 18, 3)
    assert broker_versions(resp.body) == {3: (0, 12), 18: (0, 3)}
    assert proto.in_flight == {}


def test_flexible_response_header_v1_skips_tagged_fields() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.MetadataRequest(), 12)
    body = m.MetadataResponse(throttle_time_ms=5, cluster_id="cl", controller_id=1)
    # Response header v1: correlation id + tagged fields (here one unknown tag 3, 1 byte).
    header = struct.pack(">i", corr) + b"\x01\x03\x01z"
    [resp] = proto.receive_data(frame(header + body.encode(12)))
    assert resp.body == body


def test_non_flexible_response_header_v0() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.MetadataRequest(), 8)
    body = m.MetadataResponse(throttle_time_ms=5, cluster_id="cl", controller_id=1)
    [resp] = proto.receive_data(frame(struct.pack(">i", corr) + body.encode(8)))
    assert resp.body == body and resp.api_version == 8


def test_partial_frames_are_buffered() -> None:
    proto = KafkaProtocol("c")
    a, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    b, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    data = api_versions_response_v3(a) + api_versions_response_v3(b)
    got: list[Response] = []
    for i in range(len(data)):
        got += proto.receive_data(data[i : i + 1])
        if i < len(data) // 2 - 1:
            assert got == []
    assert [r.correlation_id for r in got] == [a, b]
    assert proto.buffered == 0


def test_many_frames_in_one_chunk_and_a_partial_tail() -> None:
    proto = KafkaProtocol("c")
    ids = [proto.send_request(m.ApiVersionsRequest(), 3)[0] for _ in range(3)]
    data = b"".join(api_versions_response_v3(c) for c in ids)
    got = proto.receive_data(memoryview(data[:-5]))
    assert [r.correlation_id for r in got] == ids[:2]
    assert proto.buffered == len(api_versions_response_v3(0)) - 5
    assert [r.correlation_id for r in proto.receive_data(data[-5:])] == ids[2:]


def test_responses_are_matched_by_correlation_id_not_order() -> None:
    proto = KafkaProtocol("c")
    meta, _ = proto.send_request(m.MetadataRequest(), 12)
    api, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    meta_frame = frame(struct.pack(">i", meta) + b"\x00" + m.MetadataResponse().encode(12))
    got = proto.receive_data(api_versions_response_v3(api) + meta_frame)
    assert [(r.correlation_id, r.api_key) for r in got] == [(api, 18), (meta, 3)]
    assert isinstance(got[1].body, m.MetadataResponse)


def test_records_stay_valid_after_more_data_arrives() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.FetchRequest(), 17)
    f = m.FetchResponse
    part = f.PartitionData(partition_index=0, records=b"batch-bytes")
    body = f(responses=[f.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=[part])])
    [resp] = proto.receive_data(frame(struct.pack(">i", corr) + b"\x00" + body.encode(17)))
    records = resp.body.responses[0].partitions[0].records
    assert isinstance(records, memoryview)
    proto.send_request(m.ApiVersionsRequest(), 3)
    proto.receive_data(api_versions_response_v3(1)[:7])  # reuses the receive buffer
    assert records == b"batch-bytes"


def _fetch_response_frame(corr: int, records: bytes) -> bytes:
    f = m.FetchResponse
    part = f.PartitionData(partition_index=0, records=records)
    body = f(responses=[f.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=[part])])
    return frame(struct.pack(">i", corr) + b"\x00" + body.encode(17))


def test_a_frame_bigger_than_the_scratch_buffer_is_read_into_its_own_buffer() -> None:
    """A big response (a fetch's megabytes) goes from the reads straight into one buffer of
    its own, whose part the records are: get_buffer hands out the rest of it, read by read;
    a small response after it is back in the scratch buffer."""
    from kcore.protocol.framing import SCRATCH_SIZE

    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.FetchRequest(), 17)
    api, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    records = bytes(range(256)) * (3 * SCRATCH_SIZE // 256)
    data = _fetch_response_frame(corr, records) + api_versions_response_v3(api)
    got: list[Response] = []
    pos = 0
    targets = []
    while pos < len(data):
        target = proto.get_buffer(-1)
        targets.append(target)
        n = min(len(target), 10_000, len(data) - pos)
        target[:n] = data[pos : pos + n]
        pos += n
        got += proto.buffer_updated(n)
        if pos < len(data) and not got:
            assert proto.buffered == pos
    assert [r.correlation_id for r in got] == [corr, api]
    assert proto.buffered == 0
    view = got[0].body.responses[0].partitions[0].records
    assert view == records
    # the reads within the frame landed in the buffer the records are a view of
    assert any(t.obj is view.obj for t in targets)
    assert isinstance(got[1].body, m.ApiVersionsResponse)


def test_a_big_frame_through_receive_data_in_odd_pieces() -> None:
    from kcore.protocol.framing import SCRATCH_SIZE

    proto = KafkaProtocol("c")
    ids = [proto.send_request(m.FetchRequest(), 17)[0] for _ in range(3)]
    payloads = [b"x" * (SCRATCH_SIZE - 100), b"y" * (SCRATCH_SIZE * 2 + 7), b"z" * 10]
    data = b"".join(_fetch_response_frame(c, r) for c, r in zip(ids, payloads, strict=True))
    got: list[Response] = []
    for i in range(0, len(data), 4099):
        got += proto.receive_data(data[i : i + 4099])
    assert [r.correlation_id for r in got] == ids
    assert [bytes(r.body.responses[0].partitions[0].records) for r in got] == payloads
    assert proto.buffered == 0
    got = []
    proto2 = KafkaProtocol("c")
    ids = [proto2.send_request(m.FetchRequest(), 17)[0] for _ in range(3)]
    data = b"".join(_fetch_response_frame(c, r) for c, r in zip(ids, payloads, strict=True))
    got = proto2.receive_data(data)  # all at once
    assert [bytes(r.body.responses[0].partitions[0].records) for r in got] == payloads


def test_a_bad_frame_after_a_big_one_is_raised_after_it() -> None:
    from kcore.protocol.framing import SCRATCH_SIZE

    proto = KafkaProtocol("c", max_frame_size=1 << 20)
    corr, _ = proto.send_request(m.FetchRequest(), 17)
    data = _fetch_response_frame(corr, b"r" * (SCRATCH_SIZE + 1)) + b"\xff\xff\xff\xff" + b"\0" * 8
    [resp] = proto.receive_data(data)
    assert resp.correlation_id == corr
    with pytest.raises(ProtocolError, match="frame size"):
        proto.receive_data(b"")
    with pytest.raises(ProtocolError, match="frame size"):
        proto.buffer_updated(0)


def test_a_big_frame_size_over_the_limit_is_refused_before_any_buffer() -> None:
    proto = KafkaProtocol("c", max_frame_size=1 << 20)
    with pytest.raises(ProtocolError, match="frame size"):
        proto.receive_data(struct.pack(">i", (1 << 20) + 1) + b"\0" * 100)


def test_unknown_correlation_id() -> None:
    proto = KafkaProtocol("c")
    with pytest.raises(ProtocolError, match="correlation id 5"):
        proto.receive_data(api_versions_response_v3(5))
    with pytest.raises(ProtocolError):  # the connection stays broken
        proto.receive_data(b"")


def test_body_that_does_not_parse() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.MetadataRequest(), 12)
    with pytest.raises(ProtocolError, match="MetadataResponse"):
        proto.receive_data(frame(struct.pack(">i", corr) + b"\x00\x00\x00"))


def test_trailing_bytes_after_the_body() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.MetadataRequest(), 12)
    data = struct.pack(">i", corr) + b"\x00" + m.MetadataResponse().encode(12) + b"junk"
    with pytest.raises(ProtocolError, match="unread"):
        proto.receive_data(frame(data))


def test_bad_frame_size() -> None:
    for size in (b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x02"):
        proto = KafkaProtocol("c", max_frame_size=1 << 20)
        with pytest.raises(ProtocolError, match="frame size"):
            proto.receive_data(size + b"\x00" * 8)


def test_good_responses_before_a_bad_frame_are_returned_first() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    got = proto.receive_data(api_versions_response_v3(corr) + api_versions_response_v3(99))
    assert [r.correlation_id for r in got] == [corr]
    with pytest.raises(ProtocolError, match="99"):
        proto.receive_data(b"")


def test_api_versions_falls_back_to_v0_for_an_old_broker() -> None:
    """A broker that does not know ApiVersionsRequest v4 answers UNSUPPORTED_VERSION (35) in
    an ApiVersionsResponse v0 (KIP-511), listing what it supports."""
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.ApiVersionsRequest(), 4)
    v0 = m.ApiVersionsResponse(
        error_code=35,
        api_keys=[m.ApiVersionsResponse.ApiVersion(api_key=18, min_version=0, max_version=2)],
    ).encode(0)
    [resp] = proto.receive_data(frame(struct.pack(">i", corr) + v0))
    assert resp.api_version == 0 and resp.body.error_code == 35
    assert choose_version(18, resp.body) == 2


def test_forget() -> None:
    proto = KafkaProtocol("c")
    corr, _ = proto.send_request(m.ApiVersionsRequest(), 3)
    proto.forget(corr)
    with pytest.raises(ProtocolError):
        proto.receive_data(api_versions_response_v3(corr))


# ---------------------------------------------------------------------------------------------
# Header versions and version negotiation


def test_header_versions() -> None:
    assert request_header_version(3, 8) == 1 and request_header_version(3, 9) == 2
    assert response_header_version(3, 8) == 0 and response_header_version(3, 9) == 1
    assert request_header_version(18, 3) == 2
    assert response_header_version(18, 3) == 0 and response_header_version(18, 4) == 0
    assert request_header_version(17, 1) == 1  # SaslHandshake is never flexible


def test_choose_version() -> None:
    broker = {3: (0, 12), 18: (0, 3), 1: (4, 99), 22: (0, 99)}
    assert choose_version(3, broker) == 12  # the broker's max
    assert choose_version(1, broker) == 18  # kcore's max
    assert choose_version(3, broker, max_version=9) == 9
    # InitProducerId's newest version is marked unstable in Kafka's schema.
    assert choose_version(22, broker) == m.APIS[22].valid_versions[1] - 1
    assert choose_version(22, broker, allow_unstable=True) == m.APIS[22].valid_versions[1]
    with pytest.raises(UnsupportedVersionError):
        choose_version(0, broker)  # the broker does not list Produce
    with pytest.raises(UnsupportedVersionError):
        choose_version(3, {3: (14, 20)})  # no overlap
    with pytest.raises(UnsupportedVersionError):
        choose_version(3, broker, min_version=13)
    with pytest.raises(UnsupportedVersionError):
        choose_version(7, {7: (0, 3)})  # ControlledShutdown: kcore has no version of it


def test_negotiate_versions() -> None:
    resp = m.ApiVersionsResponse(
        api_keys=[
            m.ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in [(0, 3, 11), (3, 0, 12), (7, 0, 3), (9999, 0, 1)]
        ]
    )
    assert negotiate_versions(resp) == {0: 11, 3: 12}
    assert negotiate_versions(resp, [3]) == {3: 12}
