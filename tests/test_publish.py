"""tools/publish.py against the Hub stand-in, with the real huggingface_hub client on both sides:
the upload, the card, no second commit for the same export, the refusals, the token kept secret."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from testkit.hub_server import HubServer
from testkit.process_watch import CANARY_TOKEN, ProcessWatch
from testkit.workspace import sh, sha256s

pytestmark = pytest.mark.slow

READ_ONLY_TOKEN = "hf_readonly_for_tests"
REPO_ID = "alice/tiny-sft"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    server = HubServer(tmp_path_factory.mktemp("publish-hub"))
    server.add_user(CANARY_TOKEN, "alice", orgs=("alice-lab",))
    server.add_user(READ_ONLY_TOKEN, "carol", role="read")
    server.endpoint = server.start()
    yield server
    server.stop()


def publish(hub, cwd, home, *args, token=CANARY_TOKEN, **extra):
    """`python -m tools.publish ...` as a user runs it: the token in HF_TOKEN, nowhere else
    (`home`: HF_HOME, where `hf auth login` would have stored one). The stand-in speaks the
    Hub's LFS upload protocol, not Xet (HF_HUB_DISABLE_XET)."""
    return sh(
        [sys.executable, "-m", "tools.publish", *args],
        cwd,
        check=False,
        timeout=600,
        HF_ENDPOINT=hub.endpoint,
        HF_TOKEN=token,
        HF_HOME=str(home),
        HF_HUB_DISABLE_XET="1",
        **extra,
    )


def test_publish_uploads_the_export_with_a_card_that_traces_it(hub, tiny_run, tmp_path):
    from huggingface_hub import errors, snapshot_download

    root = tiny_run.path
    watch = ProcessWatch()
    watch.start()
    try:
        first = publish(hub, root, tmp_path / "hf-home", REPO_ID)
        again = publish(hub, root, tmp_path / "hf-home", REPO_ID)
    finally:
        watch.stop_event.set()
        watch.join()
    export = sha256s(root / "models" / "sft-hf")
    assert first.returncode == 0, first.stderr
    assert f"published {len(export) + 1} files to {hub.endpoint}/{REPO_ID} as alice" in first.stdout, first.stdout
    assert "private)" in first.stdout
    commits = [sha for repo, sha in hub.commits if repo == REPO_ID]
    assert len(commits) == 1
    # Unchanged export, unchanged card: huggingface_hub drops every file and makes no commit.
    assert again.returncode == 0 and "nothing uploaded" in again.stdout, again.stdout + again.stderr
    assert [sha for repo, sha in hub.commits if repo == REPO_ID] == commits

    got = tmp_path / "downloaded"
    snapshot_download(REPO_ID, endpoint=hub.endpoint, token=CANARY_TOKEN, local_dir=got, cache_dir=tmp_path / "cache")
    assert {k: v for k, v in sha256s(got).items() if k != "README.md"} == export  # the same bytes
    with pytest.raises(errors.RepositoryNotFoundError):  # private: invisible without the token
        snapshot_download(REPO_ID, endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "anonymous")

    card = (got / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "transformers" and "sft" in front["tags"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    shaping = yaml.safe_load(re.search(r"```yaml\n(.*?)```", card, re.S).group(1))
    assert shaping["train"] == params["train"] and shaping["model"] == params["model"]
    assert shaping["dataset"] == params["dataset"] and shaping["base_model"] == params["base_model"]
    counts = json.loads((root / "metrics" / "dataset.json").read_text())
    assert f"({counts['train']['rows']} conversations trained on, 0 skipped" in card
    heldout = json.loads((root / "metrics" / "eval.json").read_text())["eval"]
    assert f"| held-out loss | {heldout['base_loss']:.4f} | {heldout['fine_tuned_loss']:.4f} |" in card
    capitals = json.loads((root / "metrics" / "benchmark.json").read_text())["benchmark"]["chat_capitals"]
    assert (
        f"| chat_capitals (lm-eval) | {capitals['base']:.4f} ± {capitals['base_stderr']:.4f} "
        f"| {capitals['fine_tuned']:.4f} ± {capitals['fine_tuned_stderr']:.4f} |"
    ) in card  # lm-eval's standard errors beside the scores
    check = json.loads((root / "metrics" / "export_check.json").read_text())["export"]
    assert f"max KL {check['kl_max']:.3g}, mean KL {check['kl_mean']:.3g}" in card
    assert f"max KL {check['rounding']['kl_max']:.3g}" in card  # what bf16 rounding cost
    git_head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    md5 = next(o["md5"] for o in lock["stages"]["convert_out"]["outs"] if o["path"] == "models/sft-hf")
    assert f"pipeline commit: `{git_head}`\n" in card and f"DVC hash `{md5}`" in card

    # With --gguf, the checked GGUF files too, at the root, and their figures in the card.
    with_gguf = publish(hub, root, tmp_path / "hf-home", REPO_ID, "--gguf")
    assert with_gguf.returncode == 0, with_gguf.stderr
    snapshot_download(REPO_ID, endpoint=hub.endpoint, token=CANARY_TOKEN, local_dir=got, cache_dir=tmp_path / "cache")
    checked = json.loads((root / "metrics" / "gguf_check.json").read_text())["gguf"]
    for figures in checked.values():
        assert sha256s(got)[figures["file"]] == sha256s(root / "models" / "gguf")[figures["file"]]
        assert (
            f"| {figures['file']} | {figures['bytes'] / 1e6:.1f} | {figures['kl_max']:.3g} |"
            in (got / "README.md").read_text()
        )

    # The token: in no argv (sampled while both commands ran), no output, no file on the Hub.
    assert any("tools.publish" in c for c in watch.seen_commands) and watch.leaks == []
    assert CANARY_TOKEN not in first.stdout + first.stderr + again.stdout + again.stderr
    for path in hub.root.rglob("*"):
        assert not path.is_file() or CANARY_TOKEN.encode() not in path.read_bytes(), path


def test_publish_refuses_in_one_line_before_sending_anything(hub, tiny_run, tmp_path):
    failed = tmp_path / "failed-export"  # an export whose check failed, as convert_out leaves it
    (failed / "models" / "sft-hf").mkdir(parents=True)
    (failed / "metrics").mkdir()
    (failed / "params.yaml").write_text((tiny_run.path / "params.yaml").read_text())
    (failed / "assets").symlink_to(tiny_run.path / "assets")  # the recipe's data, which params.yaml names
    (failed / "models" / "sft-hf" / "config.json").write_text("{}")
    (failed / "metrics" / "export_check.json").write_text(json.dumps({"export": {"passed": False}}))
    home = tmp_path / "no-login"  # no token stored by `hf auth login`
    cases = [
        (tiny_run.path, ["alice"], {}, "'alice': expected a repository id like OWNER/NAME"),
        (tiny_run.path, [REPO_ID], {"token": None}, "no Hugging Face token found: export HF_TOKEN"),
        (tiny_run.path, [REPO_ID], {"token": "hf_unknown"}, "the Hub refused the token"),
        (tiny_run.path, ["carol/model"], {"token": READ_ONLY_TOKEN}, "the token of carol is read-only"),
        (tiny_run.path, ["bob/model"], {}, "bob/model: bob is not alice or one of their organisations"),
        (failed, [REPO_ID], {"PYTHONPATH": str(tiny_run.path)}, "models/sft-hf did not pass its export check"),
    ]
    commits_before = list(hub.commits)
    for cwd, args, extra, message in cases:
        proc = publish(hub, cwd, home, *args, **extra)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("publish: error: "), (
            proc.stderr
        )
        assert message in proc.stderr, (message, proc.stderr)
    assert hub.commits == commits_before
    assert not (hub.root / "models" / "bob").exists()
