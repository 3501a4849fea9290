"""``baton serve`` on a three-node NATS cluster: replicated streams, run partitions that move by themselves.

Two services share the cluster's four run partitions through leases in a JetStream key-value
bucket (``--share-partitions``); nobody changes a flag when one of them dies or comes back.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections import Counter

import nats
import pytest
import yaml
from bus_fixtures import CLUSTER_PARTITIONS
from bus_support import TIMEOUT, open_run, request
from cluster_support import owners, seconds_until
from serve_support import ROOT, Serve

from baton.adapters.bus import partition_mapping
from baton.adapters.bus.nats_app import (
    EVENTS_STREAM,
    REPLY_HEADER,
    SUBMISSIONS_STREAM,
    durable_subject,
    jetstream_ready,
)
from baton.adapters.bus.partitions import BUCKET
from baton.adapters.wire import decode_verdict, encode_submission
from tests.support.local_servers import LocalNatsCluster, nats_server_binary

pytestmark = pytest.mark.timeout(240)

SHARE = ("--share-partitions", str(CLUSTER_PARTITIONS), "--replicas", "3")
RUNS = [f"cluster-run-{n}" for n in range(12)]  # spread over every partition by the server's hash


def shares(cluster: LocalNatsCluster) -> list[int]:
    """How many partitions each holder has, largest first (every partition held: they sum to 4)."""
    held = owners(cluster.urls)
    if sorted(held) != list(range(CLUSTER_PARTITIONS)):
        return []
    return sorted(Counter(held.values()).values(), reverse=True)


def answered(cluster: LocalNatsCluster, submissions: list[str]) -> list[str]:
    """Open (or re-open) each run over the cluster: the verdicts, one per run."""

    async def send() -> list[str]:
        nc = await nats.connect(cluster.urls, connect_timeout=10)
        try:
            verdicts = [await request(nc, open_run(run_id)) for run_id in submissions]
            return [v.verdict for v in verdicts]
        finally:
            await nc.close()

    return asyncio.run(send())


def test_partitions_move_to_the_survivor_when_a_service_dies_and_spread_again_when_it_returns(
    nats_cluster: LocalNatsCluster, bus_store_url: str, services: list[Serve]
) -> None:
    """Given a cluster and service A alone, when B joins, A is killed -9 and A returns, then the
    partitions go 4, 2+2, 4 (B alone), 2+2, and every run is answered at each stage."""
    services.append(Serve(nats_cluster.url, bus_store_url, *SHARE))
    services[0].wait_ready()
    assert shares(nats_cluster) == [4]
    assert answered(nats_cluster, RUNS) == ["accepted"] * len(RUNS)

    services.append(Serve(nats_cluster.url, bus_store_url, *SHARE))
    services[1].wait_ready()
    seconds_until(lambda: shares(nats_cluster) == [2, 2], "the joining service to take its share")
    assert answered(nats_cluster, RUNS) == ["duplicate"] * len(RUNS)

    services[0].kill()
    seconds_until(lambda: shares(nats_cluster) == [4], "the survivor to take the dead service's partitions")
    assert answered(nats_cluster, RUNS) == ["duplicate"] * len(RUNS)

    services.append(Serve(nats_cluster.url, bus_store_url, *SHARE))
    services[2].wait_ready()
    seconds_until(lambda: shares(nats_cluster) == [2, 2], "the load to spread again")
    assert answered(nats_cluster, RUNS) == ["duplicate"] * len(RUNS)
    assert services[1].stop() > 0 and services[2].stop() > 0


def test_the_streams_and_the_partition_bucket_have_a_replica_on_every_node(
    nats_cluster: LocalNatsCluster, bus_store_url: str, services: list[Serve]
) -> None:
    """Given a service started with --replicas 3, then each stream it makes has three replicas, all current."""
    services.append(Serve(nats_cluster.url, bus_store_url, *SHARE))
    services[0].wait_ready()

    async def replicas() -> dict[str, tuple[int, int]]:
        nc = await nats.connect(nats_cluster.urls, connect_timeout=10)
        try:
            js, found = nc.jetstream(), {}
            for stream in (SUBMISSIONS_STREAM, EVENTS_STREAM, f"KV_{BUCKET}"):
                info = await js.stream_info(stream)
                assert info.cluster is not None
                followers = [peer for peer in info.cluster.replicas or [] if peer.current]
                found[stream] = (info.config.num_replicas or 1, 1 + len(followers))
            return found
        finally:
            await nc.close()

    assert asyncio.run(replicas()) == {name: (3, 3) for name in (SUBMISSIONS_STREAM, EVENTS_STREAM, f"KV_{BUCKET}")}


def test_the_compose_topology_is_a_valid_cluster_mapping_the_partitions_its_services_share() -> None:
    """Given docker-compose's node config, then nats-server accepts it and it maps what the services lease."""
    config = ROOT / "deploy" / "nats-cluster.conf"
    checked = subprocess.run(
        [nats_server_binary(), "-c", str(config), "-t"],
        env={**os.environ, "NATS_NAME": "n1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout

    [(source, target)] = partition_mapping(4).items()
    assert f'"{source}": "{target}"' in config.read_text()
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert "--share-partitions 4 --replicas 3" in " ".join(compose["baton"]["command"])
    assert {f"nats-{n}" for n in (1, 2, 3)} <= compose.keys()


def test_durable_submissions_published_while_a_node_is_down_are_answered_once(
    nats_cluster: LocalNatsCluster, bus_store_url: str, services: list[Serve]
) -> None:
    """Given two services on the cluster, when a node is killed and runs are opened by durable
    (JetStream) submissions, each published twice, then each is answered, the second as a duplicate."""
    services += [Serve(nats_cluster.url, bus_store_url, *SHARE) for _ in range(2)]
    for service in services:
        service.wait_ready()
    nats_cluster.kill(nats_cluster.node_of(f"baton-serve-{services[0].proc.pid}"))
    runs = [f"durable-{n}" for n in range(6)]

    async def publish_twice() -> list[str]:
        nc = await nats.connect(nats_cluster.urls, connect_timeout=10)
        try:
            inbox = nc.new_inbox()
            replies = await nc.subscribe(inbox)
            js = nc.jetstream()
            for attempt in range(2):
                for run_id in runs:
                    submission = open_run(run_id)
                    headers = {REPLY_HEADER: inbox, "Nats-Msg-Id": f"{submission.submission_id}-{attempt}"}
                    # published again under a new message id: past JetStream's own dedupe, the ledger's is what holds
                    await jetstream_ready(
                        lambda s=submission, h=headers: js.publish(
                            durable_subject(s.run_id), encode_submission(s), headers=h, timeout=TIMEOUT
                        )
                    )
            verdicts = [decode_verdict((await replies.next_msg(timeout=TIMEOUT)).data) for _ in range(2 * len(runs))]
            return sorted(f"{v.run_id}:{v.verdict}" for v in verdicts)
        finally:
            await nc.close()

    assert asyncio.run(publish_twice()) == sorted(f"{r}:{v}" for r in runs for v in ("accepted", "duplicate"))
