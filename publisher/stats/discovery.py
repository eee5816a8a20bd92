"""Finding the model when the checker was given none (zero-code mode starts from optimizers).

On sampled steps a global module forward pre-hook watches module calls. The first call of a
forward is its outermost module; if that module holds parameters some optimizer owns, it is
adopted as a root (a GAN yields two roots, a model called piecewise one per piece). Submodules
of adopted roots and modules owning no optimizer parameter (loss modules) are remembered and
skipped cheaply. Discovery stops once the roots cover every optimizer parameter, or after
``_PATIENCE`` sampled steps without finding anything new (an optimizer over loose tensors), so
the global hook never stays for long.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from publisher.measure.budget import Schedule
from publisher.measure.check import Check

_PATIENCE = 10


class RootDiscovery(Check):
    """Adopts the outermost modules that hold optimizer parameters, on the steps ``schedule`` says."""

    def __init__(self, schedule: Schedule, owned: Callable[[], set[int]],
                 adopt: Callable[[nn.Module], None]) -> None:
        self.schedule = schedule
        self._owned = owned
        self._adopt = adopt
        self._handle: RemovableHandle | None = None  # the global hook, while armed
        self._known: set[int] = set()  # modules inside adopted roots, and modules rejected
        self._covered: set[int] = set()  # parameters of adopted roots
        self._fruitless = 0
        self.finished = False

    def restart(self) -> None:
        """A new optimizer appeared: its parameters may live in modules not found yet."""
        self.finished = False
        self._fruitless = 0

    def note_root(self, root: nn.Module) -> None:
        """A root known by other means (the model given later): its modules need no look."""
        self._known.update(id(m) for m in root.modules())
        self._covered.update(id(p) for p in root.parameters())

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def after_step(self, next_index: int) -> None:
        """Called while armed and before sampled steps, until finished."""
        wanted = self._owned() - self._covered
        if self._handle is not None and wanted:
            self._fruitless += 1
        if (not wanted and self._covered) or self._fruitless > _PATIENCE:
            self.finished = True
            self.close()
        elif wanted and self.schedule.due(next_index):
            if self._handle is None:
                self._handle = register_module_forward_pre_hook(self._on_forward)
        else:
            self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_forward(self, module: nn.Module, args: tuple) -> None:
        if id(module) in self._known:
            return
        with self.meter:
            self._look(module)

    def _look(self, module: nn.Module) -> None:
        wanted = self._owned() - self._covered
        if not wanted:
            return  # no optimizer yet (or all found): judge no module now
        self._known.add(id(module))
        if wanted.intersection(id(p) for p in module.parameters()):
            self._fruitless = 0
            self.note_root(module)
            self._adopt(module)
