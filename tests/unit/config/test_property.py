"""Property: any document through load + merge + validate is a Config or an FdlError, nothing else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fdl.config.project import EnvSelection, load_config
from fdl.errors import FdlError

KEYS = ["cluster", "controller", "host", "port", "bind", "join", "discovery", "start", "token", "quorum",
        "hosts", "ranks", "window_s", "tunnel_only", "ssh", "user", "identity", "workers", "address", "arch",
        "local_devices", "env", "data_path", "python", "commands", "run", "build", "bin", "args", "publish",
        "source", "cwd", "to", "gate", "persist", "devices", "inherit-from", "test", "train", "x"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-70000, 70000), st.floats(allow_nan=True),
    st.sampled_from(["auto", "manual", "hybrid", "cpu:2", "all", "10.0.0.1:1337", "a;b", "node-b", "", "0,1"]),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.sampled_from(KEYS), children, max_size=5)),
    max_leaves=25,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=5)


def _mutate(text: str, data: st.DataObject) -> str:
    """Occasionally break the YAML text itself: cut it, or splice in hostile characters."""
    choice = data.draw(st.integers(0, 5))
    if choice == 0 and text:
        return text[: data.draw(st.integers(0, len(text)))]
    if choice == 1:
        at = data.draw(st.integers(0, len(text)))
        hostile = st.sampled_from(["\t", ":", "&a", "*a", "[", "{", "- ", "!!python/object:os.system", "\"", "---\n"])
        return text[:at] + data.draw(hostile) + text[at:]
    return text


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(base=documents, overlay=documents, data=st.data())
def test_load_merge_validate_never_crashes(base: dict, overlay: dict, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base_text = _mutate(yaml.safe_dump(base, sort_keys=False), data)
        overlay_text = _mutate(yaml.safe_dump(overlay, sort_keys=False), data)
        (root / "fdl.yml").write_bytes(base_text.encode("utf-8", "replace"))
        (root / "fdl.o.yml").write_bytes(overlay_text.encode("utf-8", "replace"))
        for env in (None, "o"):
            try:
                config = load_config(root, EnvSelection(env, "--env") if env else EnvSelection())
            except FdlError as exc:
                assert str(exc).strip(), "an error must say something"
                assert "Traceback" not in str(exc)
            else:
                assert isinstance(config.data, dict)
