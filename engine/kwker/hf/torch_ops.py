"""kwker.hf.torch_ops: a faster plain `model.generate(...)` without a KwkDecoder.

    from kwker.hf import torch_ops
    torch_ops.install()      # every float32 nn.Linear on the CPU now runs on kwker's kernels
    model.generate(...)
    torch_ops.uninstall()    # torch's own Linear again; the packed copies are freed

Each Linear's weight is packed once, at its first call, into the kernels' panel layout (a copy:
the model keeps its own tensors) and repacked if the weight changes in place. The matmuls run on
one persistent pool of native threads. Calls that need autograd, or that are not float32 on the
CPU, go to torch's own Linear. Results are the same FMA-chain float32 sums as the native
decoder's (not always bit-identical to torch's BLAS, which may sum in another order); greedy
tokens are tested to match on the real model.
"""

from __future__ import annotations

import weakref

import torch

from kwker import _native
from kwker.cpu_backend import best_isa, decoder_available

# "original": torch's Linear.forward, "pool": the native pool, "packed": module -> entry
_state: dict = {}
_packed: weakref.WeakKeyDictionary[torch.nn.Linear, tuple] = weakref.WeakKeyDictionary()


def installed() -> bool:
    return "original" in _state


def install(threads: int | None = None) -> None:
    """Routes float32 CPU nn.Linear calls to the native kernels (a no-op when already installed)."""
    if installed():
        return
    if not decoder_available():
        raise RuntimeError(f"this CPU has no supported SIMD kernels (best: {_native.isa_best()})")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    from kwker.loading.build import default_threads

    _state["pool"] = _native.Pool(threads or default_threads())
    _state["isa"] = best_isa()
    _state["torch_threads"] = torch.get_num_threads()
    # torch's own pool would spin on the cores the native pool needs between matmuls
    torch.set_num_threads(1)
    _state["original"] = torch.nn.Linear.forward
    torch.nn.Linear.forward = _forward


def uninstall() -> None:
    """Restores torch's Linear and frees the packed weights."""
    if not installed():
        return
    torch.nn.Linear.forward = _state.pop("original")
    torch.set_num_threads(_state["torch_threads"])
    _packed.clear()
    _state.clear()


def _version(t: torch.Tensor | None):
    return None if t is None else (t.data_ptr(), t._version, tuple(t.shape))


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w, b = self.weight, self.bias
    if (
        x.dtype != torch.float32
        or w.dtype != torch.float32
        or x.device.type != "cpu"
        or w.device.type != "cpu"
        or x.numel() == 0
        or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
    ):
        return _state["original"](self, x)
    key = (_version(w), _version(b))
    entry = _packed.get(self)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            linear = _native.Linear(
                w.detach().numpy(),
                None if b is None else b.detach().numpy(),
                _state["pool"],
                _state["isa"],
            )
        entry = _packed[self] = (key, linear)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = entry[1](rows.detach().numpy())
    return torch.from_numpy(y).view(*x.shape[:-1], y.shape[-1])
