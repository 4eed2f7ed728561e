"""kcore: a Kafka client for Python whose hot path is compiled."""

from . import _codec  # noqa: F401  (fail at import if the compiled codec is missing)

__version__ = "0.1.0"
