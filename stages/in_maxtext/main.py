"""Runs one of MaxText's entry points with the base checkpoint's own Hugging Face config.

MaxText's converters look the model up in a hard-coded table (`HF_MODEL_CONFIGS`, keyed by
`model_name`) and name tensors the way transformers holds them in memory. This wrapper, run
as the child process in place of `python -m <module>`, replaces that table entry with the
checkpoint's `config.json` (in the form the family's tables read: stages/lib/families/) and,
for a checkpoint in another key layout (the Hub's, or text-only), renames the parameter
mapping's Hugging Face names to match the file. Nothing of MaxText is edited: the
entry point then runs unmodified, as its own `__main__`.

    python -m stages.in_maxtext.main maxtext.checkpoint_conversion.to_maxtext --model-name gemma3-4b \
        --hf-config models/base-hf --hf-layout hub -- .../maxtext/configs/base.yml model_name=gemma3-4b ...

On a worker of a multi-host job (stages/lib/launch.py) the command must not name paths of
the machine that built it: an argument `maxtext:<path>` is a file of the MaxText package
installed here (its config files), and `--fetch gs://.../tokenizer=<dir>` copies what MaxText
can only read from a local directory (the tokenizer) to <dir> first, once per worker.

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

    from stages.lib import families

    adapt = getattr(families.of(model_name), "converter_config", None)
    if adapt is None:
        return
    for table in (param_mapping.PARAM_MAPPING, param_mapping.HOOK_FNS, hf_shape.HF_SHAPE):
        stock = table[model_name]
        table[model_name] = lambda config, *args, _stock=stock, **kwargs: _stock(adapt(config), *args, **kwargs)


def read_layout(model_name: str, layout: str) -> None:
    from maxtext.checkpoint_conversion.utils import param_mapping

    from stages.lib import families
    from stages.lib.checkpoint import rename

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
    if "--" not in sys.argv:
        sys.exit(
            "usage: python -m stages.in_maxtext.main MODULE [--model-name M --hf-config DIR] [--hf-layout L] -- ARGS..."
        )
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("module")
    parser.add_argument(
        "--model-name", help="MaxText's model_name, whose table entries --hf-config/--hf-layout replace"
    )
    parser.add_argument("--hf-config", help="HF checkpoint directory whose config.json replaces MaxText's table entry")
    parser.add_argument("--hf-layout", default="transformers", help="tensor-name layout of the HF checkpoint read")
    parser.add_argument("--validate-only", action="store_true", help="only run MaxText's config validation on ARGS")
    parser.add_argument("--fetch", action="append", default=[], metavar="URL=DIR", help="copy URL to DIR first")
    parser.add_argument(
        "--served-chat", action="store_true", help="SFT data rendered as served (stages/in_maxtext/served_chat.py)"
    )
    ours = parser.parse_args(sys.argv[1:split])
    maxtext_args = [in_this_install(a) for a in sys.argv[split + 1 :]]
    for pair in ours.fetch:
        url, local = pair.split("=", 1)
        fetch(url, local)
    name = ours.model_name
    if (ours.hf_config or ours.hf_layout != "transformers") and not name:
        parser.error("--hf-config and --hf-layout need --model-name")

    if ours.validate_only:
        from maxtext.configs import pyconfig

        # A module of ours (stages/in_maxtext/) takes its own options, then `--` and MaxText's.
        if "--" in maxtext_args:
            maxtext_args = maxtext_args[maxtext_args.index("--") + 1 :]
        # The converters' own flags (--hf_model_path, ...) are not MaxText config keys, and
        # validating must not try to join a TPU cluster.
        keys = [a for a in maxtext_args if not a.startswith(("--", "skip_jax_distributed_system="))]
        pyconfig.initialize_pydantic([ours.module] + keys + ["skip_jax_distributed_system=true"])
        config = keys[0].split(os.sep + "configs" + os.sep, 1)[-1] if keys and keys[0].endswith(".yml") else "base.yml"
        print(f"MaxText accepted the configuration for {ours.module} ({config})")
        return
    if ours.hf_config:
        use_checkpoint_config(name, ours.hf_config)
        tables_read_the_config(name)
    if ours.hf_layout != "transformers":
        read_layout(name, ours.hf_layout)
    if ours.served_chat:
        from stages.in_maxtext import served_chat

        served_chat.install()
    preload_imports(ours.module)
    sys.argv = [ours.module] + maxtext_args
    # alter_sys=False: this light module stays __main__, so the processes grain spawns for
    # data (they import the parent's __main__) start in ~10 s instead of ~25 s: they do not
    # import the whole trainer. (The config file is passed explicitly: MaxText need not
    # infer it from sys.argv[0].)
    runpy.run_module(ours.module, run_name="__main__", alter_sys=False)


if __name__ == "__main__":
    main()
