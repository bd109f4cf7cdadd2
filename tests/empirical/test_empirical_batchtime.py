"""The A100 profile oracle and the cvxpy batch-time fit (no vLLM needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from kvstab.arrivals import poisson_arrivals
from kvstab.empirical.batchtime import BatchTimeModel, fit_batch_time, load_profile
from kvstab.empirical.replay import ReplayConfig, StepLog, replay_model
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.workload import parse_workload


@pytest.fixture(scope="module")
def profile(data_dir: Path):  # noqa: ANN201 - an A100Profile
    return load_profile(str(data_dir / "profiles" / "a100-llama-3-8b"))


@pytest.fixture(scope="module")
def log() -> StepLog:
    w = parse_workload("s=U(10,1200),o=U(10,400)")
    cfg = ReplayConfig.for_capacity(32_768, 16, max_num_batched_tokens=512, max_num_seqs=256)
    return replay_model(poisson_arrivals(w, 0.3, ModelParams(bbar=1.0), 1200, seed=1), cfg, 1200)


def _only(log: StepLog, **cols: int) -> StepLog:
    """A one-step log with the given composition (other columns 0)."""
    zero = {f.name: np.zeros(1, dtype=np.int64) for f in dataclasses.fields(StepLog) if f.name not in ("source", "config", "wall_s")}
    zero.update({k: np.array([v], dtype=np.int64) for k, v in cols.items()})
    return StepLog(source="test", config=log.config, **zero)


def test_linear_operators_match_the_data_readme(profile, log: StepLog) -> None:  # noqa: ANN001
    # README: linear layers ≈ 9.7 ms for 1 token and 34.6 ms for 512 (32 layers)
    one = profile.step_times(_only(log, prefill_tokens=1, prefill_reqs=1, tokens=1))[0]
    big = profile.step_times(_only(log, prefill_tokens=512, prefill_reqs=1, prefill_sq=512 * 512, tokens=512))[0]
    lin_one = one - 32 * (profile.prefill_coef[0] + profile.prefill_coef[1] + profile.prefill_coef[3]) / 1e3
    assert lin_one == pytest.approx(9.7e-3, rel=0.03)
    assert big > lin_one and big == pytest.approx(34.6e-3, rel=0.15)


def test_decode_attention_reads_about_8ms_per_100k_tokens(profile) -> None:  # noqa: ANN001
    per_token_ms = 32 * profile.decode_coef[1]
    assert per_token_ms * 100_000 == pytest.approx(8.0, rel=0.15)
    assert profile.decode_error[0] < 0.15


def test_fit_recovers_a_known_model(log: StepLog) -> None:
    truth = BatchTimeModel(a=0.010, b=40e-6, c=0.0, d=90e-9)  # c = 0: the fit must not go negative
    model, rep = fit_batch_time([log], [truth.times(log)])
    assert model.c >= 0
    for name in ("a", "b", "d"):
        assert getattr(model, name) == pytest.approx(getattr(truth, name), rel=1e-3)
    assert model.c < 1e-8
    assert rep.test_rel_rmse < 1e-3 and rep.test_steps > 0


def test_fit_to_the_profile_reports_its_error(profile, log: StepLog) -> None:  # noqa: ANN001
    model, rep = fit_batch_time([log], [profile.step_times(log)])
    assert min(model.a, model.b, model.c, model.d) >= 0
    assert 0 < rep.test_rel_rmse < 0.10
    assert abs(rep.test_total_rel) < 0.02
    # the fitted model is a usable cost model for a replay
    t = model.times(log)
    assert t.shape == (log.steps,) and (t[log.tokens > 0] > 0).all()


def test_step_times_accept_a_constant_or_a_model(log: StepLog) -> None:
    assert (log.step_times(0.0372) == 0.0372).all()
    m = BatchTimeModel(0.01, 0.0, 0.0, 0.0)
    assert (log.step_times(m)[log.tokens > 0] == 0.01).all()
    with pytest.raises(InvalidArgument):
        log.step_times(0.0)


def test_bad_profile_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="lacks mlp.csv"):
        load_profile(str(tmp_path))
    for f in ("mlp.csv", "attention_decode_sampled_tp1.csv", "attention_prefill_sampled_tp1.csv"):
        (tmp_path / f).write_text("a,b\n1,2\n")
    with pytest.raises(InvalidArgument, match="no tensor-parallel-1 rows"):
        load_profile(str(tmp_path))
