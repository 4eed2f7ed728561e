"""Type stubs for the generated compiled decoders (src/kcore/protocol/_decoders.pyx)."""

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

DECODERS: dict[type[Any], Callable[[Any, int, int], tuple[Any, int]]]

class StructArray(Sequence[Any]):
    """A decoded array of structs whose elements are made on first use (see the module)."""

    @property
    def element_type(self) -> type[Any]: ...
    @property
    def elements_made(self) -> bool: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...

def decode_metadata_response(
    buf: bytes | bytearray | memoryview,
    version: int,
    pos: int = 0,
    pause_every: int = 0,
    pause: Callable[[], object] | None = None,
) -> tuple[Any, int]: ...  # (MetadataResponse, next position)
def decode_produce_response(
    buf: bytes | bytearray | memoryview,
    version: int,
    pos: int = 0,
    pause_every: int = 0,
    pause: Callable[[], object] | None = None,
) -> tuple[Any, int]: ...  # (ProduceResponse, next position)
