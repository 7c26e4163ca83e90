"""The in-place KV-cache build (``kv_cache="inplace"``): a tiny LLaMA decoder compiled with its past inputs as
preallocated buffers written at ``past_length`` gives ONNX Runtime's logits (and, in the buffers' filled prefix,
its presents) over a prefill from an empty past, decode steps and a chunk; generate() over it gives transformers'
greedy tokens; the manifest records the cache; what the rewrite cannot handle, and a step past the capacity, are
refused in one line."""

import json
import os

import numpy as np
import pytest
import tvm
from tvm.script import relax as R

from tvm_fusion_ext.compile.kv_cache import apply_kv_cache, check_kv_cache, drop_crops_within_capacity
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.models.causal_lm import past_names, present_names

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CAPACITY, LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 48, 2, 2, 16, 1000  # models/causal_lm's "tiny"


@pytest.fixture(scope="module")
def inplace_artifact(tiny_causal_lm, tmp_path_factory):
    from tvm_fusion_ext.compile.artifact import compile_artifact
    from tvm_fusion_ext.deploy import load

    out = tmp_path_factory.mktemp("kv") / "inplace"
    compile_artifact(tiny_causal_lm, str(out), target={"kind": "llvm", "num-cores": 2}, kv_cache="inplace",
                     max_shapes={"past_key_values.*": [4, KV_HEADS, CAPACITY, HEAD_DIM],
                                 "attention_mask": [4, CAPACITY]})
    return load(str(out))


def test_manifest_records_the_cache_and_its_inputs(inplace_artifact):
    kv = inplace_artifact.manifest["kv_cache"]
    assert kv["mode"] == "inplace" and kv["capacity"] == CAPACITY and kv["length_input"] == "past_length"
    assert kv["past_inputs"] == past_names(LAYERS)
    specs = inplace_artifact.input_specs
    assert specs["past_length"] == ((1,), "int64") and list(specs)[-1] == "past_length"
    assert all(specs[n][0][1:] == (KV_HEADS, CAPACITY, HEAD_DIM) for n in past_names(LAYERS))


def test_steps_match_onnxruntime_from_an_empty_past(inplace_artifact, tiny_causal_lm):
    """Prefill (5 tokens, past 0), three decode steps, a chunk of 3, one more step: logits equal ONNX Runtime's
    run on the exported model with the concatenated past; each present's filled prefix equals its present."""
    session = ort.InferenceSession(tiny_causal_lm, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    batch, past = 2, 0
    buffers = {n: np.zeros((batch, KV_HEADS, CAPACITY, HEAD_DIM), "float32") for n in past_names(LAYERS)}
    ort_past = {n: np.zeros((batch, KV_HEADS, 0, HEAD_DIM), "float32") for n in past_names(LAYERS)}
    for new in (5, 1, 1, 1, 3, 1):
        mask = np.ones((batch, past + new), np.int64)
        mask[1, :2] = 0  # the second row left-padded
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, past:]
        step = {"input_ids": rng.integers(3, VOCAB, (batch, new)).astype(np.int64), "attention_mask": mask,
                "position_ids": positions.astype(np.int64)}
        want = dict(zip(["logits", *present_names(LAYERS)], session.run(None, {**step, **ort_past})))
        got = inplace_artifact.run({**step, **buffers, "past_length": np.array([past], np.int64)})
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4,
                                   err_msg=f"logits at past {past}, {new} new")
        for p_name, present in zip(past_names(LAYERS), present_names(LAYERS)):
            assert got[present].shape == (batch, KV_HEADS, CAPACITY, HEAD_DIM)
            np.testing.assert_allclose(got[present][:, :, :past + new], want[present], rtol=1e-5, atol=1e-5)
            buffers[p_name] = got[present]  # run() copies its inputs: the updated buffer comes back as present
        ort_past = {p: want[q] for p, q in zip(past_names(LAYERS), present_names(LAYERS))}
        past += new


def test_generate_tokens_equal_transformers_greedy(inplace_artifact):
    from tvm_fusion_ext.deploy.generate import generate
    from tvm_fusion_ext.models.causal_lm import causal_lm

    ids = np.array([[11, 57, 300, 42, 7], [0, 0, 99, 512, 3]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)
    got = generate(inplace_artifact, ids, max_new_tokens=10, attention_mask=mask)
    model, _ = causal_lm("tiny")
    with torch.no_grad():
        want = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=10,
                              do_sample=False, pad_token_id=0).numpy()
    np.testing.assert_array_equal(got, want)


def test_a_step_past_the_capacity_is_refused(inplace_artifact):
    from tvm_fusion_ext.deploy.generate import generate

    feeds = {"input_ids": np.ones((1, 4), np.int64), "attention_mask": np.ones((1, CAPACITY + 1), np.int64),
             "position_ids": np.zeros((1, 4), np.int64), "past_length": np.array([CAPACITY - 3], np.int64),
             **{n: np.zeros((1, KV_HEADS, CAPACITY, HEAD_DIM), "float32") for n in past_names(LAYERS)}}
    with pytest.raises(InputError, match=f"past the KV cache's capacity of {CAPACITY}") as err:
        inplace_artifact.run(feeds)
    assert "\n" not in str(err.value)
    feeds.update(attention_mask=np.ones((1, 9), np.int64), past_length=np.array([4], np.int64))
    with pytest.raises(InputError, match="attention mask covers 9 positions"):
        inplace_artifact.run(feeds)
    with pytest.raises(InputError, match="capacity"):  # generation that outgrows the buffers stops in one line
        generate(inplace_artifact, np.ones((1, CAPACITY - 2), np.int64), max_new_tokens=5)


def test_generation_fills_the_capacity_exactly_and_one_more_is_refused_before_it_starts(inplace_artifact):
    """A prompt of P and N new tokens fill P + N - 1 positions (the last token is never fed): exactly the capacity
    runs; one past it is refused before the first step, naming what fits."""
    from tvm_fusion_ext.deploy.generate import generate

    ids = np.full((1, CAPACITY - 5), 7, np.int64)
    assert generate(inplace_artifact, ids, max_new_tokens=6).shape == (1, CAPACITY + 1)
    steps = []

    class Counting:  # the artifact, counting the VMs generate makes (one per generation, at its first step)
        def __getattr__(self, name):
            return getattr(inplace_artifact, name)

        def new_vm(self):
            steps.append(1)
            return inplace_artifact.new_vm()

    with pytest.raises(InputError, match=f"reach {CAPACITY + 1} positions at the last step, past the KV cache's "
                                         f"capacity of {CAPACITY}; at most 6 new tokens fit"):
        generate(Counting(), ids, max_new_tokens=7)
    with pytest.raises(InputError, match="the prompt alone does not fit"):
        generate(Counting(), np.ones((1, CAPACITY + 1), np.int64), max_new_tokens=1)
    assert not steps
    np.testing.assert_array_equal(generate(inplace_artifact, np.ones((1, CAPACITY + 1), np.int64), 0),
                                  np.ones((1, CAPACITY + 1)))  # nothing to run, nothing refused


def test_sampled_generation_over_the_artifact_equals_transformers_and_repeats_with_its_seed(inplace_artifact):
    from _generation_reference import transformers_generate

    from tvm_fusion_ext.deploy.generate import generate

    ids = np.array([[11, 57, 300, 42, 7], [0, 0, 99, 512, 3]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)
    settings = {"do_sample": True, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 17}
    got, stats = generate(inplace_artifact, ids, 10, mask, return_stats=True, **settings)
    np.testing.assert_array_equal(got, transformers_generate(ids, mask, 10, **settings))
    np.testing.assert_array_equal(generate(inplace_artifact, ids, 10, mask, **settings), got)
    assert stats.time_to_first_token_s > 0 and stats.step_s > 0 and stats.tokens_per_s > 0


def test_generate_command_prints_the_tokens_and_timings(inplace_artifact, capsys):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.deploy.generate import generate

    ids = np.array([[0, 0, 99, 512, 3], [11, 57, 300, 42, 7]], np.int64)
    mask = (np.arange(5) >= np.array([[2], [0]])).astype(np.int64)
    flags = ["--max-new-tokens", "6", "--sample", "--temperature", "0.8", "--top-k", "20", "--seed", "3"]
    assert main(["generate", inplace_artifact.path, "--prompt-ids", "99,512,3", "--prompt-ids", "11,57,300,42,7",
                 *flags, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = generate(inplace_artifact, ids, 6, mask, do_sample=True, temperature=0.8, top_k=20, seed=3)
    assert out["new_tokens"] == want[:, 5:].tolist() and out["prompts"] == [[99, 512, 3], [11, 57, 300, 42, 7]]
    assert out["stats"]["time_to_first_token_s"] > 0 and out["stats"]["tokens_per_s"] > 0
    assert main(["generate", inplace_artifact.path, "--prompt-ids", "99,512,3", *flags]) == 0
    text = capsys.readouterr().out
    alone = generate(inplace_artifact, ids[:1, 2:], 6, do_sample=True, temperature=0.8, top_k=20, seed=3)
    assert text.startswith(f"0: 99,512,3 -> {','.join(map(str, alone[0, 3:]))}\n") and "time to first token" in text
    assert main(["generate", inplace_artifact.path, "--prompt-ids", "1,x"]) == 2
    assert "--prompt-ids '1,x': expected token ids" in capsys.readouterr().err
    assert main(["generate", inplace_artifact.path, "--prompt-ids", "1", "--max-new-tokens", str(CAPACITY + 1)]) == 2
    assert f"at most {CAPACITY} new tokens fit" in capsys.readouterr().err


def test_sampled_generation_runs_runtime_only_without_torch(inplace_artifact):
    """Where TVM is runtime-only and torch is absent: sampling is numpy alone (the command and the function)."""
    import subprocess
    import sys

    script = ("import sys, numpy as np\nsys.modules['torch'] = None\n"  # importing torch would now fail
              "from tvm_fusion_ext.deploy import generate, load\n"
              f"t = generate(load({inplace_artifact.path!r}), np.array([[5, 6, 7]]), 4, do_sample=True, seed=0, "
              "top_p=0.9, repetition_penalty=1.1)\n"
              "print(t.shape, 'tvm.relax' in sys.modules)\n")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "(1, 7) False"
    res = subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", "generate", inplace_artifact.path,
                          "--prompt-ids", "5,6,7", "--sample", "--seed", "0"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("0: 5,6,7 -> ") and "tokens/s" in res.stdout


def test_a_raw_call_past_the_capacity_stays_in_its_buffers(inplace_artifact):
    """The VM called directly (no run-time checks): the write drops positions past the capacity and attention
    clamps its key reads into the buffers, so the call completes with finite logits and the rows before
    ``past_length`` untouched."""
    from tvm_fusion_ext.deploy.io import input_tensors

    past, new = CAPACITY - 1, 4
    rng = np.random.default_rng(3)
    buffers = {n: rng.standard_normal((1, KV_HEADS, CAPACITY, HEAD_DIM)).astype("float32") for n in past_names(LAYERS)}
    feeds = {"input_ids": np.ones((1, new), np.int64), "attention_mask": np.ones((1, past + new), np.int64),
             "position_ids": np.arange(past, past + new)[None].astype(np.int64), **buffers,
             "past_length": np.array([past], np.int64)}
    args = input_tensors([feeds[n] for n in inplace_artifact.input_specs], inplace_artifact.device)
    out = inplace_artifact.new_vm()["main"](*args, *inplace_artifact._weights)
    assert np.isfinite(out[0].numpy()).all()
    np.testing.assert_array_equal(out[1].numpy()[:, :, :past], buffers[past_names(LAYERS)[0]][:, :, :past])


# --------------------------------------------------------------------------------- refusals of the rewrite

def _module(func):
    return tvm.IRModule({"main": func})


def test_a_model_without_a_past_is_refused():
    @R.function
    def main(x: R.Tensor(("b", 4), "float32")):
        return x

    with pytest.raises(InputError, match="no past"):
        apply_kv_cache(_module(main), "inplace")


def test_a_past_read_by_something_else_is_refused():
    @R.function
    def main(past_key: R.Tensor(("b", 2, "p", 8), "float32"), new: R.Tensor(("b", 2, "s", 8), "float32")):
        R.func_attr({"tir_var_upper_bound": {"p": 64}})
        with R.dataflow():
            doubled = R.add(past_key, past_key)
            R.output(doubled)
        return doubled

    with pytest.raises(InputError, match="past input 'past_key' is read by relax.add"):
        apply_kv_cache(_module(main), "inplace")


def _sliding_window(capacity: int) -> tvm.IRModule:
    """A Mistral-style cache: the past cropped to its last 7 positions, joined by the new rows, the present cropped
    the same way; the past bounded by ``capacity``."""
    @R.function
    def main(past_key: R.Tensor(("b", 2, "p", 8), "float32"), new: R.Tensor(("b", 2, "s", 8), "float32")):
        with R.dataflow():
            kept = R.strided_slice(past_key, [2], [-7], [9223372036854775807])
            joined = R.concat((kept, new), axis=2)
            present = R.strided_slice(joined, [2], [-7], [9223372036854775807])
            R.output(present)
        return present

    return _module(main.with_attr("tir_var_upper_bound", {"p": capacity}))


def test_a_sliding_window_cache_is_refused_naming_the_window():
    """Mistral's and Gemma2's exports crop the past to the window's last positions before the new keys join it:
    a buffer written in place cannot drop positions, so the build says so and what to compile instead."""
    with pytest.raises(InputError) as info:
        apply_kv_cache(drop_crops_within_capacity(_sliding_window(64), "inplace"), "inplace")
    text = str(info.value)
    assert "cropped to its last 7 positions" in text and "capacity of 64" in text, text
    assert "--kv-cache concat" in text and "at most 7 positions" in text and "\n" not in text, text


def test_a_sliding_window_no_shorter_than_the_capacity_writes_in_place():
    """A window whose crop keeps at least the capacity's positions never drops one (Mistral-7B's 4096-token
    window under a 2048-position cache): the crops of the past and of the present go, the new rows are written
    into the buffer, and its filled prefix equals the exported concatenation. The same crop under a larger
    capacity stays, and is refused."""
    mod = _sliding_window(7)
    assert drop_crops_within_capacity(mod, "concat").same_as(mod)
    with pytest.raises(InputError, match="fewer than the capacity of 64"):
        apply_kv_cache(drop_crops_within_capacity(_sliding_window(64), "inplace"), "inplace")
    out, report = apply_kv_cache(drop_crops_within_capacity(mod, "inplace"), "inplace")
    assert report.capacity == 7 and "strided_slice" not in out.script() and "call_tir_inplace" in out.script()
    ex = tvm.compile(out, target="llvm")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    for past, new in ((0, 3), (5, 1), (6, 1)):
        buffer = rng.standard_normal((1, 2, 7, 8)).astype("float32")
        rows = rng.standard_normal((1, 2, new, 8)).astype("float32")
        want = np.concatenate([buffer[:, :, :past][:, :, -7:], rows], axis=2)[:, :, -7:]
        got = vm["main"](tvm.runtime.tensor(buffer), tvm.runtime.tensor(rows),
                         tvm.runtime.tensor(np.array([past], np.int64))).numpy()
        np.testing.assert_array_equal(got[:, :, :past + new], want, err_msg=f"past {past}, {new} new")


def test_a_cache_passed_through_unchanged_is_refused():
    """An encoder-decoder's cross-attention cache is returned as given, never concatenated."""
    @R.function
    def main(past_cross_key: R.Tensor(("b", 2, "p", 8), "float32")):
        R.func_attr({"tir_var_upper_bound": {"p": 64}})
        return past_cross_key

    with pytest.raises(InputError, match="read by an output"):
        apply_kv_cache(_module(main), "inplace")


def test_a_pinned_past_and_unknown_modes_are_refused(tiny_causal_lm):
    from tvm_fusion_ext.compile.pipeline import fuse
    from tvm_fusion_ext.frontend import load_onnx

    pinned = load_onnx(tiny_causal_lm, shapes={"input_ids": [1, 1], "attention_mask": [1, 5], "position_ids": [1, 1],
                                               "past_key_values.*": [1, KV_HEADS, 4, HEAD_DIM]})
    with pytest.raises(InputError, match="pinned to 4"):
        apply_kv_cache(fuse(pinned)[0], "inplace")
    with pytest.raises(InputError, match="kv_cache must be one of concat, inplace"):
        check_kv_cache("paged")
    assert apply_kv_cache(pinned, "concat")[0] is pinned  # the default changes nothing
    from tvm_fusion_ext.compile.pipeline import compile_model

    with pytest.raises(InputError, match="needs fusion"):
        compile_model(load_onnx(tiny_causal_lm), fuse_graph=False, kv_cache="inplace")


def test_decode_bench_runs_the_inplace_artifact_against_onnxruntime(inplace_artifact, tiny_causal_lm):
    from tvm_fusion_ext.tools.bench.decode import bench_decode

    r = bench_decode(inplace_artifact.path, past=20, batch=2, onnx=tiny_causal_lm, repeat=2, out=lambda _: None)
    assert r["kv_cache"]["mode"] == "inplace" and r["input_shapes"]["past_length"] == [1]
    assert r["input_shapes"]["past_key_values.0.key"] == [2, KV_HEADS, CAPACITY, HEAD_DIM]
    assert r["max_abs_diff_vs_ort"] < 1e-4


def test_compile_command_takes_the_cache_mode():
    from tvm_fusion_ext.cli import build_parser

    args = build_parser().parse_args(["compile", "m.onnx", "-o", "out", "--kv-cache", "inplace"])
    assert args.kv_cache == "inplace"
    assert build_parser().parse_args(["compile", "m.onnx", "-o", "out"]).kv_cache == "concat"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compile", "m.onnx", "-o", "out", "--kv-cache", "paged"])
