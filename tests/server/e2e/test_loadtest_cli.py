"""``hopserve loadtest`` against a real server whose graph has external IDs."""

from __future__ import annotations

from typer.testing import CliRunner

from hopserve.cli import app


def test_loadtest_draws_ids_from_the_graph_and_explains_failures(served, graph_dir) -> None:
    """Regression: on a graph ingested with external IDs every request failed
    (``{'INVALID_ARGUMENT': 3262}``) and the reason was never shown."""
    runner = CliRunner()
    common = ["loadtest", "--target", served.target, "--model", "sage", "--concurrency", "2"]
    common += ["--duration", "0.5", "--warmup", "0"]
    ok = runner.invoke(app, [*common, "--graph", str(graph_dir)])
    assert ok.exit_code == 0, ok.output
    assert "errors 0" in ok.output and "first error" not in ok.output
    blind = runner.invoke(app, common)
    assert blind.exit_code == 0, blind.output
    assert "first error: [INVALID_ARGUMENT] GetEmbeddings: model 'sage':" in blind.output
    assert "pass --graph <graph dir> or --nodes-file" in blind.output
