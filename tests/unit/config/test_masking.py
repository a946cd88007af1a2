"""What `fdl config show` masks (fdl.config.masking): the names, URLs and flags people put secrets in, and the
ordinary values that stay readable."""

from __future__ import annotations

import pytest

from fdl.config.masking import Mask, find_masks, mask_text, secret_name


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "GITHUB_TOKEN", "token", "AccessToken", "API_TOKENS",
    "AWS_SECRET_ACCESS_KEY", "client_secret", "SECRETS_FILE",
    "DB_PASSWORD", "PGPASSWORD", "MYSQL_PASSWD", "PASS", "DB_PASS", "SSH_PASSPHRASE",
    "API_KEY", "APIKEY", "apiKey", "KEY_ID", "AWS_ACCESS_KEY_ID", "KEY", "SIGNING_KEYS", "wandb-key",
    "CREDENTIAL", "GOOGLE_APPLICATION_CREDENTIALS",
    "AUTH", "BASIC_AUTH", "OAUTH_CLIENT_ID", "AUTHORIZATION", "authToken",
])
def test_names_that_say_secret(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", [
    "MONKEY", "MONKEY_PATCH", "monkeyPatch", "KEYBOARD_LAYOUT", "TURKEY", "HOCKEY_TEAM", "WHISKEY",
    "TOKENIZER", "TOKENIZERS_PARALLELISM", "GIT_AUTHOR_NAME", "AUTHORS", "BYPASS_CACHE", "PASSTHROUGH",
    "COMPASS", "WANDB_MODE", "CUDA_VISIBLE_DEVICES", "identity", "host", "run", "args", "LD_PRELOAD", "",
])
def test_ordinary_names_stay_readable(name: str) -> None:
    assert not secret_name(name)


@pytest.mark.parametrize("text, shown", [
    ("postgres://u:pw@db/x", "postgres://<redacted>@db/x"),
    ("https://oauth2:ghp_x@github.com/o/r", "https://<redacted>@github.com/o/r"),
    ("https://ghp_tokenonly@github.com/o/r", "https://<redacted>@github.com/o/r"),
    ("git+https://u:p@ss@host/o/r#main", "git+https://<redacted>@host/o/r#main"),
    ("psql postgres://u:pw@db/x -c 'select 1'", "psql postgres://<redacted>@db/x -c 'select 1'"),
    ("rsync://op:pw@ctrl:/tree", "rsync://<redacted>@ctrl:/tree"),
    ("train --wandb-key wk_123 --epochs 3", "train --wandb-key <redacted> --epochs 3"),
    ("train --password=hunter2 --epochs 3", "train --password=<redacted> --epochs 3"),
    ("train --api-key='a b' --x", "train --api-key=<redacted> --x"),
    ("--db=postgres://a:b@c/d", "--db=postgres://<redacted>@c/d"),
])
def test_text_keeps_everything_but_the_secret(text: str, shown: str) -> None:
    assert mask_text(text) == shown


@pytest.mark.parametrize("text", [
    "rsync://op@10.0.0.1:2222:/tree", "ssh://git@github.com/o/r", "git+ssh://git@github.com/o/r#v1",
    "sshfs://fdl-b300@host:22:/data", "https://github.com/o/r", "https://example.com/a@b",
    "mail me at me@example.com", "cargo build --release --features cuda", "train --use-key --epochs 3",
    "train --tokenizer bpe --monkey 3 --keyboard us",
])
def test_ordinary_text_stays_readable(text: str) -> None:
    assert mask_text(text) == text


def test_find_masks_covers_names_args_urls_and_key_material() -> None:
    data = {
        "cluster": {"controller": {"join": {"token": "f3" * 32}}},
        "commands": {"train": {
            "run": "python train.py --password=pw",
            "args": ["--wandb-key", "wk_abc", "--epochs", "3", "--token=t0k", "--api-key", 1234, "--use-key",
                     "--lr", "0.1", "--tokenizer", "bpe"],
            "env": {"AWS_SECRET_ACCESS_KEY": "sk", "DATABASE_URL": "postgres://u:pw@db/x", "TOKENIZER": "bpe",
                    "MAX_TOKENS": 4096, "NUM_KEYS": 8, "API_KEYS": ["k1", "k2"], "USE_AUTH": True, "API_TOKEN": None,
                    "DEPLOY": "-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n",
                    "SOURCE": "rsync://op@ctrl:/tree"},
        }},
    }
    masks = find_masks(data)
    train = ("commands", "train")
    assert masks == {
        ("cluster", "controller", "join", "token"): Mask(whole=True),
        (*train, "run"): Mask(whole=False, shown="python train.py --password=<redacted>"),
        (*train, "args", 1): Mask(whole=True),
        (*train, "args", 4): Mask(whole=False, shown="--token=<redacted>"),
        (*train, "args", 6): Mask(whole=True),
        (*train, "env", "AWS_SECRET_ACCESS_KEY"): Mask(whole=True),
        (*train, "env", "DATABASE_URL"): Mask(whole=False, shown="postgres://<redacted>@db/x"),
        (*train, "env", "API_KEYS", 0): Mask(whole=True),
        (*train, "env", "API_KEYS", 1): Mask(whole=True),
        (*train, "env", "DEPLOY"): Mask(whole=True),
    }
