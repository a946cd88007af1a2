"""The pure NCCL build plan: tags, archs, gencode flags, paths and docker commands."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fdl.nccl.plan import (
    KNOWN_ARCHS,
    Arch,
    BuildPlan,
    NcclVersion,
    PlanError,
    arch_label,
    archs_from_capabilities,
    command_line,
    gencode_flags,
    parse_archs,
    parse_jobs,
)


@pytest.mark.parametrize("text, version, ref", [
    ("v2.27.5", "2.27.5", "v2.27.5-1"),
    ("2.27.5", "2.27.5", "v2.27.5-1"),
    ("v2.26.2-1", "2.26.2", "v2.26.2-1"),
    (" v2.21.5-3 ", "2.21.5", "v2.21.5-3"),
])
def test_tag_forms_map_to_nccl_git_tags(text, version, ref):
    parsed = NcclVersion.parse(text)
    assert (parsed.version, parsed.git_ref, str(parsed)) == (version, ref, f"v{version}")


@pytest.mark.parametrize("text", ["", "latest", "v2.27", "v2.27.5.1", "2.27.x", "v2.27.5-", "master", "v3.0.0"])
def test_bad_tags_are_refused_with_the_expected_shape(text):
    with pytest.raises(PlanError) as err:
        NcclVersion.parse(text)
    assert "--tag" in err.value.message
    assert "v2.27.5" in err.value.message
    assert err.value.exit_code == 1


def test_versions_order_numerically():
    assert NcclVersion.parse("v2.9.9") < NcclVersion.parse("v2.10.0") < NcclVersion.parse("v2.27.5")


def test_archs_parse_sort_and_deduplicate():
    assert parse_archs("12.0;6.1;6.1") == (Arch(6, 1), Arch(12, 0))
    assert parse_archs("sm_86, 90 compute_61") == (Arch(6, 1), Arch(8, 6), Arch(9, 0))
    assert parse_archs("sm120") == (Arch(12, 0),)


@pytest.mark.parametrize("text, says", [
    ("7.4", "'7.4' is not a CUDA compute capability"),
    ("6.1;banana", "'banana' is not a CUDA compute capability"),
    ("3.5", "older than anything"),
    ("sm_35", "older than anything"),
    ("12", "write 12.0 if you meant compute capability 12.0"),
    (";;", "names no architecture"),
])
def test_bad_archs_are_refused_by_name(text, says):
    with pytest.raises(PlanError) as err:
        parse_archs(text)
    assert says in err.value.message
    assert err.value.exit_code == 1


def test_gencode_has_sass_per_arch_and_ptx_for_the_newest():
    assert gencode_flags((Arch(6, 1), Arch(12, 0))) == [
        "-gencode=arch=compute_61,code=sm_61",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    assert arch_label((Arch(6, 1), Arch(12, 0))) == "sm61-sm120"


@given(st.sets(st.sampled_from(KNOWN_ARCHS), min_size=1))
def test_any_known_arch_set_plans_consistently(pairs):
    text = ";".join(f"{a}.{b}" for a, b in pairs)
    archs = parse_archs(text)
    flags = gencode_flags(archs)
    assert len(flags) == len(pairs) + 1
    assert list(archs) == sorted(archs)
    newest = max(archs)
    assert flags[-1] == f"-gencode=arch=compute_{newest.number},code=compute_{newest.number}"
    assert arch_label(archs).split("-") == [f"sm{a}{b}" for a, b in sorted(pairs)]


def test_capabilities_from_nvml_are_deduplicated():
    assert archs_from_capabilities([(8, 6), (12, 0), (8, 6)]) == (Arch(8, 6), Arch(12, 0))


def test_no_nvml_and_no_gpus_say_what_to_pass():
    with pytest.raises(PlanError) as missing:
        archs_from_capabilities(None)
    assert "NVML" in missing.value.message and "--archs" in missing.value.message
    with pytest.raises(PlanError) as none:
        archs_from_capabilities([])
    assert "no GPUs" in none.value.message and "--archs" in none.value.message


def test_jobs_bounds():
    assert parse_jobs(6) == 6
    for bad in (0, -1, 257):
        with pytest.raises(PlanError, match="--jobs"):
            parse_jobs(bad)


def test_plan_names_every_path_and_command():
    plan = BuildPlan(nccl=NcclVersion.parse("v2.27.5"), archs=(Arch(6, 1), Arch(12, 0)), root="/srv/flodl")
    assert plan.library == "/srv/flodl/libtorch/nccl/builds/v2.27.5-sm61-sm120/lib/libnccl.so.2"
    assert plan.dockerfile == "/srv/flodl/libtorch/nccl/context/v2.27.5-sm61-sm120/Dockerfile.nccl.source"
    commands = plan.docker_commands()
    assert commands["build"] == ["docker", "build", "--tag", "fdl-nccl:v2.27.5-sm61-sm120", "--file",
                                 plan.dockerfile, plan.context_dir]
    assert commands["copy"][2] == "<container>:/opt/nccl/build/lib"
    assert command_line(commands["copy"]).startswith("docker cp <container>:/opt/nccl/build/lib /srv/flodl/")
    role = plan.role_vars()
    assert role["fdl_nccl_tag"] == "v2.27.5-1" and role["fdl_nccl_version"] == "2.27.5"
    assert role["fdl_nccl_output_dir"] == "/srv/flodl/libtorch/nccl/builds/v2.27.5-sm61-sm120"
    assert role["fdl_nccl_gencode"] == plan.gencode
    assert plan.to_dict()["estimated_minutes"] == [5, 15]
