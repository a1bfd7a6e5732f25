"""Names and numbers as people type them (issue 40, item 2): GPU types and presets in any case,
close-match suggestions on a miss, exponent numbers without a dot read as numbers."""

from __future__ import annotations

import pytest

from hetrl.errors import SpecError, closest, finite_number
from hetrl.io import load_cluster, load_workload, parse_text, spec_name
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.hardware import GPUType, gpu_type
from hetrl.spec.model import model_preset
from tests.cli_helpers import assert_user_error, run


@pytest.mark.parametrize(("typed", "name"), [
    ("l40s", "L40S"), ("L40s", "L40S"), ("a100", "A100-80GB"), ("h100-80GB", "H100"),
    ("A100-80gb", "A100-80GB"), ("h200", "H200")])
def test_gpu_types_match_in_any_case(typed, name):
    assert gpu_type(typed).name == name


def test_a_user_type_matches_in_any_case_and_shadows_the_catalog():
    mine = GPUType("RTX-4090", 165.2, 24, 1008)
    assert gpu_type("rtx-4090", [mine]) is mine
    shadow = GPUType("L40S", 1.0, 1.0, 1.0)
    assert gpu_type("l40s", [shadow]) is shadow


def test_an_unknown_gpu_suggests_the_closest_names():
    with pytest.raises(SpecError) as info:
        ClusterSpec.from_dict({"nodes": [{"gpu": "H100"}, {"gpu": "L40"}]})
    assert info.value.field == "nodes[1].gpu"
    assert "unknown GPU type; known:" in str(info.value)
    assert "did you mean 'L40S'" in str(info.value)


def test_closest_ignores_case():
    assert closest("l40", ["L40S", "L4", "H100"])[:2] == ["L40S", "L4"]
    assert closest("zzz", ["L40S"]) == []


def test_nodes_store_the_catalog_name():
    c = ClusterSpec.from_dict({"nodes": [{"gpu": "l40s", "count": 2}]})
    assert c.nodes[0].gpu == "L40S" and c.gpu_counts() == {"L40S": 2}


def test_presets_match_in_any_case():
    assert load_cluster("A100X8").name == "a100x8"
    assert load_workload("Qwen3-4B-GRPO-Sync").name == "qwen3-4b-grpo-sync"
    assert spec_name("A100X8") == "a100x8"
    assert model_preset("LLAMA-3.1-8b").name == "Llama-3.1-8B"


def test_an_unknown_preset_suggests_the_closest(capsys):
    code, _, err = run(capsys, "describe", "paper64-single-regoin")
    assert_user_error(code, err, "did you mean 'paper64-single-region'")
    with pytest.raises(SpecError, match="did you mean 'Qwen3-8B'"):
        model_preset("qwen3-8")


def test_prices_name_gpu_types_in_any_case():
    c = ClusterSpec.from_dict({"nodes": [{"gpu": "L4"}], "prices": {"gpu_hour": {"l4": 0.5}}})
    assert c.price_list.gpu_hour("L4", "us-east-1") == 0.5


@pytest.mark.parametrize(("text", "value"), [
    ("1e-3", 1e-3), ("1E5", 1e5), ("2.5e9", 2.5e9), ("-1e+3", -1e3), ("5.3e3", 5300.0),
    (".5e1", 5.0)])
def test_exponent_numbers_read_as_numbers(text, value):
    data = parse_text(f"x: {text}\n", is_json=False)
    assert data["x"] == value and isinstance(data["x"], float)


def test_plain_numbers_and_strings_are_unchanged():
    data = parse_text("a: 12\nb: 1.5\nc: '1e-3'\nd: 1e\ne: e5\nf: 1_000\ng: abc\n", is_json=False)
    assert data == {"a": 12, "b": 1.5, "c": "1e-3", "d": "1e", "e": "e5", "f": 1000, "g": "abc"}
    assert isinstance(data["a"], int)


def test_a_cluster_file_takes_exponent_bandwidths(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nodes:\n  - {gpu: L4, region: a}\n  - {gpu: L4, region: b}\n"
                    "region_links:\n  - {a: a, b: b, latency_ms: 5, bandwidth_gbps: 1e-3}\n")
    c = load_cluster(path)
    assert c.region_links[0].bandwidth_gbps == pytest.approx(1e-3)


def test_a_quoted_number_says_why_it_is_refused():
    with pytest.raises(SpecError) as info:
        finite_number("bandwidth_gbps", "1e-3")
    assert "not the string '1e-3'" in str(info.value) and "without quotes" in str(info.value)
    with pytest.raises(SpecError, match="must be a number$"):
        finite_number("x", "fast")
