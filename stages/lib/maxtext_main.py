"""Runs one of MaxText's entry points with the base checkpoint's own Hugging Face config.

MaxText's converters look the model up in a hard-coded table (`HF_MODEL_CONFIGS`, keyed by
`model_name`) and name tensors the way transformers holds them in memory. This wrapper, run
as the child process in place of `python -m <module>`, replaces that table entry with the
checkpoint's `config.json` and, for a checkpoint in the Hub's key layout, renames the
parameter mapping's Hugging Face names to match the file. Nothing of MaxText is edited: the
entry point then runs unmodified, as its own `__main__`.

    python -m stages.lib.maxtext_main maxtext.checkpoint_conversion.to_maxtext \
        --hf-config models/base-hf --hf-layout hub -- model_name=gemma3-4b ...
"""

import argparse
import runpy
import sys


def use_checkpoint_config(model_name: str, config_dir: str) -> None:
    import transformers
    from maxtext.checkpoint_conversion.utils import hf_model_configs

    # Both converters did `from ... import HF_MODEL_CONFIGS`: mutate the shared dict, don't rebind.
    hf_model_configs.HF_MODEL_CONFIGS[model_name] = transformers.AutoConfig.from_pretrained(config_dir)


def read_layout(model_name: str, layout: str) -> None:
    from maxtext.checkpoint_conversion.utils import param_mapping

    from stages.lib import gemma3

    stock = param_mapping.PARAM_MAPPING[model_name]
    src, dst = gemma3.TRANSFORMERS_PREFIX, gemma3.LAYOUTS[layout]

    def mapping_in_checkpoint_names(*args, **kwargs):
        mapping = stock(*args, **kwargs)
        return {
            mt: [gemma3.rename(n, src, dst) for n in hf] if isinstance(hf, list) else gemma3.rename(hf, src, dst)
            for mt, hf in mapping.items()
        }

    param_mapping.PARAM_MAPPING[model_name] = mapping_in_checkpoint_names


def main() -> None:
    if "--" not in sys.argv:
        sys.exit("usage: python -m stages.lib.maxtext_main MODULE [--hf-config DIR] [--hf-layout L] -- ARGS...")
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("module")
    parser.add_argument("--hf-config", help="HF checkpoint directory whose config.json replaces MaxText's table entry")
    parser.add_argument("--hf-layout", default="transformers", help="tensor-name layout of the HF checkpoint read")
    parser.add_argument("--validate-only", action="store_true", help="only run MaxText's config validation on ARGS")
    ours = parser.parse_args(sys.argv[1:split])
    maxtext_args = sys.argv[split + 1 :]
    model_name = next((a.split("=", 1)[1] for a in maxtext_args if a.startswith("model_name=")), None)

    if ours.validate_only:
        from maxtext.configs import pyconfig

        # The converters' own flags (--hf_model_path, ...) are not MaxText config keys, and
        # validating must not try to join a TPU cluster.
        keys = [a for a in maxtext_args if not a.startswith(("--", "skip_jax_distributed_system="))]
        pyconfig.initialize_pydantic([ours.module] + keys + ["skip_jax_distributed_system=true"])
        print(f"MaxText accepted the configuration for {ours.module}")
        return
    if ours.hf_config:
        use_checkpoint_config(model_name, ours.hf_config)
    if ours.hf_layout != "transformers":
        read_layout(model_name, ours.hf_layout)
    sys.argv = [ours.module] + maxtext_args
    runpy.run_module(ours.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
