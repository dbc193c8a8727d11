"""A CPU-only stand-in for CUDA's "Expected all tensors to be on the same device".

On a CPU machine every tensor is on the CPU, so code that builds a tensor on the host and multiplies it
with one on the accelerator works here and fails on every GPU. ``DeviceGuard`` is a TorchFunctionMode
that gives each tensor one of two places and refuses, as CUDA would, an operation that mixes them:

- ``device``: model parameters, a tensor moved with ``.to(device)`` / ``.cuda()`` or made by a factory
  given a ``torch.device`` (``torch.zeros(..., device=dev)``), and what is computed from these;
- ``host``: a tensor made by a factory without a device (``torch.tensor(rewards)``), one given the
  string "cpu", one moved with ``.cpu()`` or built from numpy, and what is computed from these.

A tensor of neither (a gradient the autograd engine made, say) mixes with both. As on CUDA, a 0-dim host
tensor may join a device operation, an index tensor may be on either side, and ``*_like`` factories and
``new_*`` methods take their input's place. ``.to(device)`` of a host tensor returns a copy, so the host
original stays host, as it would on a GPU.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

DEVICE, HOST = "device", "host"
TAG = "_grpo_place"

FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.arange,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.linspace,
    torch.eye,
    torch.from_numpy,
}
LIKE = {
    torch.zeros_like,
    torch.ones_like,
    torch.full_like,
    torch.empty_like,
    torch.rand_like,
    torch.randn_like,
    torch.randint_like,
    torch.Tensor.new_tensor,
    torch.Tensor.new_zeros,
    torch.Tensor.new_ones,
    torch.Tensor.new_full,
    torch.Tensor.new_empty,
}
INDEXING = {
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch.Tensor.index_select,
    torch.index_select,
    torch.Tensor.gather,
    torch.gather,
    torch.Tensor.scatter,
    torch.Tensor.scatter_,
}


def place(t) -> str | None:
    if isinstance(t, torch.nn.Parameter):
        return DEVICE
    return getattr(t, TAG, None)


def _mark(out, where: str | None):
    if where is None:
        return out
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
            setattr(t, TAG, where)
    return out


def _place_of_device_arg(value) -> str | None:
    if isinstance(value, str):
        return HOST if value == "cpu" else DEVICE
    if isinstance(value, torch.device):
        return DEVICE
    return None


def _target_of_to(args, kwargs) -> str | None:
    """Where ``tensor.to(...)`` sends a tensor: DEVICE / HOST, or None for a dtype-only conversion."""
    for value in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(value, torch.Tensor):
            return place(value)
        where = _place_of_device_arg(value)
        if where is not None:
            return where
    return None


class DeviceMixError(RuntimeError):
    pass


class DeviceGuard(TorchFunctionMode):
    """Refuses operations that mix host and device tensors (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            given = kwargs.get("device")
            if func is torch.as_tensor and args and isinstance(args[0], torch.Tensor) and given is None:
                return _mark(func(*args, **kwargs), place(args[0]))
            where = HOST if given is None or func is torch.from_numpy else _place_of_device_arg(given)
            return _mark(func(*args, **kwargs), where)
        if func in LIKE:
            given = kwargs.get("device")
            return _mark(func(*args, **kwargs), _place_of_device_arg(given) if given is not None else place(args[0]))
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            target = (
                HOST
                if func is torch.Tensor.cpu
                else DEVICE
                if func is torch.Tensor.cuda
                else _target_of_to(args, kwargs)
            )
            out = func(*args, **kwargs)
            if target is None:
                return _mark(out, place(args[0]))
            if out is args[0] and place(out) not in (None, target) and not isinstance(out, torch.nn.Parameter):
                out = out.clone()  # on a GPU this would be a copy: the original keeps its place
            return _mark(out, target)
        if func is torch.Tensor.__deepcopy__:  # a copy keeps its place (its memo holds every tensor copied so far)
            return _mark(func(*args, **kwargs), place(args[0]))
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func in INDEXING:
            tensors = tensors[:1] + [t for t in tensors[1:] if t.is_floating_point()]  # indices may be anywhere
        places = {place(t) for t in tensors if not (place(t) == HOST and t.dim() == 0)} - {None}
        if len(places) > 1:
            shapes = [(tuple(t.shape), place(t)) for t in tensors]
            raise DeviceMixError(
                f"Expected all tensors to be on the same device: {getattr(func, '__name__', func)} "
                f"mixes host and device tensors {shapes}"
            )
        out = func(*args, **kwargs)
        return _mark(out, places.pop() if places else None)
