"""Options several commands share are declared once (fdl.cli.options): `--json` is spelled in one place."""

from __future__ import annotations

from tests.conftest import REPO


def test_json_is_declared_once_and_every_command_with_it_uses_the_shared_option():
    spelled = [str(path.relative_to(REPO)) for path in sorted((REPO / "fdl").rglob("*.py"))
               if '"--json"' in path.read_text()]  # main.py's boundary looks for options.JSON_FLAG
    assert spelled == ["fdl/cli/options.py"]
    users = {path.stem for path in (REPO / "fdl" / "cli").glob("*.py") if "json_option(" in path.read_text()}
    assert users >= {"config", "join_config", "libtorch", "nccl", "probe", "publish", "start", "status"}
