"""The cost of security on serving: plaintext vs TLS vs TLS + tokens vs TLS + tokens + rate limit.

One run, one graph (synthetic power-law, 200K nodes by default), one model (2-layer
GraphSAGE), the batching+cache server of ``bench/serve.py`` (dynamic batching, 2 ms window;
Redis cache on a private ``redis-server``). Four configurations of the public port:

* ``plaintext`` — no security;
* ``tls`` — TLS (ECDSA P-256 certificate from a throw-away CA);
* ``tls+tokens`` — TLS and a token file; the client sends a valid ``embeddings:read`` token;
* ``tls+tokens+limit`` — also a per-client rate limit far above the offered load
  (1e6 requests/s), so nothing is refused: it measures the gate's bookkeeping.

Every run starts a fresh ``hopserve serve`` on a flushed (cold) cache and measures, with the
client options of its configuration (CA certificate, token):

1. new connections: ``--connects`` fresh clients one after another, each timed from
   channel creation to the answer of its first call (a health check) — the handshake cost;
2. the closed loop of ``hopserve loadtest`` (32 concurrent clients, Zipf 1.1 target
   popularity, log-normal set sizes with median 16), with the CPU the server and the load
   client use over the measured window (psutil): the server's busy cores show whether it
   is the bottleneck (then its extra work per request shows as lower QPS), the client's
   CPU time per request shows what TLS and the token cost the caller;
3. cached lookups of 16 nodes one request at a time (p50/p99 end-to-end), where per-call
   TLS and token costs show most.

The configurations are interleaved and repeated, alternately forwards and backwards
(``--repeat 4``: a b c d d c b a a b c d d c b a; an even count puts every configuration
at the same mean position), so that machine noise and drift show; the report gives every
run and the mean per configuration. Each run first checks that the server enforces its
configuration (a plaintext client is refused by a TLS port, a call without a token is
UNAUTHENTICATED on a token port).
Certificates and tokens are generated into a temporary folder and removed afterwards.

Outputs ``bench/results/security.{json,md,png}``; client and server share this machine's
cores, so read the ratios, not the absolute times.

    python bench/security.py               # default (several minutes)
    python bench/security.py --quick       # smoke check (small graph, short runs; < 40 s)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from security_report import report_out

from hopserve.security.tls import channel_credentials

MODEL = "sage"
CONFIGS = [  # name, tls, tokens, rate limit
    ("plaintext", False, False, False),
    ("tls", True, False, False),
    ("tls+tokens", True, True, False),
    ("tls+tokens+limit", True, True, True),
]
RATE_LIMIT = {"requests_per_s": 1e6, "burst": 1_000_000}
"""Far above any load this machine can offer: every call passes through the bucket."""
FRESH_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""Channel option of the connection timings: no subchannel (connection) shared with an
earlier channel of this process, so every client really connects (and handshakes)."""


# --------------------------------------------------------------------------- secrets
@dataclass(frozen=True)
class Secrets:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and one token."""

    ca: Path
    cert: Path
    key: Path
    tokens_file: Path
    token: str

    @classmethod
    def generate(cls, folder: Path) -> Secrets:
        from hopserve.security import pki
        from hopserve.security.tokens import hash_token, new_token

        folder.mkdir(parents=True, exist_ok=True)
        ca = pki.make_ca("hopserve bench CA")
        leaf = pki.issue(ca, "localhost", ["127.0.0.1"])
        token = new_token()
        paths = {name: folder / name for name in ("ca.crt", "server.crt", "server.key")}
        paths["ca.crt"].write_bytes(ca.cert)
        paths["server.crt"].write_bytes(leaf.cert)
        paths["server.key"].write_bytes(leaf.key)
        paths["server.key"].chmod(0o600)
        tokens_file = folder / "tokens.yaml"
        tokens_file.write_text(
            "tokens:\n"
            f"  - {{name: bench, scopes: [embeddings:read], sha256: {hash_token(token)}}}\n"
        )
        return cls(paths["ca.crt"], paths["server.crt"], paths["server.key"], tokens_file, token)

    def security(self, tls: bool, tokens: bool, limit: bool) -> dict[str, Any] | None:
        """The config's ``security`` section (None: plaintext, no section)."""
        if not (tls or tokens or limit):
            return None
        section: dict[str, Any] = {}
        if tls:
            section["tls"] = {"cert_file": str(self.cert), "key_file": str(self.key)}
        if tokens:
            section["tokens_file"] = str(self.tokens_file)
        if limit:
            section["rate_limit"] = dict(RATE_LIMIT)
        return section

    def client_options(self, tls: bool, tokens: bool) -> dict[str, Any]:
        """``EmbeddingClient`` / ``run_load`` keyword arguments for that configuration."""
        options: dict[str, Any] = {}
        if tls:
            options["root_certificates"] = str(self.ca)
        if tokens:
            options["token"] = self.token
        return options


# --------------------------------------------------------------------------- server
def server_config(port: int, metrics_port: int) -> dict[str, Any]:
    """The ``server`` section of bench/serve.py's batching+cache configuration."""
    return {
        "port": port,
        "metrics_port": metrics_port,
        "max_wait_ms": 2.0,
        "max_batch_requests": 0,
        "max_queue": 1024,
    }


def write_config(
    path: Path,
    data: harness.SageData,
    port: int,
    metrics_port: int,
    redis_url: str,
    security: dict[str, Any] | None,
) -> Path:
    """A ``hopserve`` config: harness.write_config's, plus the ``security`` section."""
    import yaml

    harness.write_config(
        path,
        [harness.model_entry(MODEL, data)],
        server=server_config(port, metrics_port),
        cache={"backend": "redis", "redis_url": redis_url, "ttl_s": 3600},
    )
    if security is not None:
        cfg = yaml.safe_load(path.read_text())
        cfg["security"] = security
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def check_posture(target: str, tls: bool, tokens: bool, options: dict[str, Any]) -> list[str]:
    """Proof that the server runs the configuration measured: a plaintext client fails on
    a TLS port, a call without a token is UNAUTHENTICATED on a token port, a call with the
    configuration's options succeeds. Returns what was checked.

    Raises:
        RuntimeError: the server does not enforce what its configuration says.
    """
    from hopserve.client import EmbeddingClient, HopserveError

    def refusal(**opts: Any) -> str:
        try:
            with EmbeddingClient(target, timeout=5.0, max_retries=0, **opts) as client:
                client.get_model(MODEL)
        except HopserveError as err:
            return err.code.name
        return "OK"

    checked = []
    if tls:
        if (code := refusal(token=options.get("token"))) != "UNAVAILABLE":
            raise RuntimeError(f"a plaintext client got {code} from the TLS port {target}")
        checked.append("plaintext client refused (UNAVAILABLE)")
    if tokens:
        without = {k: v for k, v in options.items() if k != "token"}
        if (code := refusal(**without)) != "UNAUTHENTICATED":
            raise RuntimeError(f"a call without a token got {code} from {target}")
        checked.append("call without token refused (UNAUTHENTICATED)")
    if (code := refusal(**options)) != "OK":
        raise RuntimeError(f"a call with the configuration's options got {code} from {target}")
    return checked


# --------------------------------------------------------------------------- measurements
class CpuWindow:
    """CPU seconds the server (with any children) and this process (the load client, alone) use
    between two instants of a load run: its recorded window, ``warmup_s`` to ``warmup_s +
    duration_s`` after :meth:`start` (two timer threads take the snapshots)."""

    def __init__(self, server_pid: int, begin_s: float, end_s: float) -> None:
        import psutil

        self._server = psutil.Process(server_pid)
        self._client = psutil.Process()
        self._times = (begin_s, end_s)
        self._snaps: list[tuple[float, float, float]] = []
        self._timers: list[Any] = []

    @staticmethod
    def _cpu(proc: Any, children: bool) -> float:
        total = 0.0
        for p in [proc, *(proc.children(recursive=True) if children else ())]:
            try:
                t = p.cpu_times()
            except Exception:  # noqa: BLE001 - a child that just exited
                continue
            total += t.user + t.system
        return total

    def _snap(self) -> None:
        t = time.perf_counter()
        # not the client's children: they are the server and redis-server
        self._snaps.append((t, self._cpu(self._server, True), self._cpu(self._client, False)))

    def start(self) -> CpuWindow:
        import threading

        self._timers = [threading.Timer(t, self._snap) for t in self._times]
        for timer in self._timers:
            timer.start()
        return self

    def result(self, qps: float) -> dict[str, float]:
        """Cores busy and CPU milliseconds per request (``qps`` in the window)."""
        for timer in self._timers:
            timer.join()
        (t0, s0, c0), (t1, s1, c1) = sorted(self._snaps)
        seconds = t1 - t0
        requests = max(qps * seconds, 1.0)
        return {
            "server_cores": (s1 - s0) / seconds,
            "client_cores": (c1 - c0) / seconds,
            "server_cpu_ms_per_request": 1e3 * (s1 - s0) / requests,
            "client_cpu_ms_per_request": 1e3 * (c1 - c0) / requests,
        }


def new_connections(target: str, count: int, options: dict[str, Any]) -> dict[str, Any]:
    """p50/p99 of a new client's channel creation + first call (a health check), ``count``
    clients one after another (one untimed client first, to load what the first needs)."""
    import numpy as np

    from hopserve.client import EmbeddingClient

    lat = []
    for i in range(count + 1):
        t = time.perf_counter()
        client = EmbeddingClient(
            target, timeout=10.0, max_retries=0, channel_options=FRESH_CONNECTION, **options
        )
        ok = client.health()
        elapsed = time.perf_counter() - t
        client.close()
        if not ok:
            raise RuntimeError(f"health check of {target} failed")
        if i:
            lat.append(elapsed)
    pct = harness.percentiles(np.asarray(lat) * 1e3, (50, 99))
    return {"p50_ms": pct["p50"], "p99_ms": pct["p99"], "connections": count}


def schedule(repeat: int) -> list[tuple[str, bool, bool, bool]]:
    """Configurations interleaved, alternately forwards and backwards: a b c d d c b a …"""
    order: list[tuple[str, bool, bool, bool]] = []
    for r in range(repeat):
        order += CONFIGS if r % 2 == 0 else CONFIGS[::-1]
    return order


# --------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    p = harness.parser(__doc__)
    harness.add_graph_args(p, nodes=200_000, avg_degree=10.0)
    harness.add_load_args(p)
    p.add_argument("--repeat", type=int, default=4, help="runs per configuration (interleaved)")
    p.add_argument("--lookups", type=int, default=500, help="cached 16-node lookups per run")
    p.add_argument("--connects", type=int, default=50, help="fresh connections timed per run")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke check: 20K nodes, 1 s runs, one repeat; writes to a temporary folder "
        "unless --out is given",
    )
    harness.add_io_args(p, data=harness.REPO / "data")
    p.set_defaults(out=None)
    args = p.parse_args()
    if args.quick:
        args.nodes, args.duration, args.warmup = 20_000, 1.0, 0.5
        args.repeat, args.lookups, args.connects = 1, 100, 10
        if args.out is None:
            args.out = tempfile.mkdtemp(prefix="hopserve-security-quick-")
    if args.out is None:
        args.out = str(harness.RESULTS)
    return args


def main() -> None:
    args = parse_args()
    started = time.monotonic()

    from hopserve.client.loadtest import run_load

    data = harness.prepare_sage(Path(args.data), args.nodes, args.avg_degree)
    harness.log(f"graph ready ({args.nodes:,} nodes)")
    spec = harness.load_spec(args, MODEL)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hopserve-bench-security-") as tmp:
        secrets = Secrets.generate(Path(tmp) / "secrets")
        redis = harness.RedisServer.launch(Path(tmp) / "redis", maxmemory="1gb")
        try:
            for index, (name, tls, tokens, limit) in enumerate(schedule(args.repeat), 1):
                options = secrets.client_options(tls, tokens)
                port, metrics_port = harness.free_port(), harness.free_port()
                target = f"127.0.0.1:{port}"
                with redis.client() as client:  # a cold cache for every run
                    client.flushall()
                config = write_config(
                    Path(tmp) / f"{index}-{name}.yaml",
                    data,
                    port,
                    metrics_port,
                    redis.url,
                    secrets.security(tls, tokens, limit),
                )
                log_path = Path(tmp) / f"{index}-{name}.log"
                credentials = channel_credentials(options["root_certificates"]) if tls else None
                server = harness.start_frontend(
                    config, port, log_path, model=MODEL, credentials=credentials
                )
                try:
                    harness.log(f"run {index}: {name} …")
                    posture = check_posture(target, tls, tokens, options)
                    connect = new_connections(target, args.connects, options)
                    assert server.pid is not None
                    cpu = CpuWindow(server.pid, args.warmup, args.warmup + args.duration).start()
                    report = asyncio.run(run_load(target, spec, **options)).to_dict()
                    report["cpu"] = cpu.result(report["qps"])
                    report["cached_16"] = asyncio.run(
                        harness.cached_lookups(target, MODEL, args.lookups, **options)
                    )
                    report["connect"] = connect
                    report.update(run=index, configuration=name, tls=tls, tokens=tokens)
                    report["rate_limit"] = limit
                    report["posture_checked"] = posture
                    runs.append(report)
                    harness.log(
                        f"run {index}: {name}: {report['qps']:.0f} QPS, p99 "
                        f"{report['p99_ms']:.1f} ms, server cores "
                        f"{report['cpu']['server_cores']:.2f}, cached p50 "
                        f"{report['cached_16']['p50_ms']:.2f} ms, connect p50 "
                        f"{connect['p50_ms']:.2f} ms, errors {report['errors'] or 0}"
                    )
                finally:
                    server.terminate(30)
        finally:
            redis.stop()
    report_out(args, runs, time.monotonic() - started, configs=CONFIGS, rate_limit=RATE_LIMIT)


if __name__ == "__main__":
    main()
