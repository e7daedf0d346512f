"""The most a forged-logprob group can weigh in a step when no spot-check can see it.

    python -m benchmarks.spotcheck_influence [--c 2.0] [--tokens 32]

One honest peer sample (generator logprobs = the trainer's, rho = 1) next to forged copies of it
(generator logprobs at the validate floor -50, at 0, and at the value that puts rho just at C),
the same positive advantage, through `objective.objective_loss` with the default F-TIS config:
reports each one's gradient weight sum_t |d loss / d log pi_theta_t| as a multiple of the honest
sample's, and whether the KL / advantage filter removed it. The bound: at most C (the truncation)
times an honest sample's weight, and 0 once the KL filter catches it.

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import emit, parse_args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--c", type=float, default=None, help="objective.truncation_c (default: the config's)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = parse_args(ap, {"tokens": 8})
    from swarm_node.config import ObjectiveConfig
    from swarm_node.method.objective import ObjectiveInputs, objective_loss

    cfg = ObjectiveConfig() if args.c is None else ObjectiveConfig(truncation_c=args.c)
    torch.manual_seed(args.seed)
    theta = -torch.rand(args.tokens, dtype=torch.float64) * 3.0 - 0.05  # [T] the trainer's logprobs
    kinds = {"honest": theta.clone(), "floor": torch.full_like(theta, -50.0), "zero": torch.zeros_like(theta),
             "just_at_c": theta - torch.log(torch.tensor(cfg.truncation_c, dtype=torch.float64))}
    out = {}
    for name, gen in kinds.items():
        t = theta.clone()[None].requires_grad_(True)  # [1,T]
        inputs = ObjectiveInputs(trainer_logprobs=t, step_start_logprobs=theta[None].clone(),
                                 generator_logprobs=gen[None], mask=torch.ones(1, args.tokens, dtype=torch.bool),
                                 advantages=torch.tensor([1.0], dtype=torch.float64),
                                 is_peer=torch.tensor([True]), sample_weights=torch.tensor([1.0], dtype=torch.float64))
        loss, stats = objective_loss(inputs, cfg)
        loss.backward()
        out[name] = float(t.grad.abs().sum())
    honest = out["honest"]
    emit({"benchmark": "spotcheck_influence", "variant": cfg.variant_name, "truncation_c": cfg.truncation_c,
          "kl_threshold": cfg.kl_threshold, "kl_estimator": cfg.kl_estimator, "tokens": args.tokens,
          "gradient_weight_vs_honest": {k: v / honest for k, v in out.items()},
          "bound": cfg.truncation_c})


if __name__ == "__main__":
    main()
