"""Whether a traced block may write into memory its inputs share.

The engine hands a block views of stored values and of the graph's features (destination
rows, whole tables of a full layer); a block that writes into one would change a stored
layer for the batches after it, or the graph itself. :func:`writes_into_inputs` finds every
such write in the block's fx graph, conservatively.
"""

from __future__ import annotations

import operator

from torch import fx

__all__ = ["writes_into_inputs"]


def writes_into_inputs(gm: fx.GraphModule) -> bool:
    """Whether an op of ``gm`` may write into memory one of its placeholders shares.

    An input's aliases are the inputs and what any op outside a short list of ops known to
    return new tensors (arithmetic, activations, ``cat``, the convs' adapters, ``Linear``,
    …) makes of them. A write is an in-place method or function (``mul_``, ``relu_``,
    ``aten.relu_``), an ``inplace=True`` or ``out=`` argument, an in-place ``torch.nn``
    module, and any call of a function or module hopserve does not know (an ``fx.wrap``'d
    helper), which may write into all of its arguments. A write into a tensor the block made
    itself (``relu_`` of a conv's output) is no write into an input.
    """
    aliases: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            aliases.add(node)
            continue
        if node.op == "output":
            continue
        if any(arg in aliases for arg in _written(node, gm)):
            return True
        if not _returns_new_tensor(node, gm) and any(
            arg in aliases for arg in node.all_input_nodes
        ):
            aliases.add(node)
    return False


def _written(node: fx.Node, gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes whose memory ``node`` may write into."""
    args = list(node.all_input_nodes)
    out = node.kwargs.get("out")
    written = [out] if isinstance(out, fx.Node) else []
    first = args[:1]
    if node.kwargs.get("inplace") is True:
        written += first
    if node.op == "call_method" and _in_place_name(str(node.target)):
        written += first
    elif node.op == "call_function":
        if node.target in _IN_PLACE_OPERATORS or _in_place_name(_function_name(node.target)):
            written += first
        elif not _known_function(node.target):
            written += args  # an unknown helper may write into any argument
    elif node.op == "call_module" and not str(node.target).startswith("adapters."):
        module = gm.get_submodule(str(node.target))
        if not _torch_nn_module(module):
            written += args
        elif getattr(module, "inplace", False):
            written += first
    return written


def _returns_new_tensor(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node``'s result is a tensor it made (else it may alias an argument)."""
    if node.kwargs.get("inplace") is True or "out" in node.kwargs:
        return False
    if node.op == "call_module":
        if str(node.target).startswith("adapters."):
            return True  # a conv's output
        module = gm.get_submodule(str(node.target))
        name = type(module).__name__
        fresh = name in _FRESH_MODULES or name in _PURE_LIBRARY_MODULES
        return fresh and _torch_nn_module(module) and not getattr(module, "inplace", False)
    if node.op == "call_method":
        return str(node.target) in _FRESH_NAMES
    if node.op == "call_function":
        return _known_function(node.target) and _function_name(node.target) in _FRESH_NAMES
    return False


# Ops whose result is always a new tensor (never a view or their argument itself).
_FRESH_NAMES = frozenset((
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "matmul", "mm", "bmm",
    "addmm", "linear", "bilinear", "cat", "concat", "concatenate", "stack", "hstack",
    "vstack", "relu", "relu6", "elu", "selu", "celu", "gelu", "silu", "mish", "sigmoid",
    "tanh", "softplus", "softsign", "leaky_relu", "prelu", "rrelu", "hardtanh", "hardswish",
    "hardsigmoid", "glu", "logsigmoid", "softmax", "log_softmax", "normalize", "layer_norm",
    "batch_norm", "group_norm", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "clamp",
    "clip", "maximum", "minimum", "where", "sum", "mean", "prod", "amax", "amin", "max", "min",
    "std", "var", "norm", "div", "multiply", "subtract", "outer", "cumsum", "clone",
    "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
))  # fmt: skip
_FRESH_MODULES = frozenset((
    "Linear", "Bilinear", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm",
    "InstanceNorm1d", "ReLU", "ReLU6", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish",
    "Sigmoid", "Tanh", "Softplus", "Softsign", "LeakyReLU", "PReLU", "Hardtanh", "Hardswish",
    "Hardsigmoid", "GLU", "LogSigmoid", "Softmax", "LogSoftmax",
))  # fmt: skip
_IN_PLACE_OPERATORS = frozenset(
    getattr(operator, f"i{name}")
    for name in (
        "add", "and", "floordiv", "lshift", "matmul", "mod", "mul", "or", "pow", "rshift",
        "sub", "truediv", "xor",
    )
) | {operator.setitem}  # fmt: skip


def _function_name(target) -> str:  # noqa: ANN001 - an fx call_function target
    """``relu_`` of ``torch.relu_``; ``relu_`` of the op overload ``aten.relu_.default``."""
    name = getattr(target, "__name__", "")
    return name.split(".")[0]


def _known_function(target) -> bool:  # noqa: ANN001 - an fx call_function target
    """torch's and Python's operators, and hopserve's own helpers (``dst_rows``, the typed
    graph's row ids: none writes into its arguments)."""
    if target in _IN_PLACE_OPERATORS:
        return True
    module = getattr(target, "__module__", None) or ""
    return module in ("operator", "_operator", "builtins") or module.startswith(
        ("torch", "hopserve.")
    )


def _in_place_name(name: str) -> bool:
    """PyTorch's naming convention: ``add_``, ``relu_`` write into their first argument."""
    return name.endswith("_") and not name.startswith("_")


def _torch_nn_module(module) -> bool:  # noqa: ANN001 - an nn.Module
    """A ``torch.nn`` or hopserve module, or a library module known to write nothing it is
    given."""
    cls = type(module)
    if cls.__module__.startswith(("torch.nn.", "hopserve.")):
        return True
    return cls.__name__ in _PURE_LIBRARY_MODULES and cls.__module__.startswith(
        ("torch_geometric.nn.", "dgl.nn.")
    )


# Library modules that return new tensors and write into none of their inputs.
_PURE_LIBRARY_MODULES = frozenset({"JumpingKnowledge"})
