"""What the stages share, on the parent's side: the `python -m stages.<name>` process DVC runs.
Code that runs inside MaxText's own process is in stages/in_maxtext/; what differs between
model families, in stages/shared/families/. Nothing here imports stages/in_maxtext/
(docs/layout.md draws the layers).

  how a stage runs    errors (UserError, StageFailed, Interrupted: a leaf), cli (run a stage,
                      one line per failure), params (params.yaml validated; keys read noted),
                      outputs (atomic writes, staged directories), paths (the artifacts),
                      dvc_yaml (what dvc.yaml declares)
  inputs              hub (the Hugging Face Hub), gguf_source (a GGUF dequantized), tiny (tiny
                      checkpoints), checkpoint (safetensors files, tensor names), chat (rows)
  running MaxText     flags (params -> MaxText's command lines), maxtext (one MaxText process:
                      log, progress, signals), launch (a job of one process per host),
                      hardware (where it runs: CPU or TPU, chips, disk)
  training            workdir (the run's working directory; the scratch layout), stream and
                      train_data (what MaxText reads), train_metrics (MaxText's metrics ->
                      DVCLive)
  the gates           gate (the conversion and export checks' verdict on their reports)
  judging the model   answers (both models' greedy answers, on the models the benchmark loads)
"""
