#!/usr/bin/env python3
"""Trains Loom's small built-in model (LLaMA architecture, ~15.7M parameters) on tiny shakespeare and
exports it as GGUF with the project's own numpy writer (tools/gguf_numpy.py).

Retrain (one GPU; python 3.12, torch 2.x with CUDA, tokenizers, transformers, numpy):

    python3 tools/train_shakespeare.py --data ../shared/data/tinyshakespeare.txt --out OUT [--minutes 5]

Writes to OUT: loom-shakespeare-f16.gguf (the model with its tokenizer), tokenizer.json (the Hugging Face
tokenizer), heldout_sample.txt + heldout_ids.txt (vectors for Loom's tokenizer test), results.json.

Data split, on a character boundary (the corpus is ASCII, so also a byte boundary): with N characters
and cut = int(0.9 * N), text[:cut] is the train split and text[cut:] the held-out split. The tokenizer
is trained on the whole train split. The model trains on train[:int(0.95 * len(train))]; the rest of
the train split (the "validation" slice) picks the checkpoint (best validation loss at the periodic
evaluations): one epoch of the ~285k fit tokens is ~18 steps of 64 x 256, so a 15M model overfits
(hence also residual dropout 0.2 and at most 3000 steps), and choosing the checkpoint on the held-out
text would make its perplexity optimistic. The held-out split is used only for reporting.
Training stops at --max-steps or when --minutes have passed (the step count is fitted to --minutes
after timing 20 steps, so the cosine schedule completes).

Every training window starts with BOS (its first token is replaced by BOS), the way the perplexity
evaluation (see heldout_eval) and Loom's prompts (add_bos_token) present text to the model.
Seeds are fixed (python, numpy, torch); cuDNN/cuBLAS determinism is not forced (the attention and
embedding backward kernels use atomics), so two runs may differ in the last bits and the losses in
the third decimal.
"""
import argparse
import copy
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_numpy import GgufReader, GgufWriter  # noqa: E402

SEED = 1234
N_VOCAB, N_CTX, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 4096, 256, 384, 8, 6, 2, 64, 1024
NORM_EPS, ROPE_BASE = 1e-5, 10000.0
BATCH, LR, LR_MIN, WARMUP, WEIGHT_DECAY, CLIP, DROPOUT = 64, 1e-3, 1e-4, 200, 0.1, 1.0, 0.2
SPECIAL = "<|endoftext|>"  # BOS and EOS
NAME, LICENSE = "loom-shakespeare-15m", "CC0-1.0"


def fail(msg):
    raise SystemExit(f"train_shakespeare: FAILED: {msg}")


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(text):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # the GPT-2 regex
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=N_VOCAB, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def tokenizer_tables(tok):
    """Tokens in id order, token types, merges "left right" in rank order, the special token's id."""
    vocab = tok.get_vocab(with_added_tokens=True)
    n = len(vocab)
    if sorted(vocab.values()) != list(range(n)):
        fail("tokenizer ids are not 0..n-1")
    tokens = [None] * n
    for t, i in vocab.items():
        tokens[i] = t
    special = vocab[SPECIAL]
    raw = json.loads(tok.to_str())["model"]["merges"]
    # tokenizers < 0.20 writes merges as "a b", newer versions as ["a", "b"].
    pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in raw]
    if any(" " in t for t in tokens):
        fail("a token contains a space; 'left right' merges would be ambiguous")
    for a, b in pairs:
        if a not in vocab or b not in vocab or a + b not in vocab:
            fail(f"merge '{a} {b}' is not over vocabulary tokens")
    from tokenizers import pre_tokenizers
    if set(pre_tokenizers.ByteLevel.alphabet()) - set(vocab):
        fail("some of the 256 byte tokens are missing: Loom could not tokenize every text")
    types = [3 if i == special else 1 for i in range(n)]
    return tokens, types, [f"{a} {b}" for a, b in pairs], special


def check_tokenizer_tables(tokens, merges, tok, sample):
    """Rebuilds a BPE tokenizer from the exported tables alone; it must encode like the trained one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    rebuilt = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    rebuilt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if rebuilt.encode(sample).ids != tok.encode(sample).ids:
        fail("a tokenizer rebuilt from the exported tokens and merges encodes differently")
    if tok.decode(tok.encode(sample).ids) != sample:
        fail("the tokenizer does not round-trip the held-out sample")


# ---------------------------------------------------------------- model

def make_model(n_vocab, bos):
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=n_vocab, hidden_size=N_EMBD, intermediate_size=N_FF, num_hidden_layers=N_LAYER,
        num_attention_heads=N_HEAD, num_key_value_heads=N_HEAD_KV, head_dim=HEAD_DIM, rms_norm_eps=NORM_EPS,
        rope_theta=ROPE_BASE, max_position_embeddings=N_CTX, tie_word_embeddings=False, attention_bias=False,
        mlp_bias=False, hidden_act="silu", bos_token_id=bos, eos_token_id=bos)
    model = transformers.LlamaForCausalLM(cfg)
    # Residual dropout (LlamaConfig has none): on the outputs of o_proj and down_proj while training.
    def drop(module, inputs, output):
        return F.dropout(output, DROPOUT, module.training)
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(drop)
        layer.mlp.down_proj.register_forward_hook(drop)
    # The RoPE base must be what the GGUF will say (transformers has renamed its rope settings before).
    inv_freq = getattr(getattr(model.model, "rotary_emb", None), "inv_freq", None)
    want = 1.0 / ROPE_BASE ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    if inv_freq is None:
        print("warning: model.model.rotary_emb.inv_freq not found; RoPE base not checked")
    elif not torch.allclose(inv_freq.double().cpu(), want, rtol=1e-5):  # an f32 buffer
        fail(f"the model's RoPE frequencies are not base {ROPE_BASE} over head_dim {HEAD_DIM}")
    return model


def lr_at(step, total):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / max(1, total - WARMUP))
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def heldout_eval(model, ids, bos, autocast):
    """Perplexity the way llama.cpp's `perplexity` tool (and `loom perplexity`) computes it:
    ids = the tokenized text with BOS first; chunk c = ids[c*256 : (c+1)*256] for c < len(ids) // 256
    (a partial last chunk is dropped); the chunk's first token is replaced by BOS; the logits at
    positions p = 128 .. 254 are scored against the token at p + 1 (127 predictions per chunk: the
    second half of the window, so every scored token has at least 128 tokens of context);
    ppl = exp(mean NLL over all scored tokens). Also returns the plain loss: the mean NLL of all
    255 predictions of every chunk. Returns (mean NLL scored, plain mean NLL, scored count)."""
    model.eval()
    dev = next(model.parameters()).device
    n_chunk = len(ids) // N_CTX
    if n_chunk == 0:
        fail(f"{len(ids)} tokens do not fill one {N_CTX}-token chunk")
    chunks = torch.tensor(np.asarray(ids[:n_chunk * N_CTX]).reshape(n_chunk, N_CTX), device=dev)
    chunks[:, 0] = bos
    first = N_CTX // 2
    scored, plain, n_scored, n_plain = 0.0, 0.0, 0, 0
    for b in range(0, n_chunk, 32):
        x = chunks[b:b + 32]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=x, use_cache=False).logits
        nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                              reduction="none").view(x.shape[0], N_CTX - 1)  # nll[:, p]: position p -> p+1
        scored += nll[:, first:].double().sum().item()
        n_scored += nll[:, first:].numel()
        plain += nll.double().sum().item()
        n_plain += nll.numel()
    model.train()
    return scored / n_scored, plain / n_plain, n_scored


# ---------------------------------------------------------------- export

def permute_rope_rows(w, n_head):
    """transformers rotates halves (i, i + hd/2) of each head; GGUF llama rotates adjacent pairs
    (2i, 2i + 1). Row i of a head becomes row 2i, row i + hd/2 becomes row 2i + 1 (hf_reference.py's
    unpermute_rope_rows undoes this)."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def export_gguf(model, path, tokens, types, merges, bos):
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    w = GgufWriter()
    a = "llama"
    w.add_string("general.architecture", a)
    w.add_string("general.name", NAME)
    w.add_string("general.license", LICENSE)
    w.add_string("general.description",
                 "A small LLaMA-architecture model trained by Loom's tools/train_shakespeare.py on tiny "
                 "shakespeare (Karpathy's char-rnn corpus, public-domain text of Shakespeare's plays); "
                 "byte-level BPE vocabulary of 4096 tokens trained on the same text.")
    w.add_u32("general.file_type", 1)  # mostly f16
    for key, v in [("context_length", N_CTX), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                   ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                   ("attention.head_count_kv", N_HEAD_KV), ("attention.key_length", HEAD_DIM),
                   ("attention.value_length", HEAD_DIM), ("rope.dimension_count", HEAD_DIM),
                   ("vocab_size", len(tokens))]:
        w.add_u32(f"{a}.{key}", v)
    w.add_f32(f"{a}.attention.layer_norm_rms_epsilon", NORM_EPS)
    w.add_f32(f"{a}.rope.freq_base", ROPE_BASE)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt-2")  # Loom's name for the GPT-2 regex (src/text/pretokenize.cpp)
    w.add_string_array("tokenizer.ggml.tokens", tokens)
    w.add_i32_array("tokenizer.ggml.token_type", types)
    w.add_string_array("tokenizer.ggml.merges", merges)
    w.add_u32("tokenizer.ggml.bos_token_id", bos)
    w.add_u32("tokenizer.ggml.eos_token_id", bos)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_eos_token", False)

    f16 = lambda k: sd[k].astype(np.float16)  # noqa: E731
    w.add_tensor("token_embd.weight", f16("model.embed_tokens.weight"))
    names = [("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
             ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
             ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
             ("ffn_down", "mlp.down_proj")]
    for il in range(N_LAYER):
        for gname, hname in names:
            t = sd[f"model.layers.{il}.{hname}.weight"]
            if gname == "attn_q":
                t = permute_rope_rows(t, N_HEAD)
            if gname == "attn_k":
                t = permute_rope_rows(t, N_HEAD_KV)
            w.add_tensor(f"blk.{il}.{gname}.weight", t.astype(np.float32 if t.ndim == 1 else np.float16))
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].astype(np.float32))
    w.add_tensor("output.weight", f16("lm_head.weight"))
    w.write(path)


def check_export(model, path, tokens, merges, sample_ids):
    """Re-reads the file and rebuilds the model with hf_reference.py (independent un-permutation and
    name mapping); its logits must match the trained model's (whose matrices were already rounded
    to f16, so only float32 vs float64 arithmetic differs)."""
    import hf_reference
    g = GgufReader(path)
    if g.metadata["tokenizer.ggml.tokens"] != tokens or g.metadata["tokenizer.ggml.merges"] != merges:
        fail("the tokenizer tables read back differ from those written")
    ref, n_vocab = hf_reference.build_model(g)
    torch.set_default_dtype(torch.float32)  # build_model sets float64
    if n_vocab != len(tokens) or len(sample_ids) < 2 * N_CTX:
        fail(f"the GGUF's vocabulary is {n_vocab} (expected {len(tokens)}), or the sample is short")
    x = torch.tensor([sample_ids[:N_CTX], sample_ids[N_CTX:2 * N_CTX]], device="cuda")  # two full windows
    model.eval()
    with torch.no_grad():
        want = model(input_ids=x, use_cache=False).logits.double()
        got = ref.eval()(input_ids=x, use_cache=False).logits.double()
    nmse = float(((got - want) ** 2).sum() / (want ** 2).sum())
    agree = float((got.argmax(-1) == want.argmax(-1)).double().mean())
    print(f"self-check: GGUF via hf_reference.build_model vs trained model, {x.numel()} tokens: "
          f"NMSE = {nmse:.3e} (limit 1e-5), argmax agreement {agree:.4f}")
    if not nmse < 1e-5:
        fail(f"exported model's logits differ from the trained model's (NMSE {nmse:.3e})")
    return nmse


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="tinyshakespeare.txt")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget (evaluations included)")
    ap.add_argument("--max-steps", type=int, default=3000,
                    help="upper bound on the step count (one epoch of the fit split is ~18 steps: more overfits)")
    ap.add_argument("--eval-every", type=int, default=250, help="validation/held-out evaluation interval")
    args = ap.parse_args()
    t_start = time.time()
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU")
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda"

    text = open(args.data, encoding="utf-8").read()
    cut = int(0.9 * len(text))
    train_text, heldout_text = text[:cut], text[cut:]
    fit_cut = int(0.95 * len(train_text))
    print(f"data: {len(text)} characters; train {len(train_text)} (model fit {fit_cut}, validation "
          f"{len(train_text) - fit_cut}), held-out {len(heldout_text)}")

    tok = train_tokenizer(train_text)
    tokens, types, merges, bos = tokenizer_tables(tok)
    n_vocab = len(tokens)
    sample = heldout_text[:4000]
    check_tokenizer_tables(tokens, merges, tok, sample)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    sample_ids = tok.encode(sample).ids
    with open(os.path.join(args.out, "heldout_sample.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(sample)
    with open(os.path.join(args.out, "heldout_ids.txt"), "w") as f:
        f.write(" ".join(map(str, sample_ids)) + "\n")
    print(f"tokenizer: {n_vocab} tokens, {len(merges)} merges, '{SPECIAL}' = {bos}; "
          f"held-out sample: 4000 characters -> {len(sample_ids)} tokens")

    enc = lambda s: np.array([bos] + tok.encode(s).ids, dtype=np.int64)  # noqa: E731
    fit_ids = torch.from_numpy(enc(train_text[:fit_cut])).to(dev)
    val_ids, heldout_ids = enc(train_text[fit_cut:]), enc(heldout_text)
    print(f"tokens: fit {len(fit_ids)}, validation {len(val_ids)}, held-out {len(heldout_ids)} (BOS included)")

    model = make_model(n_vocab, bos).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters ({n_params / 1e6:.2f}M)")
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]  # norms: no decay
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))
    offsets = torch.arange(N_CTX + 1, device=dev)

    budget, total, best = args.minutes * 60.0, args.max_steps, (float("inf"), -1, None)  # best: nll, step, state
    losses, step, t_mark, t_train = [], 0, None, time.time()

    def evaluate():
        nonlocal best
        v_nll, _, _ = heldout_eval(model, val_ids, bos, True)
        h_nll, h_plain, _ = heldout_eval(model, heldout_ids, bos, True)
        mark = ""
        if v_nll < best[0]:
            best = (v_nll, step, copy.deepcopy(model.state_dict()))
            mark = " (best so far)"
        print(f"eval step {step}: validation nll {v_nll:.4f}, held-out nll {h_nll:.4f} "
              f"(ppl {math.exp(h_nll):.2f}), held-out plain loss {h_plain:.4f}{mark}", flush=True)

    model.train()
    while step < total:
        if time.time() - t_train > budget:
            print(f"time guard: stopping at step {step} of {total}")
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total)
        ix = torch.randint(0, len(fit_ids) - N_CTX - 1, (BATCH,), device=dev)
        win = fit_ids[ix[:, None] + offsets]
        x, y = win[:, :-1].clone(), win[:, 1:]
        x[:, 0] = bos
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, n_vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step == 5:
            t_mark = time.time()
        if step == 25:  # 20 steps timed after warm-up: fit the step count to the budget
            per_step = (time.time() - t_mark) / 20  # 10% of the budget is left for the evaluations
            total = max(WARMUP + 100, min(args.max_steps, int(0.9 * budget / per_step)))
            print(f"timing: {per_step * 1e3:.1f} ms/step -> {total} steps")
        if step % 100 == 0:
            print(f"step {step:5d}/{total}  train loss {np.mean(losses[-100:]):.4f}  lr {lr_at(step - 1, total):.2e}  "
                  f"{time.time() - t_train:.0f} s", flush=True)
        if step % args.eval_every == 0 or step == total:
            evaluate()
    if step % args.eval_every != 0 and step != total:  # stopped by the time guard
        evaluate()
    train_seconds = time.time() - t_train
    model.load_state_dict(best[2])
    print(f"checkpoint: step {best[1]} (validation nll {best[0]:.4f})")

    # Round the matrices to f16 now, so the numbers below describe exactly the exported weights, and
    # compute in true float32 from here on (TF32 would cost the self-check's 1e-5 NMSE margin).
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())
    h_nll, h_plain, n_scored = heldout_eval(model, heldout_ids, bos, False)
    print(f"heldout_loss = {h_plain:.4f}")
    print(f"heldout_ppl_ctx256 = {math.exp(h_nll):.4f}  (mean NLL {h_nll:.4f} over {n_scored} scored tokens, "
          f"float32, f16 weights)")

    gguf_path = os.path.join(args.out, "loom-shakespeare-f16.gguf")
    export_gguf(model, gguf_path, tokens, types, merges, bos)
    print(f"wrote {gguf_path} ({os.path.getsize(gguf_path)} bytes)")
    nmse = check_export(model, gguf_path, tokens, merges, sample_ids)

    import tokenizers, transformers  # noqa: E401
    results = {
        "model": NAME, "license": LICENSE, "parameters": n_params, "n_vocab": n_vocab, "n_ctx": N_CTX,
        "steps_run": step, "steps_planned": total, "checkpoint_step": best[1],
        "train_loss_last100": float(np.mean(losses[-100:])), "validation_nll_ctx256": best[0],
        "heldout_loss": h_plain, "heldout_nll_ctx256": h_nll, "heldout_ppl_ctx256": math.exp(h_nll),
        "heldout_scored_tokens": n_scored, "heldout_tokens_with_bos": int(len(heldout_ids)),
        "ppl_rule": "llama.cpp perplexity: BOS + tokens, 256-token chunks, first token of each chunk set to "
                    "BOS, logits at positions 128..254 scored against the next token",
        "export_nmse_vs_trained": nmse, "train_seconds": train_seconds, "total_seconds": time.time() - t_start,
        "seed": SEED, "torch": torch.__version__, "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__, "gpu": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    print(f"train_shakespeare: OK in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
