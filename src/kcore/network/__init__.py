"""I/O that drives the sans-IO protocol layer over sockets."""

from .connection import BrokerConnection

__all__ = ["BrokerConnection"]
