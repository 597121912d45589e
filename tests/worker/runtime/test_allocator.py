"""``worker/runtime/allocator.py``: which allocator a process uses, and starting a child
under tcmalloc (a real child process, where libtcmalloc-minimal4 is installed)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from hopserve.worker.runtime.allocator import (
    active_allocator,
    allocator_hint,
    find_tcmalloc,
    log_allocator,
    with_tcmalloc,
)

LINE = "7f0000000000-7f0000021000 r-xp 00000000 08:01 42 "


def test_the_allocator_is_read_from_the_mapped_libraries(tmp_path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(f"{LINE}/usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert active_allocator(maps) == "glibc"
    maps.write_text(f"{LINE}/usr/lib/libc.so.6\n{LINE}/usr/local/lib/libtcmalloc_minimal.so.4\n")
    assert active_allocator(maps) == "tcmalloc"
    maps.write_text(f"{LINE}/usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert active_allocator(maps) == "jemalloc"
    assert active_allocator(tmp_path / "absent") == "unknown"


def test_tcmalloc_goes_first_in_ld_preload_unless_an_allocator_was_chosen() -> None:
    lib = "/opt/lib/libtcmalloc_minimal.so.4"
    assert with_tcmalloc({}, lib) == {"LD_PRELOAD": lib}
    assert with_tcmalloc({"LD_PRELOAD": "/a.so"}, lib)["LD_PRELOAD"] == f"{lib}:/a.so"
    for chosen in ("/usr/lib/libtcmalloc.so.4", "/a.so:/usr/lib/libjemalloc.so.2"):
        assert with_tcmalloc({"LD_PRELOAD": chosen}, lib) == {"LD_PRELOAD": chosen}
    opted_out = {"HOPSERVE_ALLOCATOR": "system"}
    assert with_tcmalloc(opted_out, lib) == opted_out
    in_image = {"HOPSERVE_ALLOCATOR": "system", "LD_PRELOAD": f"{lib}:/a.so"}
    assert with_tcmalloc(in_image, lib)["LD_PRELOAD"] == "/a.so"
    del in_image["LD_PRELOAD"]
    assert "LD_PRELOAD" not in with_tcmalloc(in_image | {"LD_PRELOAD": lib}, lib)


def test_only_glibc_gets_a_hint_naming_the_fix() -> None:
    assert allocator_hint("tcmalloc") is None
    hint = allocator_hint("glibc")
    assert "LD_PRELOAD=" in hint and "tcmalloc" in hint


@pytest.mark.skipif(find_tcmalloc() is None, reason="libtcmalloc-minimal4 is not installed")
def test_a_child_started_with_tcmalloc_allocates_with_it() -> None:
    code = (
        "import torch; from hopserve.worker.runtime.allocator import active_allocator; "
        "x = torch.ones(1 << 20); print(active_allocator(), float(x.sum()))"
    )
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    for child_env, want in ((env, "glibc"), (with_tcmalloc(env), "tcmalloc")):
        out = subprocess.run(
            [sys.executable, "-c", code], env=child_env, capture_output=True, text=True,
            check=True, timeout=120,
        )  # fmt: skip
        assert out.stdout.split() == [want, str(float(1 << 20))]


def test_the_worker_logs_its_allocator_at_info_level(caplog) -> None:
    """A choice of footprint, not a fault: info level (a secured worker logs no warning)."""
    with caplog.at_level(logging.INFO, logger="hopserve.worker"):
        allocator = log_allocator()
    (record,) = [r for r in caplog.records if "CPU allocator" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert f"CPU allocator: {allocator}" in record.getMessage()
    assert ("LD_PRELOAD=" in record.getMessage()) == (allocator == "glibc")
