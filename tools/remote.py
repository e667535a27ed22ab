"""Moves pipeline outputs to and from the DVC remote, and explains failures in one line.

    python -m tools.remote push                  # every output, plus the run-cache
    python -m tools.remote pull models/sft-hf    # only the fine-tuned weights
    python -m tools.remote pull                  # everything dvc.lock names
    python -m tools.remote status                # what the remote lacks

Plain `dvc push` / `dvc pull` work as well; this adds what they lack when a transfer of a
multi-GB checkpoint goes wrong. The bucket and credentials are checked first, so a missing
bucket or an unusable key fails in a second with one line instead of after minutes of
retries. The storage library's retry tracebacks go to logs/remote.log, not the terminal.
A failed transfer ends with a line naming the remote and what to run next, at the latest a
minute after the remote stopped answering (re-running is always safe: DVC sends or fetches
only what is missing, and a killed push leaves no partial object in the bucket). `push`
includes `--run-cache` (DVC 3 sends its entries but not the uncached metrics files they
restore, so other machines still re-run stages with metrics;
docs/remote.md, "Getting the model out").

`pull` first hashes what this machine's DVC cache already holds of the outputs it is asked
for: DVC 3.67 checks out a cached object without hashing it again, so a byte changed on this
disk (the object's size and time kept) would be handed out as the output. A damaged object
is deleted, said in one line, and fetched again from the remote with the rest.
"""

import argparse
import hashlib
import io
import json
import logging
import os
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

import yaml

from stages.lib.cli import run
from stages.shared.errors import StageFailed, UserError

LOG = os.path.join("logs", "remote.log")
# How long the remote's endpoint may refuse connections before the transfer is given up.
# gcsfs retries each request for ~30 s, and DVC moves the run-cache file by file, so without
# this a push that lost its network would go on for half a minute per file still to send.
GIVE_UP_AFTER_S = 60
# Answers that mean "not now", not "not you": gcsfs retries them with backoff (6 tries, 1-16 s apart).
UNAVAILABLE = (408, 429, 500, 502, 503, 504)
RETRIES_S = 35
CONNECTION_TROUBLE = (
    "Cannot connect to host",
    "Connect call failed",
    "ServerDisconnected",
    "Connection reset",
    "ClientConnectorError",
    "TimeoutError",
    "out of retries",
)


def default_remote(repo) -> tuple[str, dict]:
    name = repo.config["core"].get("remote")
    if not name:
        raise UserError("no default DVC remote; add one: dvc remote add -d NAME URL")
    return name, repo.config["remote"][name]


def endpoint_of(config: dict) -> tuple[str, str, int]:
    """(endpoint URL, host, port) of a gs:// remote."""
    endpoint = config.get("endpointurl") or "https://storage.googleapis.com"
    host = urlsplit(endpoint)
    return endpoint, host.hostname, host.port or (443 if host.scheme == "https" else 80)


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


def give_up_when_unreachable(host: str, port: int, message: str) -> None:
    """A watchdog beside DVC's transfer: once the endpoint has refused connections for
    GIVE_UP_AFTER_S, print `message` and end the process (what was sent is kept; a re-run
    sends the rest). Shorter outages are left to the storage library's retries."""

    def watch() -> None:
        down_since = None
        while True:
            time.sleep(5)
            if reachable(host, port):
                down_since = None
                continue
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since >= GIVE_UP_AFTER_S:
                logging.shutdown()
                print(f"remote: failed: {message}", file=sys.stderr, flush=True)
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="remote-watchdog").start()


def check_gcs(name: str, config: dict, fs_args: dict) -> None:
    """Bucket and credentials, in a second, before DVC starts its transfers."""
    import gcsfs

    url = config["url"]
    bucket = urlsplit(url).netloc
    endpoint, host, port = endpoint_of(config)
    try:  # gcsfs retries a refused connection for about a minute; answer at once instead
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise UserError(
            f"remote '{name}' ({url}): cannot reach {endpoint} ({e.strerror or e}); check the network, then run this "
            "again"
        ) from None
    try:
        fs = gcsfs.GCSFileSystem(**fs_args)
        exists = fs.exists(bucket)
    except gcsfs.retry.HttpError as e:
        if e.code not in UNAVAILABLE:
            raise
        raise UserError(
            f"remote '{name}' ({url}): {endpoint} still answers {e.code} ({e.message}) after gcsfs's retries "
            f"(~{RETRIES_S} s): the service is down or overloaded; run this again later"
        ) from None
    except Exception as e:  # noqa: BLE001 - credential failures come in many types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"remote '{name}' ({url}): credentials rejected or unusable ({first}); run "
            "`gcloud auth application-default login` (or fix `credentialpath`: dvc remote modify --local "
            f"{name} credentialpath KEY.json)"
        ) from None
    if not exists:
        raise UserError(
            f"remote '{name}' ({url}): bucket {bucket} does not exist or is not visible to these credentials; "
            f"create it (gcloud storage buckets create gs://{bucket}) or set the right one: "
            f"dvc remote modify --local {name} url gs://BUCKET/dvc"
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


def lost_connection(command: str, name: str, url: str) -> str:
    return (
        f"lost the connection to remote '{name}' ({url}) during {command}; what was transferred is kept and "
        f"will not be sent again. When it is reachable, run: python -m tools.remote {command}  (details: {LOG})"
    )


class Said(io.TextIOBase):
    """Stands in for stderr while DVC runs: passes everything through and keeps the end of it,
    whose causes (DVC prints one line per failed file) explain a failure in one line."""

    def __init__(self, stream):
        self.stream, self.text = stream, ""

    def write(self, text: str) -> int:
        self.text = (self.text + text)[-65536:]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def out_of_disk(command: str, cache: str) -> str:
    from stages.lib.hardware import free_bytes

    return (
        f"{command} ran out of disk space in the DVC cache {cache} ({free_bytes(cache) / 1e9:.2f} GB free there now); "
        "nothing half-fetched is taken for an output (`dvc status` names what is missing). Free some space or "
        f"move the cache (dvc cache dir --local PATH), then run: python -m tools.remote {command}"
    )


def explain_failure(command: str, name: str, url: str, dvc_said: str = "", cache: str = "") -> StageFailed:
    with open(LOG, errors="replace") as f:
        log = f.read()
    if "No space left on device" in dvc_said + log:
        return StageFailed(out_of_disk(command, cache))
    if any(marker in log for marker in CONNECTION_TROUBLE):
        return StageFailed(lost_connection(command, name, url))
    return StageFailed(
        f"{command} with remote '{name}' ({url}) failed (details above and in {LOG}); fix that, "
        f"then run: python -m tools.remote {command}"
    )


def cached_objects(object_path, targets: list[str], lock_file: str = "dvc.lock") -> dict[str, dict[str, str]]:
    """{output path: {md5: its object in the local cache}}, the objects present, for the outputs
    dvc.lock records that `targets` name (a stage, an output, a path in or above one; every
    output when none): a directory's own listing and its files'. `object_path`: DVC's own
    (`repo.cache.local.oid_to_path`)."""
    if not os.path.exists(lock_file):
        return {}
    with open(lock_file) as f:
        stages = (yaml.safe_load(f) or {}).get("stages", {})

    def named(stage: str, path: str) -> bool:
        if not targets:
            return True
        for t in (t.rsplit(":", 1)[-1].rstrip("/") for t in targets):
            if t == stage or t == path or path.startswith(t + "/") or t.startswith(path + "/"):
                return True
        return False

    found = {}
    for stage, entry in stages.items():
        for out in entry.get("outs", []):
            if "md5" not in out or not named(stage, out["path"]):
                continue
            oids = [out["md5"]]
            listing = object_path(out["md5"])
            if out["md5"].endswith(".dir") and os.path.exists(listing):
                with open(listing) as f:
                    oids += [e["md5"] for e in json.load(f)]
            found[out["path"]] = {oid: object_path(oid) for oid in oids if os.path.exists(object_path(oid))}
    return found


def damaged(objects: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """The objects whose bytes no longer hash to their md5, by output."""

    def md5_of(path: str) -> str:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "md5").hexdigest()

    bad = {
        out: [p for oid, p in found.items() if md5_of(p) != oid.removesuffix(".dir")] for out, found in objects.items()
    }
    return {out: paths for out, paths in bad.items() if paths}


def repair_cache(objects: dict[str, dict[str, str]], cache: str) -> bool:
    """Deletes the damaged ones of `objects` (cached_objects'), saying so; whether any was."""
    bad = damaged(objects)
    for paths in bad.values():
        for path in paths:
            os.chmod(path, 0o644)  # (DVC keeps its objects read-only)
            os.unlink(path)
    if bad:
        count = sum(len(p) for p in bad.values())
        print(
            f"remote: {count} object(s) of {', '.join(sorted(bad))} in this machine's DVC cache ({cache}) no longer "
            "match their hash (changed on this disk); deleted, fetched again from the remote, and checked out anew",
            file=sys.stderr,
            flush=True,
        )
    return bool(bad)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.remote", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("push", "pull", "status"))
    parser.add_argument("targets", nargs="*", help="outputs or stages (default: everything dvc.lock names)")
    args = parser.parse_args()
    command, targets = args.command, args.targets
    said = sys.stderr = Said(sys.stderr)  # before DVC is imported: its log handlers keep the stream they find
    from dvc.cli import main as dvc_main
    from dvc.repo import Repo

    quiet_storage_logs()  # (before the check: gcsfs logs each retry it gives up on with a traceback)
    with Repo() as repo:
        name, config = default_remote(repo)
        if config["url"].startswith("gs://"):
            check_gcs(name, config, repo.cloud.get_remote(name).fs.fs_args)
            _, host, port = endpoint_of(config)
            give_up_when_unreachable(host, port, lost_connection(command, name, config["url"]))
        elif "://" not in config["url"]:  # a local directory (the demo's remote)
            os.makedirs(config["url"], exist_ok=True)
        cache = repo.cache.local_cache_dir
        ours = cached_objects(repo.cache.local.oid_to_path, targets) if command == "pull" else {}
    args = {"push": ["push", "--run-cache"], "pull": ["pull"], "status": ["status", "--cloud"]}[command]
    if repair_cache(ours, cache):
        args.append("--force")  # (a copy checked out from a damaged object is as wrong as the object)
    code = dvc_main(args + targets)
    if code != 0:
        raise explain_failure(command, name, config["url"], said.text, cache)


if __name__ == "__main__":
    run(main, "remote")
