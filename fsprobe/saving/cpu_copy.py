"""A snapshot of a checkpoint object, tensors copied to CPU memory, that `torch.save` writes
exactly as it would the original (sharing, types, attributes kept): docs/design.md §7, "A
background save's snapshot". torch is imported when a snapshot is taken, not with this module.
"""

from __future__ import annotations

import copy
from typing import Any

#: Values that cannot change, so the snapshot may share them with the original.
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range)


def cpu_copy(obj: object) -> Any:
    """A copy of `obj` that no later change of the original reaches; see the module docstring."""
    import torch  # lazily: see the module docstring

    return _Copier(torch).copy(obj)


class _Copier:
    """One snapshot: what was copied so far, by object and by storage, to keep the sharing."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        #: id(original) -> copy; the `copy.deepcopy` memo convention, so it is shared with it.
        self.memo: dict[int, Any] = {}
        #: (device, address, bytes) of an original storage -> its copy in CPU memory.
        self.storages: dict[tuple[str, int, int], Any] = {}
        self.immutable = (
            *_IMMUTABLE,
            torch.dtype,
            torch.device,
            torch.Size,
            torch.layout,
            torch.memory_format,
        )

    def copy(self, value: Any) -> Any:
        if isinstance(value, self.immutable):
            return value
        known = self.memo.get(id(value))
        if known is not None:
            return known
        kind = type(value)
        if isinstance(value, self.torch.Tensor):
            copied = self._tensor(value)
        elif isinstance(value, dict):
            return self._dict(value)
        elif kind is list:
            return self._list(value)
        elif kind is tuple or (issubclass(kind, tuple) and hasattr(kind, "_fields")):
            return self._tuple(value)
        else:
            return copy.deepcopy(value, self.memo)
        self.memo[id(value)] = copied
        return copied

    def _dict(self, original: dict) -> dict:
        copied = copy.copy(original)  # its type, attributes and (defaultdict) factory, shallow
        self.memo[id(original)] = copied  # before the values: a dict may contain itself
        for key, value in original.items():
            copied[key] = self.copy(value)  # an existing key keeps its place in the order
        for name, value in getattr(original, "__dict__", {}).items():
            setattr(copied, name, self.copy(value))
        return copied

    def _list(self, original: list) -> list:
        copied: list = []
        self.memo[id(original)] = copied
        copied.extend(self.copy(item) for item in original)
        return copied

    def _tuple(self, original: tuple) -> tuple:
        items = [self.copy(item) for item in original]
        if id(original) in self.memo:  # reached again through a list or dict inside it
            return self.memo[id(original)]
        copied = type(original)(*items) if hasattr(original, "_fields") else tuple(items)
        self.memo[id(original)] = copied
        return copied

    def _is_plain(self, tensor: Any) -> bool:
        """A dense tensor that `torch.save` writes as storage + offset + size + stride alone."""
        torch = self.torch
        return (
            type(tensor) in (torch.Tensor, torch.nn.Parameter)
            and tensor.layout == torch.strided
            and not tensor.is_quantized
            and not tensor.is_nested
            and tensor.device.type != "meta"
            and not tensor.is_conj()
            and not tensor.is_neg()
            and not vars(tensor)
        )

    def _tensor(self, original: Any) -> Any:
        torch = self.torch
        if not self._is_plain(original):
            return copy.deepcopy(original, self.memo)
        storage = original.untyped_storage()
        copied_storage = self._storage(storage)
        copied = torch.empty((), dtype=original.dtype).set_(
            copied_storage, original.storage_offset(), original.size(), original.stride()
        )
        if type(original) is torch.nn.Parameter:
            return torch.nn.Parameter(copied, requires_grad=original.requires_grad)
        return copied.requires_grad_(original.requires_grad)

    def _storage(self, storage: Any) -> Any:
        """The CPU copy of `storage`, made once however many tensors view it."""
        address = storage.data_ptr()
        key = (str(storage.device), address, storage.nbytes())
        copied = self.storages.get(key) if address else None
        if copied is None:
            copied = self.torch.UntypedStorage(storage.nbytes())
            copied.copy_(storage)
            if address:  # empty storages have no address to share; each gets its own
                self.storages[key] = copied
        return copied
