"""Parameters meant to be one tensor stay one tensor (``ties_hold``).

Weight tying makes two module attributes hold the *same* ``nn.Parameter``: a language model's output
projection reuses its input embedding (``head.weight = embed.weight``; Press & Wolf, "Using the
Output Embedding to Improve Language Models", https://arxiv.org/abs/1608.05859; Hugging Face's
``PreTrainedModel.tie_weights``, https://huggingface.co/docs/transformers/main_classes/model). A tie
that comes apart raises no error: the two halves train separately and the model quietly trains
worse. Two ways it happens, both caught here:

1. a tie that breaks during training: names that were one tensor now resolve to two (a side
   re-created, ``load_state_dict(..., assign=True)``). Found by identity: one module-path lookup
   per tied name on each check, no tensor work;
2. a tie lost before training started (a meta-device model loaded with ``assign=True`` from a
   checkpoint holding separate copies). Found by values and structure: a *designed-tied* pair is
   two trained floating-point matrices of one shape, bit-identical but not constant when first
   seen, in modules of different kinds (an ``nn.Embedding`` and an ``nn.Linear``).

Which pairs count and why, what is not caught, what it was measured on and what it costs (one
full comparison of the candidate pairs at the start, then ``probe_elements`` per pair on checked
steps, read back without a sync): docs/detectors.md, "``tie_broken``".
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import PendingResults, StatusBoard
from publisher.measure.budget import Schedule
from publisher.measure.check import Check
from publisher.measure.tensors import flat_sample, sample_stride, stack_on

TIES = "ties_hold"

#: At most this many same-shape pairs are compared at the start (likely embedding pairs first).
_MAX_PAIRS = 64
#: Elements compared at once by the full equality at the start (bounds the temporary memory).
_CHUNK = 1 << 24
#: Name fragments of input embeddings and output projections (wording and ordering only).
_HINTS = ("embed", "wte", "lm_head", "decoder", "output", "vocab", "tok", "word", "unembed", "logit")
_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
_NEVER = 1 << 62

_BROKEN_CAUSES = [
    "one side re-created with nn.Parameter(...) (or its module replaced) after the tie was made",
    "load_state_dict(..., assign=True): assign puts the checkpoint's tensors in place of the parameters, "
    "so names that shared one get separate tensors (tie again afterwards, e.g. Hugging Face's "
    "model.tie_weights())",
    "embeddings resized (e.g. resize_token_embeddings) without re-tying the output projection",
    "a checkpoint that holds the tied tensors as separate copies, loaded with assign=True",
]
_LOST_CAUSES = [
    "the model was built on the meta device (or with initialisation skipped) and loaded with "
    "load_state_dict(..., assign=True): the tie made in __init__ is replaced by the checkpoint's two "
    "tensors (tie again after loading, e.g. Hugging Face's model.tie_weights())",
    "the checkpoint holds the tied tensors as separate copies (a cloned state dict, or a format that "
    "cannot store shared tensors)",
    "one side re-created with nn.Parameter(...) from a copy of the other",
    "embeddings resized (e.g. resize_token_embeddings) without re-tying the output projection",
]


@dataclass(frozen=True)
class _Slot:
    """Where a parameter lives: its full name and the (root, module path, attribute) that hold it."""

    name: str
    root: nn.Module
    path: str
    attr: str
    kind: type

    def current(self) -> torch.Tensor | None:
        """The tensor this name holds now (None when the module or the attribute is gone)."""
        try:
            module = self.root.get_submodule(self.path) if self.path else self.root
        except AttributeError:
            return None
        return module._parameters.get(self.attr)


@dataclass
class _Tie:
    """Names that held one tensor when first seen."""

    slots: list[_Slot]
    ident: int  # id() of the shared tensor when last seen whole (wording only: which side changed)

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(slot.name for slot in self.slots)


@dataclass
class _Twins:
    """Two separate parameters that looked designed-tied: identical at ``since``."""

    a: _Slot
    b: _Slot
    since: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.a.name, self.b.name)


def _walk(roots: Sequence[tuple[str, nn.Module]]) -> dict[int, tuple[torch.Tensor, list[_Slot]]]:
    """Every parameter of the roots with every name it has (ties give a parameter several)."""
    found: dict[int, tuple[torch.Tensor, list[_Slot]]] = {}
    for prefix, root in roots:
        for path, module in root.named_modules(remove_duplicate=False):
            for attr, param in module._parameters.items():
                if param is None:
                    continue
                name = f"{prefix}{path}.{attr}" if path else f"{prefix}{attr}"
                slots = found.setdefault(id(param), (param, []))[1]
                if all(slot.name != name for slot in slots):
                    slots.append(_Slot(name, root, path, attr, type(module)))
    return found


def _related(a: type, b: type) -> bool:
    return issubclass(a, b) or issubclass(b, a)


def _hinted(slot: _Slot) -> bool:
    return issubclass(slot.kind, _EMBEDDINGS) or any(h in slot.name.lower() for h in _HINTS)


def _shape(param: torch.Tensor | None) -> list[int] | None:
    try:
        return None if param is None else list(param.shape)
    except (RuntimeError, ValueError):  # a parameter without a shape yet (lazy modules)
        return None


def _size(param: torch.Tensor) -> str:
    shape = _shape(param)
    return "?" if shape is None else "x".join(map(str, shape)) or "scalar"


def _alike(param: torch.Tensor) -> tuple:
    """What two parameters must share to be compared at all: shape, dtype and device."""
    return (tuple(param.shape), param.dtype, param.device)


def _pairs(found: dict[int, tuple[torch.Tensor, list[_Slot]]], eligible: set[int]
           ) -> list[tuple[_Slot, _Slot, torch.Tensor, torch.Tensor]]:
    """Same-shape matrices in modules of different kinds (candidates for a lost tie), likely first.

    A parameter's kinds are the classes of every module holding it (an already tied one has two); two
    parameters are of different kinds when no class of one is a class, subclass or base of the other's.
    """
    groups: dict[tuple, dict[frozenset[type], list[tuple[torch.Tensor, _Slot]]]] = {}
    for key in eligible:
        param, slots = found[key]
        by_kind = groups.setdefault(_alike(param), {})
        by_kind.setdefault(frozenset(slot.kind for slot in slots), []).append((param, slots[0]))
    pairs = []
    for by_kind in groups.values():
        for kinds_a, kinds_b in itertools.combinations(by_kind, 2):
            if any(_related(a, b) for a in kinds_a for b in kinds_b):
                continue
            for (pa, sa), (pb, sb) in itertools.product(by_kind[kinds_a], by_kind[kinds_b]):
                (sa, pa), (sb, pb) = sorted(((sa, pa), (sb, pb)), key=lambda m: m[0].name)
                pairs.append((sa, sb, pa, pb))
    pairs.sort(key=lambda p: (not (_hinted(p[0]) or _hinted(p[1])), p[0].name, p[1].name))
    return pairs


def _unplaced_pairs(params: Iterable[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Same-shape pairs of matrices whose modules are not known yet (no model given, none found
    yet), the rarest shapes first: an input embedding and its output projection are usually the
    only two matrices of their shape, a network's layers come many to a shape, so past
    ``_MAX_PAIRS`` pairs of the commonest shapes are the ones left out."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for param in params:
        groups.setdefault(_alike(param), []).append(param)
    shared = sorted((group for group in groups.values() if len(group) > 1), key=len)
    return itertools.chain.from_iterable(itertools.combinations(group, 2) for group in shared)


def _holds(found: dict[int, tuple[torch.Tensor, list[_Slot]]], param: torch.Tensor) -> bool:
    entry = found.get(id(param))
    return entry is not None and entry[0] is param


def _trainable(param: torch.Tensor) -> bool:
    return param.requires_grad and _matrix(param)


def _trainable_matrices(found: dict[int, tuple[torch.Tensor, list[_Slot]]]) -> set[int]:
    return {key for key, (param, _) in found.items() if _trainable(param)}


def _matrix(param: torch.Tensor) -> bool:
    """A plain floating-point matrix with values to compare.

    Tensor subclasses are left out: a ``DTensor`` (FSDP2, tensor parallel) would turn a comparison
    into a collective, and a lazy module's ``UninitializedParameter`` has no shape yet.
    """
    return (type(param) in (torch.Tensor, nn.Parameter) and param.is_floating_point() and param.dim() >= 2
            and param.numel() > 0 and param.device.type != "meta")


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Are two same-shape tensors bit-identical? A 0-dim bool on their device (no host sync)."""
    rows = max(1, _CHUNK // max(1, a[0].numel()))
    parts = [(x != y).any() for x, y in zip(a.detach().split(rows), b.detach().split(rows), strict=True)]
    return ~(torch.stack(parts).any() if len(parts) > 1 else parts[0])


def _varied(sample: torch.Tensor) -> torch.Tensor:
    """More than two distinct values in the sample (not a constant, identity or 0/1 pattern)."""
    return ~((sample == sample.min()) | (sample == sample.max())).all()


def _keep_identical(tags: list, found: Callable[[list], None], verdict: torch.Tensor) -> None:
    """Hand ``found`` the tags whose verdict row (equal, varied) is all true."""
    rows = verdict.reshape(-1, 2).tolist()
    found([tag for tag, (equal, varied) in zip(tags, rows, strict=True) if equal and varied])


@dataclass
class _Unplaced:
    """Two trained parameters that were bit-identical (and varied) at the start while their modules
    were unknown: a designed-tied pair once the modules found later are of different kinds."""

    a: weakref.ref
    b: weakref.ref
    since: int


class TieCheck(Check):
    """Tied parameters stay one tensor; designed-tied pairs (separate but identical at the start) stay
    identical. Called by the checker from its optimizer hooks."""

    names = (TIES,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, pending: PendingResults) -> None:
        self._board = board
        self._pending = pending
        self._limit = config.probe_elements
        self.schedule = Schedule(config.dense_steps, config.check_every)
        self._roots: list[tuple[str, nn.Module]] = []
        self._ties: dict[tuple[str, ...], _Tie] = {}
        self._twins: dict[tuple[str, str], _Twins] = {}
        self._drifted: dict[tuple[str, str], _Twins] = {}
        # Pairs found identical by value alone while no module was known (zero-code mode's first step).
        self._unplaced: list[_Unplaced] = []
        # Parameters already compared at a start (by id, with a weak reference against id reuse).
        self._considered: dict[int, weakref.ref] = {}
        self._candidates = 0  # same-shape pairs in different module kinds at the last look
        self._last = -1
        #: The next optimizer pre-step hook should look at the values (roots or optimizers changed).
        self.wants_values = False

    # ----------------------------------------------------------------- the checker's calls

    def set_roots(self, roots: list[tuple[str, nn.Module]]) -> None:
        """(Re)read the model's structure: the ties it has now and whether any pair could be one."""
        self._roots = roots
        found = _walk(roots)
        self._add_ties(found)
        self._place(found)
        self._candidates = len(_pairs(found, _trainable_matrices(found)))
        self.wants_values = bool(roots)
        if self._ties or self._candidates:
            self._board.idle_message(TIES, "waiting for the first optimizer step")
        else:
            self._board.idle_message(TIES, self._nothing())

    def optimizers_changed(self) -> None:
        """An optimizer was added: its parameters may form pairs not looked at yet (by value alone
        while no module is known)."""
        self.wants_values = True

    def before_step(self, owned: Sequence[torch.Tensor], step: int) -> None:
        """Called at an optimizer pre-step hook while :attr:`wants_values` with the watched optimizers'
        parameters: ties seen now, and the start comparison of the candidate pairs (before the step
        moves them). With no module known yet, the pairs are compared by value alone and kept until
        the modules are found (:meth:`set_roots`)."""
        self.wants_values = False
        if not self._roots:
            params = {id(p): p for p in owned if _trainable(p)}
            fresh = (((a, b), a, b) for a, b in _unplaced_pairs(params.values())
                     if not (self._seen(a) and self._seen(b)))
            tagged = list(itertools.islice(fresh, _MAX_PAIRS))
            self._consider(params)
            self._compare(tagged, partial(self._remember, step))
            return
        found = _walk(self._roots)
        self._add_ties(found)
        trainable = _trainable_matrices(found)
        self._candidates = len(_pairs(found, trainable))
        eligible = trainable & {id(p) for p in owned}
        pairs = [pair for pair in _pairs(found, eligible) if (pair[0].name, pair[1].name) not in self._twins
                 and not (self._seen(pair[2]) and self._seen(pair[3]))]
        self._consider({key: found[key][0] for key in eligible})
        self._compare([((slot_a, slot_b), a, b) for slot_a, slot_b, a, b in pairs[:_MAX_PAIRS]],
                      partial(self._found, step))

    @property
    def idle(self) -> bool:
        """Nothing to look at on the post-step checks."""
        return not self._ties and not self._twins

    def due(self, index: int) -> bool:
        return index != self._last and not self.idle and self.schedule.due(index)

    def next_due(self, upcoming: int) -> int:
        """The smallest step count ``c`` (> ``upcoming``) with ``due(c - 1)``, huge when idle."""
        return _NEVER if self.idle else self.schedule.next_due(upcoming) + 1

    def after_step(self, index: int, step: int) -> None:
        """Called when :meth:`due`, after the optimizer step of index ``index``."""
        self._last = index
        self._check_ties(step)
        self._check_twins(step)

    # ----------------------------------------------------------------- ties (identity)

    def _add_ties(self, found: dict[int, tuple[torch.Tensor, list[_Slot]]]) -> None:
        for key, (_, slots) in found.items():
            if len(slots) > 1:
                tie = _Tie(slots, key)
                self._ties.setdefault(tie.key, tie)
                for a, b in itertools.combinations(tie.key, 2):  # now one tensor: nothing to compare
                    self._twins.pop((a, b), None)
                    self._twins.pop((b, a), None)

    def _check_ties(self, step: int) -> None:
        if not self._ties:
            return
        broken: list[tuple[_Tie, list[tuple[_Slot, torch.Tensor]]]] = []
        for key, tie in list(self._ties.items()):
            present = [(slot, p) for slot in tie.slots if (p := slot.current()) is not None]
            if len(present) < 2:  # a side was removed from the model: nothing tied any more
                del self._ties[key]
                continue
            if len({id(p) for _, p in present}) > 1:
                broken.append((tie, present))
            else:
                tie.ident = id(present[0][1])
        if broken:
            self._report_broken(step, broken)
        elif self._ties:
            groups = "; ".join(" = ".join(key) for key in list(self._ties)[:3])
            more = f" and {len(self._ties) - 3} more" if len(self._ties) > 3 else ""
            count = ("the tied parameters are still one tensor" if len(self._ties) == 1
                     else f"{len(self._ties)} tied parameter groups are still one tensor each")
            self._board.report(TIES, "ties", "ok", step, f"{count}: {groups}{more}")
        else:
            self._board.report(TIES, "ties", "unchecked", step, "")
            self._settle_idle()

    def _report_broken(self, step: int, broken: list[tuple[_Tie, list[tuple[_Slot, torch.Tensor]]]]) -> None:
        names: list[str] = []
        replaced: list[str] = []
        shapes: dict[str, list[int] | None] = {}
        parts = []
        for tie, present in broken:
            tensors = len({id(p) for _, p in present})
            names += [slot.name for slot, _ in present]
            moved = [slot.name for slot, p in present if id(p) != tie.ident]
            replaced += moved
            shapes.update({slot.name: _shape(p) for slot, p in present})
            which = f" ({name_list(moved)} replaced)" if moved and len(moved) < len(present) else ""
            parts.append(f"{' and '.join(slot.name for slot, _ in present)} are now {tensors} separate "
                         f"tensors{which}")
        message = ("parameters tied into one tensor have come apart and now train separately: "
                   + "; ".join(parts))
        details = {"params": names[:50], "shapes": shapes, "replaced": replaced[:50], "step": step,
                   "groups": [list(tie.key) for tie, _ in broken][:20], "likely_causes": _BROKEN_CAUSES}
        self._board.violation(TIES, "ties", step, message, details, [tie.key for tie, _ in broken])

    # ----------------------------------------------------------------- designed-tied pairs (values)

    def _seen(self, param: torch.Tensor) -> bool:
        ref = self._considered.get(id(param))
        return ref is not None and ref() is param

    def _consider(self, params: dict[int, torch.Tensor]) -> None:
        """These parameters had their start comparison: never compared in full again."""
        for key, param in params.items():
            self._considered[key] = weakref.ref(param)

    def _compare(self, pairs: Sequence[tuple[object, torch.Tensor, torch.Tensor]],
                 found: Callable[[list], None]) -> None:
        """The start comparison, whichever way the pairs were found: ``found`` gets the tags of the
        pairs ``(tag, a, b)`` that are bit-identical and not a constant pattern (at once on the CPU;
        on an accelerator through :class:`PendingResults`, without waiting)."""
        on_host: list = []
        kept: list = []
        verdicts: list[torch.Tensor] = []
        for tag, a, b in pairs:
            stride = sample_stride(a.numel(), self._limit)
            sample_a, sample_b = flat_sample(a, stride), flat_sample(b, stride)
            if a.device.type == "cpu":  # read at once: the sample first, the full comparison if it matches
                if torch.equal(sample_a, sample_b) and torch.equal(a, b) and bool(_varied(sample_a)):
                    on_host.append(tag)
                continue
            kept.append(tag)
            verdicts.append(torch.stack([_equal(a, b), _varied(sample_a)]))
        if on_host or not verdicts:  # (with verdicts on their way, "nothing to check" would be early)
            found(on_host)
        if verdicts:
            verdict = stack_on(verdicts, verdicts[0].device).float()
            self._pending.add(self, verdict, partial(_keep_identical, kept, found))

    def _found(self, step: int, pairs: list[tuple[_Slot, _Slot]]) -> None:
        """The start comparison arrived: identical, varied pairs become twins to watch."""
        for slot_a, slot_b in pairs:
            twins = _Twins(slot_a, slot_b, step)
            self._twins.setdefault(twins.key, twins)
        self._settle_idle()

    def _remember(self, step: int, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The start comparison by value alone arrived: keep the identical pairs until their modules
        are known (at once if they were found meanwhile)."""
        self._unplaced += [_Unplaced(weakref.ref(a), weakref.ref(b), step) for a, b in pairs]
        if self._unplaced and self._roots:
            self._place(_walk(self._roots))
            self._settle_idle()

    def _place(self, found: dict[int, tuple[torch.Tensor, list[_Slot]]]) -> None:
        """Pairs kept by value alone whose two parameters are now in the model: those in modules of
        different kinds (the same test as when the modules are known from the start) become twins,
        the others are dropped; pairs not found whole yet wait for the next root."""
        if not self._unplaced:
            return
        trainable = _trainable_matrices(found)
        placed: dict[frozenset[int], int] = {}
        waiting: list[_Unplaced] = []
        for pair in self._unplaced:
            a, b = pair.a(), pair.b()
            if a is None or b is None:
                continue  # a side no longer exists
            if not (_holds(found, a) and _holds(found, b)):
                waiting.append(pair)
            elif id(a) in trainable and id(b) in trainable:
                placed[frozenset((id(a), id(b)))] = pair.since
        self._unplaced = waiting
        if not placed:
            return
        for slot_a, slot_b, a, b in _pairs(found, set().union(*placed)):
            since = placed.get(frozenset((id(a), id(b))))
            if since is not None:
                twins = _Twins(slot_a, slot_b, since)
                self._twins.setdefault(twins.key, twins)

    def _settle_idle(self) -> None:
        if not self._ties and not self._twins and not self._drifted:
            self._board.idle_message(TIES, self._nothing())

    def _nothing(self) -> str:
        if self._candidates:
            return (f"no tied parameters, and none of the {self._candidates} same-shape matrix pairs in "
                    "modules of different kinds was trained by an optimizer and identical (not constant) "
                    "at the start: nothing to check")
        return ("no tied parameters, and no two trainable matrices of the same shape in modules of "
                "different kinds (as an embedding and an output projection): nothing to check")

    def _check_twins(self, step: int) -> None:
        if not self._twins:
            return
        apart: list[_Twins] = []
        compared: list[_Twins] = []
        diffs: list[torch.Tensor] = []
        for key, twins in list(self._twins.items()):
            a, b = twins.a.current(), twins.b.current()
            if a is None or b is None:
                del self._twins[key]  # a side was removed from the model
            elif a is b:
                del self._twins[key]  # tied again (e.g. tie_weights() after the first step)
                tie = _Tie([twins.a, twins.b], id(a))
                self._ties.setdefault(tie.key, tie)
            elif a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
                apart.append(twins)
            else:
                stride = sample_stride(a.numel(), self._limit)
                compared.append(twins)
                diffs.append((flat_sample(a, stride) != flat_sample(b, stride)).any())
        if not diffs:
            self._judge_twins([], step, apart, None)
            return
        verdict = stack_on(diffs, diffs[0].device).float()
        self._pending.add(self, verdict, partial(self._judge_twins, compared, step, apart))

    def _judge_twins(self, compared: list[_Twins], step: int, apart: list[_Twins],
                     verdict: torch.Tensor | None) -> None:
        differ = list(apart)
        if verdict is not None:
            differ += [t for t, d in zip(compared, verdict.tolist(), strict=True) if d]
        for twins in differ:
            if self._twins.pop(twins.key, None) is not None:
                self._drifted[twins.key] = twins
        if differ:
            self._report_drift(step, differ)
        elif self._twins and not self._drifted:
            pairs = "; ".join(f"{a} and {b}" for a, b in list(self._twins)[:3])
            count = (f"{len(self._twins)} separate pairs that look tied are" if len(self._twins) > 1
                     else "a separate pair that looks tied is")
            self._board.report(TIES, "twins", "ok", step, f"{count} still identical: {pairs}")

    def _report_drift(self, step: int, differ: list[_Twins]) -> None:
        names: list[str] = []
        shapes: dict[str, list[int] | None] = {}
        modules: dict[str, str] = {}
        parts = []
        for twins in differ:
            a, b = twins.a.current(), twins.b.current()
            names += [twins.a.name, twins.b.name]
            shapes.update({twins.a.name: _shape(a), twins.b.name: _shape(b)})
            modules.update({twins.a.name: twins.a.kind.__name__, twins.b.name: twins.b.kind.__name__})
            size = f" [{_size(a)}]" if a is not None else ""
            looks = (" (an input embedding and an output projection)"
                     if _hinted(twins.a) or _hinted(twins.b) else "")
            parts.append(f"{twins.a.name} ({twins.a.kind.__name__}) and {twins.b.name} "
                         f"({twins.b.kind.__name__}){size}{looks}")
        message = (f"{'; '.join(parts)} were bit-identical when training started but are separate tensors, "
                   f"and training has made them differ by step {step}: a weight tie lost when the model was "
                   "built or loaded")
        details = {"params": names[:50], "pairs": [list(t.key) for t in differ][:20], "shapes": shapes,
                   "modules": modules, "identical_at_step": min(t.since for t in differ),
                   "differ_at_step": step, "step": step, "likely_causes": _LOST_CAUSES}
        self._board.violation(TIES, "twins", step, message, details, [t.key for t in differ])
