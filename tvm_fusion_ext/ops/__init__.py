"""Fused operators (TOPI-style compute definitions). One file per operator; see ``registry`` for the contract."""

from .registry import (
    ATTR_INPUTS,
    ATTR_OP,
    ATTR_PARAMS,
    OperatorCall,
    call_op,
    get_op,
    inputs_of,
    make_prim_func,
    op_of,
    params_of,
)

__all__ = ["ATTR_INPUTS", "ATTR_OP", "ATTR_PARAMS", "OperatorCall", "call_op", "get_op", "inputs_of",
           "make_prim_func", "op_of", "params_of"]
