"""The server is one object: ModelParams carries b̄, and the proof's Setting and
vLLM's ReplayConfig are adapters built from it and giving it back."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import pytest

from kvstab.cli import flags
from kvstab.empirical.replay import ReplayConfig
from kvstab.errors import InvalidArgument
from kvstab.model import PAPER_BBAR, ModelParams
from kvstab.proofs.encoding import Setting


def test_bbar_is_a_validated_field_with_help() -> None:
    assert ModelParams().bbar == PAPER_BBAR
    assert ModelParams(bbar="0.5").bbar == 0.5  # validated like every value from a user
    assert "b̄" in ModelParams.help()["bbar"]
    for bad in (0.0, -1.0, math.inf, math.nan, True, "x"):
        with pytest.raises(InvalidArgument, match="b̄"):
            ModelParams(bbar=bad)  # type: ignore[arg-type]


def test_the_bbar_flag_is_derived_from_the_field() -> None:
    p = argparse.ArgumentParser()
    flags.add_server_arguments(p)
    assert flags.server_params(p.parse_args(["--bbar", "0.25", "--M", "1000"])) == ModelParams(M=1000, bbar=0.25)
    assert flags.server_params(p.parse_args([])).bbar == PAPER_BBAR
    q = argparse.ArgumentParser()
    flags.add_server_arguments(q, omit=("bbar",))
    assert not hasattr(q.parse_args([]), "bbar")


def test_replay_config_round_trips_through_model_params() -> None:
    cfg = ReplayConfig.for_capacity(1024, 16, max_num_batched_tokens=256, max_num_seqs=8)
    assert ReplayConfig.from_params(cfg.params()) == cfg
    server = ModelParams(M=1024, chunk=256, block=16, token_budget=256, max_num_seqs=8, bbar=0.02)
    assert replace(ReplayConfig.from_params(server).params(), bbar=0.02) == server
    assert ReplayConfig.from_params(server, max_model_len=512).max_model_len == 512


@pytest.mark.parametrize(
    "server,match",
    [
        (ModelParams(M=1000, chunk=256, block=16, token_budget=256, max_num_seqs=8), "multiple of the block"),
        (ModelParams(M=1024, chunk=256, block=16, token_budget=512, max_num_seqs=8), "token_budget == chunk"),
        (ModelParams(M=1024, chunk=256, block=16, max_num_seqs=8), "token_budget == chunk"),
        (ModelParams(M=1024, chunk=256, block=16, token_budget=256), "max_num_seqs"),
    ],
)
def test_a_server_vllm_cannot_be_is_refused(server: ModelParams, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        ReplayConfig.from_params(server)


def test_setting_is_built_from_model_params() -> None:
    server = ModelParams(M=4096, chunk=8, block=4, token_budget=64, max_num_seqs=3, bbar=0.5)
    fixed = Setting.from_params(server)
    assert fixed == Setting(M=4096, chunk=8, block=4, token_budget=64, max_num_seqs=3)
    assert fixed.params(4096) == replace(server, bbar=PAPER_BBAR)  # b̄ does not enter a slot's step
    assert Setting.from_params(server, symbolic_M=True) == replace(fixed, M=None)
