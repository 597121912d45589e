"""Build the user's model from a config entrypoint and load its weights safely.

``load_model("mypkg.models:GraphSAGE", {"in_dim": 128}, "sage.pt")`` imports the class,
constructs it with the keyword arguments, loads the ``state_dict`` with
``torch.load(weights_only=True)`` (plain tensors only: a file that needs pickle to build
arbitrary objects is refused) and ``load_state_dict(strict=True)``, and returns the
module in eval mode. Every failure raises :class:`ModelLoadError` naming the entrypoint,
the kwargs, the file or the mismatching keys.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import pickle
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["ModelLoadError", "import_model_class", "load_model", "load_state_dict"]

log = logging.getLogger(__name__)


class ModelLoadError(ValueError):
    """The model class, its constructor arguments or its weights file cannot be used."""


def import_model_class(entrypoint: str, search_path: Sequence[Path] = ()) -> type[nn.Module]:
    """Import ``"package.module:ClassName"`` (the attribute may be dotted: ``"m:Outer.Inner"``).

    Args:
        entrypoint: ``"package.module:ClassName"``.
        search_path: Folders searched before the installed packages (e.g. the config
            file's folder); they are on ``sys.path`` only while the module is imported.

    Raises:
        ModelLoadError: malformed entrypoint, module or attribute missing, or the attribute
            is not an ``nn.Module`` subclass; an import failure says where it looked.
    """
    module_name, sep, attr_path = entrypoint.partition(":")
    if not sep or not module_name or not attr_path:
        raise ModelLoadError(f"entrypoint {entrypoint!r}: expected 'package.module:ClassName'")
    folders = [str(Path(p)) for p in search_path]
    try:
        with _on_sys_path(folders):
            module = importlib.import_module(module_name)
    except ImportError as err:
        where = ", ".join(repr(f) for f in folders)
        searched = (
            f"searched {where}, then the installed packages"
            if folders
            else "searched sys.path only"
        )
        raise ModelLoadError(
            f"entrypoint {entrypoint!r}: cannot import module {module_name!r} ({err}); {searched}"
        ) from err
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelLoadError(
                f"entrypoint {entrypoint!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise ModelLoadError(
            f"entrypoint {entrypoint!r}: {attr_path} is a {type(obj).__name__}, "
            "not a torch.nn.Module subclass"
        )
    return obj


@contextlib.contextmanager
def _on_sys_path(folders: list[str]) -> Iterator[None]:
    """Put ``folders`` first on ``sys.path`` for the duration of an import."""
    added = [f for f in folders if f not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def load_state_dict(path: str | Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """Read a ``state_dict`` file with ``torch.load(weights_only=True)`` onto the CPU.

    Args:
        path: The file.
        key: For a checkpoint dict wrapping the ``state_dict``: the key holding it.

    Raises:
        ModelLoadError: missing/unreadable file, a file that needs pickle to rebuild
            arbitrary objects, or content that is not a mapping of names to tensors (a
            checkpoint dict gets a hint naming the key that holds the ``state_dict``).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weights {str(path)!r}: file not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = _unpickler_reason(str(err))
        if "global" in reason.lower():  # the file names classes/functions to rebuild
            raise ModelLoadError(
                f"weights {str(path)!r}: refused by torch.load(weights_only=True): the file "
                f"needs pickle to rebuild Python objects ({reason}). Save the model's "
                "state_dict (torch.save(model.state_dict(), path)), not the model object"
            ) from None
        raise ModelLoadError(
            f"weights {str(path)!r}: cannot be read by torch.load(weights_only=True) ({reason})"
        ) from None
    except Exception as err:  # corrupt zip, truncated file, not a torch file, ...
        raise ModelLoadError(
            f"weights {str(path)!r}: cannot be read by torch.load ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(state, Mapping):
        raise ModelLoadError(
            f"weights {str(path)!r}: expected a state_dict (mapping of names to tensors), "
            f"got {type(state).__name__}"
        )
    if key is not None:
        if key not in state or not isinstance(state[key], Mapping):
            keys = sorted(map(str, state))[:10]
            raise ModelLoadError(
                f"weights {str(path)!r}: weights_key {key!r} is not a state_dict in the file "
                f"(top-level keys: {keys})"
            )
        state = state[key]
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        nested = [str(k) for k, v in state.items() if _looks_like_state_dict(v)]
        hint = (
            f". It looks like a training checkpoint: the state_dict is under key "
            f"{nested[0]!r}; set `weights_key: {nested[0]}` in the model's config (or save "
            f"torch.save(checkpoint[{nested[0]!r}], path))"
            if nested
            else ""
        )
        raise ModelLoadError(
            f"weights {str(path)!r}: entries that are not tensors: "
            f"{sorted(map(str, bad))[:10]}{hint}"
        )
    return dict(state)


def _looks_like_state_dict(value: object) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, torch.Tensor) for v in value.values())
    )


def _unpickler_reason(message: str) -> str:
    """The specific part of torch's weights-only error (after ``WeightsUnpickler error:``)."""
    _, found, rest = message.partition("WeightsUnpickler error:")
    text = rest if found else message
    text = " ".join(text.split("Check the documentation")[0].split())
    text = text.split(" was not an allowed global")[0]
    return text[:300] or "not a weights-only file"


def load_model(
    entrypoint: str,
    kwargs: Mapping[str, Any] | None,
    weights: str | Path | None,
    *,
    device: str | torch.device = "cpu",
    search_path: Sequence[Path] = (),
    weights_key: str | None = None,
) -> nn.Module:
    """Construct the user's model class, load its weights strictly, return it in eval mode.

    Args:
        entrypoint: ``"package.module:ClassName"``.
        kwargs: constructor keyword arguments (``None`` = none).
        weights: ``state_dict`` file, or ``None`` to keep the constructor's initialisation.
        device: where the returned module lives.
        search_path: folders to import the entrypoint's module from first.
        weights_key: key of the ``state_dict`` inside a checkpoint dict.

    Raises:
        ModelLoadError: see :func:`import_model_class` and :func:`load_state_dict`; also a
            constructor that rejects ``kwargs``, and missing or unexpected state-dict keys
            or shape mismatches (named).
    """
    cls = import_model_class(entrypoint, search_path)
    kwargs = dict(kwargs or {})
    try:
        model = cls(**kwargs)
    except TypeError as err:
        raise ModelLoadError(
            f"entrypoint {entrypoint!r}: constructor rejected kwargs {kwargs!r} ({err})"
        ) from None
    except Exception as err:
        raise ModelLoadError(
            f"entrypoint {entrypoint!r}: constructor failed with kwargs {kwargs!r} "
            f"({type(err).__name__}: {err})"
        ) from err
    if weights is not None:
        state = load_state_dict(weights, weights_key)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as err:  # torch names missing/unexpected keys and bad shapes
            raise ModelLoadError(
                f"weights {str(weights)!r} do not match {entrypoint!r}: {err}"
            ) from None
    else:
        log.warning("model %s: no weights file; using the constructor's initialisation", entrypoint)
    return model.to(device).eval()
