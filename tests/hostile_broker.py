"""A fake Kafka broker that answers correctly and then misbehaves on purpose, and the client
probes the hostile-broker suite (``tests/test_hostile_broker.py``) runs against it.

The broker is one asyncio server on 127.0.0.1 (port 0) in a thread of its own. It reads request
headers and bodies with kcore's generated request classes and writes answers with the generated
response classes (ApiVersions, Metadata naming itself as the only broker and the leader of one
topic, FindCoordinator, InitProducerId, Produce, Fetch of real record batches, ListOffsets and
the classic group APIs). For one API it can misbehave instead (:data:`FRAME_MISBEHAVIOURS`,
:data:`METADATA_VARIANTS`, :data:`FETCH_CORRUPTIONS`, :data:`FETCH_NO_PROGRESS`, ...); only
the misbehaving bytes are made by hand. It counts the requests of every API, so that a probe
can bound a retry storm.

Run as a script, this module is one probe's child process: it reads the probe's spec (JSON)
from stdin, starts a broker, runs one client operation against it and prints a JSON report as
its last line (see :func:`run_probe`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
import struct
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

from kcore.codec import RecordBatchBuilder, crc32c, decode_batches
from kcore.protocol import ApiKey, request_class, response_class
from kcore.protocol.framing import request_header_version, response_header_version
from kcore.protocol.messages.request_header import RequestHeader
from kcore.protocol.messages.response_header import ResponseHeader

TOPIC = "hostile"
RECORDS_IN_LOG = 5

# Each is what the broker does instead of answering a request of the chosen API.
FRAME_MISBEHAVIOURS = (
    "size_minus_one",  # the frame's size field is -1
    "size_2gib",  # the size field says 2 GiB (int32 max); nothing more comes
    "wrong_correlation_id",  # a well-formed answer to a request never sent
    "truncated",  # half the frame, then the connection closes
    "garbage",  # the body is random bytes of the right length
    "bit_flip",  # one bit of the body flipped
    "never_answers",  # reads the request and says nothing
    "byte_at_a_time",  # the right answer, one byte every few milliseconds
)
# Metadata answers (after the first) naming an odd broker as the leader of the topic.
METADATA_VARIANTS = (
    "host_label_too_long",
    "host_empty_label",
    "host_empty",
    "host_not_ascii",
    "port_negative",
    "port_above_65535",
    "port_zero",
    "node_id_int32_max",
    "node_id_above_2_30",
    "node_id_negative",
    "five_thousand_brokers",
    "leader_not_listed",
)
# Fetch answers whose record batch is corrupt.
FETCH_CORRUPTIONS = (
    "batch_crc_mismatch",  # one byte of the records flipped: the CRC no longer matches
    "batch_length_negative",  # the batch's length field is -1
    "batch_length_past_end",  # the batch's length points far past the end of the answer
    # The rest keep the CRC right (computed again), so that the decoder has to find the lie.
    "batch_magic_unknown",  # magic 3
    "batch_codec_unknown",  # compression codec 7 in the attributes
    "batch_record_count_lies",  # a million records announced, five there
    "batch_record_cut_short",  # the last record's bytes end early (the batch length agrees)
)
# Fetch answers that make no progress: whole, valid batches that all end before the fetch
# offset (a broker answers from the batch holding the offset on).
FETCH_NO_PROGRESS = (
    "batches_below_fetch_offset",  # past the end of the log, the whole log (offsets 0-4) again
)

# FindCoordinator answers naming an odd coordinator (node id, host, port).
COORDINATOR_VARIANTS = {
    "coordinator_host_label_too_long": (2, "a" * 64 + ".example.com", None),
    "coordinator_port_above_65535": (2, "127.0.0.1", 70000),
    "coordinator_port_negative": (2, "127.0.0.1", -1),
    "coordinator_node_id_above_2_30": (2**30 + 7, "127.0.0.1", None),
    "coordinator_node_id_int32_max": (2**31 - 1, "127.0.0.1", None),
    "coordinator_node_id_negative": (-5, "127.0.0.1", None),
    "coordinator_node_id_unknown": (77, "127.0.0.1", None),  # a node no Metadata listed
}

# Group answers whose embedded consumer-protocol bytes are noise.
GROUP_VARIANTS = (
    "join_member_metadata_garbage",  # the members' subscriptions the leader must read
    "sync_assignment_garbage",  # this member's assignment
    "join_member_metadata_garbage_v3",  # the same after a valid version (3)
    "sync_assignment_garbage_v3",
)

# Produce answers that do not account for what was sent.
PRODUCE_VARIANTS = (
    "produce_partition_missing",  # the topic is there, the partition is not
    "produce_topic_missing",  # no topic at all
    "produce_other_partition",  # an answer for partition 7, which was not sent to
)

# ListOffsets answers that leave the partition out, or answer an offset no log has.
LIST_OFFSETS_VARIANTS = (
    "list_offsets_partition_missing",
    "list_offsets_negative_offset",  # -5
)

# OffsetFetch answers that leave the partition out, or name a committed offset below -1.
OFFSET_FETCH_VARIANTS = (
    "offset_fetch_partition_missing",
    "offset_fetch_negative_offset",  # -5
)

# Answers that are well-formed but carry an error code in every error_code field, every time.
ERROR_ANSWERS = (
    "retriable_error",  # the error a broker gives while it cannot serve (RETRIABLE_ERROR_CODES)
    "unknown_server_error",  # UNKNOWN_SERVER_ERROR (-1)
    "undefined_error_code",  # a code no Kafka version defines
)
RETRIABLE_ERROR_CODES = {
    ApiKey.METADATA: 5,  # LEADER_NOT_AVAILABLE
    ApiKey.PRODUCE: 6,  # NOT_LEADER_OR_FOLLOWER
    ApiKey.FETCH: 6,
    ApiKey.LIST_OFFSETS: 6,
    ApiKey.FIND_COORDINATOR: 15,  # COORDINATOR_NOT_AVAILABLE
    ApiKey.JOIN_GROUP: 15,
    ApiKey.INIT_PRODUCER_ID: 14,  # COORDINATOR_LOAD_IN_PROGRESS
}
UNDEFINED_ERROR_CODE = 9999

# Peers that misbehave before any Kafka request: during the TLS handshake, or in SASL.
TLS_HANGUP = "tls_hangup_mid_handshake"  # reads the ClientHello, sends half a record, hangs up
SASL_GARBAGE_CHALLENGE = "sasl_garbage_challenge"  # SaslAuthenticate "succeeds" with noise

# Versions the fake broker takes: the highest that name topics by name (not by topic id),
# so that one answer shape serves every probe.
_MAX_VERSIONS = {
    ApiKey.PRODUCE: 12,
    ApiKey.FETCH: 12,
    ApiKey.LIST_OFFSETS: 8,
    ApiKey.METADATA: 12,
    ApiKey.OFFSET_COMMIT: 8,
    ApiKey.OFFSET_FETCH: 7,
    ApiKey.FIND_COORDINATOR: 4,
    ApiKey.JOIN_GROUP: 9,
    ApiKey.HEARTBEAT: 4,
    ApiKey.LEAVE_GROUP: 5,
    ApiKey.SYNC_GROUP: 5,
    ApiKey.API_VERSIONS: 3,
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.SASL_HANDSHAKE: 1,
    ApiKey.SASL_AUTHENTICATE: 2,
}
_BYTE_DELAY_S = 0.002
_EMPTY_FETCH_WAIT_S = 0.2


def _log_batch() -> bytes:
    """The topic's whole log: one record batch of RECORDS_IN_LOG records at offset 0."""
    builder = RecordBatchBuilder(base_offset=0)
    for i in range(RECORDS_IN_LOG):
        builder.append(f"k{i}".encode(), f"value-{i}".encode(), 1_700_000_000_000 + i)
    return builder.build()


# Offsets in a v2 record batch header (see Kafka's DefaultRecordBatch): what the corruptions
# below write over; the CRC (crc32c) covers the bytes from the attributes on.
_LENGTH_AT, _MAGIC_AT, _CRC_AT, _ATTRIBUTES_AT, _COUNT_AT = 8, 16, 17, 21, 57


def _corrupt(batch: bytes, how: str) -> bytes:
    out = bytearray(batch)
    if how == "batch_magic_unknown":
        out[_MAGIC_AT] = 3
    elif how == "batch_codec_unknown":
        out[_ATTRIBUTES_AT + 1] |= 0x07
    elif how == "batch_record_count_lies":
        struct.pack_into(">i", out, _COUNT_AT, 1_000_000)
    elif how == "batch_record_cut_short":
        del out[-3:]
        struct.pack_into(">i", out, _LENGTH_AT, len(out) - 12)
    if how in ("batch_codec_unknown", "batch_record_count_lies", "batch_record_cut_short"):
        struct.pack_into(">I", out, _CRC_AT, crc32c(bytes(out[_ATTRIBUTES_AT:])))
        return bytes(out)
    if how == "batch_magic_unknown":
        return bytes(out)
    if how == "batch_crc_mismatch":
        out[-1] ^= 0xFF  # inside the last record: covered by the CRC
    elif how == "batch_length_negative":
        struct.pack_into(">i", out, _LENGTH_AT, -1)
    elif how == "batch_length_past_end":
        struct.pack_into(">i", out, _LENGTH_AT, 1_000_000)
    else:
        raise ValueError(how)
    return bytes(out)


class FakeBroker:
    """A one-node cluster on 127.0.0.1 holding topic ``hostile`` (one partition, five records).

    ``api``/``misbehaviour``: requests of that API key get the misbehaviour (one of
    :data:`FRAME_MISBEHAVIOURS`, or for Metadata one of :data:`METADATA_VARIANTS`, for Fetch
    one of :data:`FETCH_CORRUPTIONS` or :data:`FETCH_NO_PROGRESS`) once ``answer_first`` of
    them were answered correctly. ``requests`` counts requests per API key (misbehaved on or
    not), ``connections`` the connections accepted. ``tls``: (certificate, key) PEM files to
    serve TLS with.
    """

    def __init__(
        self,
        api: int | None = None,
        misbehaviour: str | None = None,
        *,
        answer_first: int = 0,
        node_id: int = 1,
        seed: int = 26,
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.api = api
        self.misbehaviour = misbehaviour
        self.answer_first = answer_first
        self.node_id = node_id
        self.random = random.Random(seed)
        self.requests: Counter[int] = Counter()
        self.errors: list[str] = []
        self.connections = 0
        self.tls = tls
        self.port = 0
        self._log = _log_batch()
        self._next_produce_offset = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-broker", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake broker did not start")
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            ctx = None
            if self.tls is not None:
                ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ctx.load_cert_chain(*self.tls)
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(listen())
        self._loop.run_forever()

    def stop(self) -> None:
        """Stop listening. Open connections stay until the process ends: a probe's process
        ends right after, and the loop's thread is a daemon."""
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)

    # -- serving --------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.misbehaviour == TLS_HANGUP:
                await reader.read(5)  # the ClientHello's record header
                # a ServerHello's record header and the start of its body, then nothing more
                writer.write(bytes([0x16, 0x03, 0x03, 0x00, 0x7A, 0x02, 0x00, 0x00]))
                await writer.drain()
                return
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                if not await self._handle(frame, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:  # a bug of the fake's own: the probe is void, and says so
            self.errors.append(traceback.format_exc()[-2000:])
        finally:
            writer.close()

    async def _handle(self, frame: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to be closed."""
        api_key, version = struct.unpack_from(">hh", frame, 0)
        header, pos = RequestHeader.decode(frame, request_header_version(api_key, version), 0)
        request, _ = request_class(api_key).decode(frame, version, pos)
        self.requests[api_key] += 1
        misbehave = (
            api_key == self.api and self.requests[api_key] > self.answer_first
        ) and self.misbehaviour is not None
        variant = self.misbehaviour if misbehave else None
        shaped = variant in METADATA_VARIANTS or variant in FETCH_CORRUPTIONS
        shaped = shaped or variant in FETCH_NO_PROGRESS
        shaped = shaped or variant in PRODUCE_VARIANTS or variant in COORDINATOR_VARIANTS
        shaped = shaped or variant in GROUP_VARIANTS or variant in LIST_OFFSETS_VARIANTS
        shaped = shaped or variant in OFFSET_FETCH_VARIANTS
        if variant in ERROR_ANSWERS:
            code = {
                "retriable_error": RETRIABLE_ERROR_CODES.get(api_key, -1),
                "unknown_server_error": -1,
                "undefined_error_code": UNDEFINED_ERROR_CODE,
            }[variant]
            body = await self._answer(api_key, version, request, None, error_code=code)
            variant = None
        else:
            body = await self._answer(api_key, version, request, variant if shaped else None)
        head = ResponseHeader(correlation_id=header.correlation_id).encode(
            response_header_version(api_key, version)
        )
        if variant is None or shaped:
            await self._write(writer, _frame(head, body))
            return True
        return await self._misbehave(writer, variant, head, body)

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def _misbehave(
        self, writer: asyncio.StreamWriter, how: str, head: bytes, body: bytes
    ) -> bool:
        if how == "size_minus_one":
            await self._write(writer, struct.pack(">i", -1) + head + body)
        elif how == "size_2gib":
            await self._write(writer, struct.pack(">i", 0x7FFFFFFF) + head + body)
        elif how == "wrong_correlation_id":
            (corr,) = struct.unpack_from(">i", head, 0)
            wrong = struct.pack(">i", (corr + 1000) & 0x7FFFFFFF) + head[4:]
            await self._write(writer, _frame(wrong, body))
        elif how == "truncated":
            data = _frame(head, body)
            await self._write(writer, data[: max(5, len(data) // 2)])
            return False
        elif how == "garbage":
            await self._write(writer, _frame(head, self.random.randbytes(len(body))))
        elif how == "bit_flip":
            flipped = bytearray(body)
            bit = self.random.randrange(len(flipped) * 8)
            flipped[bit // 8] ^= 1 << (bit % 8)
            await self._write(writer, _frame(head, bytes(flipped)))
        elif how == "never_answers":
            pass
        elif how == "byte_at_a_time":
            for byte in _frame(head, body):
                await self._write(writer, bytes([byte]))
                await asyncio.sleep(_BYTE_DELAY_S)
        else:
            raise ValueError(f"unknown misbehaviour {how!r}")
        return True

    # -- correct answers ------------------------------------------------------------------------
    async def _answer(
        self, api_key: int, version: int, req: Any, variant: str | None, error_code: int = 0
    ) -> bytes:
        answer: Callable[[Any, int, str | None], Any] = getattr(
            self, f"_{ApiKey(api_key).name.lower()}"
        )
        result = answer(req, version, variant)
        if asyncio.iscoroutine(result):
            result = await result
        if isinstance(result, bytes):
            return result
        if error_code:
            _set_error_codes(result, error_code, version)
        return bytes(result.encode(version))

    def _api_versions(self, req: Any, version: int, variant: str | None) -> Any:
        cls = response_class(ApiKey.API_VERSIONS)
        from kcore.protocol.messages.api_versions_response import ApiVersion

        keys = [
            ApiVersion(api_key=k, min_version=0, max_version=v) for k, v in _MAX_VERSIONS.items()
        ]
        if version > _MAX_VERSIONS[ApiKey.API_VERSIONS]:
            return cls(error_code=35, api_keys=keys).encode(0)
        return cls(api_keys=keys)

    def _broker(self, node_id: int, host: str = "127.0.0.1", port: int | None = None) -> Any:
        from kcore.protocol.messages.metadata_response import MetadataResponseBroker

        return MetadataResponseBroker(
            node_id=node_id, host=host, port=self.port if port is None else port
        )

    def _metadata(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.metadata_response import (
            MetadataResponse,
            MetadataResponsePartition,
            MetadataResponseTopic,
        )

        brokers = [self._broker(self.node_id)]
        leader = self.node_id
        if variant is not None:
            # The odd broker leads the topic: the client has to connect to it.
            odd = {
                "host_label_too_long": (2, "a" * 64 + ".example.com", None),
                "host_empty_label": (2, "kafka..example.com", None),
                "host_empty": (2, "", None),
                "host_not_ascii": (2, "k\u00e4fka-\u2603.invalid", None),
                "port_negative": (2, "127.0.0.1", -1),
                "port_above_65535": (2, "127.0.0.1", 70000),
                "port_zero": (2, "127.0.0.1", 0),
                "node_id_int32_max": (2**31 - 1, "127.0.0.1", None),
                "node_id_above_2_30": (2**30 + 7, "127.0.0.1", None),
                "node_id_negative": (-5, "127.0.0.1", None),
            }.get(variant)
            if odd is not None:
                leader = odd[0]
                brokers = [self._broker(self.node_id), self._broker(*odd)]
            elif variant == "five_thousand_brokers":
                # node 1 is this broker; the others refuse connections (port 1)
                brokers += [self._broker(n, port=1) for n in range(2, 5001)]
            elif variant == "leader_not_listed":
                leader = 99
            else:
                raise ValueError(f"unknown metadata variant {variant!r}")
        coordinator = COORDINATOR_VARIANTS.get(self.misbehaviour or "")
        if coordinator is not None and self.misbehaviour != "coordinator_node_id_unknown":
            # As in a real cluster, the coordinator FindCoordinator names is a broker too.
            brokers.append(self._broker(*coordinator))
        names = [TOPIC] if req.topics is None else [t.name for t in req.topics]
        topics = [
            MetadataResponseTopic(
                name=name,
                partitions=[
                    MetadataResponsePartition(
                        partition_index=0,
                        leader_id=leader,
                        leader_epoch=0,
                        replica_nodes=[leader],
                        isr_nodes=[leader],
                        offline_replicas=[],
                    )
                ],
            )
            for name in names
        ]
        return MetadataResponse(
            brokers=brokers, cluster_id="hostile", controller_id=self.node_id, topics=topics
        )

    def _find_coordinator(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.find_coordinator_response import (
            Coordinator,
            FindCoordinatorResponse,
        )

        node_id, host, port = self.node_id, "127.0.0.1", self.port
        if variant is not None:
            node_id, host, odd_port = COORDINATOR_VARIANTS[variant]
            port = self.port if odd_port is None else odd_port
        if version < 4:
            return FindCoordinatorResponse(
                node_id=node_id, host=host, port=port, error_message=None
            )
        return FindCoordinatorResponse(
            coordinators=[
                Coordinator(key=key, node_id=node_id, host=host, port=port, error_message=None)
                for key in req.coordinator_keys
            ]
        )

    def _sasl_handshake(self, req: Any, version: int, variant: str | None) -> Any:
        return response_class(ApiKey.SASL_HANDSHAKE)(mechanisms=["PLAIN", "SCRAM-SHA-256"])

    def _sasl_authenticate(self, req: Any, version: int, variant: str | None) -> Any:
        # PLAIN: any credentials will do. SCRAM: the server-first message is noise.
        noise = self.random.randbytes(48) if self.misbehaviour == SASL_GARBAGE_CHALLENGE else b""
        return response_class(ApiKey.SASL_AUTHENTICATE)(error_message=None, auth_bytes=noise)

    def _init_producer_id(self, req: Any, version: int, variant: str | None) -> Any:
        return response_class(ApiKey.INIT_PRODUCER_ID)(producer_id=4242, producer_epoch=0)

    def _produce(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.produce_response import (
            PartitionProduceResponse,
            ProduceResponse,
            TopicProduceResponse,
        )

        topics = []
        for topic in req.topic_data:
            parts = []
            for part in topic.partition_data:
                base = self._next_produce_offset
                batches = decode_batches(part.records or b"")
                self._next_produce_offset += sum(b.record_count for b in batches)
                index = 7 if variant == "produce_other_partition" else part.index
                if variant != "produce_partition_missing":
                    parts.append(PartitionProduceResponse(index=index, base_offset=base))
            topics.append(TopicProduceResponse(name=topic.name, partition_responses=parts))
        return ProduceResponse(responses=[] if variant == "produce_topic_missing" else topics)

    async def _fetch(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.fetch_response import (
            FetchableTopicResponse,
            FetchResponse,
            PartitionData,
        )

        topics = []
        empty = True
        for topic in req.topics:
            parts = []
            for part in topic.partitions:
                records = b""
                if part.fetch_offset < RECORDS_IN_LOG:
                    records = self._log
                    if variant in FETCH_CORRUPTIONS:
                        records = _corrupt(self._log, variant)
                    empty = False
                elif variant in FETCH_NO_PROGRESS:
                    records = self._log  # every batch of it ends before the fetch offset
                    empty = False
                parts.append(
                    PartitionData(
                        partition_index=part.partition,
                        high_watermark=RECORDS_IN_LOG,
                        last_stable_offset=RECORDS_IN_LOG,
                        log_start_offset=0,
                        aborted_transactions=[],
                        records=records,
                    )
                )
            topics.append(FetchableTopicResponse(topic=topic.topic, partitions=parts))
        if empty:
            # As a broker does: an answer with nothing new waits up to max_wait_ms.
            await asyncio.sleep(min(req.max_wait_ms / 1000, _EMPTY_FETCH_WAIT_S))
        return FetchResponse(responses=topics)

    def _list_offsets(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.list_offsets_response import (
            ListOffsetsPartitionResponse,
            ListOffsetsResponse,
            ListOffsetsTopicResponse,
        )

        topics = [
            ListOffsetsTopicResponse(
                name=t.name,
                partitions=[
                    ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        timestamp=-1,
                        offset=-5
                        if variant == "list_offsets_negative_offset"
                        else 0
                        if p.timestamp == -2
                        else RECORDS_IN_LOG,
                        leader_epoch=0,
                    )
                    for p in t.partitions
                    if variant != "list_offsets_partition_missing"
                ],
            )
            for t in req.topics
        ]
        return ListOffsetsResponse(topics=topics)

    def _join_group(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.join_group_response import (
            JoinGroupResponse,
            JoinGroupResponseMember,
        )

        member = req.member_id or "member-1"
        protocol = req.protocols[0]
        metadata = protocol.metadata
        if variant == "join_member_metadata_garbage":
            metadata = self.random.randbytes(len(metadata))
        elif variant == "join_member_metadata_garbage_v3":
            metadata = b"\x00\x03" + self.random.randbytes(len(metadata))
        return JoinGroupResponse(
            generation_id=1,
            protocol_type=req.protocol_type,
            protocol_name=protocol.name,
            leader=member,
            member_id=member,
            members=[JoinGroupResponseMember(member_id=member, metadata=metadata)],
        )

    def _sync_group(self, req: Any, version: int, variant: str | None) -> Any:
        mine = [a.assignment for a in req.assignments if a.member_id == req.member_id]
        assignment = mine[0] if mine else b""
        if variant == "sync_assignment_garbage":
            assignment = self.random.randbytes(max(len(assignment), 24))
        elif variant == "sync_assignment_garbage_v3":
            assignment = b"\x00\x03" + self.random.randbytes(max(len(assignment), 24))
        return response_class(ApiKey.SYNC_GROUP)(
            protocol_type=req.protocol_type,
            protocol_name=req.protocol_name,
            assignment=assignment,
        )

    def _heartbeat(self, req: Any, version: int, variant: str | None) -> Any:
        return response_class(ApiKey.HEARTBEAT)()

    def _leave_group(self, req: Any, version: int, variant: str | None) -> Any:
        return response_class(ApiKey.LEAVE_GROUP)(members=[])

    def _offset_fetch(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.offset_fetch_response import (
            OffsetFetchResponse,
            OffsetFetchResponsePartition,
            OffsetFetchResponseTopic,
        )

        topics = [
            OffsetFetchResponseTopic(
                name=t.name,
                partitions=[
                    OffsetFetchResponsePartition(
                        partition_index=p,
                        committed_offset=-5 if variant == "offset_fetch_negative_offset" else -1,
                    )
                    for p in t.partition_indexes
                    if variant != "offset_fetch_partition_missing"
                ],
            )
            for t in (req.topics or [])
        ]
        return OffsetFetchResponse(topics=topics)

    def _offset_commit(self, req: Any, version: int, variant: str | None) -> Any:
        from kcore.protocol.messages.offset_commit_response import (
            OffsetCommitResponse,
            OffsetCommitResponsePartition,
            OffsetCommitResponseTopic,
        )

        topics = [
            OffsetCommitResponseTopic(
                name=t.name,
                partitions=[
                    OffsetCommitResponsePartition(partition_index=p.partition_index)
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ]
        return OffsetCommitResponse(topics=topics)


def _set_error_codes(message: Any, code: int, version: int) -> None:
    """Every ``error_code`` field ``version`` has, in ``message`` and the structs it holds,
    set to ``code``."""
    from kcore.protocol.types import Message

    for info in message.FIELDS:
        if info.attr == "error_code" and info.versions is not None:
            lo, hi = info.versions
            if lo <= version <= hi:
                message.error_code = code
    for field in message.__slots__:
        value = getattr(message, field, None)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, Message):
                _set_error_codes(item, code, version)


def _frame(head: bytes, body: bytes) -> bytes:
    return struct.pack(">i", len(head) + len(body)) + head + body


# -- probes (run in a child process) -----------------------------------------------------------

# The client settings every probe uses, short so that a probe ends in seconds. Retries wait
# RETRY_BACKOFF_S (retry and reconnect backoff alike, with no exponential growth), so an error
# that persists for T seconds may cost at most T / RETRY_BACKOFF_S requests plus a few.
RETRY_BACKOFF_S = 0.2
CLIENT_CONFIG: dict[str, Any] = {
    "request.timeout.ms": 1500,
    "retry.backoff.ms": 200,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 200,
    "reconnect.backoff.max.ms": 200,
    "socket.connection.setup.timeout.ms": 1000,
    "socket.connection.setup.timeout.max.ms": 1000,
}
PRODUCER_CONFIG = {
    **CLIENT_CONFIG,
    "delivery.timeout.ms": 4000,
    "max.block.ms": 4000,
    "linger.ms": 0,
}
CONSUMER_CONFIG = {
    **CLIENT_CONFIG,
    "default.api.timeout.ms": 4000,
    "fetch.max.wait.ms": 200,
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}
SENDS = 3
POLL_FOR_S = 5.0


def _produce(bootstrap: str, extra: dict[str, Any]) -> dict[str, Any]:
    from kcore.errors import KcoreError
    from kcore.producer import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, **extra})
    outcome: dict[str, Any] = {"sent": 0, "acked": 0, "failed": [], "unresolved": 0}
    try:
        futures = []
        for i in range(SENDS):
            futures.append(producer.send(TOPIC, value=f"v{i}".encode(), key=b"k"))
            outcome["sent"] += 1
        try:
            producer.flush(timeout=10)
        finally:
            for future in futures:
                if not future.done():
                    outcome["unresolved"] += 1
                    continue
                exc = future.exception()
                if exc is None:
                    outcome["acked"] += 1
                else:
                    outcome["failed"].append(_describe(exc))
                    if not isinstance(exc, KcoreError):
                        outcome["non_kcore_future_error"] = _describe(exc)
    finally:
        producer.close(timeout=5)
    return outcome


def _consume(bootstrap: str, extra: dict[str, Any], *, group: bool) -> dict[str, Any]:
    from kcore.consumer import Consumer
    from kcore.types import TopicPartition

    config = {"bootstrap.servers": bootstrap, **CONSUMER_CONFIG, **extra}
    if group:
        config["group.id"] = "hostile-group"
    consumer = Consumer(config)
    records = 0
    try:
        if group:
            consumer.subscribe([TOPIC])
        else:
            consumer.assign([TopicPartition(TOPIC, 0)])
        deadline = time.monotonic() + POLL_FOR_S
        while time.monotonic() < deadline:
            records += len(consumer.poll(timeout=0.5))
    finally:
        consumer.close()
    return {"records": records}


def _end_offsets(bootstrap: str, extra: dict[str, Any]) -> dict[str, Any]:
    from kcore.consumer import Consumer
    from kcore.types import TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, **CONSUMER_CONFIG, **extra})
    try:
        offsets = consumer.end_offsets([TopicPartition(TOPIC, 0)], timeout=6)
    finally:
        consumer.close()
    return {"end_offsets": {f"{tp.topic}-{tp.partition}": o for tp, o in offsets.items()}}


def _committed(bootstrap: str, extra: dict[str, Any]) -> dict[str, Any]:
    from kcore.consumer import Consumer
    from kcore.types import TopicPartition

    config = {"bootstrap.servers": bootstrap, **CONSUMER_CONFIG, "group.id": "hostile-group"}
    consumer = Consumer({**config, **extra})
    try:
        committed = consumer.committed([TopicPartition(TOPIC, 0)], timeout=6)
    finally:
        consumer.close()
    return {"committed": repr(committed)}


def _init_transactions(bootstrap: str, extra: dict[str, Any]) -> dict[str, Any]:
    from kcore.producer import Producer

    config = {"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, "transactional.id": "hostile"}
    producer = Producer({**config, **extra})
    try:
        producer.init_transactions(timeout=6)
    finally:
        producer.close(timeout=5)
    return {"initialized": True}


# The client operation that exercises each API.
OPERATIONS: dict[str, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
    "produce": _produce,
    "fetch": lambda b, e: _consume(b, e, group=False),
    "group": lambda b, e: _consume(b, e, group=True),
    "end_offsets": _end_offsets,
    "committed": _committed,
    "init_transactions": _init_transactions,
}
OPERATION_FOR_API = {
    ApiKey.API_VERSIONS: "end_offsets",
    ApiKey.METADATA: "produce",
    ApiKey.PRODUCE: "produce",
    ApiKey.INIT_PRODUCER_ID: "produce",
    ApiKey.FETCH: "fetch",
    ApiKey.LIST_OFFSETS: "end_offsets",
    ApiKey.FIND_COORDINATOR: "committed",
    ApiKey.JOIN_GROUP: "group",
}


def _is_foreign(exc: BaseException) -> bool:
    """Neither a kcore error nor an OS-level one: what bad input from a peer must never
    surface as, even only in the log."""
    from kcore.errors import KcoreError

    return not isinstance(exc, (KcoreError, OSError, asyncio.CancelledError))


class _ForeignExceptionLog(logging.Handler):
    """Collects the log records whose exception is not a kcore one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _is_foreign(exc):
            self.found.append(
                f"{record.name}: {record.getMessage()[:200]}: "
                f"{type(exc).__qualname__}: {str(exc)[:200]}"
            )


def _describe(exc: BaseException) -> dict[str, Any]:
    from kcore.errors import CorruptRecordError, KcoreError

    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "kcore": isinstance(exc, KcoreError),
        "corrupt_record": isinstance(exc, CorruptRecordError),
        "message": str(exc)[:600],
        "length": len(str(exc)),
    }


def run_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one probe: ``spec`` names ``api`` (an API key or None), ``misbehaviour``,
    ``answer_first``, ``operation`` and ``config`` (extra client settings)."""
    tls = spec.get("tls")
    broker = FakeBroker(
        spec.get("api"),
        spec.get("misbehaviour"),
        answer_first=spec.get("answer_first", 0),
        tls=tuple(tls) if tls else None,
    )
    bootstrap = broker.start()
    foreign_log = _ForeignExceptionLog()
    logging.getLogger().addHandler(foreign_log)
    report: dict[str, Any] = {"error": None}
    started = time.monotonic()
    try:
        report["outcome"] = OPERATIONS[spec["operation"]](bootstrap, spec.get("config", {}))
    except BaseException as exc:  # noqa: BLE001  (the report names whatever escaped)
        report["error"] = _describe(exc)
        report["traceback"] = traceback.format_exc()[-3000:]
    report["elapsed_s"] = time.monotonic() - started
    report["fake_broker_errors"] = broker.errors
    report["logged_foreign_exceptions"] = foreign_log.found[:20]
    report["requests"] = {ApiKey(k).name: n for k, n in broker.requests.items()}
    report["connections"] = broker.connections
    broker.stop()
    return report


if __name__ == "__main__":
    result = run_probe(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
