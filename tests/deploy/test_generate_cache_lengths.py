"""How generate() follows a decoder's cache length (numpy stand-ins for compiled models; no compiling): a model
whose ``present`` drops its oldest positions (a sliding window, as Mistral's and Gemma2's exports crop their
cache) gets, each step, a mask of exactly its kept positions plus the new token, with positions still counted
from the whole sequence; a cache longer than the mask (a static cache) and layers keeping different lengths are
refused in one line."""

import numpy as np
import pytest

from tvm_fusion_ext.deploy.generate import generate
from tvm_fusion_ext.errors import InputError

VOCAB, HEADS, HEAD_DIM = 16, 2, 4


class WindowedDecoder:
    """A two-layer decoder stand-in whose cache keeps the last ``keep[layer]`` positions (None: all), plus
    ``extra`` zero positions after them (a cache longer than past + new). It refuses a mask that does not cover
    its past and new tokens, as a compiled graph does, and picks the next token from the row's last position."""

    def __init__(self, keep=(None, None), extra=0):
        self.keep, self.extra, self.calls = keep, extra, []
        past = (("batch", HEADS, "past", HEAD_DIM), "float32")
        self.input_specs = {"input_ids": (("batch", "new"), "int64"), "attention_mask": (("batch", "total"), "int64"),
                            "position_ids": (("batch", "new"), "int64"),
                            **{f"past_key_values.{i}.{kv}": past for i in range(2) for kv in ("key", "value")}}
        self.output_names = ["logits"] + [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]

    def run(self, feeds):
        ids, mask, positions = feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"]
        batch, new = ids.shape
        past = feeds["past_key_values.0.key"].shape[2]
        assert mask.shape[1] == past + new, (mask.shape, past, new)
        self.calls.append((mask.copy(), positions.copy()))
        out = {"logits": np.eye(VOCAB, dtype=np.float32)[(positions + 3) % VOCAB]}
        for layer, keep in enumerate(self.keep):
            for kv in ("key", "value"):
                cache = np.concatenate([feeds[f"past_key_values.{layer}.{kv}"],
                                        np.ones((batch, HEADS, new, HEAD_DIM), np.float32)], axis=2)
                cache = cache[:, :, -keep:] if keep else cache
                out[f"present.{layer}.{kv}"] = np.concatenate(
                    [cache, np.zeros((batch, HEADS, self.extra, HEAD_DIM), np.float32)], axis=2)
        return out


PROMPT = np.array([[5, 6, 7, 8], [0, 0, 9, 10]], np.int64)
MASK = np.array([[1, 1, 1, 1], [0, 0, 1, 1]], np.int64)  # the second row left-padded


def test_a_sliding_window_cache_gets_a_mask_of_its_kept_positions():
    model = WindowedDecoder(keep=(3, 3))
    tokens = generate(model, PROMPT, max_new_tokens=6, attention_mask=MASK)
    masks = [m for m, _ in model.calls]
    assert [m.shape[1] for m in masks] == [4, 4, 4, 4, 4, 4]  # 3 kept + 1 new after the prefill
    # the padded row's zeros are the oldest columns: they leave the mask once the window has passed them
    assert masks[1][1].tolist() == [0, 1, 1, 1] and masks[2][1].tolist() == [1, 1, 1, 1]
    # positions count the whole sequence, not the mask's columns
    assert [p[:, -1].tolist() for _, p in model.calls] == [[3, 1], [4, 2], [5, 3], [6, 4], [7, 5], [8, 6]]
    np.testing.assert_array_equal(tokens[:, 4:], [[6, 7, 8, 9, 10, 11], [4, 5, 6, 7, 8, 9]])


def test_a_full_cache_keeps_every_column_of_the_mask():
    model = WindowedDecoder()
    generate(model, PROMPT, max_new_tokens=4, attention_mask=MASK)
    assert [m.shape[1] for m, _ in model.calls] == [4, 5, 6, 7]
    assert all(m[1, :2].tolist() == [0, 0] for m, _ in model.calls)


@pytest.mark.parametrize("model, expected", [
    (WindowedDecoder(keep=(3, None)), "its layers keep caches of different lengths (present.0.key 3 positions, "
                                      "present.1.key 4"),
    (WindowedDecoder(extra=2), "present.0.key holds 6 positions after a step whose attention_mask covered 4"),
])
def test_caches_one_mask_cannot_cover_are_refused_in_one_line(model, expected):
    with pytest.raises(InputError) as info:
        generate(model, PROMPT, max_new_tokens=4, attention_mask=MASK)
    assert expected in str(info.value) and "\n" not in str(info.value), info.value
    assert len(model.calls) == 1  # refused after the prefill, before a step is fed a cache it cannot line up
