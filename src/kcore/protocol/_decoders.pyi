"""Type stubs for the generated compiled decoders (src/kcore/protocol/_decoders.pyx)."""

from collections.abc import Callable
from typing import Any

DECODERS: dict[type[Any], Callable[[Any, int, int], tuple[Any, int]]]

def decode_metadata_response(
    buf: bytes | bytearray | memoryview,
    version: int,
    pos: int = 0,
    release_gil_every: int = 0,
) -> tuple[Any, int]: ...  # (MetadataResponse, next position)
