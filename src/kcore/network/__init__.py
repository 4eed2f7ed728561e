"""I/O that drives the sans-IO protocol layer over sockets: one asyncio connection per broker
(:class:`BrokerConnection`), the event-loop thread the synchronous APIs run it on
(:class:`LoopThread`), and a blocking connection for tools and tests that want no loop."""

from .address import format_address, parse_address
from .backoff import ExponentialBackoff
from .blocking import BlockingBrokerConnection
from .connection import BrokerConnection, ConnectionSettings
from .loop_thread import LoopThread

__all__ = [
    "BlockingBrokerConnection",
    "BrokerConnection",
    "ConnectionSettings",
    "ExponentialBackoff",
    "LoopThread",
    "format_address",
    "parse_address",
]
