"""What both processes of a stage import: the stage's own (`python -m stages.<name>`, the parent)
and MaxText's (`python -m stages.in_maxtext.main`, the child). Nothing here imports stages/lib/
(the parent's side) or stages/in_maxtext/ (the child's), and nothing heavy at module level, so
either side takes what it needs and no more (tests/test_layout.py holds these rules).

  contract    the typed requests a stage hands each MaxText process: the one contract between them
  errors      UserError, StageFailed, Interrupted: imports nothing of ours
  families/   one module per model family; nothing else names a family
  checkpoint  safetensors files and tensor names (reading, renaming, writing shards)
  tiny        tiny checkpoints of a family's architecture, built offline
  rendering   a conversation as it is served, and which of its tokens training learns
  logits      how two sets of next-token logits compare (the logit gate's figures)
"""
