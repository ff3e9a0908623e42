"""A private Redis Cluster for the tests: 3 masters and 3 replicas from the `redis-server` binary,
on free loopback ports, in a temporary folder.

Invariant: every process this module signals is a node it started (by PID, each in a session of
its own: taskline_cli.localservers.PrivateServer); nothing is found by name. A node keeps
nothing on disk but its cluster config, so a node restarted comes back empty, as a replica of
whichever node took its slots. Tests get the cluster flushed (every master) before and after.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from taskline_cli.localservers import LOOPBACK, PrivateRedis, ServerError, free_port
from tests.servers import scratch_dir

NODE_TIMEOUT_MS = 1000
"""How long a node is unreachable before the cluster counts it failed (then a replica takes
over): short, so a failover in a test takes about a second or two."""
READY_TIMEOUT_S = 60.0


def distinct_free_ports(n: int) -> list[int]:
    """`n` different ports nothing listens on now."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


class ClusterNode(PrivateRedis):
    """One node of the cluster: cluster mode on, its own bus port, no persistence."""

    name = "redis-cluster-node"

    def __init__(self, workdir: Path, port: int, bus_port: int) -> None:
        super().__init__(workdir, port=port)
        self.bus_port = bus_port

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--cluster-enabled", "yes", "--cluster-port",
                str(self.bus_port), "--cluster-config-file", str(self.workdir / "nodes.conf"),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS)]

    def client(self, timeout: float = 5.0) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=timeout,
                           socket_connect_timeout=timeout, decode_responses=True)

    def role(self) -> str | None:
        """"master" or "slave" as the node says now; None when it does not answer."""
        try:
            with self.client(1.0) as c:
                return str(c.info("replication")["role"])
        except redis.RedisError:
            return None


class RedisClusterServers:
    """The cluster: start, flush, fail a master over, stop (only its own nodes)."""

    def __init__(self, root: Path, masters: int = 3, replicas: int = 1) -> None:
        count = masters * (1 + replicas)
        ports = distinct_free_ports(2 * count)  # a bus port taken by a node to come hangs it
        self.nodes = [ClusterNode(root / f"node{i}", ports[2 * i], ports[2 * i + 1])
                      for i in range(count)]
        self.replicas = replicas

    @property
    def url(self) -> str:
        """REDIS_URL as an operator writes it: one node of the cluster, nothing else."""
        return self.nodes[0].url

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        argv = ["redis-cli", "--cluster", "create",
                *(f"{LOOPBACK}:{n.port}" for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        self.wait_healthy()

    def wait_healthy(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until every running node says cluster_state:ok and every replica is in sync."""
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if time.monotonic() > deadline:
                raise ServerError("the Redis Cluster did not become healthy")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.client(1.0) as c:
                    if c.cluster("info").get("cluster_state") != "ok":
                        return False
                    info = c.info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
            except redis.RedisError:
                return False
        return True

    def masters(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.running and n.role() == "master"]

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        for node in self.nodes:
            if node.running and node is not master:
                with node.client() as c:
                    info = c.info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == master.port:
                    return node
        raise ServerError(f"no replica of the master on port {master.port}")

    def master_of(self, key: str) -> ClusterNode:
        """The node that holds `key`'s slot now."""
        for node in self.masters():
            with node.client() as c:
                slot = int(c.cluster("keyslot", key))
                owner = c.cluster("slots")
            for start, end, primary, *_ in owner:
                if start <= slot <= end and int(primary[1]) == node.port:
                    return node
        raise ServerError(f"no master holds the slot of {key}")

    def failover(self, master: ClusterNode) -> ClusterNode:
        """CLUSTER FAILOVER on a replica of `master` (a coordinated switch); the new master."""
        replica = self.replica_of(master)
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + READY_TIMEOUT_S
        # Until the old master knows it is a replica, it still answers CLUSTER SLOTS as the
        # slot's owner, and master_of may name it.
        while replica.role() != "master" or master.role() == "master" or not self._healthy():
            if time.monotonic() > deadline:
                raise ServerError("the failover did not complete")
            time.sleep(0.05)
        return replica

    def migrate_slot(self, key: str, to: ClusterNode, pause_s: float = 0.05) -> None:
        """Move `key`'s slot to the master `to` as `redis-cli --cluster reshard` does (IMPORTING,
        MIGRATING, MIGRATE key by key, then the new owner told to every master), a pause
        between keys so clients meet the slot half moved (ASK, TRYAGAIN)."""
        source = self.master_of(key)
        with source.client() as src, to.client() as dst:
            slot = int(src.cluster("keyslot", key))
            src_id, dst_id = src.cluster("myid"), dst.cluster("myid")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
                src.execute_command("MIGRATE", LOOPBACK, to.port, "", 0, 5000, "KEYS", *keys)
                time.sleep(pause_s)
        for node in self.masters():
            with node.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    def flush(self) -> None:
        client = RedisCluster(host=LOOPBACK, port=self.masters()[0].port, socket_timeout=5)
        try:
            client.flushall(target_nodes=RedisCluster.PRIMARIES)
        finally:
            client.close()

    def close(self) -> None:
        for node in self.nodes:
            node.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A 3-master, 3-replica Redis Cluster started once per session."""
    with scratch_dir("taskline-redis-cluster-") as root:
        cluster = RedisClusterServers(root)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.close()


@pytest.fixture
def cluster_redis_url(redis_cluster: RedisClusterServers) -> Iterator[str]:
    """The URL of one node of a healthy, empty cluster (flushed again after the test)."""
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    yield redis_cluster.url
    redis_cluster.wait_healthy()
    redis_cluster.flush()


@pytest.fixture
def fresh_redis_cluster() -> Iterator[RedisClusterServers]:
    """A cluster for this test alone (its nodes may be failed over or killed)."""
    with scratch_dir("taskline-redis-cluster-") as root:
        cluster = RedisClusterServers(root)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.close()
