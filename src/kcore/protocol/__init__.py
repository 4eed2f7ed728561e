"""The Kafka wire protocol: generated message classes and sans-IO framing.

- ``kcore.protocol.messages``: one class per request, response, header and data type of Apache
  Kafka, generated from Kafka's JSON definitions (``tools/generate_protocol.py``). Modules are
  imported lazily: ``request_class(api_key)``, ``response_class(api_key)``,
  ``message_class(name)`` or plain attribute access (``messages.MetadataRequest``).
- :class:`KafkaProtocol`: frames requests and matches decoded responses to them, without I/O.
- :func:`choose_version`: the highest version kcore and a broker both support.
- :class:`ApiKey`: every API key by its Java name (``ApiKey.METADATA``), an ``IntEnum``.

Every generated class has ``encode(version) -> bytes``, ``encode_into(out, version)`` and the
classmethod ``decode(buf, version, pos=0) -> (obj, next_pos)``.
"""

from kcore.protocol import types
from kcore.protocol.framing import (
    InFlight,
    KafkaProtocol,
    Response,
    broker_versions,
    choose_version,
    negotiate_versions,
    request_header_version,
    response_header_version,
)
from kcore.protocol.messages import (
    API_KEYS,
    APIS,
    ApiInfo,
    ApiKey,
    message_class,
    request_class,
    response_class,
)

__all__ = [
    "API_KEYS",
    "APIS",
    "ApiInfo",
    "ApiKey",
    "InFlight",
    "KafkaProtocol",
    "Response",
    "broker_versions",
    "choose_version",
    "message_class",
    "negotiate_versions",
    "request_class",
    "request_header_version",
    "response_class",
    "response_header_version",
    "types",
]
