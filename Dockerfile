# The image every pod of an XPK workload runs (runtime.launcher: xpk; docs/multi-host.md):
# this repository at /app with the TPU environment scripts/setup-tpu.sh installs (MaxText with
# jax[tpu] and libtpu, Tunix, DVC). Only code and environment: each pod reads its inputs from
# the gs:// scratch the train stage staged them to, and writes its checkpoints there.
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/REPO/maxtext-sft:TAG .
#   docker push REGION-docker.pkg.dev/PROJECT/REPO/maxtext-sft:TAG
#
# Not built in this project's CI (no TPU wheels' platform, no registry there).
FROM python:3.12-slim-bookworm

RUN apt-get update -q && apt-get install -y -q --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# The environment first, from what defines it only, so code changes reuse this layer.
COPY pyproject.toml ./
COPY requirements/ requirements/
COPY scripts/setup-tpu.sh scripts/setup-data.sh scripts/
RUN scripts/setup-tpu.sh
COPY . .
ENV PATH=/app/.venv/bin:$PATH
