"""Measure GPU memory, step time and tokens/s of the stack users run, for the sizing fixture.

Builds each model from its published config (gpuinfra/sizing/data/models.yaml, the HF
config.json values) with random weights -- nothing is downloaded -- and runs:

* training: PyTorch AdamW (foreach), ``torch.autocast(bfloat16)`` over fp32 weights (mixed
  precision) for ``full``; PEFT LoRA (r=16 on q, k, v, o, dropout 0.05) over a bf16 base for
  ``lora``; transformers' ``gradient_checkpointing_enable()`` for ``--recompute full``; SDPA
  attention; the loss of ``AutoModelForCausalLM`` (fp32 upcast of the logits);
* inference: ``generate()`` with the default dynamic KV cache, ``batch`` prompts of ``seq - 16``
  random tokens and 16 new tokens.

The optimizer of a case is ``adamw-foreach`` (``torch.optim.AdamW`` default on CUDA, the
default grids), ``adamw-fused`` (``AdamW(fused=True)``, the HF Trainer default since torch 2.8)
or ``adamw-8bit`` (bitsandbytes ``AdamW8bit``, block-wise 8-bit state, Dettmers et al. 2022,
arXiv:2110.02861). Training rows also carry the peak of each phase of the last step (forward,
backward, optimizer step; ``max_memory_allocated`` reset at each phase's start) and what stays
allocated between steps, the memory model's phase terms. Each case runs in its own process, so
one case's allocator pool never shows in the next.

It records, per case, peak ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``, the
memory the device reports in use (``mem_get_info``: total - free, i.e. reserved + CUDA
context + library workspaces), median step time and tokens/s, and writes
``benchmarks/results/gpu-memory-<gpu>-<date>.json`` with GPU name, total memory, driver,
library versions and date. Rows use the fixture format of tests/fixtures/sizing/published.yaml
(metric ``device_used``, unit ``bytes``) so tests/sizing/test_fixtures.py checks them.

Usage (a CUDA machine with torch, transformers, peft):
    python benchmarks/measure_gpu_memory.py [--grid default|issue|phases|kv-throughput] [--steps 3] [--out DIR] [--out-file PATH]
Without CUDA it prints one line and exits 6 (gpuinfra.errors.ExitCode.MISSING_DEPENDENCY).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "gpuinfra" / "sizing" / "data" / "models.yaml"
EXIT_MISSING_DEPENDENCY = 6

#: (model, method, seq, batch, recompute[, optimizer]); ``issue`` are the two reference cases of
#: tests/cli/test_size_cli.py; ``phases`` adds longer sequences, larger micro-batches and the
#: optimizer implementations to the handed-over H100 rows (../shared/data/sizing/); ``kv-throughput``
#: adds HF ``generate`` over a range of KV-cache sizes (batch x sequence, four architectures) and
#: larger training micro-batches for step time.
OPTIMIZERS = ("adamw-foreach", "adamw-fused", "adamw-8bit")
GRIDS = {
    "phases": [
        ("phi-3-mini", "full", 2048, 1, "full", "adamw-fused"),
        ("phi-3-mini", "full", 2048, 1, "full", "adamw-foreach"),
        ("phi-3-mini", "full", 2048, 1, "full", "adamw-8bit"),
        ("phi-3-mini", "full", 8192, 1, "full", "adamw-fused"),
        ("phi-3-mini", "full", 2048, 8, "full", "adamw-fused"),
        ("gpt2-xl", "full", 1024, 16, "full", "adamw-fused"),
        ("gpt2-xl", "full", 1024, 8, "none", "adamw-8bit"),
        ("llama-3.1-8b", "lora", 8192, 1, "full", "adamw-fused"),
        ("llama-3.1-8b", "lora", 2048, 8, "full", "adamw-fused"),
        ("phi-3-mini", "inference", 4096, 16, "none"),
        ("llama-3.1-8b", "inference", 8192, 8, "none"),
    ],
    "kv-throughput": [
        ("llama-3.1-8b", "inference", 1024, 64, "none"),
        ("llama-3.1-8b", "inference", 4096, 16, "none"),
        ("llama-3.1-8b", "inference", 16384, 2, "none"),
        ("llama-3.1-8b", "inference", 32768, 1, "none"),
        ("phi-3-mini", "inference", 2048, 32, "none"),
        ("qwen2.5-7b", "inference", 8192, 4, "none"),
        ("gpt2-xl", "inference", 1024, 16, "none"),
        ("llama-3.1-8b", "lora", 4096, 4, "full", "adamw-fused"),
        ("qwen2.5-7b", "lora", 2048, 4, "full", "adamw-fused"),
        ("phi-3-mini", "full", 4096, 4, "full", "adamw-fused"),
        ("gpt2-xl", "full", 1024, 32, "full", "adamw-fused"),
    ],
    "issue": [("llama-3.1-8b", "lora", 2048, 2, "full"), ("llama-3.1-8b", "inference", 2048, 32, "none")],
    "default": [
        ("llama-3.1-8b", "lora", 2048, 2, "full"),
        ("llama-3.1-8b", "lora", 1024, 1, "none"),
        ("llama-3.1-8b", "lora", 4096, 1, "full"),
        ("llama-3.1-8b", "inference", 2048, 32, "none"),
        ("llama-3.1-8b", "inference", 4096, 8, "none"),
        ("mistral-7b", "lora", 2048, 2, "full"),
        ("qwen2.5-7b", "lora", 2048, 1, "full"),
        ("phi-3-mini", "full", 2048, 1, "full"),
        ("phi-3-mini", "full", 1024, 2, "none"),
        ("gpt2-xl", "full", 1024, 4, "none"),
        ("gpt2-xl", "full", 1024, 8, "full"),
        ("llama-3.1-8b", "full", 2048, 1, "full"),
    ],
}


def hf_config_dict(model: str) -> dict:
    """transformers config kwargs for a model of models.yaml (published config.json values).

    Raises:
        KeyError: unknown model.
    """
    data = yaml.safe_load(MODELS.read_text())[model]
    if data.get("mlp", "swiglu") in ("gelu", "gelu_new"):
        return {
            "model_type": "gpt2",
            "n_layer": data["layers"],
            "n_embd": data["hidden"],
            "n_head": data["heads"],
            "n_inner": data["ffn"],
            "vocab_size": data["vocab"],
            "n_positions": data.get("positions", 1024),
            "tie_word_embeddings": bool(data.get("tied", False)),
        }
    return {
        "model_type": "llama",
        "num_hidden_layers": data["layers"],
        "hidden_size": data["hidden"],
        "num_attention_heads": data["heads"],
        "num_key_value_heads": data["kv_heads"],
        "intermediate_size": data["ffn"],
        "vocab_size": data["vocab"],
        "max_position_embeddings": 131072,
        "tie_word_embeddings": bool(data.get("tied", False)),
    }


def case_id(model: str, method: str, seq: int, batch: int, recompute: str) -> str:
    """Row id, e.g. ``llama-3.1-8b-lora-s2048-b2-full`` (inference: no recompute part)."""
    tail = "" if method == "inference" else f"-{recompute}"
    return f"{model}-{method}-s{seq}-b{batch}{tail}"


def make_row(
    model: str,
    method: str,
    seq: int,
    batch: int,
    recompute: str,
    *,
    device_used: int | None,
    allocated: int | None,
    reserved: int | None,
    step_seconds: float | None,
    tokens_per_second: float | None,
    status: str = "ok",
    error: str | None = None,
    optimizer: str = "adamw-foreach",
    phases: dict | None = None,
) -> dict:
    """One result row in the fixture format (the workload keys of gpuinfra/sizing/calibration.py),
    plus ``optimizer`` and ``phases`` (bytes; training: ``between_steps`` allocated, then the
    ``forward``, ``backward``, ``optimizer_step`` peaks of the last step; inference: ``weights``
    allocated before ``generate()``)."""
    row = {
        "id": case_id(model, method, seq, batch, recompute),
        "model": model,
        "method": method,
        "seq": seq,
        "batch": batch,
        "recompute": recompute,
        "compute": "bf16",
        "attention": "sdpa",
        "storage": "bf16" if method in ("lora", "inference") else "fp32",
        "strategy": "ddp",
        "lora_rank": 16,
        "lora_sites": 4,
        "metric": "device_used",
        "measured": device_used,
        "unit": "bytes",
        "max_memory_allocated": allocated,
        "max_memory_reserved": reserved,
        "step_seconds": step_seconds,
        "tokens_per_second": tokens_per_second,
        "status": status,
    }
    if method != "inference":
        row["optimizer"] = optimizer
    if phases:
        row["phases"] = phases
    if error:
        row["error"] = error
    return row


def _environment(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    driver = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        or None
    )
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "peft", "accelerate", "bitsandbytes"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    free, total = torch.cuda.mem_get_info()
    return {
        "gpu": props.name,
        "total_memory_bytes": total,
        "total_memory_gib": round(total / 2**30, 2),
        "driver": driver,
        "versions": versions,
        "date": dt.date.today().isoformat(),
    }


def _optimizer(torch, params: list, name: str):
    """The optimizer ``name`` (:data:`OPTIMIZERS`) over ``params``, lr 1e-5."""
    if name == "adamw-8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=1e-5)
    return torch.optim.AdamW(params, lr=1e-5, fused=name == "adamw-fused", foreach=name == "adamw-foreach")


def _phase_peak(torch) -> tuple[int, int]:
    """(peak allocated, peak reserved) bytes since the last reset; resets both."""
    peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    return peak


def _run_case(
    torch, model: str, method: str, seq: int, batch: int, recompute: str, steps: int, optimizer: str = "adamw-foreach"
) -> dict:
    import transformers

    cfg = hf_config_dict(model)
    config = transformers.AutoConfig.for_model(**cfg)
    config._attn_implementation = "sdpa"
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    dtype = torch.float32 if method == "full" else torch.bfloat16
    with torch.device("cuda"):  # random init on the GPU: same tensors, minutes faster than on the CPU
        net = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    times = []
    phases: dict = {}
    tokens = seq * batch
    if method == "inference":
        net.eval()
        phases = {"weights": torch.cuda.memory_allocated()}
        prompt = torch.randint(0, cfg["vocab_size"], (batch, seq - 16), device="cuda")
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                net.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=16,
                    min_new_tokens=16,
                    do_sample=False,
                    pad_token_id=0,
                )
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    else:
        if method == "lora":
            import peft

            net = peft.get_peft_model(
                net,
                peft.LoraConfig(
                    r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
                ),
            )
        if recompute == "full":
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if method == "lora":
                net.enable_input_require_grads()
        net.train()
        optim = _optimizer(torch, [p for p in net.parameters() if p.requires_grad], optimizer)
        ids = torch.randint(0, cfg["vocab_size"], (batch, seq), device="cuda")
        allocated = reserved = 0
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            peaks = {"between_steps": torch.cuda.memory_allocated()}
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = net(input_ids=ids, labels=ids).loss
            peaks["forward"], pool = _phase_peak(torch)
            loss.backward()
            peaks["backward"], pool_backward = _phase_peak(torch)
            optim.step()
            optim.zero_grad(set_to_none=True)
            peaks["optimizer_step"], pool_step = _phase_peak(torch)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            allocated = max(allocated, *peaks.values())
            reserved = max(reserved, pool, pool_backward, pool_step)
            phases = peaks
    free, total = torch.cuda.mem_get_info()
    if method == "inference":
        allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    context = (total - free) - torch.cuda.memory_reserved()  # CUDA context + library workspaces now
    step = statistics.median(times[1:] or times)
    del net
    return make_row(
        model,
        method,
        seq,
        batch,
        recompute,
        device_used=reserved + context,
        allocated=allocated,
        reserved=reserved,
        step_seconds=round(step, 4),
        tokens_per_second=round(tokens / step, 1),
        optimizer=optimizer,
        phases=phases,
    )


def _optimizer_option(case: tuple) -> dict:
    """``{"optimizer": ...}`` when the grid case names one (a 6th element), else ``{}``."""
    return {"optimizer": case[5]} if len(case) > 5 else {}


def _failed_row(case: tuple, status: str, error: str) -> dict:
    """The row of a case that measured nothing (``status`` ``oom`` or ``error``)."""
    return make_row(
        *case[:5],
        device_used=None,
        allocated=None,
        reserved=None,
        step_seconds=None,
        tokens_per_second=None,
        status=status,
        error=error,
        **_optimizer_option(case),
    )


def _case_in_child(case: tuple, steps: int, timeout_seconds: float) -> dict:
    """Run ``case`` in a fresh Python process (``--one-case``) and return its row; a crash or a
    timeout becomes a row with ``status`` ``error``."""
    command = [sys.executable, __file__, "--one-case", json.dumps(list(case)), "--steps", str(steps)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_seconds, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])
        error = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout_seconds:.0f} s"
    return _failed_row(case, "error", error)


def _one_case(torch, case: tuple, steps: int) -> dict:
    """Row of one case in this process; an out-of-memory error is a row with ``status`` ``oom``."""
    try:
        return _run_case(torch, *case[:5], steps=steps, **_optimizer_option(case))
    except torch.cuda.OutOfMemoryError as exc:
        return _failed_row(case, "oom", str(exc).splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    """Run the grid; write the results file. Returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="default")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--out-file", type=Path, default=None, help="results file (default: DIR/gpu-memory-<gpu>-<date>.json)"
    )
    parser.add_argument("--case-timeout-seconds", type=float, default=300.0)
    parser.add_argument("--one-case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(
            "error: measure_gpu_memory.py needs torch, transformers and peft on a CUDA machine (torch not installed)",
            file=sys.stderr,
        )
        return EXIT_MISSING_DEPENDENCY
    if not torch.cuda.is_available():
        print("error: measure_gpu_memory.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return EXIT_MISSING_DEPENDENCY
    if args.one_case is not None:
        print(json.dumps(_one_case(torch, tuple(json.loads(args.one_case)), args.steps)), flush=True)
        return 0
    env = _environment(torch)
    name = env["gpu"].lower().replace("nvidia ", "").replace(" ", "-")
    path = args.out_file or args.out / f"gpu-memory-{name}-{env['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in GRIDS[args.grid]:
        rows.append(_case_in_child(case, args.steps, args.case_timeout_seconds))
        print(json.dumps(rows[-1]), flush=True)
        # written after every case: a run stopped at its time limit keeps what it measured
        path.write_text(json.dumps({"schema_version": 1, "environment": env, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
