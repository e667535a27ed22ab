"""The pipeline's stages, one module each, run by DVC as `python -m stages.<name>` (dvc.yaml).

Their shared code is in stages/lib/; the commands people run by hand are in tools/.
"""
