"""Training's TensorBoard events on this machine's disk when its working directory is on gs://
(contract.Setup.events_dir; stages/lib/flags.py's events_here).

Tunix registers its TensorBoard backend as a listener of every `jax.monitoring` scalar, Orbax's
checkpoint I/O figures included, and tensorboardX writes an event file on gs:// by uploading
the whole file again, with a generation precondition, at each flush. When the bucket carries
out an upload but the answer is lost (GCS drops connections under load), the client's retry
meets its own write and fails with 412 Precondition Failed; raised inside Orbax's commit
callback, that took the checkpoint save, and the run, with it (measured through the suite's
flaky bucket: tests/test_multihost.py). Events on local disk cannot meet that. What the
pipeline keeps of the run's curves comes from MaxText's metrics file (DVCLive), not from them;
the profiler's traces (train.profile) still go to the working directory.
"""

import dataclasses


def install(events_dir: str) -> None:
    from tunix.sft import metrics_logger

    stock = metrics_logger.MetricsLoggerOptions.create_backends

    def create_backends(options):
        return stock(dataclasses.replace(options, log_dir=events_dir))

    metrics_logger.MetricsLoggerOptions.create_backends = create_backends
