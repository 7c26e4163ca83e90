"""``tvm-fusion generate ARTIFACT --prompt-ids 1,2,3 [--max-new-tokens N] [--sample ...]``: token ids in, token ids
and the timings a serving team reads first out (time to first token, median decode step, tokens per second), over
a compiled KV-cache decoder (:func:`~tvm_fusion_ext.deploy.generate`). Runtime-only, like ``run`` on an artifact:
it imports nothing that compiles. No tokenizer: ids in, ids out."""

from __future__ import annotations

import json
from typing import List

from ..errors import InputError


def cmd_generate(args) -> int:
    import numpy as np

    from ..deploy import generate, load
    from ..deploy.manifest import is_artifact

    if not is_artifact(args.artifact):
        raise InputError(f"{args.artifact}: not an artifact directory (generate runs one built by "
                         f"`tvm-fusion compile MODEL.onnx -o ART`)")
    prompts = [_ids(text, "--prompt-ids") for text in args.prompt_ids]
    eos = _ids(args.eos, "--eos") if args.eos else None
    pad = args.pad_token_id if args.pad_token_id is not None else (eos[0] if eos else 0)
    width = max(len(p) for p in prompts)
    ids = np.array([[pad] * (width - len(p)) + p for p in prompts], np.int64)  # left-padded, as generate takes
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int64)
    sampling = {"do_sample": True, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                "seed": args.seed} if args.sample else {}
    tokens, stats = generate(load(args.artifact), ids, args.max_new_tokens, mask, eos_token_id=eos,
                             pad_token_id=pad, repetition_penalty=args.repetition_penalty, return_stats=True,
                             **sampling)
    new = tokens[:, width:].tolist()
    if args.json:
        print(json.dumps({"prompts": prompts, "new_tokens": new, "stats": stats.to_dict()}))
        return 0
    for row, (prompt, out) in enumerate(zip(prompts, new)):
        print(f"{row}: {','.join(map(str, prompt))} -> {','.join(map(str, out))}")
    print(stats.summary())
    return 0


def _ids(text: str, flag: str) -> List[int]:
    try:
        ids = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ids = []
    if not ids or any(v < 0 for v in ids):
        raise InputError(f"{flag} '{text}': expected token ids separated by commas, e.g. 1,2,3")
    return ids


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate token ids with a compiled KV-cache decoder (artifact): greedy or "
                                        "sampled, with time to first token and decode speed")
    p.add_argument("artifact", help="artifact directory of a KV-cache decoder, from `tvm-fusion compile`")
    p.add_argument("--prompt-ids", action="append", required=True, metavar="IDS",
                   help="a prompt's token ids, e.g. 1,5,9; repeat for a batch (shorter prompts are left-padded)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate per prompt (default 16)")
    p.add_argument("--eos", metavar="IDS", help="stop ids, e.g. 2 or 2,32000: a row stops after one of them")
    p.add_argument("--pad-token-id", type=int,
                   help="id of the left padding and of a finished row's tokens (default: the first --eos id, else 0)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding (transformers' "
                                                         "semantics: temperature, then top-k, then top-p)")
    p.add_argument("--temperature", type=float, default=1.0, help="with --sample: divides the logits (default 1)")
    p.add_argument("--top-k", type=int, default=50, help="with --sample: keep the K most likely tokens (default 50, "
                                                         "0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --sample: keep the most likely tokens up to "
                                                            "probability P (default 1: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide the logits of tokens already present (transformers' penalty; default 1: none)")
    p.add_argument("--seed", type=int, help="with --sample: the random seed (the same seed, the same tokens)")
    p.add_argument("--json", action="store_true", help="print {prompts, new_tokens, stats} as JSON")
    p.set_defaults(func=cmd_generate)
