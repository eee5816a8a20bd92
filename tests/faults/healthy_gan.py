"""Healthy: a GAN, two optimizers stepping alternately; the generator loss backpropagates into the
discriminator's parameters, which are cleared by ``opt_d.zero_grad()`` before D's next backward.
The discriminator has Dropout (its train mode is checked through both optimizers)."""

import torch
from _harness import Case, Run, main, mlp
from torch import nn


def train(run: Run) -> None:
    generator = mlp((4, 16, 2), seed=1)
    discriminator = mlp((2, 16, 16, 1), dropout=0.2, seed=2)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    run.watch([opt_d, opt_g], nn.ModuleDict({"G": generator, "D": discriminator}))
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(3)
    for _ in range(30):
        real = torch.randn(32, 2, generator=g) * 0.5 + 2.0
        fake = generator(torch.randn(32, 4, generator=g))
        opt_d.zero_grad()
        d_real, d_fake = discriminator(real), discriminator(fake.detach())
        (bce(d_real, torch.ones(32, 1)) + bce(d_fake, torch.zeros(32, 1))).backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(discriminator(fake), torch.ones(32, 1)).backward()
        opt_g.step()


CASE = Case("healthy_gan", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
