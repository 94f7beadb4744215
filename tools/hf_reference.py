#!/usr/bin/env python3
"""Independent reference: Loom's logits against Hugging Face transformers on the same weights.

Loads a Loom-written GGUF (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3 or gpt-oss; weights
dequantized by tools/gguf_numpy.py) into transformers' LlamaForCausalLM / Qwen2ForCausalLM /
Qwen3ForCausalLM / Qwen3MoeForCausalLM / Gemma2ForCausalLM / Gemma3ForCausalLM (text-only,
Gemma3TextConfig) / Phi3ForCausalLM / GptOssForCausalLM, runs the
given tokens in float64, and compares the logits with the float32 [n_tokens, n_vocab] file Loom wrote
(`loom run --dump-logits`).

GGUF conventions undone here: llama q/k rows are permuted for interleaved RoPE; Gemma norm weights
are stored as 1 + w (transformers' Gemma RMSNorm multiplies by 1 + w itself). RoPE scaling comes from
the file: Llama 3.1's rope_freqs.weight becomes rope_scaling llama3 (factor = its largest divisor,
low/high frequency factors 1 and 4 over 8192 tokens, what `loom gen-model` writes; the script checks
that transformers' frequencies then equal base^(-2i/d) / rope_freqs), and rope.scaling.type yarn
becomes rope_scaling yarn with max_position_embeddings = factor x original context (transformers
derives the factor from that ratio); Phi-3's rope_factors_short/long become rope_scaling longrope. The
gemma and qwen3moe
mappings were written against transformers 4.5x (per-expert Linear modules; rope_theta /
rope_local_base_freq / rope_scaling); fused expert tensors (gate_up_proj) of newer versions are
handled, other config changes may not be.

gpt-oss (written without transformers at hand; GptOssForCausalLM of transformers 4.55+): llama.cpp's
converter splits transformers' fused experts, and this undoes it. transformers holds
mlp.experts.gate_up_proj as [n_expert, n_embd, 2 n_ff] with the gate in the even columns and up in the
odd ones (forward: gate_up[..., ::2], gate_up[..., 1::2]), gate_up_proj_bias [n_expert, 2 n_ff] likewise,
down_proj [n_expert, n_ff, n_embd] (x @ down_proj: the transposed Linear weight) and down_proj_bias
[n_expert, n_embd]; the router is mlp.router (weight [n_expert, n_embd], bias), the sinks
self_attn.sinks [n_head]. The expert layout is taken from the model's own parameter shapes and its
forward's source (interleaved ::2 / 1::2, or halves by chunk), and refused when neither is found. The
config: local layers 0, 2, ... (layer_types), YaRN with truncate False as the released config says,
attention biases, swiglu_limit 7.

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


def ref_dtype(arch):
    """float64, except for MoE models: transformers' grouped expert matmul takes no float64 (float32
    with TF32 off then, still orders of magnitude inside the 1e-4 threshold)."""
    if arch.endswith("moe") or arch == "gpt-oss":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch.float32
    return torch.float64


def gpt_oss_expert_layout(model):
    """'interleaved' (gate = gate_up[..., ::2], up = gate_up[..., 1::2]) or 'halves' (chunk(2)), read from
    the experts module's forward, so that a change in transformers fails loudly instead of mapping wrong."""
    import inspect

    experts = model.model.layers[0].mlp.experts
    # the whole class: transformers 5 moved the split into a helper (_apply_gate)
    src = inspect.getsource(type(experts))
    if "::2" in src:
        return "interleaved"
    if "chunk(2" in src:
        return "halves"
    raise SystemExit(f"hf_reference: cannot tell how {type(experts).__name__} splits gate_up_proj")


def gpt_oss_layer(g, model, il):
    """The sinks and the experts of layer il in transformers' layout (see the module docstring)."""
    sd = {f"model.layers.{il}.self_attn.sinks": g.tensor(f"blk.{il}.attn_sinks.weight")}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    prefix = f"model.layers.{il}.mlp.experts"
    # numpy order: gate/up weights (n_expert, n_ff, n_embd), down (n_expert, n_embd, n_ff), biases
    # (n_expert, n_ff) / (n_expert, n_embd): each expert's slice is a torch Linear weight (out, in)
    gate, up, down = (g.tensor(f"blk.{il}.ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    gate_b, up_b, down_b = (g.tensor(f"blk.{il}.ffn_{n}_exps.bias") for n in ("gate", "up", "down"))
    n_expert, n_ff, n_embd = gate.shape
    layout = gpt_oss_expert_layout(model)
    fused_in_last = shapes[f"{prefix}.gate_up_proj"] == (n_expert, n_embd, 2 * n_ff)  # x @ gate_up
    if not fused_in_last and shapes[f"{prefix}.gate_up_proj"] != (n_expert, 2 * n_ff, n_embd):
        raise SystemExit(f"hf_reference: gate_up_proj has shape {shapes[f'{prefix}.gate_up_proj']}")
    fused = np.empty((n_expert, 2 * n_ff, n_embd), dtype=np.float32)  # rows: the fused outputs
    fused_b = np.empty((n_expert, 2 * n_ff), dtype=np.float32)
    if layout == "interleaved":
        fused[:, 0::2], fused[:, 1::2] = gate, up
        fused_b[:, 0::2], fused_b[:, 1::2] = gate_b, up_b
    else:
        fused[:, :n_ff], fused[:, n_ff:] = gate, up
        fused_b[:, :n_ff], fused_b[:, n_ff:] = gate_b, up_b
    sd[f"{prefix}.gate_up_proj"] = fused.swapaxes(1, 2) if fused_in_last else fused
    sd[f"{prefix}.gate_up_proj_bias"] = fused_b
    down_shape = shapes[f"{prefix}.down_proj"]
    if down_shape == (n_expert, n_ff, n_embd):  # x @ down_proj
        sd[f"{prefix}.down_proj"] = down.swapaxes(1, 2)
    elif down_shape == (n_expert, n_embd, n_ff):
        sd[f"{prefix}.down_proj"] = down
    else:
        raise SystemExit(f"hf_reference: down_proj has shape {down_shape}")
    sd[f"{prefix}.down_proj_bias"] = down_b
    return sd


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
        tie_word_embeddings=tied, torch_dtype=ref_dtype(arch),
    )
    gemma = arch in ("gemma2", "gemma3")
    if gemma:
        # Loom's rule (llm_hparams.cpp): query_pre_attn_scalar is head_dim except for the 27B models.
        layers_27b = 46 if arch == "gemma2" else 62
        qpas = n_embd // n_head if int(p("block_count")) == layers_27b else head_dim
        window = int(p("attention.sliding_window", 0)) or int(p("context_length", 2048))
        common.update(query_pre_attn_scalar=qpas, sliding_window=window, hidden_activation="gelu_pytorch_tanh")
    rope_freqs = g.tensor("rope_freqs.weight") if "rope_freqs.weight" in g.tensors else None
    if rope_freqs is not None:
        if arch != "llama":
            raise SystemExit(f"hf_reference: rope_freqs.weight in a {arch} file is not handled")
        common["rope_scaling"] = {"rope_type": "llama3", "factor": float(rope_freqs.max()), "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        # transformers wants the scaled context above the original one (the frequencies do not depend on it)
        common["max_position_embeddings"] = max(common["max_position_embeddings"], 8192 * 16)
    if p("rope.scaling.type", "none") == "yarn":
        orig = int(p("rope.scaling.original_context_length"))
        factor = float(p("rope.scaling.factor"))
        common["max_position_embeddings"] = int(round(factor * orig))
        common["rope_scaling"] = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    elif p("rope.scaling.type", "none") not in ("none", "linear"):
        raise SystemExit(f"hf_reference: rope.scaling.type {p('rope.scaling.type')} is not handled")
    has_qkv_bias = "blk.0.attn_q.bias" in g.tensors
    if arch == "llama":
        # transformers' attention_bias covers q, k, v and o; a file without attn_output.bias gets zeros.
        cfg = transformers.LlamaConfig(**common, attention_bias=has_qkv_bias, mlp_bias=False)
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = transformers.Qwen3Config(**common, attention_bias=False), transformers.Qwen3ForCausalLM
    elif arch == "phi3":
        # Every layer attends through the file's window; Phi3Config's default pad id (32000) would not
        # fit a small vocabulary.
        window = int(p("attention.sliding_window", 0)) or None
        extra = {}
        if "rope_factors_short.weight" in g.tensors:
            # LongRoPE: transformers derives the cos/sin scale from max_position_embeddings /
            # original_max_position_embeddings and picks the long factors when the sequence is longer
            # than the original context; Loom picks them when its context (-c) is.
            extra["original_max_position_embeddings"] = int(p("rope.scaling.original_context_length"))
            extra["rope_scaling"] = {"type": "longrope", "rope_type": "longrope",
                                     "short_factor": [float(x) for x in g.tensor("rope_factors_short.weight")],
                                     "long_factor": [float(x) for x in g.tensor("rope_factors_long.weight")]}
        cfg = transformers.Phi3Config(**common, **extra, sliding_window=window, pad_token_id=None, bos_token_id=None,
                                      eos_token_id=None, partial_rotary_factor=int(p("rope.dimension_count", head_dim)) / head_dim)
        cls = transformers.Phi3ForCausalLM
    elif arch == "qwen3moe":
        cfg = transformers.Qwen3MoeConfig(
            **common, attention_bias=False, num_experts=int(p("expert_count")),
            num_experts_per_tok=int(p("expert_used_count")), moe_intermediate_size=int(p("expert_feed_forward_length")),
            norm_topk_prob=bool(p("expert_weights_norm", True)), decoder_sparse_step=1, mlp_only_layers=[])
        cls = transformers.Qwen3MoeForCausalLM
    elif arch == "gemma2":
        cfg = transformers.Gemma2Config(
            **common, attn_logit_softcapping=float(p("attn_logit_softcapping", 50.0)),
            final_logit_softcapping=float(p("final_logit_softcapping", 30.0)))
        cls = transformers.Gemma2ForCausalLM
    elif arch == "gemma3":
        extra = dict(rope_local_base_freq=float(p("rope.freq_base_swa", 10000.0)), attn_logit_softcapping=None,
                     final_logit_softcapping=float(p("final_logit_softcapping")) if p("final_logit_softcapping") else None)
        if p("rope.scaling.type", "none") == "linear":
            extra["rope_scaling"] = {"rope_type": "linear", "factor": float(p("rope.scaling.factor"))}
        if not p("attention.sliding_window"):  # no window in the file: every layer global
            extra["layer_types"] = ["full_attention"] * int(p("block_count"))
        cfg, cls = transformers.Gemma3TextConfig(**common, **extra), transformers.Gemma3ForCausalLM
    elif arch == "gpt-oss":
        n_layer = int(p("block_count"))
        window = int(p("attention.sliding_window"))
        gcommon = dict(common, intermediate_size=int(p("expert_feed_forward_length")))
        # the released config's YaRN: beta 32 / 1 and the correction range not rounded (truncate False)
        gcommon["rope_scaling"] = dict(gcommon.get("rope_scaling", {}), beta_fast=32.0, beta_slow=1.0, truncate=False)
        cfg = transformers.GptOssConfig(
            **gcommon, num_local_experts=int(p("expert_count")), num_experts_per_tok=int(p("expert_used_count")),
            sliding_window=window, attention_bias=True, swiglu_limit=7.0, pad_token_id=None, bos_token_id=None,
            eos_token_id=None, layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layer)])
        cls = transformers.GptOssForCausalLM
    else:
        raise SystemExit(f"hf_reference: architecture '{arch}' is not handled")
    cfg._attn_implementation = "eager"
    # Built directly on the GPU in float64: random initialisation of a 1B model on the CPU takes minutes.
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(ref_dtype(arch))
    with torch.device(dev):
        model = cls(cfg)

    out_norm = g.tensor("output_norm.weight")
    sd = {"model.embed_tokens.weight": g.tensor("token_embd.weight"),
          "model.norm.weight": out_norm - 1.0 if gemma else out_norm}
    if not tied:
        sd["lm_head.weight"] = g.tensor("output.weight")
    names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    }
    if gemma:  # sandwich norms: ffn_norm is the pre-FFN norm there
        names.update({"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"})
    if arch == "qwen3moe":
        names["ffn_gate_inp"] = "mlp.gate"
    if arch == "phi3":  # fused projections; ffn_up holds the gate rows, then the up rows, as gate_up_proj
        names.update({"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"})
    if arch == "gpt-oss":  # the FFN's pre-norm is post_attention_norm in GGUF; a biased router
        names.update({"post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router"})
        del names["ffn_norm"]
    hf_keys = set(model.state_dict().keys())
    for il in range(cfg.num_hidden_layers):
        for gname, hname in names.items():
            for kind in ("weight", "bias"):
                key = f"blk.{il}.{gname}.{kind}"
                if key not in g.tensors:
                    continue
                w = g.tensor(key)
                if arch == "llama" and gname in ("attn_q", "attn_k"):
                    nh = n_head if gname == "attn_q" else n_head_kv
                    # a bias is one value per row: it follows the rows' order
                    w = unpermute_rope_rows(w, nh) if kind == "weight" else unpermute_rope_rows(w[:, None], nh)[:, 0]
                if gemma and gname.endswith("norm"):
                    w = w - 1.0  # GGUF holds 1 + w
                sd[f"model.layers.{il}.{hname}.{kind}"] = w
        if arch == "qwen3moe":
            # GGUF stacks experts: gate/up (n_expert, n_ff_exp, n_embd), down (n_expert, n_embd, n_ff_exp),
            # each expert's slice being the torch Linear weight.
            gate, up, down = (g.tensor(f"blk.{il}.ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
            prefix = f"model.layers.{il}.mlp.experts"
            if f"{prefix}.0.gate_proj.weight" in hf_keys:
                for e in range(gate.shape[0]):
                    sd[f"{prefix}.{e}.gate_proj.weight"] = gate[e]
                    sd[f"{prefix}.{e}.up_proj.weight"] = up[e]
                    sd[f"{prefix}.{e}.down_proj.weight"] = down[e]
            elif f"{prefix}.gate_up_proj" in hf_keys:  # fused experts: gate rows first, then up
                fused = np.concatenate([gate, up], axis=1)
                if tuple(model.state_dict()[f"{prefix}.gate_up_proj"].shape) != fused.shape:
                    fused = fused.swapaxes(1, 2)
                sd[f"{prefix}.gate_up_proj"] = fused
                dshape = tuple(model.state_dict()[f"{prefix}.down_proj"].shape)
                sd[f"{prefix}.down_proj"] = down if dshape == down.shape else down.swapaxes(1, 2)
            else:
                raise SystemExit(f"hf_reference: unknown expert layout in {cls.__name__}")
        if arch == "gpt-oss":
            sd.update(gpt_oss_layer(g, model, il))
    if arch == "llama" and has_qkv_bias:
        for il in range(cfg.num_hidden_layers):
            sd.setdefault(f"model.layers.{il}.self_attn.o_proj.bias", np.zeros(n_embd))
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev, ref_dtype(arch)) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Buffers computed from the config (RoPE tables, Gemma 3's embedding scale) are not weights.
    missing = [m for m in missing if not (tied and m == "lm_head.weight") and "rotary_emb" not in m
               and not m.endswith("embed_scale")]
    if missing or unexpected:
        raise SystemExit(f"hf_reference: weights do not map: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()
    if rope_freqs is not None:
        # The llama3 config must give the frequencies Loom reads from the file.
        n_rot = 2 * rope_freqs.size
        want = float(p("rope.freq_base", 10000.0)) ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot) / rope_freqs
        for name, buf in model.named_buffers():
            if name.endswith("inv_freq"):
                got = buf.detach().cpu().double().numpy()
                if not np.allclose(got, want, rtol=1e-6, atol=0):
                    raise SystemExit(f"hf_reference: {name} differs from base^(-2i/d) / rope_freqs: "
                                     f"max rel {np.max(np.abs(got / want - 1)):.2e}")
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
