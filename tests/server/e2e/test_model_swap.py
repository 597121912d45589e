"""Model swaps under load: 0 failed requests, and no row of one version served as another.

A real front-end (in-process worker, Redis cache on the session's private redis-server,
gRPC on loopback) serves version 1 of ``TinySAGE``; client threads send a steady stream
of unversioned requests (``GetEmbeddings`` and ``StreamEmbeddings``) while an admin
loads version 2 beside it as the new default and unloads version 1, then does the same
with version 3. The three versions have different weights; every answer's
``model_version`` must name the version whose own full-graph forward equals its rows,
and a request sent after a switch returned must be answered by the new default.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from support.model_versions import MODEL, ServiceThread, Versions, write_versions

from hopserve.client import EmbeddingClient

CLIENTS = 5
STREAMS = 1


@dataclass
class Seen:
    """What one load thread saw."""

    answers: list[tuple[float, str, np.ndarray, np.ndarray]] = field(default_factory=list)
    streams: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _load(target: str, ids: np.ndarray, seed: int, stop: threading.Event, seen: Seen) -> None:
    rng = random.Random(seed)
    with EmbeddingClient(target, timeout=30) as client:
        while not stop.is_set():
            want = np.asarray(rng.sample(list(ids), rng.randint(1, 24)), dtype=np.int64)
            sent = time.monotonic()
            try:
                res = client.get_embeddings_with_info(MODEL, want)
            except Exception as err:  # counted, never raised from the thread
                seen.errors.append(f"{type(err).__name__}: {err}")
                continue
            seen.answers.append((sent, res.model_version, want, res.embeddings))


def _stream(target: str, ids: np.ndarray, seed: int, stop: threading.Event, seen: Seen) -> None:
    rng = np.random.default_rng(seed)
    with EmbeddingClient(target, timeout=30) as client:
        while not stop.is_set():
            want = rng.choice(ids, 300)
            sent = time.monotonic()
            try:
                rows = np.concatenate(
                    [r for _, r in client.stream_embeddings(MODEL, want, cache_policy="bypass")]
                )
            except Exception as err:
                seen.errors.append(f"stream {type(err).__name__}: {err}")
                continue
            seen.streams.append((sent, want, rows))


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Versions:
    return write_versions(
        tmp_path_factory.mktemp("swap"), {"1": 11, "2": 12, "3": 13}, num_nodes=600,
        num_edges=4000,
    )  # fmt: skip


def test_model_swap_under_load(
    versions: Versions, default_cache: dict, request: pytest.FixtureRequest
) -> None:
    if default_cache["backend"] == "redis":
        request.getfixturevalue("redis_server")  # a flushed redis-server
    server = ServiceThread(versions.config(["1"], cache=default_cache))
    stop = threading.Event()
    seen = [Seen() for _ in range(CLIENTS + STREAMS)]
    threads = [
        threading.Thread(target=_load, args=(server.target, versions.external_ids, k, stop, s))
        for k, s in enumerate(seen[:CLIENTS])
    ] + [
        threading.Thread(target=_stream, args=(server.target, versions.external_ids, 99, stop, s))
        for s in seen[CLIENTS:]
    ]  # fmt: skip
    switched: dict[str, float] = {}  # version -> when SetDefault (via load) returned
    drained: dict[str, int] = {}
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        with server.admin() as admin:
            for old, new in (("1", "2"), ("2", "3")):
                info = admin.load_model(versions.entry(new), make_default=True)
                switched[new] = time.monotonic()
                assert info.is_default and info.state == "ready"
                time.sleep(0.5)  # both versions loaded, the new one taking the traffic
                drained[old] = admin.unload_model(MODEL, old).drained_requests
                time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(60)
    finally:
        stop.set()
        server.stop()

    errors = [e for s in seen for e in s.errors]
    answers = [a for s in seen for a in s.answers]
    streams = [a for s in seen for a in s.streams]
    assert errors == [], errors[:5]
    assert len(answers) > 100 and streams
    by_version = {v: 0 for v in ("1", "2", "3")}
    for sent, version, ids, rows in answers:
        by_version[version] += 1
        assert versions.matches(version, ids, rows), (version, ids[:5])
        for other in set(by_version) - {version}:  # the versions really differ
            assert not versions.matches(other, ids, rows)
        if sent > switched.get("3", np.inf):
            assert version == "3", "a request sent after the switch to 3 got " + version
        elif sent > switched["2"]:
            assert version in ("2", "3"), "a request sent after the switch to 2 got " + version
    assert all(count > 10 for count in by_version.values()), by_version
    for _sent, ids, rows in streams:  # one version per stream, never a mix
        owners = [v for v in by_version if versions.matches(v, ids, rows)]
        assert len(owners) == 1, f"stream rows match versions {owners}"
    assert set(drained) == {"1", "2"}
