"""Every exception kcore raises.

``KafkaError`` subclasses, one per broker error code, are generated from the Java client's
``Errors`` enum (``tools/generate_errors.py``); the rest are kcore's own."""

from ._base import (
    ConfigError,
    CorruptRecordError,
    CrcMismatchError,
    DecompressionLimitError,
    InvalidLengthError,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    ProtocolError,
    TruncatedDataError,
    UnsupportedCodecError,
    UnsupportedMagicError,
    VarintOverflowError,
)

__all__ = [
    "ConfigError",
    "CorruptRecordError",
    "CrcMismatchError",
    "DecompressionLimitError",
    "InvalidLengthError",
    "KafkaError",
    "KcoreError",
    "KcoreTimeoutError",
    "ProtocolError",
    "TruncatedDataError",
    "UnsupportedCodecError",
    "UnsupportedMagicError",
    "VarintOverflowError",
]
