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


# regression (issue 37, finding 9): masking went by flag name only; values shaped like secrets, the common secret
# flags of curl/sshpass/mysql and HTTP credentials printed in clear.


@pytest.mark.parametrize("text, shown", [
    ("curl --bearer tok_abc https://x", "curl --bearer <redacted> https://x"),
    ("curl --cookie 'sid=abc; x=1' https://x", "curl --cookie <redacted> https://x"),
    ("sshpass -p hunter2 ssh box", "sshpass -p <redacted> ssh box"),
    ("curl -u op:pw https://x", "curl -u <redacted> https://x"),
    ("curl -H 'Authorization: Bearer abc.def' x", "curl -H 'Authorization: Bearer <redacted>' x"),
    ("curl -H 'Authorization: Basic b3A6cHc=' x", "curl -H 'Authorization: Basic <redacted>' x"),
    ("curl -H 'X-Api-Key: abc123' x", "curl -H 'X-Api-Key: <redacted>' x"),
    ("curl -H 'Cookie: a=1; b=2' x", "curl -H 'Cookie: <redacted>' x"),
    ("export HF_TOKEN=hf_x && train", "export HF_TOKEN=<redacted> && train"),
    ("train --resume " + "3f" * 16, "train --resume <redacted>"),
])
def test_secret_flags_headers_and_shapes_in_text(text: str, shown: str) -> None:
    assert mask_text(text) == shown


@pytest.mark.parametrize("value", [
    "5f0c" * 16,                                     # fdl's own token shape: 64 hex digits
    "0123456789abcdef0123456789abcdef",             # 128 bits of hex
    "q3Vb8XkPz9Lr0Tn4Jm7Yc2Wd5Fs1Hg6Ae+/Ku0Ri3Oo=",  # standard base64 of 32 bytes
    "cW9uZ2VyYW5kb21ieXRlcw==",                     # 16 bytes, padded
    "ghp_R7kq2Zx9Lm4Np8Ws1Tv6Yb3Cd5Fg0Hj7Ka2M", "glpat-x9Rk2Lm4Np8Ws1Tv6Yb3", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
    "sk-proj-Z2x9Lm4Np8Ws1Tv6Yb3Cd5Fg", "AKIAIOSFODNN7EXAMPLE", "xoxb-1234567890-abcdefghijkl",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcCJ9.c2lnbmF0dXJlLXZhbHVl",
    "Zk3vQ9xL2mRt7YpB4nWc8s",                       # secrets.token_urlsafe(16)
    "Xq7_Lm2-Rt9zKp4WvB8cN3yDf6GhJ1sT0uAe5iOo2lQ",  # secrets.token_urlsafe(32)
])
def test_values_shaped_like_secrets_are_masked_whole(value: str) -> None:
    assert find_masks({"commands": {"t": {"env": {"MODEL_ID": value}}}}) == {
        ("commands", "t", "env", "MODEL_ID"): Mask(whole=True)}


@pytest.mark.parametrize("value", [
    "bert-base-uncased-finetuned-squad2", "TransformerEncoderLayer2x", "MyModel_v2_Checkpoint_Final",
    "target/release/Train2Model", "/home/op/.flodl/libtorch/precompiled/cu128", "builds/sm61-sm120",
    "cu128_sm90_sm100_nccl2275", "x86_64-unknown-linux-gnu", "meta-llama/Llama-2-7b-chat-hf",
    "git+https://host/o/r#" + "a1b2" * 10, "registry/img@sha256:" + "ab" * 32,
    "CUDA_VISIBLE_DEVICES", "10.0.0.12:1337", "cargo build --release --features cuda",
])
def test_ordinary_values_stay_readable_whatever_their_shape(value: str) -> None:
    assert find_masks({"commands": {"t": {"env": {"SOME": value}}}}) == {}


def test_a_digest_under_a_digest_name_stays_readable() -> None:
    pins = {"libtorch": {"sha256": {"cu128": "ab12" * 16}}, "x": {"commit": "c0ffee" * 6 + "1234"}}
    assert find_masks(pins) == {}


def test_the_item_after_a_common_secret_flag_is_masked_in_args() -> None:
    args = ["--bearer", "b", "-p", "pw", "--cookie", "c", "-u", "op:pw", "-u", "op", "--epochs", "3"]
    masks = find_masks({"commands": {"t": {"args": args}}})
    assert sorted(path[-1] for path in masks) == [1, 3, 5, 7]


def test_errors_strip_the_userinfo_of_every_url() -> None:
    from fdl.hostside.redact import strip_userinfo

    assert strip_userinfo("mirror https://op:pw@m.example/x is bad") == "mirror https://<redacted>@m.example/x is bad"
    assert strip_userinfo("https://TOKEN@h/x") == "https://<redacted>@h/x"
    assert strip_userinfo("rsync://op@h:/tree and sshfs://u@h:/d") == "rsync://op@h:/tree and sshfs://u@h:/d"
    assert strip_userinfo("no url here, a@b") == "no url here, a@b"
