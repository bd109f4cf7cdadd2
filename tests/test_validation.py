"""One validation module: the same value is accepted or refused the same way everywhere."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from kvstab import validation as v
from kvstab.cli.flags import add_server_arguments, server_params
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, Request


@pytest.mark.parametrize("value", [4, 4.0, np.int64(4), np.int32(4), "4", "4.0", "4e0", " 4 ", "0_4"])
def test_positive_int_accepts_every_spelling_of_an_integer(value: object) -> None:
    assert v.positive_int("x", value) == 4


@pytest.mark.parametrize("value", [True, False, 0, -1, 4.5, "4.5", "four", float("nan"), float("inf"), "nan", None, [4]])
def test_positive_int_refuses_with_one_line_naming_the_value(value: object) -> None:
    with pytest.raises(InvalidArgument) as exc:
        v.positive_int("the thing", value)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("the thing must be") and repr(value) in msg


@pytest.mark.parametrize("value", ["1e23", 1e23, 2**41, "1e999999", "9" * 400])
def test_huge_values_are_refused_not_overflowed(value: object) -> None:
    with pytest.raises(InvalidArgument, match="too large|at most"):
        v.positive_int("M", value)


def test_floats_are_finite_and_bounded() -> None:
    assert v.positive_float("r", "1e-3") == 1e-3
    for bad in ("0", "-1", "inf", "nan", "1e400", True):
        with pytest.raises(InvalidArgument):
            v.positive_float("r", bad)
    with pytest.raises(InvalidArgument, match="at most"):
        v.positive_float("r", 1e300, maximum=v.MAX_RATE)
    assert v.fraction("w", 0) == 0.0
    with pytest.raises(InvalidArgument):
        v.fraction("w", 1)
    assert v.unit_fraction("rho", 1) == 1.0
    with pytest.raises(InvalidArgument):
        v.unit_fraction("rho", 0)
    with pytest.raises(InvalidArgument, match="non-negative"):
        v.nonneg_int("seed", -1)


def test_model_types_use_the_same_checks() -> None:
    assert ModelParams(M=np.int64(100), chunk=4.0).M == 100
    with pytest.raises(InvalidArgument, match="at most"):
        ModelParams(M=10**23)
    with pytest.raises(InvalidArgument):
        Request(s=True, o=1)


def test_server_flags_are_derived_from_model_params() -> None:
    p = argparse.ArgumentParser()
    add_server_arguments(p)
    args = p.parse_args([])
    assert server_params(args) == ModelParams()
    args = p.parse_args(["--M", "1e4", "--chunk", "64", "--token-budget", "256", "--max-num-seqs", "8", "--block", "16"])
    assert server_params(args) == ModelParams(M=10_000, chunk=64, block=16, token_budget=256, max_num_seqs=8)
    assert args.bbar == pytest.approx(0.0372)
    helps = {a.dest: a.help for a in p._actions}
    assert "KV capacity" in (helps["M"] or "")


def test_server_flags_refuse_bad_values_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="kvstab x")
    add_server_arguments(p, defaults={"M": None}, omit=("g",))
    assert p.parse_args([]).M is None
    for bad in (["--M", "1e23"], ["--chunk", "0"], ["--bbar", "nan"], ["--max-num-seqs", "x"]):
        with pytest.raises(SystemExit) as exc:
            p.parse_args(bad)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "must be" in err or "too large" in err
