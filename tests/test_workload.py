"""Workload specs and length laws."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvstab.errors import InvalidArgument
from kvstab.workload import PAPER_WORKLOADS, Fixed, Geometric, Uniform, parse_workload


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
