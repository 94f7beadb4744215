#!/usr/bin/env python3
"""Independent reference: Loom's logits against Hugging Face transformers on the same weights.

Loads a Loom-written GGUF (llama, qwen2 or qwen3; weights dequantized by tools/gguf_numpy.py) into
transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM, runs the given tokens in float64,
and compares the logits with the float32 [n_tokens, n_vocab] file Loom wrote (`loom run --dump-logits`).

    python3 tools/hf_reference.py --model m.gguf --loom-logits l.bin [--tokens 1,2,3] [--threshold 1e-4]

Exit code 0 when NMSE = sum((loom-ref)^2)/sum(ref^2) <= threshold, 1 otherwise.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_numpy import GgufReader  # noqa: E402


def unpermute_rope_rows(w, n_head):
    """GGUF llama stores q/k rows with each head's rotary pairs adjacent (2i, 2i+1); transformers
    rotates halves (i, i + head_dim/2). Reorders rows back to the halves layout."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def build_model(g):
    import transformers

    md = g.metadata
    arch = md["general.architecture"]
    p = lambda k, d=None: md.get(f"{arch}.{k}", d)  # noqa: E731
    n_embd, n_head = int(p("embedding_length")), int(p("attention.head_count"))
    n_head_kv = int(p("attention.head_count_kv", n_head))
    head_dim = int(p("attention.key_length", n_embd // n_head))
    n_vocab = g.tensors["token_embd.weight"][0][1]
    tied = "output.weight" not in g.tensors
    common = dict(
        vocab_size=n_vocab, hidden_size=n_embd, intermediate_size=int(p("feed_forward_length")),
        num_hidden_layers=int(p("block_count")), num_attention_heads=n_head, num_key_value_heads=n_head_kv,
        head_dim=head_dim, rms_norm_eps=float(p("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(p("rope.freq_base", 10000.0)), max_position_embeddings=int(p("context_length", 2048)),
        tie_word_embeddings=tied, torch_dtype=torch.float64,
    )
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False), transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = transformers.Qwen3Config(**common, attention_bias=False), transformers.Qwen3ForCausalLM
    else:
        raise SystemExit(f"hf_reference: architecture '{arch}' is not handled")
    cfg._attn_implementation = "eager"
    # Built directly on the GPU in float64: random initialisation of a 1B model on the CPU takes minutes.
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.float64)
    with torch.device(dev):
        model = cls(cfg)

    sd = {"model.embed_tokens.weight": g.tensor("token_embd.weight"), "model.norm.weight": g.tensor("output_norm.weight")}
    if not tied:
        sd["lm_head.weight"] = g.tensor("output.weight")
    names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    }
    for il in range(cfg.num_hidden_layers):
        for gname, hname in names.items():
            for kind in ("weight", "bias"):
                key = f"blk.{il}.{gname}.{kind}"
                if key not in g.tensors:
                    continue
                w = g.tensor(key)
                if arch == "llama" and gname in ("attn_q", "attn_k"):
                    nh = n_head if gname == "attn_q" else n_head_kv
                    w = unpermute_rope_rows(w, nh) if kind == "weight" else w
                sd[f"model.layers.{il}.{hname}.{kind}"] = w
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev, torch.float64) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (tied and m == "lm_head.weight") and "rotary_emb" not in m]
    if missing or unexpected:
        raise SystemExit(f"hf_reference: weights do not map: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()
    return model, n_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", help="comma-separated token ids (default: read LOOM_LOGITS.tokens, which loom writes)")
    ap.add_argument("--loom-logits", required=True, help="float32 [n_tokens, n_vocab] written by Loom")
    ap.add_argument("--threshold", type=float, default=1e-4)
    a = ap.parse_args()

    g = GgufReader(a.model)
    model, n_vocab = build_model(g)
    text = a.tokens if a.tokens else open(a.loom_logits + ".tokens").read()
    tokens = [int(t) for t in text.replace("\n", "").split(",") if t.strip()]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(dev).eval()
    with torch.no_grad():
        ref = model(torch.tensor([tokens], device=dev)).logits[0].cpu().numpy()
    loom = np.fromfile(a.loom_logits, dtype=np.float32)
    if loom.size != ref.size:
        raise SystemExit(f"hf_reference: Loom wrote {loom.size} logits, expected {len(tokens)} x {n_vocab}")
    loom = loom.reshape(ref.shape).astype(np.float64)
    nmse = float(((loom - ref) ** 2).sum() / (ref ** 2).sum())
    agree = float((loom.argmax(-1) == ref.argmax(-1)).mean())
    ok = nmse <= a.threshold and np.isfinite(loom).all()
    print(f"hf_reference: {os.path.basename(a.model)} arch={g.metadata['general.architecture']} tokens={len(tokens)} "
          f"NMSE={nmse:.3e} (threshold {a.threshold:.0e}) argmax agreement={agree:.3f} -> {'OK' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
