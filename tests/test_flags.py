"""params -> MaxText command lines (stages/lib/flags.py), in-process, for the committed 4B
recipe on google/gemma-3-4b-it's real config and for the tiny recipe."""

import os
import shutil
from pathlib import Path

from stages.lib import flags, maxtext_process
from stages.lib.params import load
from stages.shared import contract
from testkit.workspace import REPO
from tools.recipe import params_text


def kv(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if "=" in a)


def test_every_invocation_reads_the_config_its_entry_point_documents(project_4b):
    p = project_4b
    for invocation, config in [
        (flags.convert_in(p, "out"), "configs/base.yml"),
        (flags.train(p, "gs://b/work", "/tmp/m.jsonl", "stream.jsonl"), "configs/post_train/sft.yml"),
        (flags.convert_out(p, "out"), "configs/base.yml"),
        (flags.fit_check(p, "/tmp/w", {}), "configs/base.yml"),
    ]:
        assert invocation.args[0].endswith(os.path.join("maxtext", config)), invocation.args[0]
        assert os.path.isfile(invocation.args[0])
    for ours in (
        flags.export_check(p, {"export": "r.json"}),
        flags.heldout(p, "r.json", {"base": "b"}, "/tmp/o"),
        flags.data_position(p, "/tmp/w", "s.jsonl", 20, "r.json"),
    ):
        assert ours.args[0].endswith(os.path.join("maxtext", "configs", "post_train", "sft.yml")), ours.module


def test_the_tutorials_values_reach_maxtext(project_4b):
    """What tests/test_tpu_recipe.py's dry runs then have MaxText itself validate."""
    train = kv(flags.train(project_4b, "gs://b/work", "/tmp/m.jsonl", "/data/stream.jsonl").args)
    assert {
        k: train[k]
        for k in (
            "model_name",
            "scan_layers",
            "steps",
            "per_device_batch_size",
            "max_target_length",
            "learning_rate",
            "packing",
            "sft_train_on_completion_only",
            "train_data_columns",
            "checkpoint_storage_use_ocdbt",
            "checkpoint_storage_use_zarr3",
            "grain_worker_count",
        )
    } == {
        "model_name": "gemma3-4b",
        "scan_layers": "true",
        "steps": "1000",
        "per_device_batch_size": "1",
        "max_target_length": "2048",
        "learning_rate": "2e-05",
        "packing": "true",
        "sft_train_on_completion_only": "true",
        "train_data_columns": "['messages']",
        "checkpoint_storage_use_ocdbt": "true",
        "checkpoint_storage_use_zarr3": "true",
        "grain_worker_count": "1",
    }
    assert train["base_output_directory"] == "gs://b/work" and train["hf_train_files"] == "/data/stream.jsonl"
    assert train["enable_data_shuffling"] == "false" and train["num_epoch"] == "1"  # the stream is the order
    # saves at steps 1 and 1000, as the tutorial does
    assert train["eval_interval"] == "250" and train["checkpoint_period"] == "1000"
    convert_in = flags.convert_in(project_4b, "out")
    assert {"--save_dtype=float32", "--lazy_load_tensors=true", "use_multimodal=false"} <= set(convert_in.args)
    assert kv(convert_in.args)["base_emb_dim"] == "2560" and kv(convert_in.args)["base_num_decoder_layers"] == "34"
    assert convert_in.setup.hf_layout == "hub" and convert_in.setup.hf_config == os.path.join("models", "base-hf")
    assert {"weight_dtype=float32", "use_multimodal=false"} <= set(flags.convert_out(project_4b, "out").args)


def test_a_tpu_recipe_runs_maxtext_on_the_tpu_but_compiles_and_replays_on_the_cpu(project_4b):
    p = project_4b
    assert "hardware=cpu" not in flags.train(p, "w", "m", "s").args
    # one process on one VM: no distributed runtime to start (a VM without network has no socket for it)
    assert "skip_jax_distributed_system=true" in flags.train(p, "w", "m", "s").args
    fit = flags.fit_check(p, "/tmp/w", {"per_device_batch_size": 4})
    assert "hardware=cpu" in fit.args and "compile_topology=v6e-8" in fit.args and "per_device_batch_size=4" in fit.args
    assert fit.env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    replay = flags.data_position(p, "/tmp/w", "s.jsonl", 20, "r.json")
    assert "hardware=cpu" in replay.args and (replay.request.steps, replay.request.report) == (20, "r.json")
    assert replay.env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"  # one simulated device per chip
    train_data = [
        a
        for a in flags.train(p, "w", "m", "s.jsonl").args
        if a.split("=")[0]
        in {
            "hf_train_files",
            "max_target_length",
            "packing",
            "sft_train_on_completion_only",
            "per_device_batch_size",
            "gradient_accumulation_steps",
            "tokenizer_path",
        }
    ]
    assert set(train_data) <= set(replay.args)  # the replay batches exactly as training does


def test_lora_is_decided_once_for_training_and_the_export_check(project_4b):
    p = project_4b
    assert not any(a.startswith("lora.") for a in flags.train(p, "w", "m", "s").args)
    assert kv(flags.export_check(p, {"e": "r"}).args)["load_parameters_path"].endswith(
        os.path.join("sft-maxtext", "params")
    )
    p["train"]["lora"]["enabled"] = True
    train = kv(flags.train(p, "w", "m", "s").args)
    assert (train["lora.enable_lora"], train["lora.lora_rank"], train["lora.lora_alpha"]) == ("true", "16", "32.0")
    assert "lora.lora_module_path" not in train  # "": MaxText's default for the model
    job = flags.export_check(p, {"e": "r"})
    check, ours = job.args, job.request
    assert ours.lora_base.endswith(os.path.join("base-maxtext", "0", "items"))  # base + adapter,
    assert ours.lora_adapter.endswith(os.path.join("sft-maxtext", "lora"))  # applied unmerged ...
    assert kv(check)["load_parameters_path"].endswith(os.path.join("sft-maxtext", "params"))  # ... against the merge
    assert kv(check)["lora.lora_rank"] == "16" and "lora.enable_lora=true" not in check
    merge = flags.merge_lora(p, "models/.tmp/lora", "models/.tmp/params")
    assert merge.request.scale == 2.0  # alpha / rank


def test_the_fit_check_compiles_the_step_sft_runs(project_4b):
    """SFT accumulates gradients in Tunix over what it trains; MaxText's compiled step would
    accumulate the frozen base's too, so LoRA's fit check compiles one micro-step."""
    p = project_4b
    p["train"]["gradient_accumulation_steps"] = 8
    full = kv(flags.fit_check(p, "w", {}).args)
    assert full["gradient_accumulation_steps"] == "8" and "lora.enable_lora" not in full
    p["train"]["lora"]["enabled"] = True
    lora = flags.fit_check(p, "w", {})
    assert kv(lora.args)["gradient_accumulation_steps"] == "1" and kv(lora.args)["lora.enable_lora"] == "true"
    assert lora.setup.lora_compile


def test_runtime_settings_reach_maxtext_without_being_results(project_4b, monkeypatch):
    p = project_4b
    args = kv(flags.train(p, "w", "m", "s").args)
    assert args["jax_cache_dir"] == os.path.expanduser("~/.cache/maxtext-sft/jax")
    p["runtime"]["compile_cache_dir"] = "gs://bucket/jax-cache"
    assert kv(flags.train(p, "w", "m", "s").args)["jax_cache_dir"] == "gs://bucket/jax-cache"
    p["runtime"]["compile_cache_dir"] = "relative/cache"
    assert kv(flags.convert_in(p, "o").args)["jax_cache_dir"] == str(Path("relative/cache").resolve())
    # The one-pass readers never start a grain worker, whatever training uses.
    for one_pass in (
        flags.heldout(p, "r", {"base": "b"}, "/tmp/o"),
        flags.data_position(p, "/tmp/w", "s", 20, "r"),
    ):
        assert kv(one_pass.args)["grain_worker_count"] == kv(one_pass.args)["grain_worker_count_eval"] == "0"


def test_the_tiny_recipe_runs_on_the_cpu(tiny_base, tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(params_text("tiny"))
    shutil.copytree(REPO / "assets", tmp_path / "assets")
    os.makedirs(tmp_path / "models")
    os.symlink(tiny_base, tmp_path / "models" / "base-hf")
    monkeypatch.chdir(tmp_path)
    p = load()
    for invocation in (flags.convert_in(p, "o"), flags.train(p, "w", "m", "s"), flags.convert_out(p, "o")):
        assert {"hardware=cpu", "skip_jax_distributed_system=true"} <= set(invocation.args)
        assert kv(invocation.args)["base_emb_dim"] == "128" and kv(invocation.args)["base_num_decoder_layers"] == "8"
    # runtime.data_workers (the tiny recipe: 0, grain in MaxText's own process); the one-pass
    # readers never start a worker.
    assert kv(flags.train(p, "w", "m", "s").args)["grain_worker_count"] == "0"
    p["runtime"]["data_workers"] = 1
    assert kv(flags.train(p, "w", "m", "s").args)["grain_worker_count"] == "1"
    assert kv(flags.data_position(p, "w", "s", 10, "r").args)["grain_worker_count"] == "0"

    # A job of two CPU processes joins JAX's distributed runtime: no skip flag, inputs staged
    # (stages/lib/train_data.py), no path of this machine.
    p["hardware"]["hosts"] = 2
    staged = flags.Staged(
        "gs://b/in/base/items",
        ".scratch/w/worker-inputs/files",
        ".scratch/w/worker-inputs/files/eval.jsonl",
        {"gs://b/in/files": ".scratch/w/worker-inputs/files"},
    )
    job = flags.train(
        p, "gs://b/work", ".scratch/w/metrics.jsonl", ".scratch/w/worker-inputs/from-step-0/host-*.jsonl", staged
    )
    args = kv(job.args)
    assert "skip_jax_distributed_system=true" not in job.args and "hardware=cpu" in job.args
    assert job.args[0] == "maxtext:configs/post_train/sft.yml"  # resolved by each worker in its own install
    assert (args["tokenizer_path"], args["load_parameters_path"], args["hf_eval_files"], args["hf_train_files"]) == (
        ".scratch/w/worker-inputs/files",
        "gs://b/in/base/items",
        ".scratch/w/worker-inputs/files/eval.jsonl",
        ".scratch/w/worker-inputs/from-step-0/host-*.jsonl",
    )
    assert job.setup.fetch == {"gs://b/in/files": ".scratch/w/worker-inputs/files"}  # copied first, on each worker
    command = maxtext_process.command(job)
    assert contract.decode(command[command.index("--setup") + 1], contract.Setup) == job.setup
    inputs = {
        k: v
        for k, v in args.items()
        if k
        in {
            "tokenizer_path",
            "load_parameters_path",
            "hf_train_files",
            "hf_eval_files",
            "base_output_directory",
            "metrics_file",
        }
    }
    assert not [v for v in inputs.values() if v.startswith("/") or str(tmp_path) in v]


def test_on_a_slice_the_one_process_work_runs_on_worker_0s_cpu_and_training_on_the_slice(project_4b):
    """Left to its defaults, MaxText on worker 0 of a v6e-16 joins the slice's distributed job
    and waits for workers that never start: the conversions, the gates and evaluation run as
    one process on its CPU (the tutorial's to_maxtext flags), training on every host."""
    p = project_4b
    p["hardware"].update(kind="v6e-16", hosts=4, tpu_env=None)
    one_process = {
        "convert_in": flags.convert_in(p, "out"),
        "conversion check": flags.conversion_check(p, "out", "r.json"),
        "convert_out": flags.export_job(p, "out", "r.json"),
        "export check": flags.export_check(p, {"out": "r.json"}),
        "evaluate": flags.heldout(p, "r.json", {"base": "b"}, "w"),
    }
    for name, invocation in one_process.items():
        assert {"hardware=cpu", "skip_jax_distributed_system=true"} <= set(invocation.args), name
        assert invocation.env["JAX_PLATFORMS"] == "cpu", name
    train = flags.train(p, "gs://b/w", "m", "s")
    assert "hardware=cpu" not in train.args and "skip_jax_distributed_system=true" not in train.args
    p["hardware"].update(kind="v6e-8", hosts=1)  # one VM: its own TPU, as before
    assert "hardware=cpu" not in flags.convert_in(p, "out").args and flags.convert_in(p, "out").env == {}


def test_a_request_crosses_to_maxtexts_process_with_its_mappings_in_order():
    """HeldOut's `pairs` names the reference model first: the JSON keeps that order."""
    request = contract.HeldOut(report="r.json", checkpoints={"z": "a"}, pairs={"sft": "s", "preference_tuned": "p"})
    again = contract.decode(contract.encode(request), contract.HeldOut)
    assert again == request and list(again.pairs) == ["sft", "preference_tuned"]


def test_one_v5e_chip_the_remat_policy_and_the_saved_dtype_reach_maxtext(project_4b, monkeypatch):
    """A v5litepod-1 (one chip): MaxText's train step on the chip in one process, with the
    recipe's remat policy, which the fit check compiles too; the final parameters cast to
    train.save_dtype by our module in MaxText's process."""
    p = project_4b
    p["hardware"].update(
        kind="v5litepod-1",
        tpu_env={**p["hardware"]["tpu_env"], "TPU_ACCELERATOR_TYPE": "v5litepod-1", "TPU_TOPOLOGY": "1x1"},
    )
    p["train"].update(remat_policy="minimal", save_dtype="bfloat16")
    train = flags.train(p, "w", "m", "s")
    assert "hardware=cpu" not in train.args and "skip_jax_distributed_system=true" in train.args
    assert kv(train.args)["remat_policy"] == "minimal"
    fit = kv(flags.fit_check(p, "/tmp/w", {}).args)
    assert (fit["compile_topology"], fit["remat_policy"]) == ("v5e-1", "minimal")
    cast = flags.cast_params(p, "out/params", "out/params.cast")
    assert cast.module == "stages.in_maxtext.cast_params" and cast.request.dtype == "bfloat16"
    assert os.path.isabs(cast.request.source) and cast.request.out.endswith("params.cast")


def test_a_cpu_machine_helping_a_one_chip_run_converts_on_its_cpu(project_4b, monkeypatch):
    """runtime.check_hardware false on a machine with no chip (the CPU side of a TPU VM's run:
    docs/tpu-vm.md): the conversions, gates and evaluation run on this CPU; the same recipe on
    its TPU VM (check_hardware true) keeps them on the chip."""
    from stages.lib import hardware

    p = project_4b
    monkeypatch.setattr(hardware, "tpu_chips_present", lambda: 0)
    p["runtime"]["check_hardware"] = False
    for invocation in (flags.convert_in(p, "out"), flags.export_check(p, {"out": "r.json"})):
        assert "hardware=cpu" in invocation.args and invocation.env["JAX_PLATFORMS"] == "cpu"
    assert "hardware=cpu" not in flags.train(p, "w", "m", "s").args  # training is the chip's, always
    p["runtime"]["check_hardware"] = True
    assert "hardware=cpu" not in flags.convert_in(p, "out").args
    monkeypatch.setattr(hardware, "tpu_chips_present", lambda: 8)
    p["runtime"]["check_hardware"] = False
    assert "hardware=cpu" not in flags.convert_in(p, "out").args  # the chips are here: used


def test_a_run_on_gs_writes_its_tensorboard_events_on_the_machine(project_4b, tmp_path):
    """Scratch on gs://: Tunix's TensorBoard events go beside the local metrics file, because
    tensorboardX's retried uploads to gs:// fail with 412 once a bucket drops an answer and took
    the checkpoint save with them (stages/in_maxtext/local_events.py). Scratch on this machine:
    MaxText's own place, in the working directory."""
    import subprocess
    import sys

    p = project_4b
    p["preference"]["enabled"] = True
    for build in (flags.train, flags.preference):
        on_gcs = build(p, "gs://bucket/scratch/train-x", "/work/.scratch/train-x/metrics.jsonl", "s")
        assert on_gcs.setup.events_dir == "/work/.scratch/train-x/tensorboard", build
        assert build(p, "/work/.scratch/train-x", "/work/.scratch/train-x/metrics.jsonl", "s").setup.events_dir is None
    # What main.py installs for it: Tunix's backends then write there, not to the gs:// log_dir
    # MaxText gives them (a subprocess: the patch is process-wide).
    events = tmp_path / "events"
    code = (
        "import sys; from stages.in_maxtext import local_events; from tunix.sft import metrics_logger;"
        "local_events.install(sys.argv[1]);"
        "[b.close() for b in metrics_logger.MetricsLoggerOptions(log_dir='gs://nowhere/tb/').create_backends()]"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(events)], cwd=REPO, check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    assert [f.name.startswith("events.out.tfevents.") for f in events.iterdir()] == [True]
