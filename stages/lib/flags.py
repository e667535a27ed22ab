"""params.yaml -> MaxText jobs: the one place that decides what MaxText's process is told.

Each function returns the `Invocation` of one MaxText entry point (or one of our own child
modules that drive MaxText's code): the module; MaxText's own flags, its config file first
(so every run, a `--dry-run` included, reads the config the entry point documents); the
`Setup` stages/in_maxtext/main.py does before running it; and, for our own child modules,
their typed request (stages/shared/contract.py: the contract both processes import). The
stages only choose paths; every param that reaches MaxText's process passes through here, and
so does every decision about it derived from params (LoRA or not, which checkpoint is the
reference). Where the work runs (CPU or TPU, how many hosts) is hardware.py's to say;
MaxText's environment is maxtext_process.py's (job_env), a multi-host job's launch is
launch.py's.

    python -m stages.train --dry-run      # prints one of these, validated by MaxText
"""

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field

from stages.lib import hardware, paths
from stages.lib.params import HardwareParams, Params
from stages.shared import contract, families
from stages.shared.contract import TO_HUGGINGFACE, TO_MAXTEXT, TRAIN_COMPILE, TRAIN_DPO, TRAIN_SFT

# The config file each entry point documents; our own child modules use SFT's, since they
# run SFT's input pipeline or load what SFT trained.
CONFIG_FILES = {
    TO_MAXTEXT: "base.yml",
    TO_HUGGINGFACE: "base.yml",
    TRAIN_COMPILE: "base.yml",
    TRAIN_SFT: "post_train/sft.yml",
    TRAIN_DPO: "post_train/dpo.yml",
}


@dataclass(frozen=True)
class Invocation:
    """One MaxText process: `python -m stages.in_maxtext.main <module> --setup ... [--request
    ...] -- <args>` (stages/lib/maxtext_process.py: command)."""

    module: str  # one of MaxText's entry points, or our own child module (contract.OURS)
    args: list[str]  # MaxText's own flags, its config file first
    setup: contract.Setup  # what the wrapper does first
    request: object | None = None  # our child module's typed request (its REQUEST type)
    env: dict[str, str] = field(default_factory=dict)  # on top of maxtext_process.child_env


@dataclass(frozen=True)
class Staged:
    """A multi-host job's inputs, where every host reads them (stages/lib/train_data.py)."""

    parameters: str  # gs://...: the parameters the run starts from (base or SFT), read by Orbax
    tokenizer: str  # each worker's copy of the tokenizer files ...
    eval_file: str  # ... and of the eval split (transformers and datasets read local files)
    fetch: dict[str, str]  # {gs:// directory: the worker-local copy}, made before MaxText starts


def setup(params: dict, **what) -> contract.Setup:
    """The wrapper's Setup for a job of this recipe's model (`what`: the rest of it)."""
    return contract.Setup(model_name=params["model"]["maxtext_name"], **what)


def config_file(module: str, portable: bool = False) -> str:
    """Path of MaxText's config file for an entry point (found without importing MaxText);
    `portable`: as `maxtext:<path in the package>`, which the worker that runs it resolves
    in its own install (stages/in_maxtext/main.py)."""
    name = os.path.join("configs", CONFIG_FILES.get(module, CONFIG_FILES[TRAIN_SFT]))
    if portable:
        return f"maxtext:{name}"
    return os.path.join(importlib.util.find_spec("maxtext").submodule_search_locations[0], name)


def _bool(value: bool) -> str:
    return str(value).lower()


def _abs(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def placed_on_cpu(params: dict) -> dict:
    """The same params with the work placed on this machine's CPU, in one process (compiling
    for a TPU topology, or replaying the input pipeline, needs no TPU)."""
    on_cpu = {"kind": "cpu", "hosts": 1, "tpu_env": None}
    if isinstance(params, Params):  # a copy that reads no section (keys_read stays the stage's own)
        return params.model_copy(update={"hardware": HardwareParams(**on_cpu).locate(None)})
    return {**params, "hardware": on_cpu}


def one_host(params: dict) -> dict:
    """Params for MaxText work that runs as one process on the machine running the stage (the
    conversions, the gates, evaluation). On a multi-host TPU slice that is worker 0's CPU, as
    the tutorial runs to_maxtext: left to its defaults, MaxText would join the slice's
    distributed job and wait for workers that never start. Likewise on a CPU machine that helps
    a single-host TPU run (runtime.check_hardware false and no chip here: the stages that need
    torch, docs/tpu-vm.md). Elsewhere, the recipe's hardware.
    (Decided by hardware.kind, which these stages declare, not hardware.hosts, which they do
    not: a TPU kind fixes its host count, params.py checks hardware.hosts agrees.)"""
    tpu = hardware.TPUS.get(params["hardware"]["kind"])
    helping = tpu and not params["runtime"]["check_hardware"] and hardware.tpu_chips_present() == 0
    return placed_on_cpu(params) if tpu and (tpu.hosts > 1 or helping) else params


def one_host_env(params: dict) -> dict[str, str]:
    """The environment one_host's placement needs: JAX kept off the slice's TPU runtime."""
    return {"JAX_PLATFORMS": "cpu"} if one_host(params) is not params else {}


def common(params: dict, processes: int = 1) -> list[str]:
    """What every entry point gets: the base checkpoint's architecture, the hardware, caches.
    `processes`: of the job (only training runs as several: stages/lib/launch.py)."""
    args = families.maxtext_model_args(paths.BASE_HF, params["model"]["maxtext_name"])
    args += [
        f"scan_layers={_bool(params['model']['scan_layers'])}",
        f"jax_cache_dir={_abs(params['runtime']['compile_cache_dir'])}",
    ]
    if hardware.on_cpu(params):
        args += ["hardware=cpu"]
    tpu = hardware.TPUS.get(params["hardware"]["kind"])
    if processes == 1 and (tpu is None or tpu.hosts == 1):
        # One process has no distributed runtime to join (a job of several does). On a one-host
        # TPU VM too: starting one needs a socket, which a VM cut off from the network refuses.
        # (Decided by hardware.kind, which every stage declares, as one_host is.)
        args += ["skip_jax_distributed_system=true"]
    return args


def checkpoint_storage(params: dict) -> list[str]:
    m = params["model"]
    return [
        f"checkpoint_storage_use_ocdbt={_bool(m['checkpoint_ocdbt'])}",
        f"checkpoint_storage_use_zarr3={_bool(m['checkpoint_zarr3'])}",
    ]


def data(
    params: dict, train_file: str | None = None, workers: int | None = None, staged: Staged | None = None
) -> list[str]:
    """How chat rows become token batches: shared by training, the resume replay and the
    evaluate stage, so that held-out loss is measured on exactly what training optimises.
    `workers`: grain's data processes (the batches are the same either way); training uses
    runtime.data_workers, the one-pass readers none (a worker costs ~10 s to start).
    `staged`: a multi-host job's inputs (train_file then names every host's stream)."""
    t = params["train"]
    workers = params["runtime"]["data_workers"] if workers is None else workers
    tokenizer = staged.tokenizer if staged else _abs(paths.BASE_HF)
    eval_file = staged.eval_file if staged else _abs(os.path.join(paths.DATA, "eval.jsonl"))
    return [
        f"tokenizer_path={tokenizer}",
        "hf_path=json",
        f"hf_train_files={train_file if staged else _abs(train_file or os.path.join(paths.DATA, 'train.jsonl'))}",
        "train_split=train",
        "train_data_columns=['messages']",
        f"hf_eval_files={eval_file}",
        "hf_eval_split=train",  # a JSON file's only split, whatever it is called upstream
        "eval_data_columns=['messages']",
        f"max_target_length={t['max_target_length']}",
        f"packing={_bool(t['packing'])}",
        f"sft_train_on_completion_only={_bool(t['completion_only_loss'])}",
        f"grain_worker_count={workers}",
        f"grain_worker_count_eval={workers}",
    ]


def served(params: dict) -> bool:
    """Whether training renders conversations as served (train.chat_rendering whole) rather
    than MaxText's own way: the one place this is decided."""
    return params["train"]["chat_rendering"] == "whole"


def lora_enabled(params: dict) -> bool:
    """Whether training trains a LoRA adapter: the one place this is decided."""
    return params["train"]["lora"]["enabled"]


def lora_shape(params: dict) -> list[str]:
    """The adapter's shape: rank, alpha, which modules (what reading one back needs too)."""
    lo = params["train"]["lora"]
    args = [f"lora.lora_rank={lo['rank']}", f"lora.lora_alpha={float(lo['alpha'])}"]
    return args + ([f"lora.lora_module_path={lo['module_path']}"] if lo["module_path"] else [])


def lora(params: dict) -> list[str]:
    """MaxText's LoRA flags for train.lora (none when it is off)."""
    return ["lora.enable_lora=true", *lora_shape(params)] if lora_enabled(params) else []


def convert_in(params: dict, out_dir: str) -> Invocation:
    return Invocation(
        TO_MAXTEXT,
        [
            config_file(TO_MAXTEXT),
            *common(one_host(params)),
            "use_multimodal=false",  # text SFT; the vision tower is carried over by convert_out
            f"base_output_directory={_abs(out_dir)}",
            "run_name=convert_in",
            *checkpoint_storage(params),
            f"--hf_model_path={paths.BASE_HF}",
            "--lazy_load_tensors=true",  # one tensor at a time: RAM stays ~1 GB + the largest tensor
            f"--save_dtype={params['convert_in']['save_dtype']}",
        ],
        setup(
            params,
            hf_config=paths.BASE_HF,
            hf_layout=families.detect_layout(paths.BASE_HF, params["model"]["maxtext_name"]),
        ),
        env=one_host_env(params),
    )


def conversion_check(params: dict, converted_dir: str, report: str, others: dict[str, str] | None = None) -> Invocation:
    """The conversion check (stages/in_maxtext/logit_check.py --conversion): MaxText on the converted
    parameters in converted_dir against transformers on the base checkpoint (and on `others`,
    {HF checkpoint: report}, the calibration's faulty copies)."""
    c = params["convert_in"]["check"]
    return Invocation(
        "stages.in_maxtext.logit_check",
        [
            config_file(TRAIN_SFT),
            *common(one_host(params)),
            f"load_parameters_path={_abs(paths.converted_params(converted_dir))}",
        ],
        setup(params),
        contract.LogitCheck(
            base=paths.BASE_HF,
            reports={paths.BASE_HF: report, **(others or {})},
            tie_margin=c["tie_margin"],
            conversion=True,
        ),
        env=one_host_env(params),
    )


def _training(params: dict, staged: Staged | None = None) -> list[str]:
    t = params["train"]
    return [
        f"load_parameters_path={staged.parameters if staged else _abs(paths.BASE_MAXTEXT_PARAMS)}",
        f"run_name={contract.SFT_RUN_NAME}",
        f"steps={t['steps']}",
        f"per_device_batch_size={t['per_device_batch_size']}",
        f"gradient_accumulation_steps={t['gradient_accumulation_steps']}",
        f"learning_rate={t['learning_rate']}",
        f"warmup_steps_fraction={t['warmup_steps_fraction']}",
        "enable_data_shuffling=false",  # the train stage writes the stream already shuffled ...
        "num_epoch=1",  # ... holding every epoch (stages/lib/stream.py)
        f"init_weights_seed={t['seed']}",
        f"remat_policy={t['remat_policy']}",
        *precision_and_kernel(params),
        *lora(params),
    ]


def precision_and_kernel(params: dict) -> list[str]:
    """The weights' dtype (and so the optimizer state's: MaxText's mu_dtype follows it) and the
    attention kernel, for every training of the model: SFT, preference, their fit check."""
    t = params["train"]
    return [f"weight_dtype={t['weight_dtype']}", f"attention={t['attention']}"]


def events_here(output_dir: str, metrics_file: str) -> dict:
    """Setup's events_dir for a run whose working directory is on gs://: its TensorBoard events
    beside its metrics file, on the machine (stages/in_maxtext/local_events.py says why)."""
    return {"events_dir": os.path.join(os.path.dirname(metrics_file), "tensorboard")} if "://" in output_dir else {}


def train(
    params: dict, output_dir: str, metrics_file: str, train_file: str, staged: Staged | None = None
) -> Invocation:
    """The training run; with `staged`, one every host of a multi-host job can run: its inputs
    on gs://, no path of this machine in it (stages/lib/launch.py)."""
    t = params["train"]
    args = [
        config_file(TRAIN_SFT, portable=staged is not None),
        *common(params, hardware.hosts(params)),
        *data(params, train_file, staged=staged),
        *_training(params, staged),
        f"base_output_directory={output_dir}",
        f"eval_interval={t['eval_interval'] or -1}",
        "eval_steps=-1",  # each evaluation covers the whole eval split
        f"checkpoint_period={t['checkpoint_period']}",
        f"metrics_file={metrics_file}",
        *checkpoint_storage(params),
        *profiler(params),
    ]
    return Invocation(
        TRAIN_SFT,
        args,
        setup(
            params,
            served_chat=served(params),
            fetch=staged.fetch if staged else {},
            **events_here(output_dir, metrics_file),
        ),
    )


def preference_data(p: dict, train_file: str | None = None, staged: Staged | None = None) -> list[str]:
    """How preference pairs become batches (the preference stage and evaluate's pair scores):
    MaxText's DPO pipeline on the two texts of data/preference (stages/preference_data.py).
    `p`: the preference settings (params' `preference`, or what the preference stage recorded
    beside the model it made: evaluate declares no preference params). `staged`: a multi-host
    job's inputs (train_file then names every host's stream)."""
    tokenizer = staged.tokenizer if staged else _abs(paths.BASE_HF)
    eval_file = staged.eval_file if staged else _abs(os.path.join(paths.PREFERENCE_DATA, "eval.jsonl"))
    train_file = train_file if staged else _abs(train_file or os.path.join(paths.PREFERENCE_DATA, "train.jsonl"))
    return [
        f"tokenizer_path={tokenizer}",
        "hf_path=json",
        f"hf_train_files={train_file}",
        "train_split=train",
        "train_data_columns=['chosen','rejected']",
        f"hf_eval_files={eval_file}",
        "hf_eval_split=train",
        "eval_data_columns=['chosen','rejected']",
        f"max_target_length={p['max_target_length']}",
        f"dpo.max_prompt_length={p['max_prompt_length']}",
        f"per_device_batch_size={p['per_device_batch_size']}",
        "grain_worker_count=0",  # no in-training evaluation: evaluate scores the held-out pairs
        "grain_worker_count_eval=0",
    ]


def preference_objective(params: dict) -> list[str]:
    """The preference loss: DPO against the SFT model, or ORPO (train_dpo's `dpo.*` flags)."""
    p = params["preference"]
    return [
        f"dpo.algo={p['algorithm']}",
        f"dpo.dpo_beta={p['beta']}",
        f"dpo.orpo_lambda={p['orpo_lambda']}",
        f"dpo.dpo_label_smoothing={p['label_smoothing']}",
    ]


def preference(
    params: dict, output_dir: str, metrics_file: str, train_file: str, staged: Staged | None = None
) -> Invocation:
    """The preference run: MaxText's train_dpo from the SFT parameters; with `staged`, one
    every host of a multi-host job can run (as train's). Its stream is written already
    shuffled, holding every epoch (as train's), so MaxText's shuffle is off and a resumed run
    continues it."""
    p = params["preference"]
    args = [
        config_file(TRAIN_DPO, portable=staged is not None),
        *common(params, hardware.hosts(params)),
        *preference_data(p, train_file, staged),
        *preference_objective(params),
        f"load_parameters_path={staged.parameters if staged else _abs(paths.SFT_PARAMS)}",
        f"run_name={contract.PREFERENCE_RUN_NAME}",
        *precision_and_kernel(params),
        f"steps={p['steps']}",
        f"gradient_accumulation_steps={p['gradient_accumulation_steps']}",
        f"learning_rate={p['learning_rate']}",
        f"warmup_steps_fraction={p['warmup_steps_fraction']}",
        "enable_data_shuffling=false",
        "num_epoch=1",
        f"base_output_directory={output_dir}",
        "eval_interval=-1",
        f"checkpoint_period={p['checkpoint_period']}",
        f"metrics_file={metrics_file}",
        *checkpoint_storage(params),
    ]
    return Invocation(
        TRAIN_DPO, args, setup(params, fetch=staged.fetch if staged else {}, **events_here(output_dir, metrics_file))
    )


def profiler(params: dict) -> list[str]:
    """MaxText's profiler (as the tutorial's `profiler=xplane`) for runtime.profile_steps steps
    after the first runtime.profile_skip_steps (the first step compiles); it writes the trace
    under the run's tensorboard/ directory, which the train stage copies to logs/profile/."""
    r = params["runtime"]
    if not r["profile_steps"]:
        return []
    return [
        "profiler=xplane",
        f"skip_first_n_steps_for_profiler={r['profile_skip_steps']}",
        f"profiler_steps={r['profile_steps']}",
    ]


def data_position(
    params: dict, output_dir: str, train_file: str, steps: int, report: str, streams: list[str] | None = None
) -> Invocation:
    """The resume replay (stages/in_maxtext/data_position.py): training's input pipeline, on CPU with
    as many simulated devices as one host of the recipe's accelerator has, so batches are the
    same; `streams`: each host's stream of a multi-host job, replayed one by one."""
    return Invocation(
        "stages.in_maxtext.data_position",
        _input_pipeline_on_cpu(params, train_file, output_dir),
        setup(params, served_chat=served(params)),
        contract.DataPosition(steps=steps, report=report, streams=streams or []),
        env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={hardware.devices_per_host(params)}"},
    )


def batches(params: dict, data_file: str, output_dir: str, rows: int, report: str) -> Invocation:
    """MaxText's training rows of `data_file` (stages/in_maxtext/batches.py): training's input
    pipeline and rendering, on this machine's CPU, one host's batches (tools/batches.py)."""
    return Invocation(
        "stages.in_maxtext.batches",
        _input_pipeline_on_cpu(params, data_file, output_dir),
        setup(params, served_chat=served(params)),
        contract.Batches(rows=rows, report=report),
    )


def _input_pipeline_on_cpu(params: dict, data_file: str, output_dir: str) -> list[str]:
    """MaxText's flags for training's input pipeline over `data_file`, run on this machine's CPU
    (the resume replay, tools.batches): training's config, data and batch flags, no data workers."""
    cpu = placed_on_cpu(params)
    return [
        config_file(TRAIN_SFT),
        *common(cpu),
        *data(cpu, data_file, workers=0),
        *_training(cpu),
        f"base_output_directory={output_dir}",
    ]


def count_tokens(params: dict, splits: dict[str, str]) -> Invocation:
    """Tokens per conversation of each {jsonl: output prefix} (stages/in_maxtext/count_tokens.py),
    with the tokenizer and rendering training uses."""
    request = contract.CountTokens(
        tokenizer=_abs(paths.BASE_HF),
        rendering=params["train"]["chat_rendering"],
        splits={_abs(jsonl): _abs(out) for jsonl, out in splits.items()},
    )
    return Invocation("stages.in_maxtext.count_tokens", [], setup(params), request)


def cast_params(params: dict, source: str, out: str) -> Invocation:
    """The final parameters rounded to train.save_dtype (stages/in_maxtext/cast_params.py)."""
    request = contract.CastParams(source=_abs(source), out=_abs(out), dtype=params["train"]["save_dtype"])
    return Invocation("stages.in_maxtext.cast_params", [], setup(params), request)


def merge_lora(params: dict, adapter: str, out: str) -> Invocation:
    lo = params["train"]["lora"]
    request = contract.MergeLora(
        base=_abs(paths.BASE_MAXTEXT_PARAMS), adapter=_abs(adapter), scale=lo["alpha"] / lo["rank"], out=_abs(out)
    )
    return Invocation("stages.in_maxtext.merge_lora", [], setup(params), request)


def _to_huggingface(params: dict) -> list[str]:
    return [
        config_file(TO_HUGGINGFACE),
        *common(one_host(params)),
        "use_multimodal=false",
        f"load_parameters_path={_abs(paths.tuned_params())}",
        "run_name=convert_out",
        # Convert in float32 and round once, at the end (export.assemble): MaxText's bf16
        # path rounds Gemma's 1+w norm scales before subtracting 1, four times coarser.
        "weight_dtype=float32",
        f"--hf_model_path={paths.BASE_HF}",
    ]  # tokenizer source: the base, not the Hub


def convert_out(params: dict, out_dir: str) -> Invocation:
    """MaxText's own to_huggingface, as by hand (the stage runs it inside export_job)."""
    return Invocation(
        TO_HUGGINGFACE,
        [*_to_huggingface(params), f"base_output_directory={_abs(out_dir)}"],
        setup(params, hf_config=paths.BASE_HF),
        env=one_host_env(params),
    )


def _export_check(params: dict, reports: dict[str, str]) -> contract.LogitCheck:
    """The export check of exports ({export directory: report}) of the trained parameters."""
    c = params["convert_out"]
    lora = {}
    if lora_enabled(params):
        lora = {"lora_base": _abs(paths.BASE_MAXTEXT_PARAMS), "lora_adapter": _abs(paths.SFT_LORA)}
    return contract.LogitCheck(
        base=paths.BASE_HF, reports=reports, tie_margin=c["check"]["tie_margin"], dtype=c["dtype"], **lora
    )


def _check_reference(params: dict) -> list[str]:
    return [
        config_file(TRAIN_SFT),
        *common(one_host(params)),
        f"load_parameters_path={_abs(paths.tuned_params())}",
        *(lora_shape(params) if lora_enabled(params) else []),
    ]


def export_check(params: dict, exports: dict[str, str]) -> Invocation:
    """The export check (stages/in_maxtext/logit_check.py) of existing exports ({export directory:
    report path}): against MaxText running the trained parameters rounded as the export rounds
    them; for a LoRA run also the merged parameters against the base with its adapter applied
    by MaxText, unmerged."""
    return Invocation(
        "stages.in_maxtext.logit_check",
        _check_reference(params),
        setup(params),
        _export_check(params, exports),
        env=one_host_env(params),
    )


def export_job(params: dict, out_dir: str, report: str) -> Invocation:
    """convert_out's work in one process (stages/in_maxtext/export_job.py): to_huggingface, the
    assembly into out_dir, the export check."""
    c = params["convert_out"]
    request = contract.ExportJob(
        out=_abs(out_dir),
        shard_bytes=c["shard_size_mb"] * 1024 * 1024,
        report=report,
        check=_export_check(params, {_abs(out_dir): report}),
        check_flags=_check_reference(params),
    )
    return Invocation(
        "stages.in_maxtext.export_job",
        _to_huggingface(params),
        setup(params, hf_config=paths.BASE_HF),
        request,
        env=one_host_env(params),
    )


def heldout(
    params: dict,
    report: str,
    checkpoints: dict[str, str],
    output_dir: str,
    pairs: dict[str, str] | None = None,
    preference: dict | None = None,
) -> Invocation:
    """The evaluate stage's child (stages/in_maxtext/heldout.py): held-out loss of each MaxText
    checkpoint, through training's data flags, on conversations rendered as served; with
    `pairs` ({name: checkpoint}, the first the reference) and the `preference` settings they
    were tuned with, their scores on the held-out preference pairs."""
    request = contract.HeldOut(report=report, checkpoints={name: _abs(p) for name, p in checkpoints.items()})
    if pairs:
        weight = preference["beta"] if preference["algorithm"] == "dpo" else preference["orpo_lambda"]
        request = dataclasses.replace(
            request,
            pairs={name: _abs(path) for name, path in pairs.items()},
            algorithm=preference["algorithm"],
            beta=weight,
            pairs_flags=[
                config_file(TRAIN_DPO),
                *common(one_host(params)),
                *preference_data(preference),
                f"base_output_directory={_abs(output_dir)}",
                "run_name=evaluate-pairs",
            ],
        )
    return Invocation(
        "stages.in_maxtext.heldout",
        [
            config_file(TRAIN_SFT),
            *common(one_host(params)),
            *data(params, workers=0),
            f"base_output_directory={_abs(output_dir)}",
            "run_name=evaluate",
            # Training's batches, so that the batch-averaged loss is the one training's
            # evaluation reports (stages/in_maxtext/heldout.py).
            f"per_device_batch_size={params['train']['per_device_batch_size']}",
        ],
        setup(params, served_chat=True),  # the held-out loss of conversations as served, whatever training did
        request,
        env=one_host_env(params),
    )


def engine(params: dict, workdir: str) -> list[str]:
    """MaxText's flags for its inference engine on the recipe's model (stages/in_maxtext/engine.py):
    MaxText's base config (its inference config's mesh does not fit base.yml's axes), the
    model's architecture, on this host; float32 on a CPU (what transformers computes there, so
    the backends compare), bfloat16 weights and activations on a chip (the checkpoints the chip
    trains are saved in bfloat16: nothing is lost, and decoding reads half the bytes). The
    engine's sizes (batch, prompt and answer lengths) are its request's."""
    placed = one_host(params)
    precision = ["dtype=float32", "weight_dtype=float32"] if hardware.on_cpu(placed) else ["weight_dtype=bfloat16"]
    return [
        config_file(TO_MAXTEXT),  # base.yml
        *common(placed),
        "use_multimodal=false",
        *precision,
        f"base_output_directory={_abs(workdir)}",
        "run_name=engine",
    ]


def engine_benchmark(params: dict, request: contract.EngineBenchmark, workdir: str) -> Invocation:
    """The benchmark stage's maxtext backend (stages/in_maxtext/engine_benchmark.py)."""
    return Invocation(
        "stages.in_maxtext.engine_benchmark",
        engine(params, workdir),
        setup(params),
        request,
        env=one_host_env(params),
    )


def engine_answers(params: dict, request: contract.EngineAnswers, workdir: str) -> Invocation:
    """tools.answers on MaxText's engine (stages/in_maxtext/engine_answers.py)."""
    return Invocation(
        "stages.in_maxtext.engine_answers",
        engine(params, workdir),
        setup(params),
        request,
        env=one_host_env(params),
    )


FIT_KEYS = (
    "per_device_batch_size",
    "gradient_accumulation_steps",
    "max_target_length",
    "remat_policy",
    "weight_dtype",
    "attention",
)


# An ahead-of-time compile's environment, on a machine with chips too: JAX sets
# TPU_SKIP_MDS_QUERY itself only where it finds no chips; on a TPU VM the compile must not wait
# on the metadata server or the slice's other workers either. No TPU is used, so it does not
# take libtpu's single-process lock: the check must work beside a training run holding the TPU
# (or a test process that loaded libtpu).
AHEAD_OF_TIME_ENV = {"TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1"}


def fit_check(params: dict, workdir: str, overrides: dict) -> Invocation:
    """MaxText's ahead-of-time compile of the train step for the recipe's TPU topology, run on
    this machine's CPU with libtpu (no TPU needed): LoRA's step (the adapters and their optimizer
    state alone trained) when train.lora is on."""
    # Only the keys the compile takes (each read is a declared param of the stage: fit_check's)
    t = {key: overrides[key] if key in overrides else params["train"][key] for key in FIT_KEYS}
    # SFT accumulates gradients in Tunix (sft.yml's use_tunix_gradient_accumulation), over the
    # trained parameters alone. MaxText's pre-training step, the one compiled here, accumulates
    # over every nnx.Param, the frozen base's too: for LoRA that is a base-sized gradient buffer
    # SFT never holds (the 4B on one v5e: 23.1 GiB of temporaries). LoRA's micro-step is compiled
    # instead; the adapters' accumulated gradients it leaves out are a few MiB.
    accumulation = 1 if lora_enabled(params) else t["gradient_accumulation_steps"]
    return Invocation(
        TRAIN_COMPILE,
        [
            config_file(TRAIN_COMPILE),
            *common(placed_on_cpu(params)),
            f"compile_topology={hardware.TPUS[params['hardware']['kind']].topology}",
            "compile_topology_num_slices=1",
            f"base_output_directory={workdir}",
            "run_name=fit_check",
            f"per_device_batch_size={t['per_device_batch_size']}",
            f"gradient_accumulation_steps={accumulation}",
            f"max_target_length={t['max_target_length']}",
            f"remat_policy={t['remat_policy']}",
            f"weight_dtype={t['weight_dtype']}",
            f"attention={t['attention']}",
            *lora(params),
        ],
        setup(params, lora_compile=lora_enabled(params)),
        env=AHEAD_OF_TIME_ENV,
    )
