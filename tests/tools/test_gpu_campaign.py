"""The GPU campaign without a GPU: its build side with nvcc (sm_80), and its run side rehearsed on this CPU (the same
campaign built for llvm, run by a process whose TVM is runtime-only), so that the first GPU run is not the first
run of this code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_fusion_ext.tools.gpu_campaign.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def _run_runtime_only(campaign: Path, out: Path, *extra):
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=str(REPO))
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_module('tvm_fusion_ext.tools.gpu_campaign', "
            "run_name='__main__')\n")
    probe = ("import sys, atexit, json\n"
             "atexit.register(lambda: print('HEAVY', json.dumps(sorted(m for m in sys.modules if m.startswith("
             "('tvm.relax', 'tvm.s_tir', 'tvm_fusion_ext.compile', 'tvm_fusion_ext.schedules'))))))\n")
    return subprocess.run([sys.executable, "-c", probe + code, "gpu_campaign", "run", str(campaign), "--json",
                           str(out), *extra], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def test_speed_parts_built_for_the_cpu_run_with_the_runtime_only(tmp_path):
    pytest.importorskip("torch", reason="torch is the peer the campaign times against")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "llvm", "--parts", "dense,norms,decode", "--quick"]) == 0
    manifest = json.loads((campaign / "campaign.json").read_text())
    assert set(manifest["parts"]) == {"dense", "norms", "decode"}
    assert all(p["expected_s"] > 0 for p in manifest["parts"].values())
    done = _run_runtime_only(campaign, tmp_path / "out.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    heavy = json.loads(done.stdout.split("HEAVY ", 1)[1].splitlines()[0])
    assert heavy == [], heavy  # the run side imports nothing that compiles
    results = json.loads((tmp_path / "out.json").read_text())
    rows = [r for part in results["parts"].values() for r in part["cases"]]
    assert len(rows) == 4 and all("error" not in r for r in rows), rows
    decode = results["parts"]["decode"]["cases"]  # one query row against SDPA's, the cache's bytes per second
    assert decode[0]["gbytes_per_s"] > 0 and decode[0]["torch_gbytes_per_s"] > 0, decode
    assert all(r["ours_s"] > 0 and r["torch_s"] > 0 and r["max_abs_vs_torch"] < 0.05 for r in rows), rows
    assert "ours/torch" in done.stdout and "expected" in done.stdout  # the table and the expected times
    # a part that no longer fits the run's time budget is skipped whole and named for a second call
    done = _run_runtime_only(campaign, tmp_path / "short.json", "--parts", "dense,norms", "--budget", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    short = json.loads((tmp_path / "short.json").read_text())
    assert set(short["skipped"]) == {"dense", "norms"} and short["parts"] == {}, short
    assert "--parts dense,norms" in done.stdout


def test_run_of_a_part_not_built_or_of_no_campaign_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no campaign.json"):
        main(["run", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown part"):
        main(["build", str(tmp_path), "--arch", "llvm", "--parts", "dense,tuning"])


@pytest.mark.slow
def test_numerics_part_built_for_the_cpu_passes_with_the_runtime_only(tmp_path):
    pytest.importorskip("torch", reason="torch is the peer the campaign times against")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "llvm", "--parts", "numerics"]) == 0
    done = _run_runtime_only(campaign, tmp_path / "out.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    numerics = json.loads((tmp_path / "out.json").read_text())["parts"]["numerics"]
    assert numerics["failed"] == 0 and numerics["passed"] >= 10


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_built_with_nvcc_for_sm_80(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "sm_80", "--parts", "norms,attention,decode", "--quick"]) == 0
    cases = json.loads((campaign / "norms" / "cases.json").read_text())["cases"]
    assert len(cases) == 2 and all((campaign / "norms" / f"{c['library']}.gz").stat().st_size > 0 for c in cases)
    assert (campaign / "attention" / "attention_f16_S128_D64_H2_causal.so.gz").is_file()  # libraries travel gzipped
    assert (campaign / "decode" / "decode_attention_f16_P128_B1_H4_KV2_D64.so.gz").is_file()
    size = sum(f.stat().st_size for f in campaign.rglob("*") if f.is_file())
    assert size < 8 * 2**20  # small libraries: the whole campaign and the 23 MB runtime fit the 64 MiB carried


def test_e2e_torch_reference_is_transformers_op_for_op():
    """The run side's plain-torch BERT and LLaMA (the GPU machine has no transformers) against transformers' own
    models with the same weights drawn from the seed."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import numpy as np

    from tvm_fusion_ext.tools.gpu_campaign import e2e_models as em

    for name in ("bert-tiny", "llama-tiny"):
        config = dict(em.MODELS[name])
        family = config.pop("family")
        model = (transformers.BertModel(transformers.BertConfig(**config, attn_implementation="eager"),
                                        add_pooling_layer=False) if family == "bert" else
                 transformers.LlamaModel(transformers.LlamaConfig(**config, attn_implementation="eager")))
        weights = {k: torch.from_numpy(v.astype(np.float32)) for k, v in em.make_weights(name, 0).items()}
        assert {n for n, _ in model.named_parameters()} == set(weights)
        model.load_state_dict(weights, strict=False)
        inputs = em.make_inputs(name, 2, 16, 0)
        with torch.no_grad():
            want = model.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()}).last_hidden_state
            got = em.torch_forward(name, weights, torch.from_numpy(inputs["input_ids"]))
        assert float((want - got).abs().max()) < 1e-5, name


def test_e2e_weight_recipes_rebuild_the_lifted_weights_from_the_drawn_ones():
    import numpy as np

    from tvm_fusion_ext.tools.gpu_campaign.e2e import derive_recipes

    rng = np.random.default_rng(0)
    drawn = {n: rng.standard_normal(s).astype("float16") for n, s in
             (("q", (8, 4)), ("k", (8, 4)), ("v", (8, 4)), ("o", (4, 8)), ("b", (8,)))}
    table = rng.standard_normal((3, 5)).astype("float16")  # folded from several weights: carried as it is
    lifted = [("w0", np.concatenate([drawn[n].T for n in "qkv"], axis=1)), ("w1", drawn["o"].T.copy()),
              ("w2", drawn["b"].reshape(1, 8)), ("w3", table), ("w4", np.stack([drawn["q"], drawn["k"]], axis=-1)),
              ("w5", table.copy())]
    recipes, carried = derive_recipes(lifted, drawn)
    assert recipes[0]["concat"] == [{"param": n, "transpose": True} for n in "qkv"] and recipes[0]["axis"] == 1
    assert recipes[1] == dict(param="o", transpose=True, name="w1", shape=[8, 4], dtype="float16")
    assert recipes[2]["param"] == "b" and recipes[2]["shape"] == [1, 8]
    assert recipes[3]["carried"] == "w3" and list(carried) == ["w3"]
    assert recipes[4]["stack"] == [{"param": n, "transpose": False} for n in "qk"] and recipes[4]["axis"] == 2
    assert recipes[5]["carried"] == "w3"  # an equal constant is carried once
    with pytest.raises(SystemExit, match="w9 .*too large to carry"):
        derive_recipes([("w9", rng.standard_normal((1100, 1024)).astype("float32"))], drawn)


@pytest.mark.slow
def test_e2e_and_pool_parts_built_for_the_cpu_run_with_the_runtime_only(tmp_path):
    """Tiny BERT and LLaMA through the e2e part (weights drawn there, by the recipe; BERT also as a static build),
    a 4-candidate pool through the pool part, then the pool's times packed here into a pool file the replay reads
    and a record directory."""
    pytest.importorskip("torch", reason="torch is the peer the campaign times against")
    pytest.importorskip("transformers", reason="the e2e part exports its models from transformers")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "llvm", "--parts", "pool", "--quick"]) == 0
    assert main(["build", str(campaign), "--arch", "llvm", "--parts", "e2e", "--quick"]) == 0
    manifest = json.loads((campaign / "campaign.json").read_text())
    assert set(manifest["parts"]) == {"e2e", "pool"}  # built one at a time into one campaign
    done = _run_runtime_only(campaign, tmp_path / "out.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    heavy = json.loads(done.stdout.split("HEAVY ", 1)[1].splitlines()[0])
    assert heavy == [], heavy
    results = json.loads((tmp_path / "out.json").read_text())
    e2e = results["parts"]["e2e"]["cases"]
    assert len(e2e) == 5 and all(r["ok"] and r["ours_s"] > 0 and r["torch_s"] > 0 for r in e2e), e2e
    assert all(r["max_abs_vs_torch"] < 1e-4 for r in e2e), e2e  # fp32 here: the same weights on both sides
    pool_rows = results["parts"]["pool"]["cases"]
    assert len(pool_rows) == 4 and all(len(r["run_secs"]) == 3 for r in pool_rows), pool_rows
    assert "tiny-dense" in done.stdout and "e2e_llama-tiny_dynamic_b2_s32" in done.stdout
    assert "e2e_bert-tiny_static_b2_s32" in done.stdout  # the static variant, sharing the dynamic one's draw

    assert main(["pool-pack", str(campaign), str(tmp_path / "out.json"), str(tmp_path / "pools")]) == 0
    from tvm_fusion_ext.tools.tuning_lab.pool_file import load_dir

    (pool_file,) = load_dir(str(tmp_path / "pools"))
    assert len(pool_file) == 4 and pool_file.measured().all()
    assert (tmp_path / "pools" / "records" / "tiny-dense-template" / "manifest.json").is_file()


def test_pool_pack_of_results_without_a_pool_part_is_refused(tmp_path):
    (tmp_path / "out.json").write_text(json.dumps({"device": "x", "parts": {"norms": {"cases": []}}}))
    with pytest.raises(SystemExit, match="no pool part"):
        main(["pool-pack", str(tmp_path), str(tmp_path / "out.json"), str(tmp_path / "pools")])


def test_decode_speed_cases_are_the_llama_7b_decode_steps():
    from tvm_fusion_ext.tools.gpu_campaign.speed import cases

    full = cases("decode")
    assert [(c["inputs"]["k"][0][1], c["inputs"]["k"][0][0]) for c in full] == [
        (512, 1), (512, 8), (2048, 1), (2048, 8), (8192, 1), (8192, 8)]
    assert all(c["inputs"]["q"][0][1:] == [1, 32, 128] and c["inputs"]["k"][0][2:] == [8, 128] for c in full)
    assert all(c["params"]["split_blocks"] and c["rule"] == "tfx.decode_attention" for c in full)


def test_decode_numerics_references_agree_with_the_package_reference():
    """The campaign's own float64 reference (the run side cannot import the test helpers) against
    ``testing.decode_attention_reference`` on the same values, padded pasts included."""
    import numpy as np

    from tvm_fusion_ext.testing import decode_attention_reference
    from tvm_fusion_ext.tools.gpu_campaign.numerics import decode_attention_cases

    cases = decode_attention_cases()
    assert {c[6] for c in cases} == {"float32", "float16"} and any(c[0].endswith("_left") for c in cases)
    for name, _, rule, inputs, params, _, dtype, want, _, _ in cases:
        values = [inputs[n][0].astype(dtype).astype("float64") for n in ("q", "k", "v", "mask")]
        np.testing.assert_allclose(want, decode_attention_reference(*values, params["scale"]), atol=1e-6,
                                   err_msg=name)


def test_summary_counts_the_carried_total_and_a_campaign_too_large_is_refused(tmp_path, monkeypatch, capsys):
    """The summary adds the runtime bundle and the checkout to the campaign's files; a campaign whose carried total
    is over 64 MiB ends the build in one line with a non-zero status (the parts stay built, to carry apart)."""
    from tvm_fusion_ext.tools.gpu_campaign import __main__ as campaign

    monkeypatch.setattr(campaign, "_checkout_mib", lambda: 8.0)
    (tmp_path / "norms").mkdir()
    with open(tmp_path / "norms" / "lib.so", "wb") as f:
        f.truncate(30 * 2**20)  # sparse: its size, not its blocks, is what is carried
    text, carried = campaign.summary(tmp_path, "sm_90", ["norms"])
    assert abs(carried - (30 + campaign.RUNTIME_BUNDLE_MIB + 8)) < 0.01
    assert "norms" in text and "30.0" in text and "TOO LARGE" not in text
    assert campaign.too_large(tmp_path, carried) is None
    with open(tmp_path / "norms" / "lib.so", "r+b") as f:
        f.truncate(40 * 2**20)
    text, carried = campaign.summary(tmp_path, "sm_90", ["norms"])
    assert carried > campaign.CARRY_LIMIT_MIB and "TOO LARGE" in text
    assert "over the 64 MiB" in campaign.too_large(tmp_path, carried)

    monkeypatch.setattr(campaign, "build", lambda *a: 70.0)
    assert main(["build", str(tmp_path), "--arch", "llvm", "--parts", "norms"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "70.0 MiB carried" in err and "--parts" in err


def test_numerics_dense_inputs_are_drawn_there_and_checked(tmp_path):
    """The dense cases carry only their reference and the CRC-32s of their inputs; the run side draws the inputs
    from the seed, and a draw that differs (another numpy stream) is refused in one line, not compared."""
    import numpy as np

    from tvm_fusion_ext.tools.gpu_campaign import numerics

    cases = {c[0]: c for c in numerics._prim_cases() + numerics.int8_dense_cases()}
    drawn = [n for n in cases if n.startswith("dense")]
    assert drawn and all(n in numerics.DRAWN for n in drawn)
    assert not any(n.startswith(("attention", "layernorm")) for n in numerics.DRAWN)
    for name in drawn:
        recipe = dict(numerics.DRAWN[name], crc32=[numerics._crc(v) for v, _ in cases[name][3].values()])
        again = numerics.drawn_inputs(recipe)
        assert all(np.array_equal(a, v) for a, (v, _) in zip(again, cases[name][3].values())), name
    recipe["crc32"] = [0] * len(recipe["crc32"])
    with pytest.raises(RuntimeError, match="differ from the build's"):
        numerics.drawn_inputs(recipe)
