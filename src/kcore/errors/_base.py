"""kcore's exception hierarchy: the bases the generated Kafka error classes hang from, and kcore's
own errors (configuration, corrupt bytes, timeouts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KcoreError(Exception):
    """Base of every exception kcore raises on purpose."""


class KafkaError(KcoreError):
    """An error code returned by a Kafka broker. One subclass per code lives in
    ``kcore.errors``, generated from the Java client's ``Errors`` enum; ``code``, ``name`` and
    ``retriable`` match it."""

    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False
    default_message: str = ""

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.default_message or self.name
        super().__init__(f"[{self.name} ({self.code})] {self.message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from the message, not from ``args`` (the formatted text, which __init__ would
        # wrap a second time); ``__dict__`` carries any other attributes (e.g. ``__notes__``).
        return type(self), (self.message,), self.__dict__

    def with_message(self, message: str) -> KafkaError:
        """The same error (class and code) with ``message``, e.g. naming the call or the
        partition it is about."""
        return type(self)(message)


class ConfigError(KcoreError, ValueError):
    """A configuration key that does not exist, or a value that is not allowed for it."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # ``args`` holds one formatted string, which would not fit __init__'s two parameters.
        return type(self), (self.key, self.message), self.__dict__


class KcoreTimeoutError(KcoreError, TimeoutError):
    """An operation did not finish within its configured timeout."""


class CommitFailedError(KcoreError):
    """An offset commit that cannot succeed because the group rebalanced (or this member was
    removed) since the offsets were consumed: the partitions may now be another member's. As
    Java's ``CommitFailedException``: the consumer rejoins at its next poll."""


class WakeupError(KcoreError):
    """``Consumer.wakeup()`` was called (from another thread) during or before a blocking call
    (Java's ``WakeupException``)."""


class AcknowledgementError(KcoreError):
    """A share consumer's record acknowledged the wrong way: twice, one this consumer did not
    deliver, in implicit mode, after close, or (explicit mode) polling with records of the
    previous poll left unacknowledged."""


class NoOffsetForPartitionError(KcoreError):
    """Partitions have no position and ``auto.offset.reset`` is ``none``: the caller must
    seek them (Java's ``NoOffsetForPartitionException``). ``partitions`` names them."""

    def __init__(self, partitions: list[Any]) -> None:
        self.partitions = list(partitions)
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in self.partitions)
        super().__init__(f"no position for {names} and auto.offset.reset is none: seek first")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.partitions,)


class ProtocolError(KcoreError):
    """Bytes from a broker that do not parse as the response they claim to be, or a response
    that does not match any request in flight."""


class CorruptRecordError(KcoreError):
    """Record bytes that cannot be decoded. ``position`` is the byte offset in the input where
    the problem was found (-1 when unknown); subclasses name the case."""

    def __init__(self, message: str, position: int = -1) -> None:
        self.position = position
        where = f" at byte {position}" if position >= 0 else ""
        super().__init__(f"{message}{where}")


class TruncatedDataError(CorruptRecordError):
    """The input ends before the structure it starts is complete."""


class InvalidLengthError(CorruptRecordError):
    """A length field is negative (where that is not allowed) or points past the end."""


class CrcMismatchError(CorruptRecordError):
    """A batch's stored CRC does not match the CRC of its bytes."""


class UnsupportedMagicError(CorruptRecordError):
    """A record batch or message set with a magic byte kcore does not know."""


class UnsupportedCodecError(CorruptRecordError):
    """A compression codec id that is not none, gzip, snappy, lz4 or zstd."""


class VarintOverflowError(CorruptRecordError):
    """A varint longer than its type allows."""


class DecompressionLimitError(CorruptRecordError):
    """A compressed batch that expands past the allowed size (a decompression bomb)."""


class BrokerConnectionError(KcoreError, ConnectionError):
    """A connection to a broker could not be set up or was lost.

    ``address`` is the ``host:port`` dialled, ``stage`` where it failed: ``"dns"``,
    ``"connect"``, ``"tls"``, ``"api_versions"``, ``"authentication"`` or ``"io"`` (an
    established connection that broke). ``transient``: the peer hung up or went quiet during
    the TLS or SASL handshake, which another attempt may get past (a broker restarting, a load
    balancer), unlike an untrusted certificate or rejected credentials. Never carries
    credentials."""

    def __init__(self, address: str, stage: str, reason: str, *, transient: bool = False) -> None:
        self.address = address
        self.stage = stage
        self.reason = reason
        self.transient = transient
        super().__init__(f"{address}: {stage} failed: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.address, self.stage, self.reason), self.__dict__


class BootstrapError(KcoreError, ConnectionError):
    """No bootstrap server answered. ``attempts`` lists ``(address, reason)`` for every address
    tried, in the order tried; the message names the first ``SHOWN`` of them and counts the
    rest (a list of thousands would make a message nobody reads)."""

    SHOWN = 5

    def __init__(self, attempts: list[tuple[str, str]], timeout_s: float | None = None) -> None:
        self.attempts = list(attempts)
        self.timeout_s = timeout_s
        within = f" within {timeout_s:g}s" if timeout_s is not None else ""
        lines = "; ".join(f"{a}: {r}" for a, r in self.attempts[: self.SHOWN])
        rest = len(self.attempts) - self.SHOWN
        if rest > 0:
            lines += f"; and {rest} more (see .attempts)"
        super().__init__(f"no bootstrap server answered{within} ({lines or 'no address to try'})")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.attempts, self.timeout_s), self.__dict__


class TransactionStateError(KcoreError):
    """A transactional producer call its state does not allow: a send outside a transaction, a
    commit without ``begin_transaction``, a second ``init_transactions``, ... or a call made
    after the transaction failed. ``cause`` is the error that failed it (None for a call made
    in the wrong state); ``abortable`` says whether ``abort_transaction()`` recovers."""

    def __init__(
        self, message: str, cause: BaseException | None = None, abortable: bool = False
    ) -> None:
        self.message = message
        self.cause = cause
        self.abortable = abortable
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message, self.cause, self.abortable), self.__dict__


class TransactionAbortedError(KcoreError):
    """A record of a transaction that was aborted (or failed) before the record was sent."""


class AdminOperationError(KcoreError):
    """Some items of an operation on many items failed (an admin operation, or a lookup of
    many partitions' offsets). ``errors`` maps each failed item (topic name,
    ``TopicPartition``, ``ConfigResource``) to its error: the broker's ``KafkaError``, or what
    kept it from an answer (``KcoreTimeoutError``, ``BrokerConnectionError``); ``results``
    holds what succeeded (a dict, empty for operations that return nothing per item)."""

    def __init__(self, operation: str, errors: Mapping[Any, KcoreError], results: Any = None):
        self.operation = operation
        self.errors = dict(errors)
        self.results = {} if results is None else results
        items = "; ".join(f"{_item_text(k)}: {v}" for k, v in self.errors.items())
        super().__init__(f"{operation} failed for {len(self.errors)} item(s): {items}")


def _item_text(item: Any) -> str:
    # By shape, not type: the item types (TopicPartition, ConfigResource) live above errors.
    if hasattr(item, "topic") and hasattr(item, "partition"):
        return f"{item.topic}-{item.partition}"
    if isinstance(item, tuple) and hasattr(item, "type") and hasattr(item, "name"):
        return f"{item.type} {item.name}"
    return str(item)
