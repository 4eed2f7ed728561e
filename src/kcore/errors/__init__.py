"""Every exception kcore raises.

``KafkaError`` subclasses, one per broker error code, are generated from the Java client's
``Errors`` enum (``tools/generate_errors.py``); the rest are kcore's own. ``error_for_code``
turns a response's error code into an exception instance (``None`` for 0); ``ERRORS_BY_CODE``,
``ERRORS_BY_NAME`` and ``RETRIABLE_CODES`` are the tables behind it. ``ErrorCode`` names every
code (``ErrorCode.NONE``, ``ErrorCode.NOT_COORDINATOR``, ...) for code that compares them."""

from . import _codes
from ._base import (
    AcknowledgementError,
    AdminOperationError,
    BootstrapError,
    BrokerConnectionError,
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    CrcMismatchError,
    DecompressionLimitError,
    InvalidLengthError,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    NoOffsetForPartitionError,
    ProtocolError,
    TransactionAbortedError,
    TransactionStateError,
    TruncatedDataError,
    UnsupportedCodecError,
    UnsupportedMagicError,
    VarintOverflowError,
    WakeupError,
)
from ._codes import *  # noqa: F403  (the per-code classes and tables; see _codes.__all__)
from ._codes import ERRORS_BY_CODE as ERRORS_BY_CODE
from ._codes import ERRORS_BY_NAME as ERRORS_BY_NAME
from ._codes import RETRIABLE_CODES as RETRIABLE_CODES
from ._codes import ErrorCode as ErrorCode
from ._codes import UnknownKafkaErrorCode as UnknownKafkaErrorCode
from ._codes import error_for_code as error_for_code
from ._truncation import LogTruncationError


def error_name(code: int) -> str:
    """The Kafka name of an error code (``"NOT_COORDINATOR"``), or the number if unknown."""
    err = error_for_code(code)
    return err.name if err is not None else str(code)


__all__ = [
    "AdminOperationError",
    "BootstrapError",
    "BrokerConnectionError",
    "CommitFailedError",
    "NoOffsetForPartitionError",
    "ConfigError",
    "CorruptRecordError",
    "CrcMismatchError",
    "DecompressionLimitError",
    "InvalidLengthError",
    "KafkaError",
    "KcoreError",
    "KcoreTimeoutError",
    "LogTruncationError",
    "ProtocolError",
    "TransactionAbortedError",
    "TransactionStateError",
    "TruncatedDataError",
    "UnsupportedCodecError",
    "UnsupportedMagicError",
    "VarintOverflowError",
    "WakeupError",
    "AcknowledgementError",
    "error_name",
]
__all__ += _codes.__all__
