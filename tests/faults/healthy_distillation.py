"""Healthy: knowledge distillation at temperature 2: the student's loss is cross-entropy with label
smoothing 0.1 on the labels plus ``F.kl_div`` of its log-probabilities against the teacher's
(``log_target=True``), and, every other step, ``kl_div`` against the teacher's *probabilities*
(the default form). Probabilities and log-probabilities each where they belong: no
``loss_input_mismatch`` (nor any other warning).
"""

import torch
from _harness import Case, Run, fit, labelled, main, mlp
from torch.nn import functional

T = 2.0


def train(run: Run) -> None:
    teacher = mlp((16, 64, 10), seed=10).eval()
    student = mlp((16, 32, 10), seed=11)
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    run.watch([optimizer], student)
    calls = [0]

    def distill(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, -1].long()
        with torch.no_grad():
            teacher_logits = teacher(x) / T
        student_log_probs = functional.log_softmax(logits / T, dim=1)
        calls[0] += 1
        if calls[0] % 2:
            soft = functional.kl_div(student_log_probs, functional.log_softmax(teacher_logits, dim=1),
                                     reduction="batchmean", log_target=True)
        else:
            soft = functional.kl_div(student_log_probs, functional.softmax(teacher_logits, dim=1),
                                     reduction="batchmean")
        return functional.cross_entropy(logits, y, label_smoothing=0.1) + T * T * soft

    def forward(batch: torch.Tensor) -> torch.Tensor:
        return student(batch[:, :-1])

    for _, (x, y) in labelled(80, batch=32, seed=10):
        joined = torch.cat([x, y.unsqueeze(1).float()], dim=1)
        fit(forward, optimizer, (joined, joined), distill)


CASE = Case("healthy_distillation", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
