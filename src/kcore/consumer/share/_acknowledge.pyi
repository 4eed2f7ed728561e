"""Type stubs for the compiled acknowledgement state and per-record acknowledge
(src/kcore/consumer/share/_acknowledge.pyx)."""

from collections.abc import Callable
from typing import Any

class StateLock:
    epoch: int
    def __enter__(self) -> StateLock: ...
    def __exit__(self, *exc: object) -> None: ...

class AcknowledgementState:
    _lock: StateLock
    _delivered: dict[tuple[str, int], set[int]]
    _pending: dict[tuple[str, int], dict[int, int]]
    _renewing: dict[tuple[str, int], set[int]]
    def __init__(self) -> None: ...

class RecordAcknowledger:
    open: bool
    def __init__(
        self,
        state: AcknowledgementState,
        record_type: type[tuple[Any, ...]],
        kinds: dict[int, int],
        renew: int,
        accept: int,
        fallback: Callable[[Any, Any], None],
        open: bool,
    ) -> None: ...
    def acknowledge(self, record: Any, type: Any = ...) -> None: ...
