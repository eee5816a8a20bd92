"""A loss given the wrong kind of input: probabilities where it takes logits, and the like.

Reads the looks at the watched loss calls (:mod:`publisher.patches.loss_look`): what each loss
was given, not what it returned. The loss of such a call is finite, falls for a while and then
stops at a floor (``softmax`` fed to ``cross_entropy``: ~1.46 for 10 classes, never 0), which no
loss-curve detector can tell from a hard task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from publisher.detectors.base import Detector, Finding, fmt, where
from publisher.patches.loss_look import LossLook

#: A value this far outside a range still counts as inside it (float rounding of a softmax).
_TOLERANCE = 1e-3
#: The operations whose output is probabilities (an input made by one, through views, is one).
_SQUASHING = ("Sigmoid", "Softmax")
#: How far a row's logsumexp may be from 0 and still be log-probabilities (bf16 rounding).
_LOG_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One thing wrong with a loss call's input or target: a key, what it looked like, the fix."""

    problem: str
    seen: str
    fix: str


def mismatches(look: LossLook) -> list[Mismatch]:
    """What is wrong with one call, from its numbers alone (empty: nothing).

    Each test names a property that the right kind of tensor cannot lack and the wrong kind
    cannot escape: logits are not all in [0, 1] with every row summing to 1; log-probabilities
    are never above 0 and their rows' logsumexp is 0; probabilities are never below 0. An
    element-wise input (one logit per example) has no rows, and a fresh model's logits all sit
    in [0, 1] for dozens of steps when its bias is there (a GAN's discriminator, in the suite):
    there the input must also be the output of a sigmoid or softmax, read from the autograd
    graph (:func:`~publisher.patches.loss_look.maker`). Correct uses stay quiet: probabilities as
    *targets* (soft labels, label smoothing, distillation at any temperature), ``log_softmax``
    then ``nll_loss`` or ``kl_div``, and ``log_softmax`` output given to ``cross_entropy``
    (log_softmax is idempotent, so that one trains correctly).
    """
    name, given, target = look.function, look.input, look.target
    shape = "x".join(map(str, given.shape))
    rows = f"every row of the input ({shape}) is in [0, 1] and sums to 1: probabilities"
    found: list[Mismatch] = []
    if name == "cross_entropy" and given.probabilities(_TOLERANCE):
        found.append(Mismatch("probabilities_as_logits", f"{rows}, but cross_entropy applies log_softmax "
                              "itself", "pass the logits: drop the softmax before the loss"))
    elif (name == "binary_cross_entropy_with_logits" and look.made_by in _SQUASHING
          and given.probabilities(_TOLERANCE)):
        found.append(Mismatch("probabilities_as_logits", f"the input ({shape}) is the output of "
                              f"{look.made_by}, every value in [0, 1]: probabilities, but "
                              "binary_cross_entropy_with_logits applies sigmoid itself",
                              "pass the logits: drop the sigmoid (or use binary_cross_entropy)"))
    elif name in ("nll_loss", "kl_div") and given.probabilities(_TOLERANCE) and given.numel > 1:
        found.append(Mismatch("probabilities_as_log_probabilities", f"{rows}, but {name} takes "
                              "log-probabilities as its input", "apply log_softmax, not softmax"))
    elif name in ("nll_loss", "kl_div") and given.max > _TOLERANCE and given.row_logsumexp > _LOG_TOLERANCE:
        alternative = ", or use cross_entropy" if name == "nll_loss" else ""
        found.append(Mismatch("logits_as_log_probabilities", f"the input ({shape}) is not log-probabilities "
                              f"(largest value {fmt(given.max)} > 0, a row's logsumexp "
                              f"{fmt(given.row_logsumexp)} from 0): logits, but {name} takes "
                              "log-probabilities",
                              "apply log_softmax first" + alternative))
    if target is None:
        return found
    outside = target.min < -_TOLERANCE or target.max > 1 + _TOLERANCE
    if name == "binary_cross_entropy_with_logits" and outside:
        found.append(Mismatch("target_out_of_range", f"the target holds values from {fmt(target.min)} to "
                              f"{fmt(target.max)}, outside [0, 1]: class ids or scores, not probabilities",
                              "give 0/1 (or soft) targets; several classes need cross_entropy"))
    elif name == "cross_entropy" and target.min < -_TOLERANCE:
        found.append(Mismatch("log_probabilities_as_target", "the soft target holds negative values (down "
                              f"to {fmt(target.min)}): log-probabilities, but cross_entropy takes "
                              "probabilities as a soft target",
                              "exponentiate the target (softmax, not log_softmax)"))
    elif name == "kl_div" and not look.log_target and target.min < -_TOLERANCE:
        found.append(Mismatch("log_probabilities_as_target", f"the target holds negative values (down to "
                              f"{fmt(target.min)}): log-probabilities, but kl_div takes probabilities unless "
                              "log_target=True", "pass log_target=True, or give probabilities"))
    elif name == "kl_div" and look.log_target and target.probabilities(_TOLERANCE) and target.numel > 1:
        found.append(Mismatch("probabilities_as_log_target", "every row of the target is in [0, 1] and sums "
                              "to 1: probabilities, but log_target=True says log-probabilities",
                              "drop log_target=True, or give log-probabilities"))
    return found


class LossInputMismatch(Detector):
    """A watched loss given the wrong kind of input or target, on ``confirm`` (3) looks in a row.

    The cases (:func:`mismatches`): probabilities given to a loss that applies ``log_softmax`` or
    ``sigmoid`` itself (``softmax`` + ``cross_entropy``, ``sigmoid`` + ``BCEWithLogitsLoss``:
    the loss stops at a floor, 1.46 and 0.31 in the suite's runs); probabilities or logits where
    log-probabilities are taken (``nll_loss``, ``kl_div``); log-probabilities where probabilities
    are taken (a soft target, ``kl_div``'s target without ``log_target``); targets outside
    [0, 1] for ``binary_cross_entropy_with_logits``, which torch does not check (its sibling
    ``binary_cross_entropy`` raises). Karpathy's "A Recipe for Training Neural Networks" (2019)
    and the PyTorch docs of each loss name these as the common mistakes.

    One look could decide (a row of logits summing to 1 does not happen by chance); three in a
    row, holding ``values`` (40) values together, keep one odd call (a probe, a batch of one
    example whose single row sums to whatever) from being news. The event names the call
    (``file:line``), the operation that made the input, the tensors' shapes and dtypes and what
    was seen.
    """

    quiet_to_close = 50

    def __init__(self, confirm: int = 3, values: int = 40) -> None:
        if confirm < 1 or values < 1:
            raise ValueError("LossInputMismatch: confirm >= 1, values >= 1")
        self.confirm = confirm
        self.values = values
        self._streaks: dict[tuple[str, str], tuple[int, int]] = {}  # (function, problem) -> (looks, values)

    def observe_loss_calls(self, step: int, looks: Sequence[LossLook]) -> Sequence[Finding]:
        findings: dict[tuple[str, str], Finding] = {}
        for look in looks:
            found = {m.problem: m for m in mismatches(look)}
            for key in [k for k in self._streaks if k[0] == look.function and k[1] not in found]:
                del self._streaks[key]
            for problem, mismatch in found.items():
                key = (look.function, problem)
                calls, values = self._streaks.get(key, (0, 0))
                calls, values = calls + 1, values + look.input.numel
                self._streaks[key] = (calls, values)
                if calls >= self.confirm and values >= self.values:
                    findings[key] = self._finding(step, look, mismatch, calls)
        return list(findings.values())

    def _finding(self, step: int, look: LossLook, mismatch: Mismatch, calls: int) -> Finding:
        given, target = look.input, look.target
        return Finding(
            "loss_input_mismatch",
            f"{look.function} at {look.site}: {mismatch.seen}; the loss trains to a floor and stops "
            f"there. Fix: {mismatch.fix} ({where(step, self.rank)})",
            {
                "function": look.function,
                "problem": mismatch.problem,
                "call_site": look.site,
                "seen": mismatch.seen,
                "fix": mismatch.fix,
                "input_shape": list(given.shape),
                "input_dtype": given.dtype,
                "input_made_by": look.made_by,
                "input_min": given.min,
                "input_max": given.max,
                "input_row_sum_error": given.row_sum_error,
                "input_row_logsumexp": given.row_logsumexp,
                "target_shape": list(look.target_shape),
                "target_dtype": look.target_dtype,
                "target_min": target.min if target else None,
                "target_max": target.max if target else None,
                "log_target": look.log_target,
                "calls_looked_at": calls,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "the model ends in softmax/sigmoid and the loss applies it again (cross_entropy, "
                    "BCEWithLogitsLoss)",
                    "softmax where log_softmax was meant (nll_loss, kl_div), or no log_softmax at all",
                    "a target built in the wrong space (log-probabilities as soft labels, class ids as "
                    "BCE targets)",
                ],
            },
            key=(look.function, mismatch.problem),
        )
