"""Fetching from the Hugging Face Hub at a pinned commit, with one-line errors.

The token is whatever huggingface_hub finds by itself: the HF_TOKEN environment variable or
the login stored by `hf auth login`. It is never a parameter, never on a command line, and
never passed on to MaxText (see maxtext_process.child_env). HF_ENDPOINT selects another Hub (the
tests point it at a local stand-in server).
"""

import os

import huggingface_hub
from huggingface_hub import errors

from stages.lib import outputs
from stages.shared.errors import UserError

# What a model checkpoint needs; skips e.g. original/ or consolidated PyTorch copies.
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]


def _explain(e: Exception, repo_id: str, revision: str, repo_type: str) -> UserError:
    url = f"{huggingface_hub.constants.ENDPOINT}/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
    if isinstance(e, errors.GatedRepoError):
        if huggingface_hub.get_token() is None:
            return UserError(
                f"{repo_id} is gated and no Hugging Face token was found: accept its license at {url}, "
                "then export HF_TOKEN=... (or run `hf auth login`)"
            )
        return UserError(
            f"{repo_id} is gated and your token has no access to it: accept the license at {url} "
            "with the account the token belongs to"
        )
    if isinstance(e, errors.RevisionNotFoundError):
        return UserError(f"{repo_id}: revision {revision} not found; check the commit hash in params.yaml")
    if isinstance(e, errors.RepositoryNotFoundError):
        hint = "" if huggingface_hub.get_token() else " (if it is private, export HF_TOKEN=...)"
        return UserError(f"{repo_id}: no such {repo_type} repository on {huggingface_hub.constants.ENDPOINT}{hint}")
    if (
        isinstance(e, errors.LocalEntryNotFoundError)
        or isinstance(e, OSError)
        and not isinstance(e, errors.HfHubHTTPError)
    ):
        return UserError(
            f"cannot reach the Hugging Face Hub at {huggingface_hub.constants.ENDPOINT} to fetch {repo_id}: {e}"
        )
    return UserError(f"{repo_id}@{revision}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def check_access(repo_id: str, revision: str, repo_type: str) -> None:
    """Fails in a second, before anything is downloaded or written, if the files at this
    revision are not readable (no such repo or revision, gated without a token or license)."""
    try:
        info = huggingface_hub.HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type)
        files = [s.rfilename for s in info.siblings or []]
        probe = "config.json" if "config.json" in files else next((f for f in files if f != ".gitattributes"), None)
        if probe:  # gating protects files, not metadata: ask for one file's headers
            url = huggingface_hub.hf_hub_url(repo_id, probe, revision=revision, repo_type=repo_type)
            huggingface_hub.get_hf_file_metadata(url)
    except Exception as e:  # noqa: BLE001 - every failure becomes one explained line
        raise _explain(e, repo_id, revision, repo_type) from None


def download_size(repo_id: str, revision: str) -> int:
    """Bytes download_model will fetch (0 when the Hub does not say)."""
    import fnmatch

    info = huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    return sum(s.size or 0 for s in info.siblings or [] if any(fnmatch.fnmatch(s.rfilename, p) for p in MODEL_FILES))


def download_model(repo_id: str, revision: str, out_dir: str) -> None:
    try:
        huggingface_hub.snapshot_download(repo_id, revision=revision, local_dir=out_dir, allow_patterns=MODEL_FILES)
    except Exception as e:  # noqa: BLE001
        raise _explain(e, repo_id, revision, "model") from None
    # local_dir downloads keep bookkeeping in <dir>/.cache; it is not part of the checkpoint.
    outputs.remove(os.path.join(out_dir, ".cache"))


def load_dataset_split(repo_id: str, revision: str, split: str):
    """Rows of one split, streamed (only what is read is downloaded)."""
    import datasets

    try:
        yield from datasets.load_dataset(repo_id, revision=revision, split=split, streaming=True)
    except ValueError as e:
        if "split" in str(e).lower():
            raise UserError(f"{repo_id}: no split {split!r} ({str(e).splitlines()[0]})") from None
        raise _explain(e, repo_id, revision, "dataset") from None
    except Exception as e:  # noqa: BLE001
        raise _explain(e, repo_id, revision, "dataset") from None
