"""Times torch eager (sdpa, 2 threads) on the LLaMA-shaped prefill model: ``python time_llama_prefill_torch.py
[llama|qwen2]`` (the same config and seed as export_llama_prefill.py)."""
import sys, time, numpy as np, torch, warnings
warnings.filterwarnings("ignore")
from transformers import LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model
kind = sys.argv[1] if len(sys.argv) > 1 else "llama"
torch.manual_seed(0); torch.set_num_threads(2)
cfg = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816,
           num_hidden_layers=4, vocab_size=32000, max_position_embeddings=2048)
m = (LlamaModel(LlamaConfig(**cfg)) if kind == "llama" else Qwen2Model(Qwen2Config(**cfg))).eval()
ids = torch.randint(0, 32000, (1, 512)); mask = torch.ones(1, 512, dtype=torch.int64)
with torch.no_grad():
    for _ in range(3): m(input_ids=ids, attention_mask=mask, use_cache=False)
    ts = []
    for _ in range(10):
        t = time.perf_counter(); m(input_ids=ids, attention_mask=mask, use_cache=False); ts.append(time.perf_counter() - t)
print(f"torch eager {kind} (sdpa): median {np.median(ts)*1e3:.1f} ms p10 {np.percentile(ts,10)*1e3:.1f}")
