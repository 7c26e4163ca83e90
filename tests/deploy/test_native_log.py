"""TVM's C++ logger writes to file descriptor 2: known noise is dropped there, everything else passes through."""

import os

from tvm_fusion_ext.deploy.native_log import SCOPE_LOADED, dropping


def test_known_noise_is_dropped_and_other_lines_pass_through(capfd):
    with dropping([SCOPE_LOADED]) as dropped:
        os.write(2, f"[12:00:00] executable.cc:340: {SCOPE_LOADED}\n".encode())
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert SCOPE_LOADED not in err and "a real warning" in err
    assert len(dropped) == 1
