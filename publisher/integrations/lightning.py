"""``TuimonCallback`` for ``lightning.Trainer`` (the ``lightning`` package): one Monitor per rank.

    from publisher.integrations.lightning import TuimonCallback

    trainer = lightning.Trainer(max_steps=1000,
                                callbacks=[TuimonCallback(run="exp1", record="runs/exp1.jsonl")])

The callback takes the Monitor's keyword arguments. Automatic and manual optimization, gradient
accumulation and validation are handled as :mod:`publisher.integrations.lightning_hooks` says;
:mod:`publisher.integrations.pytorch_lightning` is the same callback for ``pytorch_lightning``.
"""

from __future__ import annotations

from publisher.extras import missing

try:
    from lightning.pytorch import Callback
except ModuleNotFoundError as error:
    raise missing(error, extra="lightning", needed_by=__name__) from None

from publisher.integrations.lightning_hooks import LightningHooks


class TuimonCallback(LightningHooks, Callback):
    """Watches a ``lightning.Trainer`` run on this rank; takes ``Monitor``'s keyword arguments."""
