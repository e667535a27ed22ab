"""Commands for people, run by hand (not DVC stages): `python -m tools.<name>`.

python -m tools.recipe tiny        # switch params.yaml to another recipe (recipes/)
python -m tools.validate           # check params.yaml and the data without running anything
python -m tools.grid K=V1,V2 ...   # queue a grid of experiments
python -m tools.remote push|pull   # move outputs to and from the DVC remote
python -m tools.schema             # regenerate params.schema.json from stages/lib/params.py
python -m tools.summary            # the last run at a glance: data, loss, export check, times
python -m tools.publish REPO_ID    # upload models/sft-hf to the Hugging Face Hub with a model card
"""
