"""Uploads the checked export (models/sft-hf) to the Hugging Face Hub, with a model card.

    python -m tools.publish OWNER/NAME            # a private repository (created if missing)
    python -m tools.publish OWNER/NAME --public   # a public one
    python -m tools.publish OWNER/NAME --gguf     # the GGUF files (models/gguf) too, beside the export

The card (README.md in the repository, written here from the run's own records) names the
base model and revision, the dataset, its revision and row counts, every param that shaped
the model, held-out loss and benchmark scores of base and fine-tuned, the export check's figures, and the git
commit and DVC hash of the export, so that an upload can be traced back to the run that
made it. Publishing an export that is already there, card included, makes no new commit.

The token is huggingface_hub's own (HF_TOKEN or `hf auth login`); it is never a param,
never on a command line, never written. Refused, with one line, before anything is sent:
no token, a read-only token, a repository in a namespace the token's user does not own,
an export that did not pass its check (or was never made), and with --gguf, GGUF files that
did not pass theirs. The GGUF files go to the repository's root, where llama.cpp
(`llama-cli -hf OWNER/NAME:Q8_0`), Ollama (`ollama run hf.co/OWNER/NAME:Q8_0`) and LM Studio
find them by their type.
"""

import argparse
import json
import os
import subprocess

import yaml

from stages.lib import gguf_source, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load, plain
from stages.shared import checkpoint, families
from stages.shared.errors import StageFailed, UserError

CARD = "README.md"
EXPORT_CHECK = os.path.join("metrics", "export_check.json")
GGUF_CHECK = os.path.join("metrics", "gguf_check.json")
SHAPING = (
    "base_model",
    "dataset",
    "model",
    "convert_in",
    "train",
    "convert_out",
)  # params sections that shape the weights


def check_export() -> dict:
    report = outputs.read_json(EXPORT_CHECK)
    if not os.path.isfile(os.path.join(paths.SFT_HF, "config.json")) or report is None:
        raise UserError(
            f"{paths.SFT_HF}: no checked export here; run `dvc repro` (or `dvc pull models/sft-hf` and "
            f"{EXPORT_CHECK}) first"
        )
    if not report.get("export", {}).get("passed"):
        raise UserError(f"{paths.SFT_HF} did not pass its export check ({EXPORT_CHECK}); it is not published")
    return report["export"]


def check_gguf() -> dict:
    """export_gguf's figures per type, refusing in one line files that are missing or failed."""
    report = (outputs.read_json(GGUF_CHECK) or {}).get("gguf", {})
    missing = [f["file"] for f in report.values() if not os.path.isfile(os.path.join(paths.GGUF, f["file"]))]
    if not report or missing:
        raise UserError(
            f"{paths.GGUF}: no checked GGUF files here; set gguf.types and run `dvc repro export_gguf` first"
        )
    failed = [kind for kind, f in report.items() if not f["passed"]]
    if failed:
        raise UserError(f"{paths.GGUF}: {', '.join(failed)} did not pass the GGUF check ({GGUF_CHECK}); not published")
    return report


def gguf_section(report: dict) -> list[str]:
    """The card's GGUF section: each file, its size and its check against this export."""
    lines = [
        "## GGUF",
        "",
        "For llama.cpp, Ollama and LM Studio (`ollama run hf.co/<this repository>:Q8_0`). Each file,",
    ]
    lines += ["read back by transformers' GGUF reader, against this export on the same fixed prompts:", ""]
    lines += ["| file | MB | max KL | mean KL | top-1 agreement |", "|---|---|---|---|---|"]
    for f in report.values():
        figures = f"{f['kl_max']:.3g} | {f['kl_mean']:.3g} | {f['top1_agreement']:.4f}"
        lines.append(f"| {f['file']} | {f['bytes'] / 1e6:.1f} | {figures} |")
    return lines + [""]


def check_token(api, repo_id: str) -> str:
    """The token's user; refuses a missing, read-only or foreign-namespace token in one line."""
    import huggingface_hub
    from huggingface_hub import errors

    if huggingface_hub.get_token() is None:
        raise UserError(
            "no Hugging Face token found: export HF_TOKEN=... (a token with write access) or run `hf auth login`"
        )
    try:
        who = api.whoami()
    except errors.HfHubHTTPError as e:
        raise UserError(
            f"the Hub refused the token ({str(e).splitlines()[0]}); check HF_TOKEN or run `hf auth login`"
        ) from None
    except OSError as e:
        raise UserError(f"cannot reach the Hugging Face Hub at {huggingface_hub.constants.ENDPOINT}: {e}") from None
    role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise UserError(
            f"the token of {who['name']} is read-only; create one with write access at "
            f"{huggingface_hub.constants.ENDPOINT}/settings/tokens"
        )
    namespace = repo_id.split("/")[0]
    owners = {who["name"], *(o["name"] for o in who.get("orgs", []))}
    if namespace not in owners:
        raise UserError(
            f"{repo_id}: {namespace} is not {who['name']} or one of their organisations "
            f"({', '.join(sorted(owners))}); publish under a namespace the token may write to"
        )
    return who["name"]


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def provenance() -> dict:
    """The git commit and the export's DVC hash (dvc.lock), and whether the record is committed."""
    lock = yaml.safe_load(open("dvc.lock")) if os.path.exists("dvc.lock") else {}
    outs = (lock.get("stages", {}).get("convert_out", {}) or {}).get("outs", [])
    md5 = next((o["md5"] for o in outs if o["path"] == paths.SFT_HF), None)
    commit = git("rev-parse", "HEAD")
    clean = bool(commit) and git("status", "--porcelain", "--", "dvc.lock", "params.yaml") == ""
    return {"git_commit": commit or None, "committed": clean, "dvc_md5": md5}


def model_card(params: dict, check: dict, repo_id: str, gguf: dict | None = None) -> str:
    b, d = params["base_model"], params["dataset"]
    counts = outputs.read_json(os.path.join("metrics", "dataset.json")) or {}
    train, held_out = counts.get("train", {}), counts.get("eval", {})
    evaluation = (outputs.read_json(os.path.join("metrics", "eval.json")) or {}).get("eval", {})
    origin = provenance()
    family = families.of(params["model"]["maxtext_name"])
    if b["source"] == "hub":
        base = b["repo_id"]
    elif b["source"] == "gguf":
        base = f"{family.NAME}, dequantized from the GGUF {gguf_source.describe(b)}"
    else:
        base = f"the tiny {family.NAME} of this pipeline (seed {b['tiny_seed']}: {family.TINY})"
    data = (
        f"{d['repo_id']}@{d['revision']}"
        if d["source"] == "hub"
        else f"{d['local_dir']} (in the pipeline's repository)"
    )
    multimodal = "vision_config" in checkpoint.read_config(paths.SFT_HF)
    tag = family.PIPELINE_TAG if multimodal else "text-generation"
    front = {"library_name": "transformers", "pipeline_tag": tag, "tags": ["maxtext", "sft", "dvc"]}
    if b["source"] == "hub":
        front["base_model"] = b["repo_id"]
    if d["source"] == "hub":
        front["datasets"] = [d["repo_id"]]
    shaping = {section: plain(params[section]) for section in SHAPING}
    loss = ""
    if evaluation:
        loss = (
            f"| held-out loss | {evaluation['base_loss']:.4f} | {evaluation['fine_tuned_loss']:.4f} |\n"
            f"| held-out perplexity | {evaluation['base_perplexity']:.4g} | {evaluation['fine_tuned_perplexity']:.4g} "
            "|\n"
        )
    benchmarks = (outputs.read_json(os.path.join("metrics", "benchmark.json")) or {}).get("benchmark", {})
    for name, score in benchmarks.items():  # lm-eval's scores and standard errors (stages/benchmark.py)
        base, tuned = (
            f"{score[who]:.4f}" + (f" ± {score[f'{who}_stderr']:.4f}" if score.get(f"{who}_stderr") is not None else "")
            for who in ("base", "fine_tuned")
        )
        loss += f"| {name} (lm-eval) | {base} | {tuned} |\n"
    rounding = check.get("rounding", {})
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {repo_id.split('/')[1]}",
        "",
        f"Supervised fine-tuning of {base} with MaxText's SFT trainer, exported to Hugging Face format "
        "and checked, by a DVC pipeline.",
        "",
        "## Provenance",
        "",
        f"- base model: {base}" + (f" at revision `{b['revision']}`" if b["source"] == "hub" else ""),
        f"- dataset: {data}, split `{d['train_split']}` ({train.get('rows', '?')} conversations trained on, "
        f"{train.get('skipped', 0)} skipped as malformed), held out: `{d['eval_split']}` ({held_out.get('rows', '?')})",
        f"- pipeline commit: `{origin['git_commit']}`"
        + ("" if origin["committed"] else " (with uncommitted changes to dvc.lock or params.yaml)"),
        f"- export: DVC hash `{origin['dvc_md5']}` of `models/sft-hf` "
        "(`dvc pull models/sft-hf` at that commit gives these files)",
        "",
        "## Evaluation",
        "",
        "| | base | fine-tuned |",
        "|---|---|---|",
        loss.rstrip() or "| held-out loss | not evaluated | |",
        "",
        "## Export check",
        "",
        f"Next-token distributions of this export (transformers, float32) against MaxText running the same "
        f"{rounding.get('dtype', params['convert_out']['dtype'])} weights (float32) on fixed prompts: max KL "
        f"{check['kl_max']:.3g}, mean KL {check['kl_mean']:.3g}, top-1 agreement {check['top1_agreement']:.4f}. "
        + (
            f"Rounding the trained float32 weights to {rounding['dtype']} costs: max KL {rounding['kl_max']:.3g}, "
            f"mean KL {rounding['kl_mean']:.3g}."
            if rounding
            else ""
        ),
        "",
        *(gguf_section(gguf) if gguf else []),
        "## Training params",
        "",
        "Every param that shaped these weights (the pipeline's params.yaml):",
        "",
        "```yaml",
        yaml.safe_dump(json.loads(json.dumps(shaping)), sort_keys=False).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.publish")
    parser.add_argument("repo_id", help="OWNER/NAME on the Hub")
    parser.add_argument("--public", action="store_true", help="make a new repository public (default: private)")
    parser.add_argument("--gguf", action="store_true", help="upload the checked GGUF files (models/gguf) too")
    args = parser.parse_args()
    if args.repo_id.count("/") != 1 or not all(args.repo_id.split("/")):
        raise UserError(f"{args.repo_id!r}: expected a repository id like OWNER/NAME")
    import huggingface_hub
    from huggingface_hub import CommitOperationAdd, errors

    params = load()
    check = check_export()
    gguf = check_gguf() if args.gguf else None
    api = huggingface_hub.HfApi()
    user = check_token(api, args.repo_id)
    files = {
        e: os.path.join(paths.SFT_HF, e)
        for e in sorted(os.listdir(paths.SFT_HF))
        if os.path.isfile(os.path.join(paths.SFT_HF, e))
    }
    for f in (gguf or {}).values():
        files[f["file"]] = os.path.join(paths.GGUF, f["file"])
    files[CARD] = model_card(params, check, args.repo_id, gguf).encode()
    try:
        api.create_repo(args.repo_id, private=not args.public, exist_ok=True)
        info = api.repo_info(args.repo_id)  # an existing repository keeps its visibility
        # huggingface_hub leaves out of the commit every file whose content the Hub already
        # holds (the oids its preupload call returns), and makes no commit when none is left.
        commit = api.create_commit(
            args.repo_id,
            [CommitOperationAdd(path, source) for path, source in files.items()],
            commit_message=f"Fine-tuned export ({provenance()['dvc_md5']})",
        )
    except errors.HfHubHTTPError as e:
        raise StageFailed(f"the Hub refused the upload to {args.repo_id} ({str(e).splitlines()[0]})") from None
    if commit.oid == info.sha:
        print(f"publish: {args.repo_id} already holds this export and card (commit {info.sha[:12]}); nothing uploaded")
        return
    print(
        f"publish: published {len(files)} files to {huggingface_hub.constants.ENDPOINT}/{args.repo_id} as {user} "
        f"(commit {commit.oid[:12]}, {'private' if info.private else 'public'})"
    )


if __name__ == "__main__":
    run(main, "publish")
