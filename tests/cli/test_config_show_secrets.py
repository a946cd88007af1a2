"""`fdl config show` masks secrets (the join token, secret-named env vars, key material) unless asked."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_fdl

TOKEN = "f3" * 32
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
