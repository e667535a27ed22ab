"""A local stand-in for the Hugging Face Hub HTTP API, for tests.

The pipeline fetches checkpoints with huggingface_hub (`get_hf_file_metadata`, `snapshot_download`)
and datasets with `datasets.load_dataset(..., streaming=True)`, which reads through HfFileSystem.
The real Hub is unreachable where the tests run, so this module serves repositories from a local
directory on 127.0.0.1 and the tests point the real libraries at it with
HF_ENDPOINT=http://127.0.0.1:<port>: the download code under test runs unchanged.

On disk, a repository revision is a directory of files (subdirectories allowed):

    <root>/models/<owner>/<name>/<40-hex commit sha>/<files...>
    <root>/datasets/<owner>/<name>/<40-hex commit sha>/<files...>

The revision `main` resolves to what `<repo>/refs/main` names (written by commits), else to the only,
or lexically last, commit sha of a repository.

Endpoints (<types> is `models` or `datasets`; other requests get a 404 and a logged warning):

    GET  /api/<types>/<owner>/<name>[/revision/<rev>]     repository info (sha, siblings, gated...)
    GET  /api/<types>/<owner>/<name>/tree/<rev>[/<dir>]   directory listing, `?recursive=true`
    POST /api/<types>/<owner>/<name>/paths-info/<rev>     entries for the form field(s) `paths`
    GET|HEAD /<owner>/<name>/resolve/<rev>/<file>          model file, Range requests honoured
    GET|HEAD /datasets/<owner>/<name>/resolve/<rev>/<file> dataset file, Range requests honoured

and, for uploads with huggingface_hub (`create_repo`, `create_commit`, `upload_folder`; its legacy
LFS transport, i.e. with HF_HUB_DISABLE_XET=1: the Xet protocol is not emulated):

    GET  /api/whoami-v2                                    the token's user, orgs and role
    POST /api/validate-yaml                                a model card's metadata block
    POST /api/repos/create                                 a repository (private or not)
    POST /api/<types>/<owner>/<name>/preupload/<rev>       upload mode (regular or lfs) and oid per file
    POST /<owner>/<name>.git/info/lfs/objects/batch        LFS batch API: where to PUT each object
    PUT  /lfs-objects/<sha256>                             an LFS object's content
    POST /api/<types>/<owner>/<name>/commit/<rev>          a commit (ndjson: header, file, lfsFile, deletedFile)

Writes need a token registered with `add_user` whose role is "write" and whose user (or one of its
orgs) owns the namespace. A private repository answers 404 to anyone else, as on the Hub.

Errors carry the `X-Error-Code` header that `huggingface_hub.utils.hf_raise_for_status` turns into
exceptions: RepoNotFound, RevisionNotFound, EntryNotFound and GatedRepo. A gated repository
(see `HubServer.add_repo`) protects its files only; its /api/ metadata stays readable, as on the Hub.
"""

import base64
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

logger = logging.getLogger(__name__)

REPO_TYPES = ("model", "dataset")
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# The Hub keeps files of 10 MB and more in Git LFS; their metadata differs (see _file_entry).
LFS_THRESHOLD = 10 * 1024 * 1024

# Groups are matched on the raw path and unquoted afterwards: huggingface_hub quotes revisions
# and tree paths with safe="", so a "/" inside them arrives as %2F.
_API_URL = re.compile(
    r"/api/(?P<types>models|datasets)/(?P<repo_id>[^/]+/[^/]+)"
    r"(?:/(?P<op>revision|tree|paths-info|preupload|commit)/(?P<rev>[^/]+)(?P<path>/.+)?)?"
)
_LFS_BATCH_URL = re.compile(r"(?:/(?P<types>datasets))?/(?P<repo_id>[^/]+/[^/]+)\.git/info/lfs/objects/batch")
_LFS_OBJECT_URL = re.compile(r"/lfs-objects/(?P<oid>[0-9a-f]{64})")
_POST_OPS = ("paths-info", "preupload", "commit")
_RESOLVE_URL = re.compile(r"(?:/(?P<types>datasets))?/(?P<repo_id>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # the request target as sent: path and query string
    authorized: bool  # whether an Authorization header was sent (its value is never kept)
    status: int


class HubError(Exception):
    """An error response, with the X-Error-Code that huggingface_hub maps to an exception."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _sha256(path: Path) -> str:
    stat = path.stat()
    return _digests(path, stat.st_mtime_ns, stat.st_size)[1]


@functools.lru_cache(maxsize=256)
def _digests(path: Path, mtime_ns: int, size: int) -> tuple[str, str]:
    """(git blob sha1, sha256) of a file; the stat fields in the key invalidate stale entries."""
    git_sha1 = hashlib.sha1(b"blob %d\0" % size)
    sha256 = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            git_sha1.update(chunk)
            sha256.update(chunk)
    return git_sha1.hexdigest(), sha256.hexdigest()


def _iso_date(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _file_entry(snapshot: Path, rel: str) -> dict:
    """A file's tree entry, as the Hub lists it.

    A file of LFS_THRESHOLD bytes or more is an LFS file: its git object is the LFS pointer, so "oid" is
    the pointer's blob sha1, and the content's sha256 is given under "lfs".
    """
    path = snapshot / rel
    stat = path.stat()
    blob_sha1, sha256 = _digests(path, stat.st_mtime_ns, stat.st_size)
    entry = {"type": "file", "path": rel, "size": stat.st_size, "oid": blob_sha1}
    if stat.st_size >= LFS_THRESHOLD:
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {stat.st_size}\n".encode()
        entry["oid"] = hashlib.sha1(b"blob %d\0%s" % (len(pointer), pointer)).hexdigest()
        entry["lfs"] = {"oid": sha256, "size": stat.st_size, "pointerSize": len(pointer)}
    return entry


def _entry(snapshot: Path, rel: str) -> dict:
    """Tree entry of the file or directory `rel` (which must exist) in a snapshot."""
    if (snapshot / rel).is_dir():
        # A stable stand-in for the git tree id, which clients only keep as an opaque sha1 string.
        tree_id = hashlib.sha1(f"{snapshot.name}:{rel}".encode()).hexdigest()
        return {"type": "directory", "path": rel, "size": 0, "oid": tree_id}
    return _file_entry(snapshot, rel)


def _within(base: Path, rel: str) -> Path | None:
    """base/rel if it exists and does not escape base (e.g. through "..")."""
    path = (base / rel).resolve()
    return path if path.exists() and path.is_relative_to(base.resolve()) else None


def _api_method(op: str | None) -> str:
    return "POST" if op in _POST_OPS else "GET"


@dataclass(frozen=True)
class User:
    name: str
    orgs: tuple[str, ...] = ()
    role: str = "write"  # or "read"

    def owns(self, namespace: str) -> bool:
        return namespace == self.name or namespace in self.orgs


def _unquoted(match: re.Match) -> dict[str, str]:
    return {key: unquote(value) for key, value in match.groupdict().items() if value is not None}


class HubServer:
    """Serves the repositories under `root` on 127.0.0.1; see the module docstring.

    Files are read from disk on every request, so repositories can be added or changed while the
    server runs. `requests` lists every request answered, in order (RecordedRequest); a request is
    recorded before its response is sent, so it is there once the client call returns.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.requests: list[RecordedRequest] = []
        self._gated: dict[tuple[str, str], frozenset[str]] = {}
        self._users: dict[str, User] = {}
        self.commits: list[tuple[str, str]] = []  # (repo_id, commit sha) of every commit made through the API
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def add_repo(
        self,
        repo_type: str,
        repo_id: str,
        revision: str,
        files: dict[str, bytes] | None = None,
        from_dir: str | Path | None = None,
        gated_tokens: set[str] | None = None,
    ) -> None:
        """Writes `files` ({path in repo: content}) and copies `from_dir` into a repo revision.

        `gated_tokens` gates the whole repository (all its revisions): only requests carrying
        `Authorization: Bearer <token>` with one of these tokens may read its files (checked before the
        revision, so a bad revision of a gated repo also answers 401/403 first). None: not gated.
        """
        if repo_type not in REPO_TYPES or not COMMIT_SHA.fullmatch(revision):
            raise ValueError(f"repo_type must be one of {REPO_TYPES} and revision a 40-hex commit sha")
        snapshot = self.root / f"{repo_type}s" / repo_id / revision
        snapshot.mkdir(parents=True, exist_ok=True)
        if from_dir is not None:
            shutil.copytree(from_dir, snapshot, dirs_exist_ok=True)
        for rel, content in (files or {}).items():
            (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
            (snapshot / rel).write_bytes(content)
        if gated_tokens is None:
            self._gated.pop((repo_type, repo_id), None)
        else:
            self._gated[(repo_type, repo_id)] = frozenset(gated_tokens)

    def add_user(self, token: str, name: str, orgs: tuple[str, ...] = (), role: str = "write") -> None:
        """A token the Hub knows: its user, the organisations the user belongs to, read or write."""
        self._users[token] = User(name, tuple(orgs), role)

    def start(self) -> str:
        """Serves in a daemon thread; returns the endpoint URL, the value for HF_ENDPOINT."""
        self._httpd = _Server(self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = self._thread = None

    def _is_gated(self, repo_type: str, repo_id: str) -> bool:
        return (repo_type, repo_id) in self._gated

    def _repo_dir(self, repo_type: str, repo_id: str, token: str | None = None) -> Path:
        repo = _within(self.root / f"{repo_type}s", repo_id)
        if repo is None or not repo.is_dir():
            raise HubError(404, "RepoNotFound", f"Repository not found: {repo_type} {repo_id}")
        user = self._users.get(token)
        if (repo / ".private").exists() and not (user and user.owns(repo_id.split("/")[0])):
            raise HubError(404, "RepoNotFound", f"Repository not found: {repo_type} {repo_id}")  # as on the Hub
        return repo

    def _writer(self, token: str | None, namespace: str) -> User:
        user = self._users.get(token)
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        if user.role != "write":
            raise HubError(403, None, f"You don't have the rights to write with this token (role: {user.role})")
        if not user.owns(namespace):
            raise HubError(403, None, f"You don't have the rights to create or write to {namespace}'s repositories")
        return user

    def _check_file_access(self, repo_type: str, repo_id: str, token: str | None) -> None:
        """As on the Hub: 401 without a token, 403 with a token whose user has not accepted the license."""
        allowed = self._gated.get((repo_type, repo_id))
        if allowed is None or token in allowed:
            return
        restricted = f"Access to {repo_type} {repo_id} is restricted"
        if token is None:
            raise HubError(401, "GatedRepo", f"{restricted}. You must be authenticated to access it.")
        raise HubError(403, "GatedRepo", f"{restricted} and you are not in the authorized list.")


def _commit(repo_dir: Path, revision: str) -> str:
    """The commit sha that `revision` (a sha or "main") names in a repository."""
    shas = sorted(p.name for p in repo_dir.iterdir() if p.is_dir() and COMMIT_SHA.fullmatch(p.name))
    if revision in shas:
        return revision
    if revision == "main" and (repo_dir / "refs" / "main").exists():
        return (repo_dir / "refs" / "main").read_text().strip()
    if revision == "main" and shas:
        return shas[-1]
    raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")


def _repo_info(repo_id: str, snapshot: Path, gated: bool) -> dict:
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    return {
        "id": repo_id,
        "author": repo_id.split("/")[0],
        "sha": snapshot.name,
        "private": (snapshot.parent / ".private").exists(),
        "gated": "manual" if gated else False,
        "disabled": False,
        "lastModified": _iso_date(snapshot.stat().st_mtime),
        "tags": [],
        "siblings": [{"rfilename": rel} for rel in files],
    }


def _tree(snapshot: Path, rel: str, recursive: bool) -> list[dict]:
    folder = _within(snapshot, rel)
    if folder is None or not folder.is_dir():
        raise HubError(404, "EntryNotFound", f"{rel} is not a directory of {snapshot.name}")
    children = folder.rglob("*") if recursive else folder.iterdir()
    return [_entry(snapshot, p.relative_to(snapshot).as_posix()) for p in sorted(children)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: HubServer):
        super().__init__(("127.0.0.1", 0), _Handler)  # loopback only, ephemeral port
        self.hub = hub


class _Handler(BaseHTTPRequestHandler):
    # Keep-alive like the real Hub (clients pool connections): every response sets Content-Length,
    # and every request body is read, even when the request fails.
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args) -> None:
        """Silenced: requests are recorded in HubServer.requests instead."""

    def _dispatch(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        url = urlsplit(self.path)
        try:
            if url.path == "/api/agent-harnesses" and self.command == "GET":
                # huggingface_hub fetches this registry once per process to tag its User-Agent when it runs
                # under an AI agent; an empty registry detects none.
                self._send_json({"standardEnvVars": [], "harnesses": {}})
            elif url.path == "/api/whoami-v2" and self.command == "GET":
                self._whoami()
            elif url.path == "/api/validate-yaml" and self.command == "POST":
                self._validate_yaml(json.loads(body))
            elif url.path == "/api/repos/create" and self.command == "POST":
                self._create_repo(json.loads(body))
            elif (
                (match := _API_URL.fullmatch(url.path))
                and match["op"] in ("preupload", "commit")
                and self.command == "POST"
            ):
                getattr(self, f"_{match['op']}")(**_unquoted(match), body=body)
            elif (match := _LFS_BATCH_URL.fullmatch(url.path)) and self.command == "POST":
                self._lfs_batch(**_unquoted(match), request=json.loads(body))
            elif (match := _LFS_OBJECT_URL.fullmatch(url.path)) and self.command == "PUT":
                self._lfs_put(match["oid"], body)
            elif (match := _API_URL.fullmatch(url.path)) and self.command == _api_method(match["op"]):
                self._api(**_unquoted(match), query=parse_qs(url.query), form=parse_qs(body.decode()))
            elif (match := _RESOLVE_URL.fullmatch(url.path)) and self.command in ("GET", "HEAD"):
                self._resolve(**_unquoted(match))
            else:
                logger.warning("hub_server: unhandled request %s %s", self.command, self.path)
                raise HubError(404, None, f"Not handled by the test Hub: {self.command} {url.path}")
        except HubError as e:
            self._send_error(e)

    def _token(self) -> str | None:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def _start_response(self, status: int, content_type: str, length: int, headers: dict[str, str]) -> None:
        authorized = "Authorization" in self.headers
        self.server.hub.requests.append(RecordedRequest(self.command, self.path, authorized, status))
        self.send_response(status)
        for name, value in {"Content-Type": content_type, "Content-Length": str(length), **headers}.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_json(self, data, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._start_response(status, "application/json", len(body), headers or {})
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message, **error.headers}
        if error.code is not None:
            headers["X-Error-Code"] = error.code
        self._send_json({"error": error.message}, error.status, headers)

    def _api(
        self, types: str, repo_id: str, query: dict, form: dict, op: str = "revision", rev: str = "main", path: str = ""
    ) -> None:
        hub = self.server.hub
        repo_type = types.removesuffix("s")
        repo_dir = hub._repo_dir(repo_type, repo_id, self._token())
        snapshot = repo_dir / _commit(repo_dir, rev)
        if op == "revision":
            self._send_json(_repo_info(repo_id, snapshot, hub._is_gated(repo_type, repo_id)))
        elif op == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._send_json(_tree(snapshot, path.lstrip("/"), recursive))
        else:  # paths-info: the form has one `paths` field per path; as on the Hub, missing ones are left out
            self._send_json([_entry(snapshot, rel) for rel in form.get("paths", []) if _within(snapshot, rel)])

    def _resolve(self, repo_id: str, rev: str, path: str, types: str = "models") -> None:
        hub = self.server.hub
        repo_type = types.removesuffix("s")
        repo_dir = hub._repo_dir(repo_type, repo_id, self._token())
        hub._check_file_access(repo_type, repo_id, self._token())
        commit = _commit(repo_dir, rev)
        found = _within(repo_dir / commit, path)
        if found is None or not found.is_file():
            # X-Repo-Commit lets huggingface_hub cache the file's absence for this commit.
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {commit}", {"X-Repo-Commit": commit})
        entry = _file_entry(repo_dir / commit, path)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        if "lfs" in entry:
            # The Hub's ETag of an LFS file is the pointer's. These headers (on the Hub, they come with the
            # redirect to its CDN) give the content's sha256 and size; huggingface_hub prefers them.
            headers |= {"X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Size": str(entry["size"])}
        self._send_file(found, entry["size"], headers)

    # ---- writes ----

    def _whoami(self) -> None:
        user = self.server.hub._users.get(self._token())
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        self._send_json(
            {
                "type": "user",
                "name": user.name,
                "orgs": [{"name": o, "type": "org"} for o in user.orgs],
                "auth": {"type": "access_token", "accessToken": {"displayName": "tests", "role": user.role}},
            }
        )

    def _create_repo(self, request: dict) -> None:
        hub = self.server.hub
        namespace = request.get("organization") or (
            hub._users[self._token()].name if self._token() in hub._users else ""
        )
        hub._writer(self._token(), namespace)
        repo_type = request.get("type") or "model"
        repo_id = f"{namespace}/{request['name']}"
        repo = hub.root / f"{repo_type}s" / repo_id
        url = f"http://{self.headers['Host']}/{'' if repo_type == 'model' else repo_type + 's/'}{repo_id}"
        if repo.exists():  # the Hub's answer, url included (huggingface_hub's exist_ok reads it)
            message = "You already created this model repo"
            self._send_json({"error": message, "url": url}, 409, {"X-Error-Message": message})
            return
        repo.mkdir(parents=True)
        if request.get("visibility", "private" if request.get("private") else "public") == "private":
            (repo / ".private").touch()
        initial = hashlib.sha1(f"initial {repo_id}".encode()).hexdigest()
        (repo / initial).mkdir()
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(initial)
        self._send_json({"url": url, "name": repo_id})

    def _validate_yaml(self, request: dict) -> None:
        """A README's metadata block, checked as the Hub checks model cards before a commit: YAML
        that parses to a mapping, with the types the Hub requires of the fields it knows."""
        import yaml

        errors = []
        content = request.get("content", "")
        if content.startswith("---\n"):
            try:
                meta = yaml.safe_load(content[4:].split("\n---", 1)[0])
            except yaml.YAMLError as e:
                meta, errors = None, [{"message": f"invalid YAML: {e}"}]
            if not errors and not isinstance(meta, dict):
                errors.append({"message": "metadata must be a YAML mapping"})
            for key, kinds in (
                ("library_name", str),
                ("pipeline_tag", str),
                ("license", str),
                ("tags", list),
                ("datasets", list),
                ("base_model", (str, list)),
            ):
                if isinstance(meta, dict) and key in meta and not isinstance(meta[key], kinds):
                    errors.append({"message": f'"{key}" must be {kinds}'})
        self._send_json({"errors": errors, "warnings": []}, 400 if errors else 200)

    def _preupload(self, types: str, repo_id: str, rev: str, body: bytes, op: str = "", path: str = "") -> None:
        hub = self.server.hub
        repo_type = types.removesuffix("s")
        hub._writer(self._token(), repo_id.split("/")[0])
        repo_dir = hub._repo_dir(repo_type, repo_id, self._token())
        snapshot = repo_dir / _commit(repo_dir, rev)
        files = []
        for f in json.loads(body)["files"]:
            lfs = f["size"] >= LFS_THRESHOLD or b"\0" in base64.b64decode(f["sample"])
            oid = None
            if _within(snapshot, f["path"]):
                entry = _file_entry(snapshot, f["path"])
                oid = (
                    entry["lfs"]["oid"]
                    if lfs and "lfs" in entry
                    else (entry["oid"] if not lfs else _sha256(snapshot / f["path"]))
                )
            files.append(
                {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._send_json({"files": files, "commitOid": snapshot.name})

    def _lfs_batch(self, repo_id: str, request: dict, types: str = "models") -> None:
        hub = self.server.hub
        hub._writer(self._token(), repo_id.split("/")[0])
        host = f"http://{self.headers['Host']}"
        objects = []
        for obj in request["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if not (hub.root / "lfs" / obj["oid"]).exists():
                entry["actions"] = {"upload": {"href": f"{host}/lfs-objects/{obj['oid']}", "header": {}}}
            objects.append(entry)
        self._send_json({"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _lfs_put(self, oid: str, body: bytes) -> None:
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, None, f"content does not match its oid {oid}")
        store = self.server.hub.root / "lfs"
        store.mkdir(exist_ok=True)
        (store / oid).write_bytes(body)
        self._send_json({})

    def _commit(self, types: str, repo_id: str, rev: str, body: bytes, op: str = "", path: str = "") -> None:
        hub = self.server.hub
        repo_type = types.removesuffix("s")
        hub._writer(self._token(), repo_id.split("/")[0])
        repo_dir = hub._repo_dir(repo_type, repo_id, self._token())
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        with hub._lock:
            parent = _commit(repo_dir, rev)
            sha = hashlib.sha1(parent.encode() + body).hexdigest()
            shutil.copytree(repo_dir / parent, repo_dir / sha, copy_function=os.link)
            for line in lines:
                kind, value = line["key"], line["value"]
                if kind in ("file", "lfsFile", "deletedFile"):
                    target = repo_dir / sha / value["path"]
                    if target.exists():
                        target.unlink()  # a hard link into the parent commit: never written through
                    if kind == "file":
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(base64.b64decode(value["content"]))
                    elif kind == "lfsFile":
                        blob = hub.root / "lfs" / value["oid"]
                        if not blob.exists():
                            raise HubError(400, None, f"LFS object {value['oid']} was never uploaded")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        os.link(blob, target)
            (repo_dir / "refs" / "main").write_text(sha)
            hub.commits.append((repo_id, sha))
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        self._send_json(
            {
                "commitUrl": f"http://{self.headers['Host']}/{prefix}{repo_id}/commit/{sha}",
                "commitOid": sha,
                "success": True,
            }
        )

    def _send_file(self, path: Path, size: int, headers: dict[str, str]) -> None:
        """Sends the file, or the single byte range asked for as `Range: bytes=<start>-[<end>]`."""
        start, end, status = 0, size - 1, 200
        if match := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
            start, end, status = int(match[1]), min(int(match[2] or size - 1), size - 1), 206
            if start > end:
                raise HubError(416, None, "Range not satisfiable", {"Content-Range": f"bytes */{size}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1
        self._start_response(status, "application/octet-stream", length, headers)
        if self.command == "HEAD":
            return
        with path.open("rb") as f:
            f.seek(start)
            try:
                while length > 0 and (chunk := f.read(min(length, 1 << 20))):
                    self.wfile.write(chunk)
                    length -= len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                # Streaming readers may close the connection before the end of the file.
                self.close_connection = True
