"""GPU catalog: datasheet numbers, aliases, errors, round trip."""

from __future__ import annotations

import pytest

from hetrl.errors import SpecError
from hetrl.spec.hardware import GPUType, gpu_aliases, gpu_catalog, gpu_type

# name: (bf16 dense TFLOPS, memory GB, memory GB/s, intra-node link, link GB/s per direction,
# node NIC Gbit/s, FP8 dense TFLOPS) -- the datasheet figures cited in hetrl/data/gpus.yaml.
# The paper's seven types keep the values they had before FP8 was added.
DATASHEET = {
    "A100-80GB": (312, 80, 2039, "nvlink", 300, 400, 0),
    "A100-40GB": (312, 40, 1555, "nvlink", 300, 400, 0),
    "H100": (989, 80, 3350, "nvlink", 450, 3200, 1979),
    "H200": (989, 141, 4800, "nvlink", 450, 3200, 1979),
    "L40S": (362, 48, 864, "pcie", 32, 400, 733),
    "L4": (121, 24, 300, "pcie", 32, 100, 242.5),
    "A10G": (70, 24, 600, "pcie", 32, 100, 0),
    # the GPUs of 2026's RL runs
    "H20": (148, 96, 4000, "nvlink", 450, 3200, 296),
    "B200": (2250, 180, 8000, "nvlink", 900, 3200, 4500),
    "GB200": (2500, 186, 8000, "nvlink", 900, 28800, 5000),
    "MI300X": (1307.4, 192, 5300, "nvlink", 448, 3200, 2614.9),
    "L20": (119.5, 48, 864, "pcie", 32, 200, 239),
    "RTX-4090": (165.2, 24, 1008, "pcie", 32, 100, 330.3),
}


def test_catalog_has_exactly_the_datasheet_types():
    assert set(gpu_catalog()) == set(DATASHEET)


def test_random_clusters_keep_to_the_papers_seven_types():
    from hetrl.spec.hardware import PAPER_GPU_TYPES
    from hetrl.spec.random_cluster import random_cluster

    assert tuple(gpu_catalog())[:7] == PAPER_GPU_TYPES
    cluster = random_cluster(0, num_nodes=64, num_regions=4)
    assert {d.gpu.name for d in cluster.devices} <= set(PAPER_GPU_TYPES)


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_catalog_numbers_match_datasheets(name):
    tflops, mem, hbm, link, link_gbps, nic, fp8 = DATASHEET[name]
    gpu = gpu_catalog()[name]
    assert (gpu.bf16_tflops, gpu.memory_gb, gpu.hbm_gbps) == (tflops, mem, hbm)
    assert (gpu.intra_link, gpu.intra_link_gbps, gpu.node_nic_gbps) == (link, link_gbps, nic)
    assert gpu.fp8_tflops == fp8 and gpu.has_fp8 == (fp8 > 0)
    assert gpu.source  # every entry cites its source


def test_a_gb200_node_is_one_nvl72_rack():
    from hetrl.spec.cluster import ClusterSpec

    rack = ClusterSpec.from_dict({"nodes": [{"gpu": "GB200", "count": 72}]})
    assert rack.num_devices == 72 and len(rack.nodes) == 1


@pytest.mark.parametrize("bad", [-1, "fast", True, 1e6])
def test_a_bad_fp8_peak_names_the_field(bad):
    with pytest.raises(SpecError, match=r"gpu\.fp8_tflops"):
        GPUType.from_dict({"name": "X", "bf16_tflops": 100, "memory_gb": 10, "hbm_gbps": 100,
                           "fp8_tflops": bad})


def test_derived_units_are_si():
    a100 = gpu_type("A100-80GB")
    assert a100.flops == 312e12
    assert a100.memory_gb == 80  # marketed
    assert a100.memory_bytes == 81920 * 2**20  # what the driver reports: 85.9e9 bytes
    assert gpu_type("L4").memory_bytes == 23034 * 2**20  # ECC-on GDDR: about its marketed GB
    assert a100.hbm_bytes_per_s == 2039e9


def test_alias_a100_is_the_80gb_part():
    assert gpu_aliases()["A100"] == "A100-80GB"
    assert gpu_type("A100") == gpu_catalog()["A100-80GB"]
    assert gpu_type("H100-80GB").name == "H100"


def test_unknown_gpu_names_field_and_lists_known_names():
    with pytest.raises(SpecError) as err:
        gpu_type("B300", field="nodes[3].gpu")
    assert err.value.field == "nodes[3].gpu"
    assert err.value.value == "B300"
    message = str(err.value)
    assert "nodes[3].gpu" in message and "unknown GPU type" in message
    for known in ("A100-80GB", "L40S", "L4", "A100"):
        assert known in message


def test_user_type_is_found_before_the_catalog():
    mine = GPUType("MyGPU", bf16_tflops=100, memory_gb=32, hbm_gbps=1000)
    assert gpu_type("MyGPU", extra=[mine]) is mine
    with pytest.raises(SpecError, match="MyGPU"):
        gpu_type("Nope", extra=[mine])  # the error lists user types too


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_from_dict_round_trip(name):
    gpu = gpu_catalog()[name]
    assert GPUType.from_dict(gpu.to_dict()) == gpu


def test_from_dict_defaults():
    gpu = GPUType.from_dict({"name": "X", "bf16_tflops": 10, "memory_gb": 16, "hbm_gbps": 500})
    assert (gpu.intra_link, gpu.intra_link_gbps, gpu.node_nic_gbps) == ("pcie", 32.0, 100.0)


GOOD = {"name": "X", "bf16_tflops": 100, "memory_gb": 48, "hbm_gbps": 900}


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("hbm_gbps", 2e9, "units: GB/s"),            # bytes/s where GB/s is expected
    ("bf16_tflops", 312e12, "units: TFLOPS"),     # FLOP/s where TFLOPS is expected
    ("memory_gb", 80e9, "units: GB"),             # bytes where GB is expected
    ("hbm_gbps", 0, "must be > 0"),
    ("memory_gb", -1, "must be > 0"),
    ("bf16_tflops", "fast", "must be a number"),
    ("intra_link", "infiniband", "must be one of"),
    ("intra_link_gbps", 0, "must be > 0"),
    ("name", "", "non-empty"),
])
def test_bad_values_are_rejected_with_the_field(key, value, problem):
    with pytest.raises(SpecError) as err:
        GPUType.from_dict({**GOOD, key: value}, field="gpu_types[0]")
    assert err.value.field == f"gpu_types[0].{key}"
    assert problem in str(err.value)


def test_missing_and_unknown_keys_are_rejected():
    with pytest.raises(SpecError) as err:
        GPUType.from_dict({"name": "X", "bf16_tflops": 1, "memory_gb": 1})
    assert err.value.field == "gpu.hbm_gbps" and "required" in str(err.value)
    with pytest.raises(SpecError) as err:
        GPUType.from_dict({**GOOD, "tflops": 1})
    assert err.value.field == "gpu.tflops" and "unknown key" in str(err.value)


@pytest.mark.parametrize("mib", [80, 80e9, 60000, -1, True, "81920"])
def test_a_driver_total_far_from_the_marketed_memory_is_refused(mib):
    with pytest.raises(SpecError, match="memory_mib"):
        GPUType.from_dict({"name": "X", "bf16_tflops": 100, "memory_gb": 80, "hbm_gbps": 100,
                           "memory_mib": mib})


def test_a_type_without_a_driver_total_uses_its_marketed_memory():
    gpu = GPUType.from_dict({"name": "X", "bf16_tflops": 100, "memory_gb": 80, "hbm_gbps": 100})
    assert gpu.memory_bytes == 80e9 and "memory_mib" not in gpu.to_dict()
