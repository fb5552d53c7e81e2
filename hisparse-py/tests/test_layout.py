"""Layout planning from Python is the CLI's plan, field for field."""

import inspect
import json
import subprocess

import pytest

import hisparse


def cli_json(cli: str, *args: str) -> dict:
    return json.loads(subprocess.check_output([cli, "layout", "--json", *args], text=True))


CASES = [
    ({}, []),
    (
        {"preset": "glm-5", "gpu_mem": 40 << 30, "host_mem": 256 << 30, "max_model_len": 32768},
        ["--preset", "glm-5", "--gpu-mem", "40GiB", "--host-mem", "256GiB", "--max-model-len", "32768"],
    ),
    (
        {"preset": "deepseek-v4", "max_model_len": 65536},
        ["--preset", "deepseek-v4", "--max-model-len", "65536"],
    ),
    (
        {"device_buffer_size": 8192, "max_query_len": 2, "max_model_len": 200000},
        ["--device-buffer-size", "8192", "--max-query-len", "2", "--max-model-len", "200000"],
    ),
]


@pytest.mark.parametrize("kwargs,flags", CASES)
def test_layout_equals_the_cli_json(cli, kwargs, flags):
    layout = hisparse.plan_layout(**kwargs)
    assert layout.to_dict() == cli_json(cli, *flags)
    assert json.loads(layout.to_json()) == layout.to_dict()


def test_deepseek_v32_reference_numbers():
    layout = hisparse.plan_layout("deepseek-v3.2", gpu_mem=80 * hisparse.GiB, host_mem=512 * hisparse.GiB)
    assert (layout.bytes_per_block, layout.host_block_stride) == (545792, 2561024)
    # 512 GiB holds the host pool and the indexer host cache: 2,561,024 + 515,328 B a block.
    assert (layout.num_gpu_blocks, layout.host_num_blocks) == (157384, 178703)
    assert layout.host_bytes_per_block == 2561024 + 515328
    assert layout.indexer_host_cache_bytes == 178703 * 515328
    assert layout.host_pool_bytes + layout.indexer_host_cache_bytes <= 512 * hisparse.GiB
    assert layout.device_buffer_size == 4096 and layout.hot_blocks_per_request == 64
    assert len(layout.index_groups) == 61
    assert layout.index_groups[60] == {"leader": 60, "layers": [60], "bucket": 5}
    assert layout.layer_offset(13) == (1, 41984)
    assert layout.host_layer_offset(1) == layout.host_num_blocks * 64 * 656
    cap = layout.capacity(32768)
    assert (cap["all_on_gpu_max"], cap["hisparse_max"]) == (43, 173)


def test_a_model_description_and_its_first_layers(cli):
    text = subprocess.check_output([cli, "layout", "--preset", "glm-5", "--print-model"], text=True)
    full = hisparse.plan_layout(model_json=text)
    assert full.to_dict() == hisparse.plan_layout("glm-5").to_dict()
    four = hisparse.plan_layout(model_json=text, layers=4)
    assert len(four.to_dict()["groups"][0]["layers"]) == 4


def test_json_round_trip():
    layout = hisparse.plan_layout("glm-5", max_model_len=16384)
    again = hisparse.Layout.from_json(layout.to_json())
    assert again.to_dict() == layout.to_dict()
    edited = layout.to_dict()
    edited["bytes_per_block"] += 1
    with pytest.raises(hisparse.InvalidArgumentError):
        hisparse.Layout.from_json(json.dumps(edited))


@pytest.mark.parametrize(
    "kwargs,says",
    [
        ({"preset": "nope"}, "unknown preset"),
        ({"host_mem": 1 << 20}, "host"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"device_buffer_size": 100000}, "device_buffer_size"),
        ({"layers": 1000}, "layers"),
        ({"model_json": "{not json"}, "model description"),
    ],
)
def test_bad_inputs_are_typed_errors(kwargs, says):
    with pytest.raises(hisparse.InvalidArgumentError) as e:
        hisparse.plan_layout(**kwargs)
    assert e.value.kind == "invalid argument"
    assert says in e.value.message, e.value.message
    assert isinstance(e.value, hisparse.HiSparseError)


def test_capacity_says_whether_one_requests_prefill_fits():
    # 4 GiB holds a 128K request's HiSparse decode but not its prefill (the whole context on the GPU).
    layout = hisparse.plan_layout("deepseek-v3.2", gpu_mem=4 * hisparse.GiB)
    d = layout.to_dict()
    assert [c["prefill_fits"] for c in d["capacity"]] == [True, True, False]
    assert d["capacity"][2]["prefill_gpu_blocks"] == 7 * 2048
    assert d["max_prefill_context"] == 71936
    assert d["warnings"][0]["kind"] == "max_model_len_prefill_never_fits"
    assert d["warnings"][0]["max_prefill_context"] == 71936
    assert layout.capacity(131072)["prefill_fits"] is False
    assert hisparse.plan_layout("deepseek-v3.2").to_dict()["warnings"] == []


def test_the_defaults_python_shows_are_the_defaults():
    """The signature's defaults (written out for Python) are the ones a call without them gets."""
    params = inspect.signature(hisparse.plan_layout).parameters
    shown = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    assert shown["max_model_len"] == 131072 and shown["gpu_mem"] == 80 * hisparse.GiB
    assert hisparse.plan_layout(**shown).to_dict() == hisparse.plan_layout().to_dict()
    coord = inspect.signature(hisparse.Coordinator).parameters
    assert coord["max_running"].default == 256 and coord["reclaim_min_blocks"].default == 64
    rt = inspect.signature(hisparse.Runtime).parameters
    assert rt["worker"].default == 0 and rt["stats_every"].default == 1
