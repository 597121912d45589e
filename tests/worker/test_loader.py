"""load_model: entrypoint import, constructor kwargs, weights_only state dicts."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from support.servable import ENTRYPOINT, TinySAGE

from hopserve.worker.loader import ModelLoadError, load_model

KWARGS = {"in_dim": 5, "hidden": 7, "out_dim": 3}


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    torch.manual_seed(1)
    path = tmp_path / "w.pt"
    torch.save(TinySAGE(**KWARGS).state_dict(), path)
    return path


def test_happy_path_loads_weights_in_eval_mode(weights):
    model = load_model(ENTRYPOINT, KWARGS, weights)
    assert isinstance(model, TinySAGE) and not model.training
    want = torch.load(weights, weights_only=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, want[key]), key


def test_no_weights_keeps_init():
    model = load_model(ENTRYPOINT, KWARGS, None)
    assert isinstance(model, TinySAGE) and not model.training


@pytest.mark.parametrize(
    ("entrypoint", "match"),
    [
        ("no_such_pkg.mod:Model", "cannot import module 'no_such_pkg.mod'"),
        ("support.servable:Missing", "has no attribute 'Missing'"),
        ("support.servable:NotAModel", "not a torch.nn.Module subclass"),
        ("support.servable", "expected 'package.module:ClassName'"),
    ],
)
def test_bad_entrypoint_is_named(entrypoint, match):
    with pytest.raises(ModelLoadError, match=match) as info:
        load_model(entrypoint, KWARGS, None)
    assert entrypoint in str(info.value)


def test_bad_kwargs_are_named():
    with pytest.raises(ModelLoadError, match="rejected kwargs") as info:
        load_model(ENTRYPOINT, {"in_dim": 5, "widht": 3}, None)
    assert "widht" in str(info.value)


def test_missing_weights_file(tmp_path):
    with pytest.raises(ModelLoadError, match="file not found") as info:
        load_model(ENTRYPOINT, KWARGS, tmp_path / "nope.pt")
    assert "nope.pt" in str(info.value)


def test_state_dict_mismatch_names_keys(tmp_path, weights):
    state = torch.load(weights, weights_only=True)
    state["extra.weight"] = torch.zeros(1)
    del state["conv2.lin_l.bias"]
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    with pytest.raises(ModelLoadError) as info:
        load_model(ENTRYPOINT, KWARGS, path)
    assert "extra.weight" in str(info.value) and "conv2.lin_l.bias" in str(info.value)


def test_shape_mismatch_is_named(weights):
    with pytest.raises(ModelLoadError, match="size mismatch"):
        load_model(ENTRYPOINT, {**KWARGS, "hidden": 9}, weights)


class _Payload:
    """Any object that needs pickle to come back (here: a whole module)."""


def test_pickled_objects_are_refused(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"model": TinySAGE(**KWARGS), "obj": _Payload()}, path)  # not a state dict
    with pytest.raises(ModelLoadError, match=r"weights_only=True.*state_dict"):
        load_model(ENTRYPOINT, KWARGS, path)


def test_non_mapping_and_garbage_files(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], path)
    with pytest.raises(ModelLoadError, match="expected a state_dict"):
        load_model(ENTRYPOINT, KWARGS, path)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(ModelLoadError, match="cannot be read"):
        load_model(ENTRYPOINT, KWARGS, junk)


def test_ordered_dict_state_is_fine(tmp_path, weights):
    path = tmp_path / "od.pt"
    torch.save(collections.OrderedDict(torch.load(weights, weights_only=True)), path)
    assert isinstance(load_model(ENTRYPOINT, KWARGS, path), TinySAGE)


def test_checkpoint_dict_gets_a_hint_and_weights_key_loads_it(tmp_path, weights):
    checkpoint = tmp_path / "ckpt.pt"
    state = torch.load(weights, weights_only=True)
    torch.save({"epoch": 3, "model_state_dict": state, "lr": 0.01}, checkpoint)
    with pytest.raises(ModelLoadError, match="weights_key: model_state_dict"):
        load_model(ENTRYPOINT, KWARGS, checkpoint)
    model = load_model(ENTRYPOINT, KWARGS, checkpoint, weights_key="model_state_dict")
    assert torch.equal(model.conv1.lin_l.weight, state["conv1.lin_l.weight"])
    with pytest.raises(ModelLoadError, match=r"weights_key 'state' is not a state_dict.*epoch"):
        load_model(ENTRYPOINT, KWARGS, checkpoint, weights_key="state")


def test_entrypoint_module_is_imported_from_the_search_path(tmp_path, monkeypatch):
    """Regression: a module next to the config could not be imported unless the server
    ran from that folder."""
    folder = tmp_path / "cfg"
    folder.mkdir()
    (folder / "my_loader_models.py").write_text(
        "from support.servable import TinySAGE\n\nclass Mine(TinySAGE):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match="searched sys.path only"):
        load_model("my_loader_models:Mine", KWARGS, None)
    model = load_model("my_loader_models:Mine", KWARGS, None, search_path=[folder])
    assert type(model).__name__ == "Mine"
    assert str(folder) not in __import__("sys").path  # only during the import
    with pytest.raises(ModelLoadError, match=rf"searched '{tmp_path}'.*installed"):
        load_model("not_there_mod:X", KWARGS, None, search_path=[tmp_path])
