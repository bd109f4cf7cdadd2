"""The generated numeric forms (kvstab.theory._forms) match the sympy derivations."""

from __future__ import annotations

import ast
import inspect

from kvstab.theory import _forms, codegen


def test_generated_module_is_fresh() -> None:
    # compare syntax trees, so that reformatting the file does not matter but
    # any change of a derived expression does
    with open(codegen.TARGET, encoding="utf-8") as fh:
        on_disk = ast.dump(ast.parse(fh.read()))
    assert on_disk == ast.dump(ast.parse(codegen.generate())), (
        "theory/_forms.py is stale: run `python -m kvstab.theory.codegen`"
    )


def test_every_form_is_generated_with_its_arguments() -> None:
    for name, (args, _, _) in codegen.FORMS.items():
        fn = getattr(_forms, name)
        assert list(inspect.signature(fn).parameters) == [a.name for a in args]


def test_numeric_path_does_not_import_sympy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kvstab.theory.area as a; from kvstab.workload import PAPER_WORKLOADS as W; "
        "from kvstab.model import ModelParams as P; a.mu(W['paper-1:1'], P(bbar=0.03)); print('sympy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
