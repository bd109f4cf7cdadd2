"""The opcodes of a tape row and the value limits its registers keep (shared by the tracer,
:mod:`kvstab.engine.tape`, the guard pass, :mod:`kvstab.engine._guards`, and the plug-in loop,
:mod:`kvstab.engine._plugin_kernel`, so that none of them imports another for them)."""

from __future__ import annotations

__all__ = ["OPS", "OP", "LIMIT", "EXACT"]

#: opcodes of a tape row ``(op, dst, a, b, c)``; the kernel's ``_eval`` mirrors this list
OPS = (
    "CONST ADD SUB MUL FDIV MOD NEG LT LE GT GE EQ NE ITE MIN MAX AND OR NOT TRUTH ADDC SUBC MULC "
    # float and mixed int/float operations (the operands' storage in the row's 6th field, see ``kinds``)
    "FCONST XADD XSUB XMUL XFDIV XMOD XNEG XLT XLE XGT XGE XEQ XNE XITE XMIN XMAX XTRUTH XTDIV XFLOOR "
    # skip the next b rows when register a is 0 (rows only a true a needs: see kvstab.engine._guards)
    "JZ "
    # ask the rule itself for this slot when register a is true (a long run of rows only a true a needs)
    "ASK "
    # fcfs_admit_projected over lookahead's Projection, evaluated natively (kvstab.engine.tape,
    # "The projection walk"): PJV copies register a into the walk's block of arguments (b: the
    # previous one, so that the block stays live); PROJ runs the walk (a: the block's last
    # register, b: M, c: the running count; the 6th field keeps a hint between slots) into the
    # admit flags as bits; PJO takes bit b of register a
    "PJV PROJ PJO"
).split()
OP = {name: i for i, name in enumerate(OPS)}

#: registers hold values within ±LIMIT; a value that could leave it is computed by a checked operation
LIMIT = 1 << 61

#: integers of at most this magnitude convert to float64 exactly (beyond, mixed arithmetic stops the run)
EXACT = 1 << 53
