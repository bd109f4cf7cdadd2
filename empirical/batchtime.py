"""Batch time: an A100 / Llama-3-8B profile as a step-time oracle, and a fitted linear model.

The profile (``kvstab/data/profiles/a100-llama-3-8b/``, from microsoft/vidur,
MIT) gives per-layer GPU kernel times.  :class:`A100Profile` turns it into the
time of one step of a given composition:

* token-linear operators (norms, QKV/O projections, RoPE, MLP, residual adds)
  depend on the step's token count ``N`` only: the sum of their per-layer
  median times, interpolated in ``N`` and multiplied by 32 layers, plus the
  embedding once;
* decode attention reads every decoding request's KV: a per-layer surrogate
  ``α + β·Σ context`` fitted (non-negative, relative error) to the sampled
  decode table — the profile samples ``(kv_cache_size, batch_size)`` sparsely;
* prefill attention of a chunk of ``n`` tokens over ``c`` cached ones: a
  per-layer surrogate ``α + β·n + γ·n·c + δ·n²`` fitted the same way.  The
  ``attn_kv_cache_save`` column is left out (the data README flags it as
  anomalous in prefill rows).

What the profile leaves out, and so every number here: the LM head and
sampling, the engine's CPU time (scheduling, detokenisation, Python), and
CUDA-graph / launch effects.  Real steps are longer.

:class:`BatchTimeModel` is the issue's model
``b(batch) = a + b·prefill_tokens + c·decode_tokens + d·kv_tokens_attended``,
fitted with cvxpy under non-negative coefficients to step times (the profile
oracle on recorded steps, or measured step times).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.steplog import StepLog

__all__ = ["A100Profile", "load_profile", "BatchTimeModel", "FitReport", "fit_batch_time", "features"]

FloatArray = npt.NDArray[np.float64]

LAYERS = 32
_LINEAR_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
_FILES = ("mlp.csv", "attention_decode_sampled_tp1.csv", "attention_prefill_sampled_tp1.csv")


def _nonneg_relative_fit(X: FloatArray, y: FloatArray) -> FloatArray:
    """Non-negative coefficients minimising the squared *relative* error ``Σ ((Xc − y)/y)²`` (cvxpy)."""
    import cvxpy as cp

    if np.any(y <= 0):
        raise InvalidArgument("batch times to fit must be positive")
    scale = np.maximum(np.abs(X).max(axis=0), 1e-300)  # columns of very different size: condition first
    A = (X / scale) / y[:, None]
    c = cp.Variable(X.shape[1], nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(A @ c - 1.0)))
    prob.solve()
    if c.value is None or prob.status not in ("optimal", "optimal_inaccurate"):
        raise InvalidArgument(f"the batch-time fit did not converge (cvxpy status {prob.status})")
    return np.maximum(np.asarray(c.value, dtype=np.float64), 0.0) / scale


def _rel_errors(pred: FloatArray, y: FloatArray) -> tuple[float, float]:
    r = (pred - y) / y
    return float(np.sqrt(np.mean(r**2))), float(np.max(np.abs(r)))


@dataclass(frozen=True, slots=True, eq=False)
class A100Profile:
    """The profile as a step-time oracle (milliseconds inside, seconds out)."""

    tokens: FloatArray  # N grid of the linear-operator table
    linear_ms: FloatArray  # 32 layers of linear operators + embedding, at each N
    decode_coef: FloatArray  # per layer: α, β·(Σ context)
    prefill_coef: FloatArray  # per layer: α, β·n, γ·n·c, δ·n²
    decode_error: tuple[float, float]  # surrogate relative error: RMS, max
    prefill_error: tuple[float, float]
    source: str

    def step_times(self, log: StepLog) -> FloatArray:
        """Seconds of each step of ``log`` by the profile."""
        n = (log.prefill_tokens + log.decode_tokens).astype(np.float64)
        if n.max(initial=0) > self.tokens[-1]:
            raise InvalidArgument(
                f"a step of {int(n.max())} tokens is beyond the profile's largest batch ({int(self.tokens[-1])})"
            )
        lin = np.where(n > 0, np.interp(n, self.tokens, self.linear_ms), 0.0)
        d = self.decode_coef
        dec = np.where(log.decode_tokens > 0, d[0] + d[1] * log.decode_ctx, 0.0)
        p = self.prefill_coef
        pre = p[0] * log.prefill_reqs + p[1] * log.prefill_tokens + p[2] * log.prefill_ctx + p[3] * log.prefill_sq
        return (lin + LAYERS * (dec + pre)) / 1000.0

    # a BatchTimeModel-like face, so a profile can be passed wherever a cost model is
    times = step_times


def _read(path: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise InvalidArgument(f"cannot read profile file {path}: {exc.strerror}") from None


def _column(rows: list[dict[str, str]], name: str, path: str) -> FloatArray:
    try:
        return np.asarray([float(r[name]) if r[name] != "" else np.nan for r in rows], dtype=np.float64)
    except KeyError:
        raise InvalidArgument(f"profile file {path} has no column {name!r}") from None
    except ValueError as exc:
        raise InvalidArgument(f"profile file {path}: column {name!r}: {exc}") from None


def load_profile(directory: str) -> A100Profile:
    """Read the vidur A100 / Llama-3-8B profile folder and build the oracle."""
    for f in _FILES:
        if not os.path.isfile(os.path.join(directory, f)):
            raise InvalidArgument(f"profile folder {directory} lacks {f} (expected {', '.join(_FILES)})")
    mlp_path = os.path.join(directory, _FILES[0])
    mlp = [r for r in _read(mlp_path) if r.get("num_tensor_parallel_workers") == "1"]
    if not mlp:
        raise InvalidArgument(f"profile file {mlp_path} has no tensor-parallel-1 rows")
    N = _column(mlp, "num_tokens", mlp_path)
    per_layer = sum(np.nan_to_num(_column(mlp, f"time_stats.{op}.median", mlp_path)) for op in _LINEAR_OPS)
    emb = np.nan_to_num(_column(mlp, "time_stats.emb.median", mlp_path))
    order = np.argsort(N)
    N, total = N[order], (LAYERS * per_layer + emb)[order]
    N, first = np.unique(N, return_index=True)  # one row per N
    total = total[first]

    dec_path = os.path.join(directory, _FILES[1])
    dec = _read(dec_path)
    kv, bs = _column(dec, "kv_cache_size", dec_path), _column(dec, "batch_size", dec_path)
    td = _column(dec, "attn_decode_median_ms", dec_path)
    Xd = np.c_[np.ones_like(td), bs * kv]
    dc = _nonneg_relative_fit(Xd, td)

    pre_path = os.path.join(directory, _FILES[2])
    pre = _read(pre_path)
    n, c = _column(pre, "prefill_chunk_size", pre_path), _column(pre, "kv_cache_size", pre_path)
    tp = _column(pre, "attn_prefill_median_ms", pre_path)
    Xp = np.c_[np.ones_like(tp), n, n * c, n * n]
    pc = _nonneg_relative_fit(Xp, tp)
    return A100Profile(
        tokens=N,
        linear_ms=total,
        decode_coef=dc,
        prefill_coef=pc,
        decode_error=_rel_errors(Xd @ dc, td),
        prefill_error=_rel_errors(Xp @ pc, tp),
        source=directory,
    )


def features(log: StepLog) -> FloatArray:
    """The fitted model's design matrix: ``1, prefill_tokens, decode_tokens, kv_tokens_attended``."""
    return np.c_[
        np.ones(log.steps),
        log.prefill_tokens.astype(np.float64),
        log.decode_tokens.astype(np.float64),
        log.kv_attended.astype(np.float64),
    ]


@dataclass(frozen=True, slots=True)
class BatchTimeModel:
    """``b(batch) = a + b·prefill_tokens + c·decode_tokens + d·kv_tokens_attended`` (seconds)."""

    a: float
    b: float
    c: float
    d: float

    def times(self, log: StepLog) -> FloatArray:
        """Seconds of each step of ``log`` (an idle step costs nothing)."""
        t = features(log) @ np.array([self.a, self.b, self.c, self.d])
        return np.where(log.tokens > 0, t, 0.0)

    def describe(self) -> str:
        """The model with its coefficients in milliseconds."""
        return (
            f"b = {1e3 * self.a:.3f} ms + {1e6 * self.b:.3f} µs·prefill + {1e6 * self.c:.3f} µs·decode "
            f"+ {1e9 * self.d:.3f} ns·kv_attended"
        )


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well the fitted model reproduces the step times it was fitted to, and held-out ones."""

    train_steps: int
    test_steps: int
    train_rel_rmse: float
    test_rel_rmse: float
    test_max_rel: float
    test_total_rel: float  # relative error of the summed time of the held-out steps


def fit_batch_time(
    logs: list[StepLog], times: list[FloatArray], test_fraction: float = 0.3, seed: int = 0
) -> tuple[BatchTimeModel, FitReport]:
    """Fit :class:`BatchTimeModel` to the busy steps of ``logs`` with step times ``times``.

    A random ``test_fraction`` of the steps is held out to report the error.
    """
    if len(logs) != len(times) or not logs:
        raise InvalidArgument("fit_batch_time needs one array of step times per log")
    X = np.concatenate([features(g)[g.tokens > 0] for g in logs])
    y = np.concatenate([np.asarray(t, dtype=np.float64)[g.tokens > 0] for g, t in zip(logs, times)])
    if X.shape[0] < 10:
        raise InvalidArgument(f"need at least 10 busy steps to fit a batch-time model, got {X.shape[0]}")
    if not 0 < test_fraction < 1:
        raise InvalidArgument(f"test fraction must be in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    test: npt.NDArray[np.bool_] = np.asarray(rng.random(X.shape[0]) < test_fraction)
    train = np.logical_not(test)
    coef = _nonneg_relative_fit(X[train], y[train])
    model = BatchTimeModel(*(float(v) for v in coef))
    tr_rms, _ = _rel_errors(X[train] @ coef, y[train])
    te_rms, te_max = _rel_errors(X[test] @ coef, y[test])
    total = float((X[test] @ coef).sum() / y[test].sum() - 1.0)
    n_test = int(np.count_nonzero(test))
    return model, FitReport(X.shape[0] - n_test, n_test, tr_rms, te_rms, te_max, total)
