"""What a training stage (train, preference) hands MaxText to read: its data stream
(stages/lib/stream.py), continued after a resume, and, for a job of several hosts, every input
staged on gs:// where each host reads it.

One host: MaxText reads the stream, the tokenizer and the eval split from this machine's disk.

Several hosts (hardware.hosts > 1): nothing a host reads may come from one machine's disk.
Staged where stages/lib/workdir.py's scratch layout puts them:
  shared input <checkpoint>-<key>/       the parameters the run starts from (JobInputs: the
                                         converted base for train, the SFT model for
                                         preference), read by Orbax
  shared input files-<key>/              the tokenizer files and the data's eval.jsonl
  the run's from-step-<N>/host-<i>.jsonl each host's stream from step N on
The two shared ones are keyed by their content (what made them), so they are uploaded once
for every run on the same inputs; each upload is complete only with its .complete
marker, so one cut short is uploaded again. Each worker copies the small ones (tokenizer,
eval split, the streams) to the run's worker_copies before MaxText starts (stages.in_maxtext.main --fetch:
transformers and MaxText's JSON reader take local files); Orbax reads the checkpoint from
gs:// itself.
"""

import hashlib
import json
import os
from dataclasses import dataclass

import fsspec

from stages.lib import flags, hardware, launch, long_rows, maxtext_process, paths, stream, workdir
from stages.shared.errors import UserError

TOKENIZER_SKIP = (".safetensors", ".safetensors.index.json", ".bin", ".pth")  # weights: not the tokenizer's


@dataclass(frozen=True)
class JobInputs:
    """What every host of a stage's job reads besides its own stream."""

    stage: str  # the stage (its declared deps identify the inputs: workdir.input_hashes)
    checkpoint: str  # the dependency holding the parameters the run starts from ...
    parameters: str  # ... and those parameters (Orbax) in it
    data: str  # the dependency whose eval.jsonl goes with the tokenizer
    what: str  # the parameters, in words


SFT = JobInputs("train", paths.BASE_MAXTEXT, paths.BASE_MAXTEXT_PARAMS, paths.DATA, "the base checkpoint")
PREFERENCE = JobInputs("preference", paths.SFT_MAXTEXT, paths.SFT_PARAMS, paths.PREFERENCE_DATA, "the SFT model")


def check_enough_data(params: dict, rows: long_rows.Fitted) -> None:
    """Fails in one line, before MaxText starts, where train.steps asks for more batches than
    train.num_epochs epochs of the rows feed (MaxText would stop short, maybe an hour in)."""
    t = params["train"]
    fed = stream.steps_fed(params, rows.lengths)
    if t["steps"] > fed:
        raise UserError(
            f"train.steps: {t['num_epochs']} epoch(s) of the {len(rows.lengths)} training conversations feed "
            f"{fed} steps (packed as MaxText packs them into rows of {t['max_target_length']} tokens), not "
            f"{t['steps']}; lower train.steps or raise train.num_epochs"
        )


def stream_names(params: dict, work: workdir.Workdir) -> list[str]:
    """Where each host's stream from step 0 is written: one file for one process on this
    machine, else one a host, in the layout `stage` uploads (a single-host v6e-8 on XPK too)."""
    return resumed_names(params, work, 0)


def resumed_names(params: dict, work: workdir.Workdir, step: int) -> list[str]:
    """Where each host's stream from step `step` on is written."""
    if launch.one_process(params):
        return [os.path.join(work.local, "stream.jsonl" if step == 0 else f"stream-from-step-{step}.jsonl")]
    hosts = hardware.hosts(params)
    return [os.path.join(work.local, f"from-step-{step}", f"host-{i:03d}.jsonl") for i in range(hosts)]


def write_streams(
    params: dict, work: workdir.Workdir, source: str, seed: int, epochs: int, packing=lambda: None
) -> list[str]:
    """Each host's stream of `source` from step 0, shuffled per epoch (train and preference):
    written once per working directory, the missing ones only. `packing`: makes the
    stream.Packing to arrange them for MaxText's packer, or None; called only if one is missing."""
    out, hosts = stream_names(params, work), hardware.hosts(params)
    missing = [i for i, path in enumerate(out) if not os.path.exists(path)]
    if missing:
        arranged = packing()
        for i in missing:
            os.makedirs(os.path.dirname(out[i]), exist_ok=True)
            stream.write(source, out[i], seed, epochs, arranged, hosts, i)
    return out


def continue_streams(params: dict, work: workdir.Workdir, step: int, full: list[str], used: list[int]):
    """After a resume at `step`: each host's stream past the `used` rows its steps took. Returns
    the streams' names and the rows left in them."""
    resumed, left = resumed_names(params, work, step), 0
    for source, rows, out in zip(full, used, resumed, strict=True):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        left += stream.skip(source, rows, out)
    return resumed, left


def full_streams(params: dict, work: workdir.Workdir, rows: long_rows.Fitted) -> list[str]:
    """Each host's stream of the training rows from step 0, arranged for MaxText's packer."""
    t = params["train"]
    return write_streams(
        params, work, rows.rows, t["seed"], t["num_epochs"], lambda: stream.packing_for(params, rows.lengths)
    )


def streams_from(params: dict, work: workdir.Workdir, step: int, rows: long_rows.Fitted) -> list[str]:
    """The streams MaxText reads: from their start, or after the rows `step` finished steps used."""
    full = full_streams(params, work, rows)
    if step == 0:
        return full
    report = f"position-{step}.json"  # computed once per resume point, kept beside the checkpoints
    work.restore(report)
    if not os.path.exists(os.path.join(work.local, report)):
        replay = flags.data_position(
            params, work.url, full[0], step, os.path.join(work.local, report), streams=full if len(full) > 1 else None
        )
        maxtext_process.run("train.data_position", replay, params)
        work.save(report)
    with open(os.path.join(work.local, report)) as f:
        consumed = json.load(f)["rows"]
    consumed = consumed if isinstance(consumed, list) else [consumed]
    resumed, _ = continue_streams(params, work, step, full, consumed)
    print(
        f"train: resuming at step {step}: the data stream continues after the {sum(consumed)} conversations "
        "those steps trained on",
        flush=True,
    )
    return resumed


def key(value) -> str:
    """A short name for what made an input (12 hex digits of its JSON)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def upload_once(local_dir: str, url: str, files: list[str] | None = None) -> bool:
    """Copies local_dir (or just `files` in it) to url, unless a complete copy is there; the
    .complete marker goes last. Returns whether anything was uploaded."""
    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(f"{root}/.complete"):
        return False
    if files is None:
        fs.put(local_dir.rstrip("/") + "/", root, recursive=True)
    else:
        for name in files:
            fs.put_file(os.path.join(local_dir, name), f"{root}/{name}")
    fs.pipe_file(f"{root}/.complete", b"")
    return True


def stage(
    params: dict, work: workdir.Workdir, streams: list[str], inputs: JobInputs, upload: bool = True
) -> tuple[str, flags.Staged]:
    """Uploads what every host reads (the module docstring; `upload` False: only names it, for
    --dry-run); returns hf_train_files as each worker sees it and the job's staged inputs."""
    made = work.inputs or workdir.input_hashes(params, inputs.stage)
    checkpoint_url = (
        workdir.shared_input(params, f"{os.path.basename(inputs.checkpoint)}-{key(made.get(inputs.checkpoint))}")
        + "/"
        + os.path.basename(inputs.parameters)
    )
    files_url = workdir.shared_input(params, f"files-{key([made.get(paths.BASE_HF), made.get(inputs.data)])}")
    from_step = os.path.dirname(streams[0])  # <work.local>/from-step-N
    streams_url = work.staged(os.path.basename(from_step))
    if upload:
        if upload_once(inputs.parameters, checkpoint_url):
            print(f"{inputs.stage}: staged {inputs.what} at {checkpoint_url}", flush=True)
        tokenizer = sorted(
            n
            for n in os.listdir(paths.BASE_HF)
            if not n.endswith(TOKENIZER_SKIP) and os.path.isfile(os.path.join(paths.BASE_HF, n))
        )
        staging = os.path.join(work.local, "files")  # hard links: one directory to upload from
        os.makedirs(staging, exist_ok=True)
        for source in [os.path.join(paths.BASE_HF, n) for n in tokenizer] + [os.path.join(inputs.data, "eval.jsonl")]:
            if not os.path.exists(os.path.join(staging, os.path.basename(source))):
                os.link(source, os.path.join(staging, os.path.basename(source)))
        upload_once(staging, files_url, [*tokenizer, "eval.jsonl"])
        upload_once(from_step, streams_url, [os.path.basename(s) for s in streams])

    # Where each worker copies them: relative to the project directory it runs in (on this
    # machine too, apart from what was staged from, so that every worker reads the same bytes).
    copies = work.worker_copies
    files_local, streams_local = os.path.join(copies, "files"), os.path.join(copies, os.path.basename(from_step))
    staged = flags.Staged(
        parameters=checkpoint_url,
        tokenizer=files_local,
        eval_file=os.path.join(files_local, "eval.jsonl"),
        fetch={files_url: files_local, streams_url: streams_local},
    )
    return os.path.join(streams_local, "host-*.jsonl"), staged


def invocation(
    build, params: dict, work: workdir.Workdir, streams: list[str], inputs: JobInputs, upload: bool = True
) -> flags.Invocation:
    """What MaxText runs for a training stage (`build`: flags.train or flags.preference): one
    process reading this machine's files, or what every host of a job runs, its inputs staged
    on gs:// (`stage`; `upload` False: only named, for --dry-run), its metrics file relative to
    the project directory each worker runs in."""
    if launch.one_process(params):
        return build(params, work.url, work.metrics_file, streams[0])
    train_file, staged = stage(params, work, streams, inputs, upload)
    return build(params, work.url, os.path.relpath(work.metrics_file), train_file, staged)
