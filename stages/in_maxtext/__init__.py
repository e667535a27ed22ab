"""Modules that run inside MaxText's process, never in a stage's own.

A stage starts `python -m stages.in_maxtext.main <module> ... -- <MaxText flags>` (built by
stages/lib/flags.py, started by stages/lib/maxtext_process.py): main.py gives MaxText the base
checkpoint's own config, then runs <module> as `__main__` with MaxText, JAX and transformers
loaded. <module> is one of MaxText's entry points (to_maxtext, train_sft, to_huggingface,
train_compile) or one of these, which use MaxText's code directly:

  count_tokens      token_lengths stage: tokens per conversation, with training's tokenisation
  logit_check       convert_in's conversion check and convert_out's export check: the logits of
                    MaxText and transformers on fixed prompts (figures: stages/shared/logits.py;
                    the verdict: stages/lib/gates/logit.py)
  export_job        convert_out's work in one process: to_huggingface, assemble_export, logit_check
  assemble_export   MaxText's HF export made a drop-in replacement for the base checkpoint
  data_position     train, resuming: where the killed run's data stream stopped
  merge_lora        train, LoRA: the adapter merged into full weights
  heldout           evaluate stage: held-out loss of each checkpoint, held-out pair scores

Each reports to the stage through files (a JSON report, the checkpoint it writes), never by
import: the stage process stays free of JAX and MaxText.
"""
