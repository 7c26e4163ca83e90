"""``tvm-fusion demo`` is quiet: no raw TVM warning on stderr, one line explaining it instead, and a summary that
lists near misses only (correct refusals are counted, not listed). The tiny encoder only (MiniLM's run is the
README's own command, timed by a user)."""

from tvm_fusion_ext.tools.bench.peers import FAST_GATHER_NOTE
from tvm_fusion_ext.tools.demo import run_demo


def test_demo_on_the_tiny_encoder_is_quiet(capfd):
    lines = []
    results = run_demo(include_minilm=False, out=lines.append)
    err = capfd.readouterr().err
    assert "Fast mode segfaults" not in err  # TVM's C++ logger writes to fd 2: captured and explained
    text = "\n".join(lines)
    assert text.count(FAST_GATHER_NOTE) == 1
    assert "Near misses" in text and "vs ORT" in text
    (tiny,) = results
    assert tiny["fused"]["attention"] == 2 and tiny["max_abs_diff_vs_ort"] < 1e-4
