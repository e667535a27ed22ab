"""Moves pipeline outputs to and from the DVC remote, and explains failures in one line.

    python -m tools.remote push                  # every output, plus the run-cache
    python -m tools.remote pull models/sft-hf    # only the fine-tuned weights
    python -m tools.remote pull                  # everything dvc.lock names
    python -m tools.remote status                # what the remote lacks

Plain `dvc push` / `dvc pull` work as well; this adds what they lack when a transfer of a
multi-GB checkpoint goes wrong. The bucket and credentials are checked first, so a missing
bucket or an unusable key fails in a second with one line instead of after minutes of
retries. The storage library's retry tracebacks go to logs/remote.log, not the terminal.
A failed transfer ends with a line naming the remote and what to run next (re-running is
always safe: DVC sends or fetches only what is missing, and a killed push leaves no partial
object in the bucket). `push` includes `--run-cache`, so another machine's
`dvc repro --pull --allow-missing` skips every stage computed here.
"""

import logging
import os
import socket
import sys
from urllib.parse import urlsplit

from stages.lib.cli import StageFailed, UserError, run

LOG = os.path.join("logs", "remote.log")
CONNECTION_TROUBLE = ("Cannot connect to host", "Connect call failed", "ServerDisconnected", "Connection reset",
                      "ClientConnectorError", "TimeoutError", "out of retries")


def default_remote(repo) -> tuple[str, dict]:
    name = repo.config["core"].get("remote")
    if not name:
        raise UserError("no default DVC remote; add one: dvc remote add -d NAME URL")
    return name, repo.config["remote"][name]


def check_gcs(name: str, config: dict, fs_args: dict) -> None:
    """Bucket and credentials, in a second, before DVC starts its transfers."""
    import gcsfs

    url = config["url"]
    bucket = urlsplit(url).netloc
    endpoint = config.get("endpointurl") or "https://storage.googleapis.com"
    host = urlsplit(endpoint)
    try:  # gcsfs retries a refused connection for about a minute; answer at once instead
        socket.create_connection((host.hostname, host.port or (443 if host.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        raise UserError(f"remote '{name}' ({url}): cannot reach {endpoint} ({e.strerror or e}); check the network, then run this again") from None
    try:
        fs = gcsfs.GCSFileSystem(**fs_args)
        exists = fs.exists(bucket)
    except Exception as e:  # noqa: BLE001 - credential failures come in many types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"remote '{name}' ({url}): credentials rejected or unusable ({first}); run "
            "`gcloud auth application-default login` (or fix `credentialpath`: dvc remote modify --local "
            f"{name} credentialpath KEY.json)"
        ) from None
    if not exists:
        raise UserError(
            f"remote '{name}' ({url}): bucket {bucket} does not exist or is not visible to these credentials; create it "
            f"(gcloud storage buckets create gs://{bucket}) or set the right one: dvc remote modify --local {name} url gs://BUCKET/dvc"
        )


def quiet_storage_logs() -> None:
    """The storage libraries log every retry with a traceback; keep those in the log file."""
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    handler = logging.FileHandler(LOG, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("gcsfs", "google", "aiohttp", "fsspec", "urllib3", "asyncio"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False


def explain_failure(command: str, name: str, url: str) -> StageFailed:
    with open(LOG, errors="replace") as f:
        log = f.read()
    again = f"python -m tools.remote {command}"
    if any(marker in log for marker in CONNECTION_TROUBLE):
        return StageFailed(
            f"lost the connection to remote '{name}' ({url}) during {command}; what was transferred is kept and "
            f"will not be sent again. When it is reachable, run: {again}  (details: {LOG})"
        )
    return StageFailed(f"{command} with remote '{name}' ({url}) failed (details above and in {LOG}); fix that, then run: {again}")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("push", "pull", "status"):
        raise UserError("usage: python -m tools.remote push|pull|status [TARGETS...]")
    command, targets = sys.argv[1], sys.argv[2:]
    from dvc.cli import main as dvc_main
    from dvc.repo import Repo

    with Repo() as repo:
        name, config = default_remote(repo)
        if config["url"].startswith("gs://"):
            check_gcs(name, config, repo.cloud.get_remote(name).fs.fs_args)
        elif "://" not in config["url"]:  # a local directory (the demo's remote)
            os.makedirs(config["url"], exist_ok=True)
    quiet_storage_logs()
    args = {"push": ["push", "--run-cache"], "pull": ["pull"], "status": ["status", "--cloud"]}[command]
    if dvc_main(args + targets) != 0:
        raise explain_failure(command, name, config["url"])


if __name__ == "__main__":
    run(main, "remote")
