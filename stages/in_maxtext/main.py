"""Runs one of MaxText's entry points with the base checkpoint's own Hugging Face config.

MaxText's converters look the model up in a hard-coded table (`HF_MODEL_CONFIGS`, keyed by
`model_name`) and name tensors the way transformers holds them in memory. This wrapper, run
as the child process in place of `python -m <module>`, replaces that table entry with the
checkpoint's `config.json` (in the form the family's tables read: stages/shared/families/) and,
for a checkpoint in another key layout (the Hub's, or text-only), renames the parameter
mapping's Hugging Face names to match the file. Nothing of MaxText is edited: the
entry point then runs unmodified, as its own `__main__`.

    python -m stages.in_maxtext.main maxtext.checkpoint_conversion.to_maxtext \
        --setup '{"model_name": "gemma3-4b", "hf_config": "models/base-hf", "hf_layout": "hub", ...}' \
        -- .../maxtext/configs/base.yml model_name=gemma3-4b ...

What to do is the job's `Setup` (stages/shared/contract.py), as JSON on the command line; our
own child modules (stages/in_maxtext/) get their typed request the same way, and run as
`run(request, maxtext_flags, setup)`. MaxText's own flags follow `--`, as MaxText takes them.

On a worker of a multi-host job (stages/lib/launch.py) the command must not name paths of
the machine that built it: an argument `maxtext:<path>` is a file of the MaxText package
installed here (its config files), and Setup.fetch copies what MaxText can only read from a
local directory (the tokenizer, the streams) from gs:// first, once per worker.

Before the entry point runs, its imports are loaded and then frozen out of the garbage
collector (`gc.freeze`): MaxText's converters call `gc.collect()` after every tensor, and
with JAX, torch and transformers loaded each full collection walks ~600,000 objects (0.4 s
on a 2-core machine), which was 40 s of a 70 s tiny-model export. Objects made later (the
weights) are collected as usual.
"""

import argparse
import ast
import gc
import importlib
import importlib.util
import os
import runpy
import sys

from stages.shared import contract


def use_checkpoint_config(model_name: str, config_dir: str) -> None:
    import transformers
    from maxtext.checkpoint_conversion.utils import hf_model_configs

    # Both converters did `from ... import HF_MODEL_CONFIGS`: mutate the shared dict, don't rebind.
    hf_model_configs.HF_MODEL_CONFIGS[model_name] = transformers.AutoConfig.from_pretrained(config_dir)


def tables_read_the_config(model_name: str) -> None:
    """MaxText's conversion tables get the config as the model family's converter expects it
    (`converter_config`: Gemma 3's tables index a text and a vision config, which a
    text-only checkpoint's config.json does not have)."""
    from maxtext.checkpoint_conversion.utils import hf_shape, param_mapping

    from stages.shared import families

    adapt = getattr(families.of(model_name), "converter_config", None)
    if adapt is None:
        return
    for table in (param_mapping.PARAM_MAPPING, param_mapping.HOOK_FNS, hf_shape.HF_SHAPE):
        stock = table[model_name]
        table[model_name] = lambda config, *args, _stock=stock, **kwargs: _stock(adapt(config), *args, **kwargs)


def read_layout(model_name: str, layout: str) -> None:
    from maxtext.checkpoint_conversion.utils import param_mapping

    from stages.shared import families
    from stages.shared.checkpoint import rename

    stock = param_mapping.PARAM_MAPPING[model_name]
    layouts = families.of(model_name).LAYOUTS
    src, dst = layouts["transformers"], layouts[layout]

    def mapping_in_checkpoint_names(*args, **kwargs):
        mapping = stock(*args, **kwargs)
        return {
            mt: [rename(n, src, dst) for n in hf] if isinstance(hf, list) else rename(hf, src, dst)
            for mt, hf in mapping.items()
        }

    param_mapping.PARAM_MAPPING[model_name] = mapping_in_checkpoint_names


def no_initial_checkpoint() -> None:
    """Orbax's checkpoint manager, given no save policy of its own, saves a fresh run's first
    step besides every `save_interval_steps` (its default policy holds an InitialSavePolicy),
    and MaxText's SFT and DPO trainers give it none: a whole checkpoint, parameters and optimizer
    state (~46.6 GB for the 4B recipe), written at step 1, which no resume needs and which
    doubled the 4B recipe's peak in /dev/shm. Options made here without a policy get Orbax's
    own default one less that save: every `save_interval_steps`, and on a preemption notice.
    (Tunix still saves the last step; a run killed before its first periodic checkpoint
    starts again from step 0, as it would have from step 1.)"""
    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_managers as policies

    class PeriodicOnly(ocp.CheckpointManagerOptions):
        def __post_init__(self):
            super().__post_init__()
            if self.save_decision_policy is None and self.should_save_fn is None and not self.save_on_steps:
                self.save_decision_policy = policies.AnySavePolicy(
                    [policies.FixedIntervalPolicy(self.save_interval_steps), policies.PreemptionCheckpointingPolicy()]
                )

    ocp.CheckpointManagerOptions = PeriodicOnly


def lora_in_the_compiled_step() -> None:
    """MaxText's ahead-of-time compile (train_compile) builds the pre-training model and, with
    lora.enable_lora, an optimizer over its LoRA parameters, but nothing adds those to the model
    (the SFT trainer does, with qwix: lora_utils.apply_lora_to_model), so the step it compiles
    would train nothing. Here the model it builds gets the adapters the way SFT's gets them, and
    the step compiled is LoRA's: the base frozen in weight_dtype, gradients and optimizer state
    for the adapters alone."""
    from flax import nnx
    from flax.core.spmd import logical_axis_rules
    from maxtext.utils import lora_utils, model_creation_utils

    stock = model_creation_utils.create_nnx_abstract_model

    def with_lora(config, mesh=None, *args, **kwargs):
        create, abstract = stock(config, mesh, *args, **kwargs)

        def create_with_lora():
            # No mesh: the adapters, replicated as SFT's are (their sharding metadata), are placed by
            # the compile; MaxText's own placement would ask a traced array for its sharding.
            with logical_axis_rules(config.logical_axis_rules):
                return lora_utils.apply_lora_to_model(create(), None, config)

        nnx.eval_shape(create_with_lora)  # the adapters' shapes, checked before the compile needs them
        return create_with_lora, abstract

    model_creation_utils.create_nnx_abstract_model = with_lora


def preload_imports(module: str) -> None:
    """Imports what `module` imports at its top level (not `module` itself: running it twice
    would define its absl flags twice), then freezes every object so far out of the GC."""
    spec = importlib.util.find_spec(module)
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the entry point's own import reports it properly
                pass
    gc.freeze()


PACKAGE_PREFIX = "maxtext:"


def in_this_install(arg: str) -> str:
    """`maxtext:configs/post_train/sft.yml` -> that file of the MaxText installed here."""
    if not arg.startswith(PACKAGE_PREFIX):
        return arg
    root = importlib.util.find_spec("maxtext").submodule_search_locations[0]
    return os.path.join(root, arg[len(PACKAGE_PREFIX) :])


def fetch(url: str, local: str) -> None:
    """Copies the directory at `url` (gs://) to `local`, unless an earlier run did; atomic:
    a copy cut short is never taken for a complete one."""
    import shutil

    import fsspec

    if os.path.exists(os.path.join(local, ".complete")):
        return
    fs, root = fsspec.core.url_to_fs(url)
    tmp = f"{local}.tmp-{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    fs.get(root.rstrip("/") + "/", tmp, recursive=True)
    open(os.path.join(tmp, ".complete"), "w").close()
    if os.path.exists(local) and not os.path.exists(os.path.join(local, ".complete")):
        shutil.rmtree(local)  # what a killed copy left
    try:
        os.rename(tmp, local)
    except OSError:  # another process of the job on this machine was first
        shutil.rmtree(tmp)


def main() -> None:
    split = sys.argv.index("--") if "--" in sys.argv else -1
    parser = argparse.ArgumentParser(
        usage="python -m stages.in_maxtext.main MODULE --setup JSON [--request JSON] [--validate-only] -- MAXTEXT_FLAGS"
    )
    parser.add_argument("module")
    parser.add_argument("--setup", required=True, help="a contract.Setup, as JSON (stages/shared/contract.py)")
    parser.add_argument("--request", help="our module's request, as JSON (its REQUEST type)")
    parser.add_argument(
        "--validate-only", action="store_true", help="only run MaxText's config validation on the flags"
    )
    if split < 0:
        parser.error("-- and MaxText's flags are required")
    ours = parser.parse_args(sys.argv[1:split])
    setup = contract.decode(ours.setup, contract.Setup)
    maxtext_flags = [in_this_install(a) for a in sys.argv[split + 1 :]]
    if ours.validate_only:
        validate(ours.module, maxtext_flags)
        return
    for url, local in setup.fetch.items():
        fetch(url, local)
    if setup.hf_config:
        use_checkpoint_config(setup.model_name, setup.hf_config)
        tables_read_the_config(setup.model_name)
    if setup.hf_layout != "transformers":
        read_layout(setup.model_name, setup.hf_layout)
    if setup.served_chat:
        from stages.in_maxtext import served_chat

        served_chat.install()
    if setup.events_dir:
        from stages.in_maxtext import local_events

        local_events.install(setup.events_dir)
    if setup.lora_compile:
        lora_in_the_compiled_step()
    if ours.module.startswith(contract.OURS):
        module = importlib.import_module(ours.module)
        gc.freeze()  # its imports are loaded (see the module docstring)
        sys.argv = [ours.module]  # what absl (grain's workers read its flags) takes for the program
        module.run(contract.decode(ours.request, module.REQUEST), maxtext_flags, setup)
        return
    preload_imports(ours.module)
    no_initial_checkpoint()
    sys.argv = [ours.module] + maxtext_flags
    # alter_sys=False: this light module stays __main__, so the processes grain spawns for
    # data (they import the parent's __main__) start in ~10 s instead of ~25 s: they do not
    # import the whole trainer. (The config file is passed explicitly: MaxText need not
    # infer it from sys.argv[0].)
    try:
        runpy.run_module(ours.module, run_name="__main__", alter_sys=False)
    finally:  # absl's app.run ends MaxText's entry points with SystemExit
        report_peak_memory()


def report_peak_memory() -> None:
    """The accelerator's peak memory in arrays over the run, which MaxText does not log: one
    line, the largest device's. On a TPU it counts the arrays the program holds (parameters,
    optimizer state, batches), not a compiled step's scratch: measured on a v5e chip, the 270M's
    figure stayed 3.12 GiB from batch 8 to 12 and with remat off, while the step's temporaries
    grow with both (docs/benchmarks.md, "On a TPU chip"). What the whole step needs is the
    compile's estimate, in MaxText's log and in the fit check. Nothing on a CPU, whose devices
    keep no such figure."""
    import jax

    try:
        stats = [d.memory_stats() or {} for d in jax.local_devices()]
    except Exception:  # noqa: BLE001 (a backend without the figure: nothing to say)
        return
    peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
    if peaks:
        limit = max(s.get("bytes_limit", 0) for s in stats)
        print(
            f"peak device memory: {max(peaks) / 2**30:.2f} GiB of {limit / 2**30:.2f} GiB in arrays "
            "(a compiled step's scratch not counted)",
            flush=True,
        )


def validate(module: str, maxtext_flags: list[str]) -> None:
    """MaxText's own config validation of the flags a job would run with (stage --dry-run)."""
    from maxtext.configs import pyconfig

    # The converters' own flags (--hf_model_path, ...) are not MaxText config keys, and
    # validating must not try to join a TPU cluster.
    keys = [a for a in maxtext_flags if not a.startswith(("--", "skip_jax_distributed_system="))]
    pyconfig.initialize_pydantic([module] + keys + ["skip_jax_distributed_system=true"])
    config = keys[0].split(os.sep + "configs" + os.sep, 1)[-1] if keys and keys[0].endswith(".yml") else "base.yml"
    print(f"MaxText accepted the configuration for {module} ({config})")


if __name__ == "__main__":
    main()
