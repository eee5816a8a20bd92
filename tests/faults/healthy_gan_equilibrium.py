"""Healthy: a GAN at equilibrium. Generator and discriminator, two optimizers stepping alternately,
320 generator steps on a 2-D Gaussian: within a few dozen steps the generator matches the data
well enough that the discriminator cannot tell, and the losses settle at their equilibrium values,
log 2 for the generator and 2 log 2 for the discriminator, and stay flat while both keep learning.
The script reports the generator's loss as the loss (the discriminator's as ``loss_d``). A flat
loss is what a GAN's success looks like: no ``loss_plateau`` (nor any other warning).
"""

import torch
from _harness import Case, Run, main, mlp
from torch import nn

STEPS = 320
BATCH = 64


def train(run: Run) -> None:
    generator = mlp((4, 32, 2), seed=1)
    discriminator = mlp((2, 32, 32, 1), seed=2)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999))
    run.watch([opt_g, opt_d], nn.ModuleDict({"G": generator, "D": discriminator}), manual=True)
    bce = nn.BCEWithLogitsLoss()
    real_label, fake_label = torch.ones(BATCH, 1), torch.zeros(BATCH, 1)
    g = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        real = torch.randn(BATCH, 2, generator=g) * 0.5 + 1.0
        fake = generator(torch.randn(BATCH, 4, generator=g))
        opt_d.zero_grad()
        loss_d = bce(discriminator(real), real_label) + bce(discriminator(fake.detach()), fake_label)
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = bce(discriminator(fake), real_label)
        loss_g.backward()
        opt_g.step()
        run.step(loss_g, loss_d=loss_d)


CASE = Case("healthy_gan_equilibrium", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
