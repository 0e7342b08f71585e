"""Bytes autograd saves per decoder layer and token (saved_tensors_hooks), LoRA and full training,
for the sizing model's per-layer activation count. Needs torch, transformers, peft and a GPU."""

import inspect
import json
import sys

import torch
import transformers


def saved_bytes(layers: int, lora: bool, dropout: float, tokens: int = 2048) -> int:
    cfg = transformers.AutoConfig.for_model(
        "llama",
        num_hidden_layers=layers,
        hidden_size=3072,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=8192,
        vocab_size=256,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        net = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16 if lora else torch.float32)
    if lora:
        import peft

        net = peft.get_peft_model(
            net,
            peft.LoraConfig(
                r=16, lora_alpha=32, lora_dropout=dropout, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
            ),
        )
    net.train()
    seen = {}

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except Exception:
            pass
        return t

    ids = torch.randint(0, 256, (1, tokens), device="cuda")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = net(input_ids=ids, labels=ids).loss
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    total = sum(v for k, v in seen.items() if k not in params)
    del loss, net
    torch.cuda.empty_cache()
    return total


out = {"torch": torch.__version__, "transformers": transformers.__version__}
try:
    import peft

    out["peft"] = peft.__version__
except ImportError:
    pass
out["rmsnorm"] = inspect.getsource(transformers.models.llama.modeling_llama.LlamaRMSNorm.forward)
h = 3072
for name, lora, drop in (("lora_d005", True, 0.05), ("lora_d0", True, 0.0), ("full", False, 0.0)):
    per_layer = saved_bytes(3, lora, drop) - saved_bytes(2, lora, drop)
    out[name + "_bytes_per_token_layer"] = per_layer / 2048
    out[name + "_in_h"] = per_layer / 2048 / h
print(json.dumps(out, indent=1))
sys.stdout.flush()
