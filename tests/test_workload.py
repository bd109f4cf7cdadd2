"""Workload specs and length laws."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.workload import PAPER_WORKLOADS, Fixed, Geometric, Uniform, Workload, parse_workload


def test_paper_workloads() -> None:
    w = parse_workload("paper-2:1")
    assert w.s == Uniform(10, 2133) and w.o == Uniform(10, 1066)
    assert PAPER_WORKLOADS["paper-1:1"].max_total == 3200


def test_parse_independent_specs() -> None:
    w = parse_workload("s=U(1,100),o=geom(0.1,50)")
    assert w.s == Uniform(1, 100) and w.o == Geometric(0.1, 50)
    assert parse_workload("s = const(7) , o = U(2,3)").s == Fixed(7)
    v, p = Geometric(0.5, 4).support()
    assert list(v) == [1, 2, 3, 4] and np.isclose(p.sum(), 1) and p[0] > p[1]


def test_trace_specs(data_dir: Path) -> None:
    path = data_dir / "traces" / "AzureLLMInferenceTrace_code.csv"
    joint = parse_workload(f"trace({path})")
    assert not joint.independent and joint.max_total == int((joint.joint_s + joint.joint_o).max())
    ind = parse_workload(f"trace({path}),independent")
    assert ind.independent and ind.max_total == ind.max_s + ind.max_o


def test_sampling_is_seeded() -> None:
    w = parse_workload("paper-1:1")
    a = w.sample(np.random.default_rng(1), 100)
    b = w.sample(np.random.default_rng(1), 100)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert a[0].min() >= 10 and a[0].max() <= 1600


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("s=U(0,10),o=U(1,2)", r"U\(a, b\): a must be a positive integer, got '0'"),
        ("s=U(10,5),o=U(1,2)", "a <= b"),
        ("s=U(1,x),o=U(1,2)", "b must be an integer, got 'x'"),
        ("s=geom(1.5,10),o=U(1,2)", r"geom p must be a number in \(0, 1\]"),
        ("s=geom(nan,10),o=U(1,2)", "geom p must be a finite number"),
        ("s=const(-1),o=U(1,2)", "v must be a positive integer"),
        ("s=const(1e21),o=U(1,2)", "v is too large"),
        ("s=U(1,2e12),o=U(1,2)", "must be at most"),
        ("s=normal(1,2),o=U(1,2)", "cannot parse the law of s"),
        ("paper-3:1", "does not parse"),
        ("trace(/no/such/file.csv)", "no such file"),
    ],
)
def test_bad_specs(spec: str, msg: str) -> None:
    with pytest.raises(InvalidArgument, match=msg) as exc:
        parse_workload(spec)
    assert "\n" not in str(exc.value)


def test_huge_laws_are_laws_but_never_listed() -> None:
    """A law over 10¹² values is valid (the theory sums it in closed form, sampling
    needs no list), but nothing may enumerate its support."""
    import numpy as np

    for spec, span in (("s=U(1,1e12),o=U(1,2)", "1000000000000"), ("s=geom(0.5,1e9),o=U(1,2)", "1000000000")):
        w = parse_workload(spec)
        assert w.s is not None
        x = w.s.sample(np.random.default_rng(0), 1000)
        assert x.min() >= 1 and x.max() <= w.s.max
        with pytest.raises(InvalidArgument, match=f"ranges over {span} values"):
            w.s.support()


def _brute(w: Workload, limit: int) -> tuple[dict[tuple[int, int], float], float]:
    """The law given s + o <= limit by listing every pair with its probability."""
    assert w.s is not None and w.o is not None
    (vs, ps), (vo, po) = w.s.support(), w.o.support()
    pairs = {(int(a), int(b)): float(p * q) for a, p in zip(vs, ps) for b, q in zip(vo, po) if a + b <= limit}
    total = sum(pairs.values())
    return {k: v / total for k, v in pairs.items()}, total


def _law(w: Workload) -> dict[tuple[int, int], float]:
    assert w.joint_s is not None and w.joint_o is not None
    rows = list(zip(w.joint_s.tolist(), w.joint_o.tolist()))
    return {k: rows.count(k) / len(rows) for k in set(rows)}


@pytest.mark.parametrize("spec,limit", [("s=U(1,9),o=U(2,7)", 8), ("s=const(4),o=U(1,9)", 6), ("s=U(3,5),o=const(2)", 6)])
def test_conditioned_independent_law_is_exact(spec: str, limit: int) -> None:
    w = parse_workload(spec)
    law, p = w.conditioned(limit)
    want, p_want = _brute(w, limit)
    assert p == pytest.approx(p_want) and _law(law) == pytest.approx(want)
    assert law.max_total <= limit


def test_conditioned_empirical_marginals_keep_their_weights(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("s,o\n1,1\n1,2\n1,5\n3,2\n")  # s: 1 three times, 3 once; o: 1, 2, 2, 5
    w = parse_workload(f"trace({f}),independent")
    law, p = w.conditioned(4)
    want, p_want = _brute(w, 4)
    assert p == pytest.approx(p_want) and _law(law) == pytest.approx(want)


def test_conditioned_joint_law_keeps_the_rows_that_fit() -> None:
    w = Workload.joint([1, 5, 2, 9], [1, 1, 3, 9])
    law, p = w.conditioned(6)
    assert p == 0.75 and sorted(zip(law.joint_s.tolist(), law.joint_o.tolist())) == [(1, 1), (2, 3), (5, 1)]
    assert w.conditioned(18) == (w, 1.0)


@pytest.mark.parametrize("M,block", [(100, 1), (100, 16), (64, 16), (17, 16)])
def test_given_fit_is_the_law_of_requests_the_server_can_hold(M: int, block: int) -> None:
    params = ModelParams(M=M, chunk=8, block=block)
    law, _ = parse_workload("s=U(1,80),o=U(1,80)").given_fit(params)
    assert params.fits_total(law.max_total)
    assert not params.fits_total(block * (M // block) + 1)


def test_conditioning_is_refused_where_it_cannot_be_exact() -> None:
    with pytest.raises(InvalidArgument, match="no integer weights"):
        parse_workload("s=U(1,10),o=geom(0.1,100)").conditioned(50)
    with pytest.raises(InvalidArgument, match="no request"):
        parse_workload("s=U(10,20),o=U(10,20)").conditioned(19)
    with pytest.raises(InvalidArgument, match="weighted pairs"):
        parse_workload("s=U(1,200000),o=U(1,200000)").conditioned(100000)
