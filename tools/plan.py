"""What a run of the recipe in params.yaml will cost, before paying for it: per stage, the bytes
downloaded, read and written and where (the boot disk, /dev/shm, gs://), the checkpoint saves,
the disk peak against the machine's, and a time from stated assumptions.

    python -m tools.plan                 # the recipe in params.yaml
    python -m tools.plan --recipe NAME   # a committed recipe (recipes/NAME.yaml)
    python -m tools.plan --grid train.learning_rate=1e-5,2e-5,5e-5 --workers 2   # a grid (tools.grid)

Runs nothing and reads no weights: the model's dimensions come from models/base-hf/config.json
when the base_model stage has run, else from MaxText's own config for model.maxtext_name. Every
figure is a projection; the assumptions are printed beside them (docs/benchmarks.md, "Cost
preview"). Not modelled: host RAM of the MaxText processes, LoRA's adapter sizes, data bytes.
"""

import argparse
import os

import yaml

from stages.lib import hardware, paths
from stages.lib.cli import run
from stages.lib.params import load, plain, validate
from stages.shared import checkpoint
from stages.shared.errors import UserError

GB = 1e9
HUB_BYTES_PER_PARAM = 2  # the Hub's checkpoints are bf16 (a downloaded one's config says)
# Stated assumptions for the time column; change them here, they are printed with every plan.
ASSUMED = {
    "mfu": 0.35,  # of the chips' peak bf16 FLOP/s
    "download_bytes_per_s": 100e6,  # from the Hub
    "disk_bytes_per_s": 200e6,  # a balanced persistent boot disk
    "shm_bytes_per_s": 2e9,  # /dev/shm: memory bandwidth, one writer
    "gcs_bytes_per_s": 400e6,  # one VM to a bucket in its region
    "boot_disk_bytes": 200e9,  # the tutorial's --boot-disk-size=200GB (docs/tpu-vm.md)
}


def maxtext_model_config(maxtext_name: str) -> dict:
    import maxtext

    path = os.path.join(os.path.dirname(maxtext.__file__), "configs", "models", f"{maxtext_name}.yml")
    with open(path) as f:
        return yaml.safe_load(f)


def dimensions(params: dict, base_hf: str = paths.BASE_HF) -> dict:
    """The language model's shape: from the downloaded checkpoint's config when there is one,
    else from MaxText's config for the architecture (which is what the Hub model has)."""
    config_path = os.path.join(base_hf, "config.json")
    if os.path.exists(config_path):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(base_hf)  # fills what config.json leaves to defaults
        text = config.get_text_config()
        vision = getattr(config, "vision_config", None)
        dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
        return {
            "layers": text.num_hidden_layers,
            "emb": text.hidden_size,
            "heads": text.num_attention_heads,
            "kv_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            "head_dim": getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            "mlp": text.intermediate_size,
            "vocab": text.vocab_size,
            "tied": bool(getattr(config, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False)),
            "vision": vision
            and _vit(vision.num_hidden_layers, vision.hidden_size, vision.intermediate_size, text.hidden_size),
            "base_bytes_per_param": checkpoint.DTYPE_BYTES[dtype.removeprefix("torch.")],
            "source": config_path,
        }
    if params["base_model"]["source"] != "hub":  # built or dequantized here: no Hub model to look up
        raise UserError(f"{config_path}: not there yet; run `dvc repro base_model` first (seconds for this recipe)")
    m = maxtext_model_config(params["model"]["maxtext_name"])
    return {
        "layers": m["base_num_decoder_layers"],
        "emb": m["base_emb_dim"],
        "heads": m["base_num_query_heads"],
        "kv_heads": m["base_num_kv_heads"],
        "head_dim": m.get("head_dim") or m["base_emb_dim"] // m["base_num_query_heads"],
        "mlp": m["base_mlp_dim"],
        "vocab": m["vocab_size"],
        "tied": bool(m.get("logits_via_embedding", False)),
        "vision": "hidden_size_for_vit" in m
        and _vit(
            m["num_hidden_layers_for_vit"], m["hidden_size_for_vit"], m["intermediate_size_for_vit"], m["base_emb_dim"]
        ),
        "base_bytes_per_param": HUB_BYTES_PER_PARAM,
        "source": f"MaxText's configs/models/{params['model']['maxtext_name']}.yml",
    }


def _vit(layers: int, width: int, mlp: int, emb: int) -> int:
    """A SigLIP-style vision tower plus its projection into the language model (approximate:
    attention and MLP weights, which are nearly all of it)."""
    return layers * (4 * width * width + 2 * width * mlp) + width * emb


def language_parameters(d: dict) -> int:
    """Weights of a decoder with grouped-query attention and a gated MLP (Gemma, Llama, Qwen);
    norms included, biases (none in these families) not."""
    attention = d["emb"] * d["head_dim"] * (2 * d["heads"] + 2 * d["kv_heads"])
    layer = attention + 3 * d["emb"] * d["mlp"] + 4 * d["emb"] + 2 * d["head_dim"]
    embeddings = d["vocab"] * d["emb"] * (1 if d["tied"] else 2)
    return d["layers"] * layer + embeddings + d["emb"]


def save_steps(steps: int, period: int) -> list[int]:
    """Where MaxText's SFT and DPO save: every `period`, and the end (Orbax's initial save at
    step 1 is left out by stages/in_maxtext/main.py: no_initial_checkpoint)."""
    return sorted({steps, *range(period, steps + 1, period)})


def _add(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def where(path: str) -> str:
    if path.startswith("gs://"):
        return "gs://"
    return "/dev/shm" if os.path.abspath(path).startswith("/dev/shm") else "boot disk"


def plan(params: dict, d: dict) -> dict:
    text = language_parameters(d)
    vision = d["vision"] or 0
    train, runtime = params["train"], params["runtime"]
    lora = train.get("lora", {}).get("enabled", False)
    per_save = hardware.checkpoint_bytes(text, lora)
    saves = save_steps(train["steps"], train["checkpoint_period"])
    scratch = where(runtime["scratch_dir"])
    f32 = checkpoint.DTYPE_BYTES["float32"]
    converted = checkpoint.DTYPE_BYTES[params["convert_in"]["save_dtype"]] * text
    base = d["base_bytes_per_param"] * (text + vision)
    final = f32 * text
    # convert_out: MaxText's float32 export beside the assembled one in convert_out.dtype
    transient, export = f32 * (text + vision), checkpoint.DTYPE_BYTES[params["convert_out"]["dtype"]] * (text + vision)
    kind = params["hardware"]["kind"]
    accelerator = hardware.TPUS.get(kind)
    chips = accelerator.chips if accelerator else None
    tokens = train["per_device_batch_size"] * (chips or 1) * train["gradient_accumulation_steps"]
    tokens *= train["max_target_length"]
    step_flops = 6 * text * tokens
    held_out = params["dataset"]["max_eval_rows"] or "all"
    interval = train["eval_interval"]
    in_training = (train["steps"] // interval + 1) if interval else 0
    reused = bool(interval) and train["steps"] % interval == 0  # evaluate takes training's held-out losses
    bench = params["benchmark"]
    # what the benchmark loads (its tasks and the greedy answers): both HF checkpoints' language models
    language_models = d["base_bytes_per_param"] * text + export * text // (text + vision)
    stages = [
        {
            "stage": "base_model",
            "downloaded": base if params["base_model"]["source"] == "hub" else 0,
            "written": {"boot disk": base},
        },
        {
            "stage": "convert_in",
            "read": base,
            "written": {"boot disk": converted},
            "passes": "its check: 1 MaxText + 1 transformers forward over the fixed prompts",
        },
        {
            "stage": "train",
            "read": converted,
            "written": _add({scratch: per_save * len(saves)}, {"boot disk": final}),
            "trained_params": final,  # float32, in models/sft-maxtext
            "saves": saves,
            "save_bytes": per_save,
            "peak": {scratch: min(len(saves), runtime["keep_checkpoints"] + 1) * per_save},
            "compute_flops": step_flops * train["steps"],
            "passes": f"in-training evaluation: {in_training} passes (step 0, then every {interval}) over the"
            f" {held_out} held-out rows",
        },
        {
            "stage": "convert_out",
            "read": final + base,
            "written": {"boot disk": export + transient},
            "passes": "export check: 1 MaxText + 1 transformers forward over the fixed prompts",
            "peak": {"boot disk": transient},
        },
        {
            "stage": "evaluate",
            # the MaxText checkpoints, unless training's evaluations are reused (stages/evaluate.py)
            "read": 0 if reused else converted + final,
            "passes": (
                f"held-out loss: training's evaluations at steps 0 and {train['steps']} (no pass, no model loaded)"
                if reused
                else f"held-out loss over the {held_out} rows, base and tuned (MaxText: 2 passes)"
            ),
        },
        {
            "stage": "benchmark",
            "read": language_models,
            "passes": f"lm-eval on base and tuned: {', '.join(t['name'] for t in bench['tasks']) or 'no tasks'}"
            + (f", {bench['limit']} items each" if bench["limit"] else ", every item")
            + f"; on the same loaded models, greedy answers to {len(bench['prompts'])} prompts x"
            f" {bench['max_new_tokens']} tokens, one batch each"
            + " (its compute is not modelled: docs/benchmarks.md projects the 4B recipe's)",
        },
    ]
    pref = params["preference"]
    if pref["enabled"]:
        stages.insert(3, preference_stage(pref, text, final, per_save, scratch, chips, runtime["keep_checkpoints"]))
        stages[-2]["read"] += final  # evaluate: the preference-tuned model, its loss and the pairs
        stages[-2]["passes"] += "; held-out pairs, SFT and preference-tuned (MaxText: 2 passes), and its loss"
    # The boot disk at its fullest: while converting out, everything the run keeps is there.
    kept = base + converted + final * (2 if pref["enabled"] else 1) + export + transient
    if scratch == "boot disk":
        kept += max(s["peak"].get("boot disk", 0) for s in stages[2:4] if "saves" in s)
    peak_flops = chips * accelerator.peak_bf16_tflops_per_chip * 1e12 if accelerator else None
    return {
        "text_parameters": text,
        "vision_parameters": vision,
        "chips": chips,
        "peak_flops": peak_flops,
        "kind": kind,
        "step_flops": step_flops,
        "stages": stages,
        "boot_disk_peak": kept,
        "scratch": scratch,
        "shm_peak": max(s["peak"].get("/dev/shm", 0) for s in stages if "saves" in s),
    }


def preference_stage(pref: dict, text: int, final: int, per_save: float, scratch: str, chips, keep: int) -> dict:
    """The preference stage (on): train_dpo from the SFT parameters, saving as SFT does; a
    step is the policy's forward and backward over both answers of every pair, and (DPO) the
    reference model's forward over them."""
    saves = save_steps(pref["steps"], pref["checkpoint_period"])
    tokens = 2 * pref["per_device_batch_size"] * (chips or 1) * pref["gradient_accumulation_steps"]
    tokens *= pref["max_target_length"]
    flops_per_token = 6 + (2 if pref["algorithm"] == "dpo" else 0)
    return {
        "stage": "preference",
        "read": final,
        "written": _add({scratch: per_save * len(saves)}, {"boot disk": final}),
        "trained_params": final,
        "saves": saves,
        "save_bytes": per_save,
        "peak": {scratch: min(len(saves), keep + 1) * per_save},
        "compute_flops": flops_per_token * text * tokens * pref["steps"],
        "passes": "the reference model's forward over every pair, each step"
        if pref["algorithm"] == "dpo"
        else "ORPO: no reference model",
    }


def seconds(stage: dict, p: dict, assumed: dict = ASSUMED) -> float:
    rate = {
        "boot disk": assumed["disk_bytes_per_s"],
        "/dev/shm": assumed["shm_bytes_per_s"],
        "gs://": assumed["gcs_bytes_per_s"],
    }
    t = stage.get("downloaded", 0) / assumed["download_bytes_per_s"]
    t += stage.get("read", 0) / assumed["disk_bytes_per_s"]
    t += sum(n / rate[fs] for fs, n in stage.get("written", {}).items())
    if stage.get("compute_flops") and p["peak_flops"]:
        t += stage["compute_flops"] / (assumed["mfu"] * p["peak_flops"])
    return t


def render(p: dict, d: dict, assumed: dict = ASSUMED) -> str:
    g = lambda n: f"{n / GB:,.1f} GB"  # noqa: E731
    lines = [
        f"Cost preview (a projection): {p['text_parameters'] / 1e9:.2f}B language-model parameters"
        + (f" + {p['vision_parameters'] / 1e9:.2f}B vision tower" if p["vision_parameters"] else "")
        + f" (from {d['source']}), hardware {p['kind']}",
        "",
        f"{'stage':<12} {'downloaded':>11} {'read':>10}  written (where)",
    ]
    for s in p["stages"]:
        written = ", ".join(f"{g(n)} ({fs})" for fs, n in s.get("written", {}).items()) or "-"
        lines.append(f"{s['stage']:<12} {g(s.get('downloaded', 0)):>11} {g(s.get('read', 0)):>10}  {written}")
        if "saves" in s:
            lines.append(
                f"{'':<12} checkpoint saves at steps {', '.join(map(str, s['saves']))}:"
                f" {len(s['saves'])} x {g(s['save_bytes'])} into {p['scratch']}"
            )
        if "passes" in s:
            lines.append(f"{'':<12} passes: {s['passes']}")
        if p["peak_flops"] or "compute_flops" not in s:
            lines.append(f"{'':<12} time: ~{seconds(s, p, assumed) / 60:.1f} min")
    boot = assumed["boot_disk_bytes"]
    lines += [
        "",
        f"boot disk peak: {g(p['boot_disk_peak'])} of {g(boot)}"
        + ("  <- does not fit" if p["boot_disk_peak"] > boot else "")
        + " (plus .venv, ~8 GB, and the OS)",
        f"/dev/shm peak (host RAM): {g(p['shm_peak'])}",
        "",
        "assumed: " + ", ".join(f"{k}={v:g}" for k, v in assumed.items()),
        f"a training step: 6 x parameters x tokens = {p['step_flops']:.2e} FLOP",
        "not modelled: MaxText's host RAM, LoRA adapter sizes, the chat data, DVC's cache (linked, not copied)",
    ]
    return "\n".join(lines)


def grid_cost(params, d: dict, variants: dict[str, list[str]], workers: int, assumed: dict = ASSUMED) -> str:
    """A grid's time and chip-hours: the shared stages once, each variant's own stages, spread
    over `workers` machines (longest first), against one machine running them in a row and
    against every variant recomputing the shared stages (a projection, as the plan is)."""
    from tools.grid import shared_stages, with_values

    shared = shared_stages(sorted({s.split("=", 1)[0] for sets in variants.values() for s in sets}))
    own = {}
    for name, sets in variants.items():
        p = plan(validate(with_values(plain(params), [s.split("=", 1) for s in sets]), name), d)
        times = {s["stage"]: seconds(s, p, assumed) for s in p["stages"]}
        own[name] = sum(t for stage, t in times.items() if stage not in shared)
    once = sum(t for stage, t in times.items() if stage in shared)
    loads = [0.0] * workers
    for t in sorted(own.values(), reverse=True):
        loads[loads.index(min(loads))] += t
    machine_s = once + sum(own.values())
    chips = p["chips"] or 1
    h = lambda s: f"{s / 3600:.2f} h"  # noqa: E731
    on = f"{workers} worker{'s' if workers > 1 else ''}"
    lines = [
        f"Grid cost (a projection, the plan's assumptions): {len(variants)} variants on {on} "
        f"of {p['kind']} ({chips} chips each)",
        f"  shared stages, run once: {', '.join(shared) or 'none'}: ~{once / 60:.1f} min",
        *[f"  {name}: ~{t / 60:.1f} min of its own stages" for name, t in own.items()],
        f"  wall: ~{(once + max(loads)) / 60:.1f} min on {on}; one machine in a row (dvc queue): "
        f"~{machine_s / 60:.1f} min",
        f"  chip-hours: {machine_s * chips / 3600:.2f} ({h(machine_s)} of machine time); the shared stages run once "
        f"save {(len(variants) - 1) * once * chips / 3600:.2f} chip-hours against each variant computing them",
        "  not modelled: evaluate's and the benchmark's compute, a worker's set-up and idle wait (the shared stages "
        "run before any variant)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", help="a committed recipe's name (recipes/NAME.yaml) instead of params.yaml")
    parser.add_argument("--base-hf", default=paths.BASE_HF, help="where a downloaded base checkpoint's config is")
    parser.add_argument("--grid", nargs="+", metavar="KEY=V1,V2", help="a grid's cost (python -m tools.grid's axes)")
    parser.add_argument("--workers", type=int, default=1, help="with --grid: machines running it")
    args = parser.parse_args(argv)
    if args.recipe:
        from tools import recipe

        params = validate(yaml.safe_load(recipe.params_text(args.recipe)), f"recipes/{args.recipe}.yaml")
    else:
        params = load()
    d = dimensions(params, args.base_hf)
    if args.grid:
        from tools.grid import expand

        if args.workers < 1:
            raise UserError(f"--workers {args.workers}: at least 1")
        print(grid_cost(params, d, expand(args.grid, plain(params)), args.workers))
        return
    print(render(plan(params, d), d))


if __name__ == "__main__":
    run(main, "plan")
