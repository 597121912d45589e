"""Dataclass <-> protobuf message, field by field, by name.

The contract keeps a field's name from the engine to the wire (:mod:`.contract`), so a
message is built from the dataclass fields it also declares, and back. What differs
(nested messages, flattened or renamed fields, "absent" spellings) the caller passes
as ``given``, which wins. Repeated fields come back as lists, map fields as dicts.
A test checks, for every pair, which names each side lacks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["from_message", "to_message"]

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def to_message(obj: Any, message_type: type[M], **given: Any) -> M:
    """``message_type(...)`` from ``obj``'s same-named dataclass fields, then ``given``."""
    names = message_type.DESCRIPTOR.fields_by_name
    values = {
        f.name: getattr(obj, f.name)
        for f in dataclasses.fields(obj)
        if f.name in names and f.name not in given
    }
    return message_type(**values, **given)


def from_message(msg: Message, cls: type[T], **given: Any) -> T:
    """``cls(...)`` from ``msg``'s same-named fields, then ``given``."""
    names = msg.DESCRIPTOR.fields_by_name
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in given or f.name not in names:
            continue
        value = getattr(msg, f.name)
        descriptor = names[f.name]
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            value = dict(value)
        elif _is_repeated(descriptor):
            value = list(value)
        values[f.name] = value
    return cls(**values, **given)


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    is_repeated = getattr(descriptor, "is_repeated", None)  # protobuf >= 5.28
    if is_repeated is not None:
        return bool(is_repeated)
    return descriptor.label == FieldDescriptor.LABEL_REPEATED
