"""The LLaMA-shaped benchmark decoder (random weights): hidden 1024, 16 heads / 4 K/V heads, intermediate 2816,
4 layers, dynamo export at batch 1, seq 512; also times torch eager on the same input."""
import sys, time, warnings, contextlib, io
import numpy as np, torch
warnings.filterwarnings("ignore")
from transformers import LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model
kind, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
cfg = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816,
           num_hidden_layers=4, vocab_size=32000, max_position_embeddings=2048)
model = (LlamaModel(LlamaConfig(**cfg)) if kind == "llama" else Qwen2Model(Qwen2Config(**cfg))).eval()
class W(torch.nn.Module):
    def __init__(s, m): super().__init__(); s.m = m
    def forward(s, input_ids, attention_mask): return s.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
w = W(model).eval()
ids = torch.randint(0, 32000, (1, 512)); mask = torch.ones(1, 512, dtype=torch.int64)
with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
    torch.onnx.export(w, (ids, mask), out, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamo=True, opset_version=18)
np.savez(out + ".inputs.npz", input_ids=ids.numpy(), attention_mask=mask.numpy())
torch.set_num_threads(2)
with torch.no_grad():
    for _ in range(3): w(ids, mask)
    ts = []
    for _ in range(10):
        t = time.perf_counter(); w(ids, mask); ts.append(time.perf_counter() - t)
print(f"torch eager {kind}: median {np.median(ts)*1e3:.1f} ms (p10 {np.percentile(ts,10)*1e3:.1f})")
