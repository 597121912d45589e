"""A throw-away local Redis Cluster: ``redis-server --cluster-enabled`` nodes joined by
``redis-cli --cluster create``, whose masters a test may kill (SIGKILL) and restart."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from hopserve.testing.processes import RedisServer, free_port

__all__ = ["LocalRedisCluster"]

SLOTS = 16384
"""Hash slots of every Redis Cluster."""


class LocalRedisCluster:
    """``masters`` primaries with ``replicas`` replicas each, on loopback, persistence off.

    Each node is a :class:`RedisServer` (its own working directory, a free client port
    and a free cluster-bus port, ``cluster-node-timeout`` of ``node_timeout_ms``), so a
    node can be killed and restarted on its port like a single server. With replicas, a
    killed master is replaced by its replica after about ``node_timeout_ms`` plus an
    election (1-3 s at the default 1000 ms).

    Args:
        workdir: Parent of the nodes' working directories (created).
        masters: Primaries (at least 3: ``redis-cli --cluster create`` refuses fewer).
        replicas: Replicas per primary.
        node_timeout_ms: ``cluster-node-timeout``: how long a silent node takes to be
            declared failed.
        password: ``requirepass`` and ``masterauth`` of every node; ``None`` for none.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        password: str | None = None,
    ) -> None:
        if shutil.which("redis-cli") is None or shutil.which("redis-server") is None:
            raise RuntimeError("redis-server and redis-cli are not installed")
        if masters < 3 or replicas < 0:
            raise ValueError(f"need masters >= 3 and replicas >= 0 (got {masters}, {replicas})")
        self.workdir = Path(workdir)
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.password = password
        self.nodes: list[RedisServer] = []
        """Every node, in the order given to ``redis-cli --cluster create`` (masters first)."""

    # Addresses ---------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """``127.0.0.1:<port>`` of every node."""
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:<port>`` of the first node (a seed URL)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.nodes[0].port}"

    def node(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    # Life cycle --------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> LocalRedisCluster:
        """Start every node, create the cluster and wait until it is healthy."""
        try:
            for i in range(self.masters * (1 + self.replicas)):
                self.nodes.append(self._launch(self.workdir / f"node{i}"))
            command = ["redis-cli", "--cluster", "create", *self.addresses]
            command += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            if self.password:
                command += ["-a", self.password, "--no-auth-warning"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}")
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node."""
        for node in self.nodes:
            node.stop()

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (an abrupt outage); :meth:`restart` brings it back."""
        self.node(port).stop()

    def restart(self, port: int, timeout_s: float = 10.0) -> None:
        """Start the killed node on ``port`` again; it rejoins from its ``nodes.conf``."""
        self.node(port).start(timeout_s)

    def flushall(self) -> None:
        """Delete every key (FLUSHALL on each live primary) and reset command statistics."""
        for node in self.live_nodes():
            with node.client() as client:
                if client.info("replication")["role"] == "master":
                    client.flushall()
                client.config_resetstat()

    # State -------------------------------------------------------------------------------

    def live_nodes(self) -> list[RedisServer]:
        """Nodes whose process runs."""
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def primaries(self) -> list[int]:
        """Ports of the nodes that serve slots, as the first live node sees it."""
        with self.live_nodes()[0].client() as client:
            slots = client.execute_command("CLUSTER", "SLOTS")
        return sorted({int(entry[2][1]) for entry in slots})

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok`` and sees the same primaries covering
        every slot, and every live replica's link to its primary is up."""
        import redis

        seen: set[tuple[tuple[int, int, int], ...]] = set()
        try:
            for node in self.live_nodes():
                with node.client() as client:
                    if client.cluster("INFO").get("cluster_state") != "ok":
                        return False
                    slots = client.execute_command("CLUSTER", "SLOTS")
                    seen.add(tuple(sorted((s[0], s[1], int(s[2][1])) for s in slots)))
                    info = client.info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
        except (redis.RedisError, OSError):
            return False
        if len(seen) != 1:
            return False
        ranges = next(iter(seen))
        return sum(end - first + 1 for first, end, _ in ranges) == SLOTS

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Wait until :meth:`healthy` (e.g. after a failover).

        Raises:
            RuntimeError: not healthy within ``timeout_s``.
        """
        self._wait(self.healthy, timeout_s, "the cluster is not healthy")

    def wait_failover(self, port: int, timeout_s: float = 30.0) -> None:
        """Wait until the killed primary on ``port`` has been replaced by a replica and
        the cluster is healthy again."""
        self._wait(
            lambda: self.healthy() and port not in self.primaries(),
            timeout_s,
            f"no replica took over from 127.0.0.1:{port}",
        )

    # Helpers -----------------------------------------------------------------------------

    def _launch(self, workdir: Path, attempts: int = 3) -> RedisServer:
        error: RuntimeError | None = None
        for _ in range(attempts):  # a free port may be taken before the server binds it
            extra = (
                "--cluster-enabled", "yes",
                "--cluster-port", str(free_port()),
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--repl-diskless-sync-delay", "0",  # replicas sync at once, not after 5 s
            )  # fmt: skip
            if self.password:
                extra += ("--masterauth", self.password)
            try:
                return RedisServer(workdir, password=self.password, extra_args=extra).start()
            except RuntimeError as err:
                error = err
        raise RuntimeError(f"could not start a cluster node: {error}")

    @staticmethod
    def _wait(condition: Callable[[], bool], timeout_s: float, failure: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{failure} after {timeout_s:g}s")
            time.sleep(0.05)
