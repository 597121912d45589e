"""Typed synthetic graphs: a recommender graph and a fraud graph, with informative labels.

Both are deterministic functions of their arguments (vectorized numpy) and give a typed
store (:mod:`~.node_types`): node types are contiguous storage-id ranges, every edge has
a relation ``src__name__dst`` (reverse relations included, so every type receives
messages), features have one width for all types (class centroid + unit noise), and each
type's external IDs are ``0..N_t-1``.

**Recommender** (:func:`synth_recommender`): users, items, categories. Each item belongs
to one category (its label; features around the category's centroid). Each user has a
preferred category (its label; features around half that centroid) and clicks
``avg_clicks`` items on average: with probability ``affinity`` an item of the preferred
category, else any item, both drawn by Zipf item popularity (hub items). A fraction
``buy_rate`` of clicks are also buys. Relations: ``user__clicks__item``,
``user__buys__item``, ``item__belongs-to__category`` and their reverses
``item__clicked-by__user``, ``item__bought-by__user``, ``category__contains__item``.

**Fraud** (:func:`synth_fraud`): accounts, devices, merchants, transactions. Fraud rings
(``ring_fraction`` of the accounts) share a few devices and pay a few ring merchants;
their transactions there are fraudulent. Labels: ring membership (accounts), fraud
(transactions), ``-1`` for devices and merchants. Relations: ``account__uses__device``,
``account__initiates__transaction``, ``transaction__paid-to__merchant`` and reverses.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hopserve.worker.graph.atomic import check_target

if TYPE_CHECKING:
    from hopserve.worker.graph.store import GraphStore

__all__ = ["TypedGraph", "synth_fraud", "synth_recommender"]

log = logging.getLogger(__name__)


@dataclass
class TypedGraph:
    """A generated typed graph in global ids (types concatenated in ``types`` order)."""

    types: list[tuple[str, int]]  # (name, count), in id order
    relations: list[str]  # "src__name__dst"
    src: np.ndarray  # int64 [E] global ids
    dst: np.ndarray
    edge_type: np.ndarray  # int16 [E] index into relations
    features: np.ndarray  # float32 [N, F]
    labels: np.ndarray  # int64 [N], -1 = none

    @property
    def num_nodes(self) -> int:
        return sum(count for _, count in self.types)

    def offset(self, name: str) -> int:
        at = 0
        for t, count in self.types:
            if t == name:
                return at
            at += count
        raise KeyError(name)

    def store(
        self,
        *,
        reorder: str | None = "rcmk",
        out: str | Path | None = None,
        overwrite: bool = False,
        progress: bool = False,
    ) -> GraphStore:
        """The typed store of this graph (written to ``out`` when given)."""
        from hopserve.worker.graph.node_types import typed_store

        return typed_store(
            self.types,
            self.src,
            self.dst,
            self.edge_type,
            self.relations,
            self.features,
            labels=self.labels,
            reorder=reorder,
            out=out,
            overwrite=overwrite,
            progress=progress,
        )


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), 7_001, stream])


def _centroids(rng: np.random.Generator, k: int, dim: int, separation: float) -> np.ndarray:
    c = rng.standard_normal((k, dim))
    c *= (separation / math.sqrt(2.0)) / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    return c.astype(np.float32)


def _zipf_weights(n: int, exponent: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    return w / w.sum()


def _with_reverses(
    parts: list[tuple[str, str, str, np.ndarray, np.ndarray]], reverse: dict[str, str]
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(src type, name, dst type, src, dst)`` per relation -> relations, src, dst, ids,
    each relation followed by its reverse ``reverse[name]``."""
    relations, srcs, dsts, ids = [], [], [], []
    for s_type, name, d_type, s, d in parts:
        for rel, a, b in ((f"{s_type}__{name}__{d_type}", s, d),
                          (f"{d_type}__{reverse[name]}__{s_type}", d, s)):  # fmt: skip
            ids.append(np.full(a.size, len(relations), np.int16))
            relations.append(rel)
            srcs.append(a)
            dsts.append(b)
    return relations, np.concatenate(srcs), np.concatenate(dsts), np.concatenate(ids)


def _check(counts: dict[str, int], dim: int) -> None:
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if dim < 1:
        raise ValueError(f"feature_dim must be >= 1, got {dim}")


def synth_recommender(
    num_users: int,
    num_items: int,
    num_categories: int,
    feature_dim: int,
    *,
    avg_clicks: float = 7.0,
    buy_rate: float = 0.2,
    affinity: float = 0.7,
    popularity: float = 1.0,
    separation: float = 2.0,
    seed: int = 0,
    reorder: str | None = "rcmk",
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> GraphStore:
    """The recommender graph (module doc): users, items, categories."""
    graph = recommender_graph(
        num_users, num_items, num_categories, feature_dim, avg_clicks=avg_clicks,
        buy_rate=buy_rate, affinity=affinity, popularity=popularity, separation=separation,
        seed=seed,
    )  # fmt: skip
    if out is not None:
        check_target(out, overwrite=overwrite)
    return graph.store(reorder=reorder, out=out, overwrite=overwrite, progress=progress)


def recommender_graph(
    num_users: int,
    num_items: int,
    num_categories: int,
    feature_dim: int,
    *,
    avg_clicks: float = 7.0,
    buy_rate: float = 0.2,
    affinity: float = 0.7,
    popularity: float = 1.0,
    separation: float = 2.0,
    seed: int = 0,
) -> TypedGraph:
    """The recommender graph's arrays (see :func:`synth_recommender`)."""
    _check({"num_users": num_users, "num_items": num_items, "num_categories": num_categories},
           feature_dim)  # fmt: skip
    for name, p in (("buy_rate", buy_rate), ("affinity", affinity)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    t0 = time.perf_counter()
    u, i, c = int(num_users), int(num_items), int(num_categories)
    rng = _rng(seed, 1)
    item_cat = rng.integers(0, c, i)
    cat_weights = _zipf_weights(c, 0.8)
    user_pref = rng.choice(c, size=u, p=cat_weights)
    item_pop = rng.permutation(_zipf_weights(i, popularity))  # popularity, not by id
    # clicks: a preferred-category item (popularity within the category) or any item
    clicks = rng.poisson(avg_clicks, u)
    click_user = np.repeat(np.arange(u), clicks)
    by_cat = np.argsort(item_cat, kind="stable")
    cat_start = np.searchsorted(item_cat[by_cat], np.arange(c + 1))
    cum_in_cat = np.zeros(i + 1)
    np.cumsum(item_pop[by_cat], out=cum_in_cat[1:])
    pref = user_pref[click_user]
    lo, hi = cum_in_cat[cat_start[pref]], cum_in_cat[cat_start[pref + 1]]
    draw = lo + rng.random(click_user.size) * (hi - lo)
    in_cat = by_cat[np.clip(np.searchsorted(cum_in_cat, draw, "right") - 1, 0, i - 1)]
    anywhere = rng.choice(i, size=click_user.size, p=item_pop)
    empty = hi <= lo  # a preferred category without items
    click_item = np.where((rng.random(click_user.size) < affinity) & ~empty, in_cat, anywhere)
    bought = rng.random(click_user.size) < buy_rate
    off_i, off_c = u, u + i
    relations, src, dst, edge_type = _with_reverses(
        [
            ("user", "clicks", "item", click_user, click_item + off_i),
            ("user", "buys", "item", click_user[bought], click_item[bought] + off_i),
            ("item", "belongs-to", "category", np.arange(i) + off_i, item_cat + off_c),
        ],
        {"clicks": "clicked-by", "buys": "bought-by", "belongs-to": "contains"},
    )
    centroids = _centroids(_rng(seed, 2), c, feature_dim, separation)
    feats = _rng(seed, 3).standard_normal((u + i + c, feature_dim), dtype=np.float32)
    feats[:u] += 0.5 * centroids[user_pref]
    feats[off_i:off_c] += centroids[item_cat]
    feats[off_c:] += centroids
    labels = np.concatenate([user_pref, item_cat, np.arange(c)]).astype(np.int64)
    log.info(
        "recommender graph: %d users, %d items, %d categories, %d edges in %.1fs",
        u, i, c, src.size, time.perf_counter() - t0,
    )  # fmt: skip
    return TypedGraph(
        [("user", u), ("item", i), ("category", c)], relations, src, dst, edge_type, feats, labels
    )


def synth_fraud(
    num_accounts: int,
    num_devices: int,
    num_merchants: int,
    num_transactions: int,
    feature_dim: int,
    *,
    ring_fraction: float = 0.02,
    separation: float = 2.0,
    seed: int = 0,
    reorder: str | None = "rcmk",
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> GraphStore:
    """The fraud graph (module doc): accounts, devices, merchants, transactions."""
    graph = fraud_graph(
        num_accounts, num_devices, num_merchants, num_transactions, feature_dim,
        ring_fraction=ring_fraction, separation=separation, seed=seed,
    )  # fmt: skip
    if out is not None:
        check_target(out, overwrite=overwrite)
    return graph.store(reorder=reorder, out=out, overwrite=overwrite, progress=progress)


def fraud_graph(
    num_accounts: int,
    num_devices: int,
    num_merchants: int,
    num_transactions: int,
    feature_dim: int,
    *,
    ring_fraction: float = 0.02,
    separation: float = 2.0,
    seed: int = 0,
) -> TypedGraph:
    """The fraud graph's arrays (see :func:`synth_fraud`)."""
    counts = {"num_accounts": num_accounts, "num_devices": num_devices,
              "num_merchants": num_merchants, "num_transactions": num_transactions}  # fmt: skip
    _check(counts, feature_dim)
    if not 0.0 <= ring_fraction < 1.0:
        raise ValueError(f"ring_fraction must be in [0, 1), got {ring_fraction}")
    a, d, m, t = (int(v) for v in counts.values())
    rng = _rng(seed, 11)
    ring = rng.random(a) < ring_fraction
    ring_devices = rng.choice(d, size=max(1, d // 200), replace=False)
    ring_merchants = rng.choice(m, size=max(1, m // 100), replace=False)
    # devices: 1-2 per account; ring accounts share the ring's few devices
    uses = rng.integers(1, 3, a)
    acc_of_use = np.repeat(np.arange(a), uses)
    device = rng.integers(0, d, acc_of_use.size)
    shared = ring[acc_of_use]
    device[shared] = rng.choice(ring_devices, size=int(shared.sum()))
    # transactions: uniform accounts; ring accounts pay ring merchants half the time
    payer = rng.integers(0, a, t)
    merchant = rng.integers(0, m, t)
    fraud = ring[payer] & (rng.random(t) < 0.5)
    merchant[fraud] = rng.choice(ring_merchants, size=int(fraud.sum()))
    off_d, off_m, off_t = a, a + d, a + d + m
    relations, src, dst, edge_type = _with_reverses(
        [
            ("account", "uses", "device", acc_of_use, device + off_d),
            ("account", "initiates", "transaction", payer, np.arange(t) + off_t),
            ("transaction", "paid-to", "merchant", np.arange(t) + off_t, merchant + off_m),
        ],
        {"uses": "used-by", "initiates": "initiated-by", "paid-to": "received"},
    )
    centroids = _centroids(_rng(seed, 12), 2, feature_dim, separation)
    feats = _rng(seed, 13).standard_normal((a + d + m + t, feature_dim), dtype=np.float32)
    feats[:a] += 0.3 * centroids[ring.astype(np.int64)]  # a weak account-level signal
    feats[off_t:] += 0.5 * centroids[fraud.astype(np.int64)]
    labels = np.concatenate([ring.astype(np.int64), np.full(d + m, -1), fraud.astype(np.int64)])
    types = [("account", a), ("device", d), ("merchant", m), ("transaction", t)]
    return TypedGraph(types, relations, src, dst, edge_type, feats, labels)
