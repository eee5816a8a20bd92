"""``TuimonCallback`` for ``pytorch_lightning.Trainer``: Lightning under its older package name.

``pytorch_lightning.Trainer`` accepts only callbacks derived from ``pytorch_lightning.Callback``,
so this is :mod:`publisher.integrations.lightning`'s callback on that base; the hooks are the same
(:mod:`publisher.integrations.lightning_hooks`).
"""

from __future__ import annotations

from publisher.extras import missing

try:
    from pytorch_lightning import Callback
except ModuleNotFoundError as error:
    raise missing(error, extra="pytorch-lightning", needed_by=__name__) from None

from publisher.integrations.lightning_hooks import LightningHooks


class TuimonCallback(LightningHooks, Callback):
    """Watches a ``pytorch_lightning.Trainer`` run on this rank; takes ``Monitor``'s keyword arguments."""
