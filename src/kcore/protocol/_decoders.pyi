"""Type stubs for the generated compiled decoders (src/kcore/protocol/_decoders.pyx)."""

from collections.abc import Callable
from typing import Any

DECODERS: dict[type[Any], Callable[[Any, int, int], tuple[Any, int]]]

def decode_metadata_response(
    buf: bytes | bytearray | memoryview,
    version: int,
    pos: int = 0,
    pause_every: int = 0,
    pause: Callable[[], object] | None = None,
) -> tuple[Any, int]: ...  # (MetadataResponse, next position)
