"""Bus URLs name one scheme and every seed server of a cluster."""

from __future__ import annotations

from baton.adapters.bus_urls import addresses, servers


def test_a_cluster_url_gives_each_seed_its_scheme() -> None:
    assert servers("nats://a:4222, b:4223,c") == ["nats://a:4222", "nats://b:4223", "nats://c"]


def test_a_single_server_url_is_itself() -> None:
    assert servers("tls://nats.example:4443") == ["tls://nats.example:4443"]


def test_addresses_fill_in_each_scheme_default_port() -> None:
    assert addresses("kafka://k1,k2:9093") == [("k1", 9092), ("k2", 9093)]
    assert addresses("nats://n1,127.0.0.1:5222") == [("n1", 4222), ("127.0.0.1", 5222)]
