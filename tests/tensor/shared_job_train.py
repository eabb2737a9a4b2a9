"""The training loop of shared_job.py's module checks (module_sgd_job, module_buckets_job), and its differences."""

from typing import Any

from torch import nn, optim


def train_sgd(models: list[nn.Module], batches: list[tuple[Any, Any]]) -> list[list[float]]:
    """Train every model on the same batches, a step each in turn (SGD, lr 0.1, momentum 0.9, a mean loss).

    Returns:
        Each model's losses, one a step.
    """
    runs = [(m, optim.SGD(m.parameters(), lr=0.1, momentum=0.9)) for m in models]
    losses: list[list[float]] = [[] for _ in models]
    for x, y in batches:
        for (model, opt), out in zip(runs, losses, strict=True):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            out.append(loss.item())
    return losses


def loss_difference(a: list[float], b: list[float]) -> float:
    """The largest difference between two runs' losses at the same step."""
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def weight_difference(a: nn.Module, b: nn.Module) -> float:
    """The largest difference between two models' parameters and buffers, over those of ``b``."""
    ours = a.state_dict()
    return max((ours[k] - v).abs().max().item() for k, v in b.state_dict().items())
