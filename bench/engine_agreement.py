"""Does MaxText's engine score what transformers scores? The benchmark stage's two backends side
by side on one machine's CPU, float32 both (stages/lib/benchmark_backends.py: `hf`, lm-eval's
transformers backend on the HF checkpoint; `maxtext`, MaxText's inference engine on the MaxText
checkpoint), on the same tasks, prompts and model.

    python -m bench.engine_agreement WORKSPACE [--ifeval N] [--gsm8k N] [--mmlu N] [--gen-toks N]

WORKSPACE is a run of a recipe whose base_model and convert_in have run (the real 270M: the small
recipes'); its base model is what both backends score (a scratch copy of the workspace's params,
the tasks cut to the slice asked for). Reported, per task: each
backend's score and standard error, and whether they agree within one; for generating tasks the
share of identical answers (and, for the recipe's greedy prompts, the character at which two
answers part); for log-likelihood tasks the mean and largest difference of the per-choice
log-likelihoods. The workspace's MaxText base should be float32 (`convert_in.save_dtype:
float32`), or the comparison measures bf16's rounding too.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stages import benchmark  # noqa: E402
from stages.lib import benchmark_backends, paths  # noqa: E402
from stages.lib.params import load  # noqa: E402


def slice_params(params_file: str, out: str, args) -> None:
    import yaml

    params = yaml.safe_load(open(params_file))
    b = params["benchmark"]
    keep = {"ifeval": args.ifeval, "gsm8k": args.gsm8k, "mmlu": args.mmlu}
    b["tasks"] = [
        {**t, "max_items": keep[t["name"]], "max_gen_toks": args.gen_toks if t["name"] != "mmlu" else None}
        for t in b["tasks"]
        if keep.get(t["name"])
    ]
    b.update(
        limit=None, gate=None, batch_size=16, max_length=1024, checkpoints="hf", backend="auto", bootstrap_iters=1000
    )
    params["hardware"] = {"kind": "cpu", "hosts": 1, "tpu_env": None}
    with open(out, "w") as f:
        yaml.safe_dump(params, f, sort_keys=False)


def first_split(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workspace")
    parser.add_argument("--ifeval", type=int, default=40)
    parser.add_argument("--gsm8k", type=int, default=20)
    parser.add_argument("--mmlu", type=int, default=2)
    parser.add_argument("--gen-toks", type=int, default=128)
    parser.add_argument("--save", default="engine-agreement.json", help="both backends' results and samples")
    args = parser.parse_args()
    save = os.path.abspath(args.save)
    os.chdir(args.workspace)
    scratch = tempfile.mkdtemp(prefix="agreement-")
    # The base alone, in each backend (their model lists, cut to it: the measure needs one model).
    benchmark_backends.HF_MODELS = {"base": paths.BASE_HF}
    benchmark_backends.MODEL_NAMES = ("base",)
    benchmark_backends.MaxTextEngine.models = staticmethod(lambda: {"base": paths.BASE_MAXTEXT_PARAMS})
    try:
        slice_params("params.yaml", os.path.join(scratch, "params.yaml"), args)
        params = load(os.path.join(scratch, "params.yaml"))
        tasks, _, task_dir = benchmark.prepare(params, scratch)
        benchmark.check_readable(tasks, task_dir)
        found = {}
        for backend in (benchmark_backends.Transformers(), benchmark_backends.MaxTextEngine()):
            found[backend.name] = backend.run(params, tasks, task_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(save, "w") as f:  # what each backend said, whatever the comparison makes of it
        json.dump(found, f, default=str)
    report = compare(tasks, found)
    print(json.dumps(report, indent=1))


def compare(tasks: list[dict], found: dict) -> dict:
    import numpy as np

    report = {}
    (hf_results, hf_samples, hf_said), (mt_results, mt_samples, mt_said) = found["hf"], found["maxtext"]
    for t in tasks:
        name, metric = t["name"], t["metric"]
        stderr_key = benchmark.stderr_key(metric)
        score = {}
        for who, results in (("hf", hf_results["base"]), ("maxtext", mt_results["base"])):
            entry = results["results"].get(name) or results.get("groups", {}).get(name)
            score[who] = (float(entry[metric]), float(entry.get(stderr_key) or float("nan")))
        diff = abs(score["hf"][0] - score["maxtext"][0])
        row = {"hf": score["hf"], "maxtext": score["maxtext"], "within_one_stderr": diff <= max(score["hf"][1], 1e-12)}
        a, b = hf_samples["base"].get(name, []), mt_samples["base"].get(name, [])  # (a group's: its subtasks')
        if t["cfg"].get("output_type") == "generate_until":
            pairs = [(x["resps"][0][0], y["resps"][0][0]) for x, y in zip(a, b, strict=True)]
            row["answers_identical"] = sum(x == y for x, y in pairs) / max(len(pairs), 1)
            row["answers"] = len(pairs)
        else:  # every choice's log-likelihood, as lm-eval logged it
            lls = [
                (float(x["resps"][i][0][0]), float(y["resps"][i][0][0]))
                for x, y in zip(a, b, strict=True)
                for i in range(len(x["resps"]))
            ]
            d = np.abs(np.array([p - q for p, q in lls]))
            row.update(loglikelihoods=len(lls), mean_abs_diff=float(d.mean()), max_abs_diff=float(d.max()))
        report[name] = row
    greedy = list(zip(hf_said["base"], mt_said["base"], strict=True))
    report["greedy_prompts"] = {
        "identical": sum(x == y for x, y in greedy),
        "of": len(greedy),
        "first_split_chars": [first_split(x, y) for x, y in greedy if x != y],
    }
    return {
        k: (
            {kk: (vv if not isinstance(vv, float) or math.isfinite(vv) else None) for kk, vv in v.items()}
            if isinstance(v, dict)
            else v
        )
        for k, v in report.items()
    }


if __name__ == "__main__":
    main()
