"""``kvstab tune`` and the memory accounting under it (:mod:`kvstab.kv_capacity`, :mod:`kvstab.fleet.tune`).

vLLM's own functions check the accounting in ``tests/empirical/test_kv_capacity_vs_vllm.py``;
here: the shipped config's shape, the formula's arithmetic, the forward search's choice against
its bounds, the verification on the fast engine (one short run), the inverse on the paper's
setting, and one line with exit 2 for every kind of bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstab.cli import main
from kvstab.errors import InvalidArgument
from kvstab.kv_capacity import GIB, gpu_spec, load_model_shape, sglang_capacity, vllm_capacity
from kvstab.theory import stability_report
from kvstab.workload import parse_workload

PAPER = ["--config", "llama-3-8b", "--gpu", "A100-40GB", "--workload", "paper-1:1", "--bbar", "0.0372",
         "--kv-cache-tokens", "131000", "--engine", "vllm"]  # fmt: skip


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_shipped_config_is_llama3_8b() -> None:
    shape = load_model_shape("llama-3-8b")
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert shape.weights_bytes == 8_030_261_248 * 2  # Llama-3-8B's published parameter count, bf16
    assert shape.is_llama3_8b


def test_config_without_kv_heads_or_head_dim_falls_back(tmp_path: Path) -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = load_model_shape(tmp_path)  # a folder holding config.json
    assert shape.kv_bytes_per_token == 2 * 2 * 4 * 16 * 4 and shape.weights_bytes is None


def test_vllm_formula_by_hand() -> None:
    shape, g = load_model_shape("llama-3-8b"), gpu_spec("A100-80GB")
    c = vllm_capacity(shape, g, 0.9, block_size=16, reserve_bytes=GIB)
    requested = -(-g.total_bytes * 9 // 10)  # ⌈total·0.9⌉
    assert c.available == requested - shape.weights_bytes - GIB
    assert c.num_blocks == c.available // (16 * 131_072) and c.M == (c.num_blocks - 1) * 16
    measured = vllm_capacity(shape, g, 0.9, available_bytes=40 * GIB)  # vLLM's logged 'Available KV cache memory'
    assert measured.num_blocks == 40 * GIB // (16 * 131_072)
    s = sglang_capacity(shape, g, 0.85)
    assert s.M == s.available // 131_072 and s.available < (g.total_bytes * 0.85 - shape.weights_bytes)


def test_forward_json_chooses_the_lowest_feasible_utilisation(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["tune", "--config", "llama-3-8b", "--gpu", "H100-80GB", "--bbar", "0.03", "--lambda", "7",
                        "--margin", "0.1", "--no-verify", "--json"], capsys)  # fmt: skip
    assert rc == 0, err
    d = json.loads(out)
    vllm, sgl = d["engines"]
    assert vllm["bounds"]["least_per_s"] * 0.9 >= 7
    assert vllm["command"].startswith("vllm serve llama-3-8b --gpu-memory-utilization ")
    assert sgl["command"].startswith("python -m sglang.launch_server --model-path llama-3-8b --mem-fraction-static ")
    assert sgl["capacity"]["max_total_num_tokens"] >= vllm["server"]["M"] or sgl["flags"]["mem_fraction_static"] == 0.95
    # one step lower on the grid would not carry λ with the margin
    util = vllm["flags"]["gpu_memory_utilization"]
    if util > 0.8:
        lower = round(util - 0.02, 2)
        rc, out, _ = run(["tune", "--config", "llama-3-8b", "--gpu", "H100-80GB", "--bbar", "0.03", "--engine",
                          "vllm", "--no-verify", "--json", "--from-flags",
                          f"--gpu-memory-utilization {lower} --max-num-batched-tokens "
                          f"{vllm['flags']['max_num_batched_tokens']} --max-num-seqs {vllm['flags']['max_num_seqs']}"],
                         capsys)  # fmt: skip
        assert json.loads(out)["bounds"]["least_per_s"] * 0.9 < 7 * 1.02


def test_done_when_both_engines_verified(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["tune", "--config", "llama-3-8b", "--gpu", "A100-80GB", "--lambda", "3", "--workload",
                        "paper-1:1", "--seeds", "2"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "vllm serve llama-3-8b" in out and "python -m sglang.launch_server" in out
    assert out.count("→ PASS") == 3  # vllm-v1 caching off and on, sglang
    assert "the shipped A100 profile" in out and "verdict: PASS" in out


def test_from_flags_reproduces_the_papers_mu(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["tune", *PAPER, "--prefix-caching", "off", "--seeds", "2", "--json", "--from-flags",
                        "vllm serve meta-llama/Meta-Llama-3-8B --max-num-batched-tokens 512"], capsys)  # fmt: skip
    assert rc == 0, err
    d = json.loads(out)
    paper = stability_report(parse_workload("paper-1:1"), __import__("kvstab").ModelParams())
    assert d["paper_mu_per_s"] == pytest.approx(paper.mu_per_s, rel=1e-12)  # M 131 000, ŝ 512, b̄ 0.0372: 3.262/s
    assert d["bounds"]["binding"] == "KV memory M"
    # the vllm-v1 model's λ* sits just under μ (its blocks and recompute cost a few percent)
    assert 0.85 * d["bounds"]["memory_per_s"] < d["critical_rate_per_s"] < 1.03 * d["bounds"]["memory_per_s"]


@pytest.mark.parametrize("argv", [
    ["--gpu", "A100-80GB", "--lambda", "3"],  # no model shape
    ["--config", "llama-3-8b", "--gpu", "B300", "--lambda", "3"],  # unknown GPU
    ["--config", "llama-3-8b", "--gpu", "H200", "--lambda", "3"],  # no profile for H200: needs --bbar
    ["--config", "llama-3-8b", "--gpu", "A100-80GB"],  # neither --lambda nor --from-flags
    ["--config", "llama-3-8b", "--gpu", "A100-80GB", "--from-flags", "--tensor-parallel-size 2", "--no-verify"],
    ["--config", "llama-3-8b", "--gpu", "A100-80GB", "--lambda", "3", "--kv-cache-tokens", "1000"],
    ["--kv-bytes-per-token", "131072", "--gpu", "A100-80GB", "--lambda", "3", "--bbar", "0.04"],  # weights unknown
    ["--config", "/nonexistent/config.json", "--gpu", "A100-80GB", "--lambda", "3"],
    ["--config", "llama-3-8b", "--gpu", "A100-80GB", "--lambda", "-1"],
    ["--config", "llama-3-8b", "--gpu", "L40S", "--bbar", "0.05", "--lambda", "1", "--workload",
     "s=U(100,300000),o=U(1,10)", "--no-verify"],  # no pool on the GPU holds the largest request
    ["--config", "llama-3-8b", "--gpu", "A100-80GB", "--bbar", "0.05", "--from-flags",
     "--num-gpu-blocks-override 100", "--no-verify"],  # the deployment's pool holds no paper-1:1 request
])  # fmt: skip
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["tune", *argv], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_config_field_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 32, "torch_dtype": "bfloat16"}))
    with pytest.raises(InvalidArgument, match="num_attention_heads"):
        load_model_shape(tmp_path / "config.json")


def test_infeasible_lambda_names_the_best_and_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = run(["tune", "--config", "llama-3-8b", "--gpu", "A100-80GB", "--lambda", "500", "--no-verify"],
                        capsys)  # fmt: skip
    assert rc == 2 and "above anything one A100-80GB can carry" in err and "replicas" in err


def test_plan_menu_uses_tunes_accounting(tmp_path: Path) -> None:
    from kvstab.fleet.plan import load_menu
    from kvstab.kv_capacity import vllm_reserve

    menu = tmp_path / "m.toml"
    menu.write_text('[[gpu]]\nname = "a"\ngpu = "A100-80GB"\nconfig = "llama-3-8b"\nmemory_utilisation = 0.92\n'
                    'block = 16\nbbar = 0.05\ncost_per_hour = 2\navailable = 1\n')  # fmt: skip
    (g,) = load_menu(menu)
    shape = load_model_shape("llama-3-8b")
    want = vllm_capacity(shape, gpu_spec("A100-80GB"), 0.92, block_size=16, reserve_bytes=vllm_reserve(shape, 2048, 256))
    assert g.M == want.M and g.block == 16
    menu.write_text('[[gpu]]\nname = "a"\ngpu = "B300"\nconfig = "llama-3-8b"\nbbar = 0.05\ncost_per_hour = 2\n'
                    'available = 1\n')  # fmt: skip
    with pytest.raises(InvalidArgument, match="unknown GPU 'B300'"):
        load_menu(menu)
