"""Real load generators against ``kvstab serve --emulate``, and their own result files imported.

Each client runs unmodified over localhost with a word-level tokenizer written
locally (:func:`kvstab.live.tokenizer.write_tokenizer`: one token per word, as
the emulator counts), so the lengths in its result file are the lengths the
emulator served.  ``kvstab bench --import`` then reads the client's file, and
what it reports is checked against the emulator's ground truth: the workload
(``E[g]``) exactly, the throughput within the 15 % the harness's own test allows
(``docs/live.md``), and so ``measured / μ`` with ``μ`` from the emulator's own
``M`` and ``b̄``.

Clients come from ``scripts/install-test-tools.sh``: ``vllm bench serve`` from
vLLM (plus ``watchfiles``, which its CLI imports), AIPerf and GuideLLM each in a
virtual environment of its own under ``<venv>/clients/NAME`` (their pins clash
with vLLM's).  A missing client is a skip, or a failure where the suite must
have it: ``KVSTAB_REQUIRE_VLLM=1`` for vLLM's, ``KVSTAB_REQUIRE_CLIENTS=1`` for
AIPerf and GuideLLM (unset, it follows ``KVSTAB_REQUIRE_VLLM``, since one
install script brings all three).  A client binary elsewhere is named by
``KVSTAB_AIPERF`` / ``KVSTAB_GUIDELLM``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvstab.cli import main
from kvstab.live.emulator import EmulatorConfig
from kvstab.live.server import ServerHandle, start_in_thread
from kvstab.live.tokenizer import write_tokenizer
from kvstab.model import ModelParams
from kvstab.steplog import ReplayConfig
from kvstab.theory import stability_report
from kvstab.workload import Workload

#: requests per client run: enough to saturate M = 1024 for a second or two, few enough to stay cheap
N = 30
CHUNK, BLOCK = 256, 16
#: the harness's own tolerance on the completion rate (docs/live.md)
RATE_TOLERANCE = 0.15


def _required(switch: str) -> bool:
    if switch == "KVSTAB_REQUIRE_CLIENTS" and switch not in os.environ:
        return os.environ.get("KVSTAB_REQUIRE_VLLM") == "1"
    return os.environ.get(switch) == "1"


def _missing(what: str, switch: str) -> None:
    if _required(switch):
        pytest.fail(f"{switch}=1 but {what} (scripts/install-test-tools.sh installs it)", pytrace=False)
    pytest.skip(f"{what} (scripts/install-test-tools.sh installs it; {switch}=1 turns this skip into a failure)")


def _client(name: str) -> Path:
    """The client's executable: ``KVSTAB_<NAME>``, else ``<venv>/clients/<name>/bin/<name>``, else on PATH."""
    given = os.environ.get(f"KVSTAB_{name.upper()}")
    for cand in (given, Path(sys.prefix) / "clients" / name / "bin" / name, shutil.which(name)):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    _missing(f"{name} is not installed", "KVSTAB_REQUIRE_CLIENTS")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("tokenizers") is None:
        _missing("the tokenizers package is not installed (the clients' tokenizer is written with it)",
                 "KVSTAB_REQUIRE_CLIENTS")
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture()
def server() -> Iterator[ServerHandle]:
    # M = 1024 tokens holds about eight requests of 64 + 64: N of them arriving at once saturate it
    vllm = ReplayConfig.for_capacity(1024, BLOCK, max_num_batched_tokens=CHUNK)
    h = start_in_thread(EmulatorConfig(server=replace(vllm.params(), bbar=0.0372), speedup=20.0, scheduler="model"))
    yield h
    h.stop()


def _run(cmd: list[str | Path], cwd: Path, **env_extra: str) -> None:
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", **env_extra}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _check_import(
    h: ServerHandle, result: Path, capsys: pytest.CaptureFixture[str], *flags: str
) -> dict[str, object]:
    """Import ``result`` with the emulator's own M and b̄ and check it against the emulator's ground truth."""
    assert h.emulator is not None
    truth = h.emulator.truth
    served = truth.served[-N:]  # a client's warm-up request, if any, came first
    s = np.array([x[0] for x in served])
    o = np.array([x[1] for x in served])
    bbar = truth.bbar()
    params = ModelParams(M=truth.M, chunk=CHUNK, block=BLOCK, bbar=bbar)
    mu = stability_report(Workload.joint(s, o), params).mu_per_s
    capsys.readouterr()
    assert main(["bench", "--import", str(result), "--M", str(truth.M), "--bbar", repr(bbar), "--chunk", str(CHUNK),
                 "--block", str(BLOCK), "--json", "--out", "", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    # GuideLLM may close its benchmark with a request still in flight on a loaded machine (incomplete)
    assert out["completed"] is None or N - 2 <= out["completed"] <= N
    # the file's lengths are what the emulator served, so E[g] and μ agree exactly
    assert out["mu_per_s"] == pytest.approx(mu, rel=1e-9)
    # the client's rate is the emulator's completions from the first arrival to the last completion
    rate = N / (max(truth.completion_times[-N:]) - min(x[2] for x in served))
    assert out["throughput_per_s"] == pytest.approx(rate, rel=RATE_TOLERANCE)
    assert out["measured_over_mu"] == pytest.approx(rate / mu, rel=RATE_TOLERANCE)
    print(f"{out['tool']}: imported {out['throughput_per_s']:.3f} req/s, emulator {rate:.3f} req/s; μ {mu:.3f} "
          f"(import {out['mu_per_s']:.3f}); measured/μ {out['measured_over_mu']:.3f} vs {rate / mu:.3f}")
    return out


def test_vllm_bench_serve_runs_against_the_emulator_and_its_file_imports(
    server: ServerHandle, tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for module in ("vllm", "watchfiles"):
        if importlib.util.find_spec(module) is None:
            _missing(f"{module} is not installed (vllm bench serve needs it)", "KVSTAB_REQUIRE_VLLM")
    _run([sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
          "--base-url", server.url, "--endpoint", "/v1/completions", "--model", "kvstab-emulator",
          "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", "64",
          "--random-output-len", "64", "--random-range-ratio", "0.5", "--num-prompts", str(N),
          "--request-rate", "inf", "--ignore-eos", "--seed", "1", "--disable-tqdm",
          "--save-result", "--save-detailed", "--result-dir", tmp_path, "--result-filename", "vllm.json"], tmp_path)
    out = _check_import(server, tmp_path / "vllm.json", capsys)
    assert out["tool"] == "vllm bench serve"


def test_aiperf_runs_against_the_emulator_and_its_export_imports(
    server: ServerHandle, tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    aiperf = _client("aiperf")
    _run([aiperf, "profile", "--model", "kvstab-emulator", "--url", server.url, "--endpoint-type", "completions",
          "--streaming", "--tokenizer", tokenizer, "--synthetic-input-tokens-mean", "64",
          "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", "64", "--output-tokens-stddev", "0",
          "--extra-inputs", "ignore_eos:true", "--extra-inputs", "min_tokens:64", "--request-count", str(N),
          "--request-rate", "1000", "--random-seed", "1", "--ui-type", "none", "--workers-max", "1",
          "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", tmp_path / "aiperf"], tmp_path)
    out = _check_import(server, tmp_path / "aiperf" / "profile_export_aiperf.json", capsys)
    assert out["tool"] == "aiperf"


def test_guidellm_runs_against_the_emulator_and_its_report_imports(
    server: ServerHandle, tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    guidellm = _client("guidellm")
    report = tmp_path / "benchmarks.json"
    _run([guidellm, "run", "--backend",
          f"kind=openai_http,target={server.url},model=kvstab-emulator,request_format=/v1/completions,http2=false",
          "--profile", "kind=poisson,rate=1000", "--constraint", f"kind=max_requests,count={N}",
          "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=64",
          "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--output", f"kind=json,path={report}",
          "--disable-progress"], tmp_path, GUIDELLM__MAX_WORKER_PROCESSES="1")  # one worker starts fastest
    out = _check_import(server, report, capsys)
    assert out["tool"] == "guidellm"



def test_the_written_tokenizer_counts_words_as_the_emulator_does(tmp_path: Path) -> None:
    if importlib.util.find_spec("tokenizers") is None:
        _missing("the tokenizers package is not installed", "KVSTAB_REQUIRE_CLIENTS")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(write_tokenizer(tmp_path) / "tokenizer.json"))
    text = "Hello, world:  w17 tok\tunseen-words w3."
    ids = tok.encode(text).ids
    # the emulator's tokenizer: one token per whitespace-separated word
    assert len(ids) == len(text.split()) == 6
    again = tok.decode(ids)
    assert len(tok.encode(again).ids) == len(again.split()) == 6
