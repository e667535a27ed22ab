"""The export check: does the HF export compute what the MaxText checkpoint computes? And its
mirror after convert_in, the conversion check: does the converted MaxText checkpoint compute
what the base HF checkpoint computes?

Run by convert_out (through stages.in_maxtext.main, like MaxText's own entry points), its
request a contract.LogitCheck (stages/shared/contract.py): the exports and their reports, the
base, the tie margin, the export's dtype, for LoRA the base parameters and the adapter; then
MaxText's config file and flags, load_parameters_path= the trained parameters
(stages/lib/flags.py builds both):

    python -m stages.in_maxtext.main stages.in_maxtext.logit_check --setup '{...}' \
        --request '{"base": "models/base-hf", "reports": {"models/sft-hf": "R.json"}, "dtype": "bfloat16", ...}' \
        -- <MaxText config file and flags>

and by convert_in, on the converted checkpoint (`conversion`: each HF checkpoint of `reports`,
the base first, against MaxText on load_parameters_path= models/base-maxtext/0/items).

(convert_out runs it in the same process as the conversion: stages/in_maxtext/export_job.py.) Several
exports of one trained checkpoint are checked against one reference, computed once: the
MaxText side is most of the cost (bench/export_check_calibration.py checks its corrupted
copies so, and tests/test_export.py its rejections).

Like is compared with like. The export holds the trained float32 weights rounded to its
dtype, so the reference is MaxText running exactly those rounded weights (each trained
tensor rounded as the export rounds it, in the model family's HF layout: the family's
`export_rounding`, stages/shared/families/), in float32, on a few fixed chat prompts;
`transformers` runs the export, in float32, on the same prompts, with MaxText's own arithmetic
where MaxText differs by design (the family's `like_maxtext`: Gemma 3's tied output head, which
MaxText computes with a bf16 table). An honest export then differs from its reference only by
the two libraries' float32 arithmetic, whatever the model's size, so the gate can be tight:
per prompt, the KL divergence of the export's next-token distributions from MaxText's, top-1
agreement and the largest logit difference. Reported beside it, as information, is what
MaxText's head costs against transformers' own (`maxtext_head`), and what
rounding to the export dtype costs (MaxText on the trained weights against MaxText on the
rounded ones). For a LoRA run the trained weights are the merge (stages/in_maxtext/merge_lora.py),
which is itself checked against MaxText applying the adapter unmerged, float32 both.
"""

import json

import numpy as np

from stages.shared import contract
from stages.shared.logits import summary
from stages.shared.prompts import fixed_prompts

REQUEST = contract.LogitCheck


def packing(lengths: list[int], devices: int) -> tuple[list[list[int]], int]:
    """The prompts packed into rows, as training packs chat rows: (rows, each a list of prompt
    indices; the row length). Each device gets whole rows of one length, so there are a
    multiple of `devices` rows; the length is the longest prompt or an even share of all the
    tokens, whichever is more, and prompts go longest first into the first row with room.
    On one device (the host CPU) the four fixed prompts make one row of their total length,
    where one row per prompt padded to the long one computed 3.6x the tokens."""
    length = max(max(lengths), -(-sum(lengths) // devices))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fits = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if fits is None:
            rows.append([])
            room.append(length)
            fits = len(rows) - 1
        rows[fits].append(i)
        room[fits] -= lengths[i]
    rows += [[] for _ in range(-len(rows) % devices)]
    return rows, length


def maxtext_model(
    maxtext_args: list[str],
    prompts: list[list[int]],
    lora: tuple[str, str] | None = None,
    layout: tuple[list[list[int]], int] | None = None,
):
    """A MaxText model (float32 compute) for these flags, sized for the prompts packed into
    rows (`layout`: other rows, as bench/check_packing.py compares); with `lora` (base params,
    adapter), the base with the adapter applied as training applied it."""
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    n_dev = jax.device_count()
    rows, length = layout or packing([len(p) for p in prompts], n_dev)
    extra = (
        [f"load_parameters_path={lora[0]}", "lora.enable_lora=true", f"lora.lora_restore_path={lora[1]}"]
        if lora
        else []
    )
    config = pyconfig.initialize_pydantic(
        ["export_check"]
        + maxtext_args
        + extra
        + [
            f"max_target_length={length}",
            f"per_device_batch_size={len(rows) // n_dev}",
            "dtype=float32",
            "run_name=export_check",
        ]
    )
    model, mesh = model_creation_utils.from_pretrained(config)
    if lora:  # as train_sft does it
        from flax.core.spmd import logical_axis_rules
        from maxtext.utils import lora_utils

        with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
            model = lora_utils.apply_lora_to_model(model, mesh, config)
            lora_utils.restore_lora_from_path(model, config)
    return model, mesh, (rows, length)


def logits(model, mesh, packed: tuple[list[list[int]], int], prompts: list[list[int]]) -> list[np.ndarray]:
    """MaxText's logits for each prompt, the prompts packed as `packing` says: each its own
    segment (attention stays inside it), its positions counted from 0."""
    import jax
    import jax.numpy as jnp
    from maxtext.common.common_types import MODEL_MODE_TRAIN

    rows, length = packed
    tokens, segments, positions = (np.zeros((len(rows), length), np.int32) for _ in range(3))
    where = {}
    for r, row in enumerate(rows):
        start = 0
        for segment, i in enumerate(row, start=1):
            end = start + len(prompts[i])
            tokens[r, start:end] = prompts[i]
            segments[r, start:end] = segment
            positions[r, start:end] = np.arange(len(prompts[i]))
            where[i] = (r, start, end)
            start = end
    with jax.set_mesh(mesh):
        out = model(
            jnp.asarray(tokens),
            jnp.asarray(positions),
            decoder_segment_ids=jnp.asarray(segments),
            enable_dropout=False,
            model_mode=MODEL_MODE_TRAIN,
        )
    out = np.asarray(jax.device_get(out), dtype=np.float32)
    return [out[r, start:end] for r, start, end in (where[i] for i in range(len(prompts)))]


def round_like_the_export(model, model_name: str, dtype: str, hf_config) -> int:
    """Replaces every parameter with the value the export holds for it, read back into
    MaxText's layout (the family's export_rounding); returns how many tensors changed."""
    import jax.numpy as jnp
    from flax import nnx

    from stages.shared import families

    state = nnx.state(model, nnx.Param)
    changed = 0
    for path, variable in nnx.to_flat_state(state):
        names = tuple(str(k) for k in path)
        value = np.asarray(variable.value, dtype=np.float32)
        rounded = families.export_rounding(model_name, names, value, dtype, hf_config)
        if not np.array_equal(rounded, value):
            changed += 1
        variable.value = jnp.asarray(rounded, dtype=variable.value.dtype)
    nnx.update(model, state)
    return changed


def transformers_logits(model_dir: str, prompts: list[list[int]], model_name: str) -> tuple[list, list | None]:
    """transformers' next-token logits for each prompt, with MaxText's own arithmetic where the
    family has some (families.like_maxtext: Gemma 3's embedding scale and bf16 output head),
    so that the gates compare like with like; and, where it has, the logits transformers' own
    output head gives on the same hidden states (what MaxText's head costs: information)."""
    import torch

    from stages.shared import families

    model = families.language_model(model_dir, model_name, torch.float32)
    head = families.like_maxtext(model_name, model)
    gated, own = [], []
    with torch.no_grad():
        for p in prompts:
            if head is None:
                gated.append(model(input_ids=torch.tensor([p])).logits[0].float().numpy())
                continue
            hidden = model.model(input_ids=torch.tensor([p])).last_hidden_state[0]  # after the final norm
            gated.append(head(hidden).numpy())
            own.append(model.get_output_embeddings()(hidden).numpy())
    return gated, (own if head is not None else None)


def with_head_cost(report: dict, gated: list, own: list | None, tie_margin: float) -> dict:
    """The report, plus what transformers' own output head gives against MaxText's (when the
    family's differ), as information beside the gated figures."""
    if own is not None:
        report["maxtext_head"] = {k: v for k, v in summary(own, gated, tie_margin).items() if k != "prompts"}
    return report


def check(
    export_dirs: list[str],
    base_dir: str,
    dtype: str,
    tie_margin: float,
    model_name: str,
    maxtext_args: list[str],
    lora: tuple[str, str] | None = None,
) -> list[dict]:
    """The export check's report for each export of one trained checkpoint (see the module
    docstring): the figures the gate reads, the rounding's cost, the config fields that
    differ from the base's, and for a LoRA run (`lora`: base params, adapter) the merge
    against the adapter unmerged. The prompts are the base's tokenizer's (an export's
    tokenizer files are the base's, byte for byte: stages/in_maxtext/assemble_export.py)."""
    from stages.in_maxtext import assemble_export

    hf_config, prompts = fixed_prompts(base_dir)
    model, mesh, packed = maxtext_model(maxtext_args, prompts)
    trained = logits(model, mesh, packed, prompts)
    rounded_tensors = round_like_the_export(model, model_name, dtype, hf_config)
    reference = logits(model, mesh, packed, prompts)
    del model
    rounding = {
        "dtype": dtype,
        "tensors": rounded_tensors,
        **{k: v for k, v in summary(trained, reference, 0.0).items() if k != "prompts"},
    }
    merge = summary(logits(*maxtext_model(maxtext_args, prompts, lora), prompts), trained, tie_margin) if lora else None
    reports = []
    for export_dir in export_dirs:
        gated, own = transformers_logits(export_dir, prompts, model_name)
        report = with_head_cost(summary(reference, gated, tie_margin), gated, own, tie_margin)
        report["rounding"] = rounding
        if merge:
            report["lora_merge"] = merge
        report["config_differences"] = assemble_export.config_differences(export_dir, base_dir)
        reports.append(report)
    return reports


def check_conversion(base_dirs: list[str], tie_margin: float, model_name: str, maxtext_args: list[str]) -> list[dict]:
    """The conversion check's report for each HF checkpoint: transformers on it (the model the
    user chose: the reference) against MaxText on the converted parameters, which training
    starts from, both in float32 on the export check's prompts. MaxText runs once, however
    many checkpoints (the stage checks one; bench/conversion_check_calibration.py faulty copies)."""
    _, prompts = fixed_prompts(base_dirs[0])
    model, mesh, packed = maxtext_model(maxtext_args, prompts)
    converted = logits(model, mesh, packed, prompts)
    del model
    reports = []
    for base_dir in base_dirs:
        gated, own = transformers_logits(base_dir, prompts, model_name)
        reports.append(with_head_cost(summary(gated, converted, tie_margin), gated, own, tie_margin))
    return reports


def run(request: contract.LogitCheck, maxtext_flags: list[str], setup: contract.Setup) -> None:
    """Checks each checkpoint of `request.reports` and writes its report."""
    checkpoints = list(request.reports)
    if request.conversion:
        found = check_conversion(checkpoints, request.tie_margin, setup.model_name, maxtext_flags)
    else:
        lora = (request.lora_base, request.lora_adapter) if request.lora_adapter else None
        found = check(
            checkpoints, request.base, request.dtype, request.tie_margin, setup.model_name, maxtext_flags, lora
        )
    for report_path, report in zip(request.reports.values(), found, strict=True):
        with open(report_path, "w") as f:
            json.dump(report, f, indent=2)
