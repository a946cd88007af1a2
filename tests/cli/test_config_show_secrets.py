"""`fdl config show` masks secrets (the join token, secret-named env vars, key material) unless asked."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_fdl

TOKEN = "7dcf04d5c6f41c04f0353caa17a146d7958843d4657ec47cb804489f50ccd43e"  # fdl refuses a token under 128 bits
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "fdl.yml").write_text(textwrap.dedent("""\
        commands:
          train:
            run: 'true'
            env:
              HF_TOKEN: hf_abcdefghijklmnop
              DB_PASSWORD: hunter2hunter2
              TOKENIZER: bpe
        """))
    (tmp_path / "fdl.farm.yml").write_text(textwrap.dedent(f"""\
        cluster:
          controller:
            host: 127.0.0.1
            join:
              discovery: true
              token: "{TOKEN}"
        commands:
          train:
            env:
              DEPLOY_KEY: |
        """) + textwrap.indent(KEY, " " * 16))
    return tmp_path


SECRETS = (TOKEN, "hf_abcdefghijklmnop", "hunter2hunter2", "b3BlbnNzaC1rZXktdjEAAAAA")


def test_human_show_masks_the_join_token_and_secret_env_values(project: Path) -> None:
    """regression: `fdl @farm config show` printed join.token in clear."""
    result = run_fdl("@farm", "config", "show", cwd=project)
    assert result.returncode == 0, result.stderr
    for secret in SECRETS:
        assert secret not in result.stdout + result.stderr
    assert "token: <redacted: 64 chars, set in fdl.farm.yml:6>" in result.stdout
    assert "HF_TOKEN: <redacted: 19 chars, set in fdl.yml:5>" in result.stdout
    assert "DB_PASSWORD: <redacted: 14 chars, set in fdl.yml:6>" in result.stdout
    assert f"DEPLOY_KEY: <redacted: {len(KEY)} chars, set in fdl.farm.yml:10>" in result.stdout
    assert "TOKENIZER: bpe" in result.stdout  # a name that merely starts like a secret is shown


def test_json_twin_masks_the_same_values_and_lists_them(project: Path) -> None:
    result = run_fdl("@farm", "config", "show", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    for secret in SECRETS:
        assert secret not in result.stdout
    doc = json.loads(result.stdout)
    assert doc["config"]["cluster"]["controller"]["join"]["token"] == "<redacted: 64 chars, set in fdl.farm.yml:6>"
    assert sorted(doc["redacted"]) == sorted(["cluster.controller.join.token", "commands.train.env.HF_TOKEN",
                                              "commands.train.env.DB_PASSWORD", "commands.train.env.DEPLOY_KEY"])


def test_show_secrets_prints_them_in_clear(project: Path) -> None:
    human = run_fdl("@farm", "config", "show", "--show-secrets", cwd=project)
    assert human.returncode == 0 and TOKEN in human.stdout and "<redacted" not in human.stdout
    doc = json.loads(run_fdl("@farm", "config", "show", "--json", "--show-secrets", cwd=project).stdout)
    assert doc["config"]["cluster"]["controller"]["join"]["token"] == TOKEN and doc["redacted"] == []


@pytest.fixture
def leaky(tmp_path: Path) -> Path:
    (tmp_path / "fdl.yml").write_text(textwrap.dedent("""\
        commands:
          train:
            run: python train.py
            args: [--wandb-key, wk_0123456789abcdef, --epochs, "3", --password=hunter2hunter2]
            env:
              AWS_SECRET_ACCESS_KEY: aws_secret_value_0001
              APIKEY: apikey_value_0002
              KEY_ID: keyid_value_0003
              DATABASE_URL: postgres://app:pg_password_0004@db.internal/x
              MONKEY: banana
              KEYBOARD_LAYOUT: dvorak
              TOKENIZER: bpe
              MAX_TOKENS: 4096
              GIT_AUTHOR_NAME: Ada
              SOURCE: rsync://op@10.0.0.1:2222:/tree
        """))
    return tmp_path


LEAKS = ("wk_0123456789abcdef", "hunter2hunter2", "aws_secret_value_0001", "apikey_value_0002", "keyid_value_0003",
         "pg_password_0004")


def test_secrets_in_names_urls_and_args_flags_are_masked_and_ordinary_values_stay(leaky: Path) -> None:
    """regression: `fdl config show` masked HF_TOKEN but printed AWS_SECRET_ACCESS_KEY, a password inside a URL
    and a secret in `args:` (`--wandb-key wk_...`) in clear."""
    human = run_fdl("config", "show", cwd=leaky)
    assert human.returncode == 0, human.stderr
    for secret in LEAKS:
        assert secret not in human.stdout + human.stderr, secret
    out = human.stdout
    assert "AWS_SECRET_ACCESS_KEY: <redacted: 21 chars, set in fdl.yml:6>" in out
    assert "APIKEY: <redacted: 17 chars, set in fdl.yml:7>" in out and "KEY_ID: <redacted: 16 chars" in out
    assert "DATABASE_URL: postgres://<redacted>@db.internal/x" in out
    assert "- <redacted: 19 chars, set in fdl.yml:4>" in out  # the value after --wandb-key
    assert "--password=<redacted>" in out and "- --epochs" in out
    for readable in ("MONKEY: banana", "KEYBOARD_LAYOUT: dvorak", "TOKENIZER: bpe", "MAX_TOKENS: 4096",
                     "GIT_AUTHOR_NAME: Ada", "SOURCE: rsync://op@10.0.0.1:2222:/tree", "- --wandb-key"):
        assert readable in out, readable

    doc = json.loads(run_fdl("config", "show", "--json", cwd=leaky).stdout)
    for secret in LEAKS:
        assert secret not in json.dumps(doc), secret
    env = doc["config"]["commands"]["train"]["env"]
    assert env["DATABASE_URL"] == "postgres://<redacted>@db.internal/x" and env["MONKEY"] == "banana"
    assert doc["config"]["commands"]["train"]["args"][1].startswith("<redacted: 19 chars")
    assert sorted(doc["redacted"]) == sorted([
        "commands.train.args[1]", "commands.train.args[4]", "commands.train.env.AWS_SECRET_ACCESS_KEY",
        "commands.train.env.APIKEY", "commands.train.env.KEY_ID", "commands.train.env.DATABASE_URL"])

    clear = run_fdl("config", "show", "--show-secrets", cwd=leaky).stdout
    clear_doc = json.loads(run_fdl("config", "show", "--json", "--show-secrets", cwd=leaky).stdout)
    for secret in LEAKS:
        assert secret in clear and secret in json.dumps(clear_doc), secret
    assert clear_doc["redacted"] == []


# regression (issue 37, finding 9): `fdl config show` masked by flag name only, so `--bearer`, `--cookie` and `-p`
# printed their values in clear, as did a token under a name that does not say secret; and the libtorch.mirror
# validation error printed the URL's password.
SHAPED = {
    "hex": "9f" * 16 + "a1" * 16,                                        # a 256-bit token, as fdl mints them
    "b64": "q3Vb8XkPz9Lr0Tn4Jm7Yc2Wd5Fs1Hg6Ae+/Ku0Ri3Oo=",             # 32 bytes of standard base64
    "gh": "ghp_" + "R7kq2Zx9Lm4Np8Ws1Tv6Yb3Cd5Fg0Hj7Ka2M",
    "bearer": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcCJ9.c2lnbmF0dXJlLXZhbHVl",
    "cookie": "sid_9a8b7c6d5e4f",
    "pw": "hunter2hunter2",
    "curl": "op:s3cr3t-pass",
}


@pytest.fixture
def shaped(tmp_path: Path) -> Path:
    (tmp_path / "fdl.yml").write_text(textwrap.dedent(f"""\
        commands:
          fetch:
            run: >-
              curl -H 'Authorization: Bearer {SHAPED['bearer']}' --cookie {SHAPED['cookie']}
              -u {SHAPED['curl']} https://models.example/x && sshpass -p {SHAPED['pw']} ssh op@box true
          train:
            run: python train.py
            args: [--bearer, {SHAPED['gh']}, -p, {SHAPED['pw']}, --epochs, "3", --model, resnet50]
            env:
              RUN_NAME: bert-base-uncased-finetuned-squad2
              MODEL_ID: {SHAPED['hex']}
              SIGNING: "{SHAPED['b64']}"
              CHECKPOINT: target/release/Train2Model
        libtorch:
          sha256:
            cu128: {"ab" * 32}
        """))
    return tmp_path


def test_values_shaped_like_secrets_and_common_secret_flags_are_masked(shaped: Path) -> None:
    for argv in (["config", "show"], ["config", "show", "--json"]):
        done = run_fdl(*argv, cwd=shaped)
        assert done.returncode == 0, done.stderr
        for name, secret in SHAPED.items():
            assert secret not in done.stdout + done.stderr, name
        for readable in ("bert-base-uncased-finetuned-squad2", "target/release/Train2Model", "resnet50", "ab" * 32,
                         "--epochs", "https://models.example/x", "Authorization: Bearer"):
            assert readable in done.stdout, readable
    doc = json.loads(run_fdl("config", "show", "--json", cwd=shaped).stdout)
    assert {"commands.train.args[1]", "commands.train.args[3]", "commands.train.env.MODEL_ID",
            "commands.train.env.SIGNING", "commands.fetch.run"} <= set(doc["redacted"])
    assert "libtorch.sha256.cu128" not in doc["redacted"]  # a digest pin is no secret


def test_an_error_that_echoes_a_url_strips_its_password(tmp_path: Path) -> None:
    (tmp_path / "fdl.yml").write_text('libtorch:\n  mirror: "https://op:mirror-pw-0001@mirror.example/libtorch?x=1"\n')
    for argv in (["config", "show"], ["config", "show", "--json"]):
        done = run_fdl(*argv, cwd=tmp_path)
        assert done.returncode == 1 and "libtorch.mirror" in done.stdout + done.stderr
        assert "mirror-pw-0001" not in done.stdout + done.stderr
        assert "https://<redacted>@mirror.example/libtorch" in done.stdout + done.stderr
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    for how in ({"FDL_LIBTORCH_MIRROR": "https://op:env-pw-0002@mirror.example/l?x"}, {}):
        argv = ["libtorch", "download", "cpu"] + ([] if how else ["--mirror", "ftp://op:flag-pw-0003@m.example/l"])
        done = run_fdl(*argv, cwd=empty, env=how)
        assert done.returncode in (1, 2), done.stdout + done.stderr
        assert "<redacted>@" in done.stderr and "pw-000" not in done.stdout + done.stderr, done.stderr
