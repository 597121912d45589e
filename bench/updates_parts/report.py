"""The run's summary and goals, the markdown report and the figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import harness

from .service import LABELS
from .streams import MODELS

GOAL_MUTATIONS_PER_S = 20_000
GOAL_P99_RATIO = 1.5
GOAL_HOT_RATIO = 0.8


def _get(d: Any, *path: str, default: Any = math.nan) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def goals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, measured (``met`` is None when the run did not measure one)."""
    configs = summary["configs"]
    out = []

    def add(goal: str, measured: str, met: bool | None) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})

    for name in ("exact", "none"):
        rate = _get(configs, name, "phases", "max", "updates", "mutations_per_s")
        if not math.isnan(rate):
            add(
                f"≥ {GOAL_MUTATIONS_PER_S:,} edge mutations/s appended durably while serving "
                f"({LABELS[name]})",
                f"{rate:,.0f}/s",
                rate >= GOAL_MUTATIONS_PER_S,
            )
    for phase, what in (("goal", "at the goal rate"), ("max", "at max throughput")):
        for name in ("none", "exact"):
            idle = _get(configs, name, "phases", "idle", "queries", "p99_ms")
            busy = _get(configs, name, "phases", phase, "queries", "p99_ms")
            rate = _get(configs, name, "phases", phase, "updates", "mutations_per_s")
            if math.isnan(idle) or math.isnan(busy):
                continue
            ratio = busy / idle
            add(
                f"query p99 with updates ≤ {GOAL_P99_RATIO}× without ({LABELS[name]}, "
                f"{what}: {rate:,.0f} mutations/s)",
                f"{busy:,.0f} ms vs {idle:,.0f} ms = {ratio:.1f}×",
                ratio <= GOAL_P99_RATIO,
            )
    stale, wrong, compared = staleness_totals(summary)
    add(
        "staleness 0 (read-your-writes: answers at or after the acknowledged sequence; rows "
        "equal to a cache-bypass recomputation)",
        f"{stale} stale answers, {wrong} wrong of {compared:,} rows compared",
        stale == 0 and wrong == 0 if compared else None,
    )
    idle = _get(configs, "refresh", "phases", "idle", "queries", "hot_hit_ratio")
    busy = _get(configs, "refresh", "phases", summary["refresh_phase"], "queries",
                "hot_hit_ratio")  # fmt: skip
    if not (math.isnan(idle) or math.isnan(busy)):
        ratio = busy / idle if idle else math.nan
        add(
            f"hot-key hit ratio with refresh_hot_rows at {summary['refresh_phase']} ≥ "
            f"{GOAL_HOT_RATIO:.0%} of the no-update ratio",
            f"{busy:.1%} vs {idle:.1%} = {ratio:.0%}",
            ratio >= GOAL_HOT_RATIO,
        )
    return out


def staleness_totals(summary: dict[str, Any]) -> tuple[int, int, int]:
    """(stale answers, wrong rows, rows compared) over every checker, quiet check and
    cold-start comparison of the run."""
    stale = wrong = compared = 0
    for cfg in summary["configs"].values():
        for phase in cfg["phases"].values():
            chk = phase.get("checker")
            if not chk:
                continue
            stale += chk["stale"]
            wrong += chk["wrong_rows"]
            compared += chk["compared"]
            quiet = chk.get("quiet") or {}
            wrong += quiet.get("wrong_rows", 0)
            compared += quiet.get("rows_compared", 0)
        cold = cfg.get("cold_start")
        if cold:
            stale += cold["stale"]
            wrong += cold["wrong_rows"]
            compared += cold["rows_compared"]
    return stale, wrong, compared


# --------------------------------------------------------------------------- markdown
def _ms(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _ratio(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.0%}"


def _num(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.0f}"


def _rate_label(rate: float) -> str:
    if rate == 0:
        return "0 (idle)"
    if math.isinf(rate):
        return "max"
    return f"{rate:,.0f}"


def markdown(summary: dict[str, Any], png: str) -> list[str]:
    """The report (tables of every measurement, ratios side by side from one run)."""
    g, load, upd = summary["graph"], summary["load"], summary["updates"]
    configs = summary["configs"]
    lines = [
        "# Graph updates on a living service",
        "",
        f"Real service (`hopserve serve` subprocess, in-process worker, Redis cache on a "
        f"private `redis-server`) serving a 2-layer GraphSAGE and a 2-layer GCN "
        f"(`hopserve.examples`, {g['dim']} → {g['hidden']} → {g['out_dim']}) on one "
        f"power-law (R-MAT) graph of {g['nodes']:,} nodes and {g['edges']:,} edges; "
        f"{summary['machine_line']}. Client (load, updater, checker) and service share the "
        f"cores{summary['load_note']}. {_revision_note(summary)}",
        "",
        f"Queries: open loop, Poisson arrivals at {load['rate']:g}/s, {load['set_size']} "
        f"targets per request, half to each model; targets Zipf (a={load['zipf']}) over a "
        f"shuffled ID space, {load['hot_fraction']:.0%} of requests drawn only from the "
        f"{load['hot_keys']} hottest keys. Every phase replays the **same** "
        f"{load['requests']}-request stream ({load['duration_s']:g} s); a warm-up played it "
        f"once, so the idle phase is each configuration's ceiling and a miss in an update "
        f"phase is an invalidated (exact) or flushed row. Latency is counted from the "
        f"scheduled arrival (client deadline {load['timeout_s']:g} s).",
        "",
        f"Updates: edge mutations through `AdminClient.update_graph` ({upd['remove_fraction']:.0%}"
        f" removals of edges added before, the rest random additions; uniform endpoints), one "
        f"batch in flight; at a fixed rate one batch every {upd['batch_interval_s'] * 1e3:g} "
        f"ms (10/s → 1 mutation per batch, 1,000/s → 100); the goal phase: "
        f"{upd['goal_rate']:,.0f}/s in one batch every {upd['goal_interval_s'] * 1e3:g} ms; "
        f"`max`: batches of {upd['max_batch']:,} back to back. Each batch is fsynced to the "
        f"update log before "
        f"it is acknowledged. Configurations run one after the other, each on a fresh copy "
        f"of the same base graph with the same query stream and the same update stream.",
        "",
        "## Goals",
        "",
    ]
    lines += harness.markdown_table(
        ["goal", "measured", "met"],
        [[x["goal"], x["measured"], {True: "yes", False: "**no**", None: "-"}[x["met"]]]
         for x in summary["goals"]],
        "lll",
    )  # fmt: skip

    # -- throughput
    lines += [
        "",
        "## Update throughput while serving",
        "",
        f"While the query stream runs ({load['duration_s']:g} s per phase): the goal phase "
        f"sends {upd['goal_rate']:,.0f} mutations/s (one batch every "
        f"{upd['goal_interval_s'] * 1e3:g} ms), `max` batches of {upd['max_batch']:,} "
        "mutations back to back (the sustained throughput).",
        "",
    ]
    rows = []
    for name, cfg in configs.items():
        for key in ("goal", "max"):
            ph = cfg["phases"].get(key)
            if not ph:
                continue
            u, q = ph["updates"], ph["queries"]
            idle = _get(cfg, "phases", "idle", "queries", "p99_ms")
            rows.append([
                LABELS[name], key, _num(u["mutations_per_s"]), u["batches"],
                _num(u["batch_mutations_mean"]),
                f"{_ms(u['ack_ms']['p50'])} / {_ms(u['ack_ms']['p99'])}",
                _ms(u["server_apply_ms_mean"]), _num(u["rows_invalidated"]["per_s"]),
                f"{_ms(q['p50_ms'])} / {_ms(q['p99_ms'])}", f"{q['p99_ms'] / idle:.1f}×",
                _errors(ph),
            ])  # fmt: skip
    lines += harness.markdown_table(
        ["configuration", "phase", "mutations/s", "batches", "mutations/batch",
         "ack p50 / p99 (ms)", "server apply mean (ms)", "rows invalidated/s",
         "query p50 / p99 (ms)", "p99 vs idle", "errors"],
        rows, "llrrrrrrrrl",
    )  # fmt: skip

    # -- latency
    lines += ["", "## Query latency with and without updates", ""]
    rows = []
    for name, cfg in configs.items():
        idle = _get(cfg, "phases", "idle", "queries", "p99_ms")
        for ph in cfg["phases"].values():
            q = ph["queries"]
            u = ph.get("updates")
            rows.append([
                LABELS[name], _rate_label(ph["update_rate"]),
                _num(u["mutations_per_s"]) if u else "-",
                f"{_ms(u['ack_ms']['p50'])} / {_ms(u['ack_ms']['p99'])}" if u else "-",
                f"{q['ok']} / {q['sent']}",
                _ms(q["p50_ms"]), _ms(q["p99_ms"]), f"{q['p99_ms'] / idle:.1f}×",
                f"{_ms(q['sage']['p50_ms'])} / {_ms(q['sage']['p99_ms'])}",
                f"{_ms(q['gcn']['p50_ms'])} / {_ms(q['gcn']['p99_ms'])}",
                _errors(ph),
            ])  # fmt: skip
    lines += [
        "Per phase: the update rate asked and achieved, the acknowledgement time of a batch, "
        "and the queries (ms, from the scheduled arrival).",
        "",
    ]
    lines += harness.markdown_table(
        ["configuration", "updates/s", "achieved", "ack p50 / p99 (ms)", "queries ok / sent",
         "p50", "p99", "p99 vs idle", "sage p50 / p99", "gcn p50 / p99", "errors"],
        rows, "lrrrrrrrrrl",
    )  # fmt: skip

    # -- hit ratio
    lines += [
        "",
        "## Cache hit ratio against the update rate",
        "",
        "Rows served from the cache / rows asked, same stream and same updates in every "
        "column; *hot* = the requests drawn from the hot keys only.",
        "",
    ]
    rates = sorted({ph["update_rate"] for c in configs.values() for ph in c["phases"].values()
                    if not math.isinf(ph["update_rate"])})  # fmt: skip
    cached = [n for n in configs if n != "none"]
    headers = ["updates/s"] + [LABELS[n] for n in configs]
    headers += [f"hot: {LABELS[n]}" for n in cached]
    per_model = [n for n in ("exact", "flush") if n in configs]
    headers += [f"{LABELS[n]}: sage / gcn" for n in per_model]
    rows = []
    for rate in rates:
        row = [_rate_label(rate)]
        for key, names in (("hit_ratio", list(configs)), ("hot_hit_ratio", cached)):
            for n in names:
                ph = _phase_at(configs[n], rate)
                row.append(_ratio(_get(ph, "queries", key)) if ph else "")
        for n in per_model:
            ph = _phase_at(configs[n], rate)
            row.append(
                f"{_ratio(_get(ph, 'queries', 'sage', 'hit_ratio'))} / "
                f"{_ratio(_get(ph, 'queries', 'gcn', 'hit_ratio'))}"
                if ph
                else ""
            )
        rows.append(row)
    lines += harness.markdown_table(headers, rows, "l" + "r" * (len(headers) - 1))

    # -- invalidation
    ex = configs.get("exact")
    if ex:
        lines += [
            "",
            "## Invalidation",
            "",
            "Rows invalidated per acknowledged batch (`UpdateGraphResponse.rows_invalidated`, "
            "summed over both models: the exact 2-hop downstream set of each, GCN's also "
            "through the changed degrees), exact-invalidation service:",
            "",
        ]
        rows = []
        for ph in ex["phases"].values():
            u = ph.get("updates")
            if not u:
                continue
            r = u["rows_invalidated"]
            rows.append([
                _rate_label(ph["update_rate"]), u["batches"], _num(u["batch_mutations_mean"]),
                _num(r["p50"]), _num(r["p90"]), _num(r["p99"]), _num(r["max"]),
                _num(r["per_mutation"]), _num(r["per_s"]),
                f"{_ms(u['ack_ms']['p50'])} / {_ms(u['ack_ms']['p99'])}",
                _ms(u["server_apply_ms_mean"]),
            ])  # fmt: skip
        lines += harness.markdown_table(
            ["updates/s", "batches", "mutations/batch", "rows p50", "p90", "p99", "max",
             "rows/mutation", "rows/s", "ack p50 / p99 (ms)", "server apply mean (ms)"],
            rows, "lrrrrrrrrrr",
        )  # fmt: skip
        hubs = ex.get("hubs") or []
        if hubs:
            lines += ["", f"One-edge batches (out of {g['nodes']:,} rows per model):", ""]
            lines += harness.markdown_table(
                ["edge", "rows invalidated", "of both models' rows", "ack (ms)"],
                [[h["edge"], f"{h['rows_invalidated']:,}",
                  f"{h['rows_invalidated'] / (2 * g['nodes']):.1%}", _ms(h["ack_ms"])]
                 for h in hubs],
                "lrrr",
            )  # fmt: skip
    cost = summary.get("cost")
    if cost:
        lines += [
            "",
            "## Where an update's time goes",
            "",
            "The service's own functions (`hopserve.worker.graph.live`) timed one by one in the "
            "benchmark process on a copy of the graph (median of "
            f"{summary['cost_reps']} batches per size, ms):",
            "",
        ]
        rows = []
        for k, c in cost["per_batch_size"].items():
            rows.append([
                f"{int(k):,}", _ms(c["resolve_s"] * 1e3), _ms(c["splice_s"] * 1e3),
                _ms(c["log_fsync_s"] * 1e3),
                f"{_ms(c['invalidate_sage_s'] * 1e3)} / {_ms(c['invalidate_gcn_s'] * 1e3)}",
                f"{c['rows_sage']:,.0f} / {c['rows_gcn']:,.0f}",
                f"{c['rows_gcn_in_degree']:,.0f}", _ms(c["total_s"] * 1e3),
                _num(int(k) / c["total_s"]),
            ])  # fmt: skip
        for name, c in cost["hubs"].items():
            rows.append([
                name, _ms(c["resolve_s"] * 1e3), _ms(c["splice_s"] * 1e3),
                _ms(c["log_fsync_s"] * 1e3),
                f"{_ms(c['invalidate_sage_s'] * 1e3)} / {_ms(c['invalidate_gcn_s'] * 1e3)}",
                f"{c['rows_sage']:,} / {c['rows_gcn']:,}", f"{c['rows_gcn_in_degree']:,}",
                _ms(c["total_s"] * 1e3), "",
            ])  # fmt: skip
        lines += harness.markdown_table(
            ["edges/batch", "resolve", "splice CSC+CSR", "log append + fsync",
             "invalidation sage / gcn", "rows sage / gcn", "gcn rows, with source degrees",
             "total", "edges/s (this size)"],
            rows, "lrrrrrrrr",
        )  # fmt: skip
        gp = cost["gcn_prepare"]
        lines += [
            "",
            f"Invalidation computes {cost['invalidation_rows_per_s']:,.0f} rows/s. The first "
            f"update of a process also builds the out-edge CSR: {cost['first_update_s']:.1f} s. "
            f"A GCN layer's whole-graph normalization (`GCNAdapter.prepare`, once per new "
            f"graph sequence before the first GCN job on it): {gp['first_s'] * 1e3:,.0f} ms "
            f"at load, {gp['per_new_sequence_s'] * 1e3:,.0f} ms per new sequence "
            f"(× {gp['layers']} layers). *gcn rows, with source degrees*: the GCN set if the "
            f"sources' out-neighbourhoods counted too (what the service invalidated before "
            f"it told PyG's `gcn_norm`, which reads in-degrees only, from DGL's `GraphConv`, "
            f"which reads source out-degrees).",
        ]

    # -- query stages
    stage_keys = ("cache_lookup", "queue_wait", "planning", "prepare", "compute", "transfer")
    rows = []
    for name in ("none", "exact"):
        cfg = configs.get(name)
        if not cfg:
            continue
        for ph in cfg["phases"].values():
            q = ph["queries"]
            st = q.get("stages_mean_ms") or {}
            rows.append(
                [LABELS[name], _rate_label(ph["update_rate"]), _ms(q["mean_ms"])]
                + [_ms(st.get(k, math.nan)) for k in stage_keys]
                + [
                    _ms(st.get("total", math.nan)),
                    _ms(st.get("total", math.nan) - sum(st.get(k, 0.0) for k in stage_keys)),
                    _ms(st.get("outside_server", math.nan)),
                    f"{_num(_get(ph, 'worker_jobs', 'replanned'))} / "
                    f"{_num(_get(ph, 'worker_jobs', 'ok'))}",
                ]
            )
    if rows:
        lines += [
            "",
            "## Where a query's time goes",
            "",
            "Mean per request (ms): the server's own stage timings (`EmbeddingResult.timing`), "
            "its total's part in no stage (waiting for the graph's lock, planning again after "
            "the graph moved on, ...) and the rest of the client-measured latency (from the scheduled arrival: "
            "network, the client's event loop, and the front-end's event loop before the "
            "request is parsed). *Jobs replanned*: worker jobs refused because the graph "
            "moved past the sequence they were planned at (`hopserve_worker_jobs_total`; a "
            "batch is planned again up to 4 times, then the request fails UNAVAILABLE).",
            "",
        ]
        lines += harness.markdown_table(
            ["configuration", "updates/s", "latency mean", *stage_keys, "server total",
             "server, in no stage", "outside the server", "jobs replanned / run"],
            rows, "l" + "r" * 12,
        )  # fmt: skip

    # -- staleness
    lines += [
        "",
        "## Staleness checker",
        "",
        "After each acknowledged batch (the newest one when several were acknowledged while "
        "it worked) the checker asks for the batch's probe node with the cache on — half of "
        "the probes are changed through an in-neighbour (2 hops) — alternating models; the "
        f"answer must be at the batch's sequence or later, and every "
        f"{summary['check_every']}th is compared with a cache-bypass recomputation at the "
        "same sequence. *Quiet*: after the phase, cached answers for the probes, 64 hot keys "
        "and the last batch's destinations against recomputations.",
        "",
    ]
    rows = []
    for name, cfg in configs.items():
        for ph in cfg["phases"].values():
            c = ph.get("checker")
            if not c:
                continue
            quiet = c.get("quiet") or {}
            rows.append([
                LABELS[name], _rate_label(ph["update_rate"]),
                f"{c['checks']} ({c['two_hop_checks']})", c["superseded"], c["stale"],
                f"{c['compared']} / {c['wrong_rows']}",
                f"{quiet.get('rows_compared', '-')} / {quiet.get('wrong_rows', '-')}"
                if quiet else "-",
                f"{_ms(c['ack_to_answer_ms']['p50'])} / {_ms(c['ack_to_answer_ms']['p99'])}",
                ", ".join(f"{k} {v}" for k, v in c["errors"].items()) or "-",
            ])  # fmt: skip
    lines += harness.markdown_table(
        ["configuration", "updates/s", "checks (2-hop)", "superseded", "stale answers",
         "rows compared / wrong", "quiet: compared / wrong", "ack → answer p50 / p99 (ms)",
         "errors"],
        rows, "lrrrrrrrl",
    )  # fmt: skip

    # -- cold start
    cold = _get(configs, "exact", "cold_start", default=None)
    if cold:
        lines += [
            "",
            "## Cold start",
            "",
            f"{cold['reps']} batches, each adding {cold['set_size']} nodes with "
            f"{cold['degree']} in- and {cold['degree']} out-edges each (no other load); then, "
            f"alternating models: a 1-node request (the first after the update: whatever a "
            f"new sequence costs), the {cold['set_size']} new nodes (cache on: all misses), "
            f"and {cold['set_size']} random existing nodes recomputed (cache bypass). "
            f"New rows vs recomputation: {cold['wrong_rows']} wrong of "
            f"{cold['rows_compared']}; stale answers: {cold['stale']}.",
            "",
        ]
        rows = []
        for model in MODELS:
            c = cold[model]
            rows.append([
                model, _ms(c["update_ms"]["p50"]),
                f"{_ms(c['first_ms']['p50'])} / {_ms(c['first_ms']['p99'])}",
                f"{_ms(c['new_ms']['p50'])} / {_ms(c['new_ms']['p99'])}",
                f"{_ms(c['existing_ms']['p50'])} / {_ms(c['existing_ms']['p99'])}",
                f"{c['new_ms']['p50'] / c['existing_ms']['p50']:.2f}×",
            ])  # fmt: skip
        lines += harness.markdown_table(
            ["model", "update ack p50 (ms)", "first request after it p50 / p99",
             f"{cold['set_size']} new nodes p50 / p99", f"{cold['set_size']} existing p50 / p99",
             "new vs existing (p50)"],
            rows, "lrrrrr",
        )  # fmt: skip

    # -- the rest
    lines += ["", "## Service start and warm-up", ""]
    lines += harness.markdown_table(
        ["configuration", "start until both models SERVING (s)", "first update (s)",
         "rows it invalidated", "warm-up stream (s)"],
        [[LABELS[n], f"{c['start_s']:.1f}", f"{c['warm_up']['first_update_s']:.1f}",
          f"{c['warm_up']['first_update_rows_invalidated']:,}",
          f"{c['warm_up']['warm_stream_s']:.1f}"] for n, c in configs.items()],
        "lrrrr",
    )  # fmt: skip
    lines += ["", "## Model hot swap", "", summary["model_swap"]]
    if summary.get("observations"):
        lines += ["", "## Observations", ""] + [f"* {x}" for x in summary["observations"]]
    lines += ["", f"![updates]({png})", "", f"Run: {summary['wall_s']:.0f} s wall; "
              f"`{summary['command']}`."]  # fmt: skip
    return lines


def _revision_note(summary: dict[str, Any]) -> str:
    """Which code was measured (and a warning when the checkout changed during the run)."""
    rev, start = summary.get("revision") or {}, summary.get("revision_start") or {}
    text = f"Code: commit `{str(rev.get('commit', '?'))[:10]}`"
    if rev.get("dirty"):
        text += " with uncommitted changes in the tree"
    if start and start.get("commit") != rev.get("commit"):
        text += (
            f" — **the checkout moved during the run** (from `{str(start.get('commit'))[:10]}`"
            "): configurations started later ran newer code"
        )
    return text + "."


def _errors(ph: dict[str, Any]) -> str:
    errs = dict(ph["queries"].get("errors") or {})
    for k, v in (_get(ph, "updates", "errors", default={}) or {}).items():
        errs[f"update {k}"] = v
    return ", ".join(f"{k} {v}" for k, v in errs.items()) or "-"


def _phase_at(cfg: dict[str, Any], rate: float) -> dict[str, Any] | None:
    for ph in cfg["phases"].values():
        if ph["update_rate"] == rate:
            return ph
    return None


# --------------------------------------------------------------------------- figure
def plot(path: Path, summary: dict[str, Any]) -> None:
    """Hit ratio vs update rate; p99 per phase; rows invalidated per batch; update cost."""
    plt = harness.pyplot()
    configs = summary["configs"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    a, b, c, d = axes.ravel()
    colors = {"exact": "#1b9e77", "refresh": "#7570b3", "flush": "#d95f02", "none": "#666666"}

    def xpos(rate: float) -> float:
        return 1.0 if rate == 0 else rate  # log axis: idle drawn at 1

    for name, cfg in configs.items():
        pts = sorted((ph["update_rate"], ph) for ph in cfg["phases"].values()
                     if not math.isinf(ph["update_rate"]))  # fmt: skip
        xs = [xpos(r) for r, _ in pts]
        a.plot(xs, [ph["queries"]["hit_ratio"] for _, ph in pts], marker="o",
               color=colors[name], label=LABELS[name])  # fmt: skip
        if name != "none":
            a.plot(
                xs,
                [ph["queries"]["hot_hit_ratio"] for _, ph in pts],
                marker="^",
                ls="--",
                color=colors[name],
                alpha=0.7,
                label=f"hot keys: {LABELS[name]}",
            )
    a.set_xscale("log")
    a.set_xlabel("edge mutations / s (idle drawn at 1)")
    a.set_ylabel("cache hit ratio")
    a.set_ylim(-0.02, 1.02)
    a.set_title("hit ratio vs update rate (same stream)")
    a.legend(fontsize=7)

    names = list(configs)
    phases = []
    for cfg in configs.values():
        for key in cfg["phases"]:
            if key not in phases:
                phases.append(key)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        vals = [_get(configs[name], "phases", p, "queries", "p99_ms") for p in phases]
        xs = [j + i * width for j in range(len(phases))]
        b.bar(xs, vals, width, color=colors[name], label=LABELS[name])
    b.set_xticks([j + 0.4 - width / 2 for j in range(len(phases))], phases)
    b.set_yscale("log")
    b.set_ylabel("query p99 (ms)")
    b.set_xlabel("updates / s")
    b.set_title("query p99 with vs without updates")
    b.legend(fontsize=7)

    ex = configs.get("exact")
    if ex:
        labels, stats = [], []
        for key, ph in ex["phases"].items():
            if ph.get("updates"):
                labels.append(key)
                stats.append(ph["updates"]["rows_invalidated"])
        for q, marker in (("p50", "o"), ("p90", "s"), ("p99", "^"), ("max", "x")):
            c.plot(labels, [s[q] for s in stats], marker=marker, ls="-", label=q)
        c.set_yscale("log")
        c.set_ylabel("rows invalidated per batch")
        c.set_xlabel("updates / s (exact)")
        c.set_title("invalidation per batch")
        c.legend(fontsize=7)

    cost = summary.get("cost")
    if cost:
        sizes = list(cost["per_batch_size"])
        parts = (("resolve_s", "resolve"), ("splice_s", "splice CSC+CSR"),
                 ("log_fsync_s", "log + fsync"), ("invalidate_s", "invalidation"))  # fmt: skip
        bottom = [0.0] * len(sizes)
        for key, label in parts:
            vals = [cost["per_batch_size"][s][key] * 1e3 for s in sizes]
            d.bar(sizes, vals, bottom=bottom, label=label)
            bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
        d.set_xlabel("edges per batch")
        d.set_ylabel("ms per batch (in-process)")
        d.set_title("where an update's time goes")
        d.legend(fontsize=7)
    harness.save_figure(fig, path)
