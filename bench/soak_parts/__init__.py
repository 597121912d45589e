"""The parts of ``bench/soak.py`` (the command line and the top-level flow stay there).

* :mod:`.common` — the run's constants (model, phase fractions, goals, scraped series),
  progress lines, gRPC status codes, number formats;
* :mod:`.reference` — the model's own full-graph forward and the row comparison
  (``tests/support.assert_exact``'s tolerance);
* :mod:`.load` — the open-loop load generator (a process of its own) and the checker thread;
* :mod:`.run` — :class:`~.run.Soak`: Redis, worker and front-end, the load, the phases and
  the faults;
* :mod:`.analysis` — records, scrapes and logs to the summary and the goals;
* :mod:`.markdown` and :mod:`.plot` — the report and the timeline figure.

``bench/`` is not a package: ``bench/soak.py`` puts it on ``sys.path``, so these modules
import ``harness`` (``bench/harness/``) and each other as ``soak_parts``.
"""
