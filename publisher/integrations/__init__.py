"""Training frameworks watched through their own callback APIs: one Monitor per rank.

- :mod:`publisher.integrations.transformers`: ``TuimonCallback`` for Hugging Face
  ``transformers.Trainer(callbacks=[...])`` (extra ``tuimon[transformers]``);
- :mod:`publisher.integrations.lightning`: ``TuimonCallback`` for ``lightning.Trainer(callbacks=[...])``
  (extra ``tuimon[lightning]``); :mod:`publisher.integrations.pytorch_lightning` the same for the
  older ``pytorch_lightning`` package name;
- :mod:`publisher.integrations.session`: what every callback does the same (the Monitor's life,
  its name, recording and address per rank, a step's loss from its micro-batches).

Each framework is imported by its own module only, so ``publisher`` and this package import
without any of them. A callback takes the Monitor's keyword arguments (``run=``, ``record=``,
``endpoint=``, ``detectors=``, ...) and builds the Monitor once the framework has the model and
the optimizer; detectors, invariants, layer samples, GPU readings and recording are the Monitor's.
"""
