"""Fixtures shared by several test modules (the cluster fixtures come from kcore's pytest
plugin)."""

from __future__ import annotations

import pytest

from kcore.testing import KafkaCluster

# 10.255.255.1 is not routed from this machine: what a client outside the brokers' network
# sees when advertised.listeners names an internal address.
UNREACHABLE_HOST = "10.255.255.1"


@pytest.fixture(scope="session")
def unreachable_cluster():
    """One broker whose client listener advertises an address this machine cannot reach (as
    behind a NAT or a load balancer); its real port on 127.0.0.1 still works for bootstrap."""
    with KafkaCluster(1, advertised_host=UNREACHABLE_HOST) as cluster:
        yield cluster
