"""Fault: knowledge distillation whose teacher target is ``log_softmax(teacher / T)`` passed to
``F.kl_div`` without ``log_target=True``: kl_div reads the log-probabilities as probabilities
(negative ones), and the student is pushed towards nonsense while the loss looks finite. Expected:
``loss_input_mismatch`` (log-probabilities where probabilities are taken) within 3 steps.
"""

import torch
from _harness import Case, Run, fit, labelled, main, mlp
from torch.nn import functional

T = 2.0


def train(run: Run) -> None:
    teacher = mlp((16, 64, 10), seed=8).eval()
    student = mlp((16, 32, 10), seed=9)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    run.watch([optimizer], student)

    def distill(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = functional.log_softmax(teacher(x) / T, dim=1)  # the bug: log_target not said
        return functional.kl_div(functional.log_softmax(logits / T, dim=1), target, reduction="batchmean")

    for _, (x, _) in labelled(40, batch=32, seed=8):
        fit(student, optimizer, (x, x), distill)


CASE = Case("fault_log_probs_as_kl_target", train, expect=("loss_input_mismatch",), trigger=0, within=3)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
