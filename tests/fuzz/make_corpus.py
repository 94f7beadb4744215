#!/usr/bin/env python3
"""Writes the hand-made seed and regression files of tests/fuzz/corpus.

Files named valid-* must parse and bad-* must be rejected (loom-fuzz-replay checks both). Files
named fuzz-<sha1> are inputs the fuzzer found that reach code the hand-made files do not (kept with
libFuzzer's -set_cover_merge=1 -use_counters=0); valid-oom-* is a fuzzer find that made the writer
allocate 1 GiB before it was fixed. This script rewrites only the hand-made files.
Run from anywhere: python3 tests/fuzz/make_corpus.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
              U64: "<Q", I64: "<q", F64: "<d"}
# ggml type id -> (block size, bytes per block)
GGML = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}


def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def value(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return u32(et) + u64(len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def kv(key, t, v): return gstr(key) + u32(t) + value(t, v)


def tensor_info(name, dims, ggml_type, offset):
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ggml_type) + u64(offset)


def pattern(n, seed):
    return bytes(((i * 31 + seed * 17) % 251) + 1 for i in range(n))


def gguf(kvs, tensors=(), version=3, alignment=32, pad_end=True):
    """kvs: encoded KVs; tensors: (name, dims, ggml_type). Data is packed at aligned offsets."""
    infos, blobs, offset = b"", [], 0
    for i, (name, dims, t) in enumerate(tensors):
        bs, ts = GGML[t]
        n = 1
        for d in dims:
            n *= d
        size = n // bs * ts
        infos += tensor_info(name, dims, t, offset)
        blobs.append((offset, pattern(size, i)))
        offset = (offset + size + alignment - 1) // alignment * alignment
    head = b"GGUF" + u32(version) + u64(len(tensors)) + u64(len(kvs)) + b"".join(kvs) + infos
    if not tensors and not pad_end:
        return head
    out = bytearray(head + b"\0" * (-len(head) % alignment))
    data_start = len(out)
    for off, blob in blobs:
        out += b"\0" * (data_start + off - len(out)) + blob
    out += b"\0" * (-len(out) % alignment)
    return bytes(out)


def header(n_tensors, n_kv, version=3): return b"GGUF" + u32(version) + u64(n_tensors) + u64(n_kv)


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(16)] + ["\u2581the", "\u2581a", "ing", "er"]
    vocab_kvs = [
        kv("general.architecture", STR, "llama"),
        kv("llama.block_count", U32, 2),
        kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        kv("tokenizer.ggml.model", STR, "llama"),
        kv("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        kv("tokenizer.ggml.scores", ARR, (F32, [-float(i) for i in range(len(tokens))])),
        kv("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3] + [6] * 16 + [1] * 4)),
        kv("tokenizer.ggml.add_bos_token", BOOL, 1),
    ]
    files["valid-vocab-mini.gguf"] = gguf(vocab_kvs, pad_end=False)
    every_type = [
        kv("t.u8", U8, 200), kv("t.i8", I8, -100), kv("t.u16", U16, 60000), kv("t.i16", I16, -30000),
        kv("t.u32", U32, 4000000000), kv("t.i32", I32, -2000000000), kv("t.f32", F32, 0.5),
        kv("t.bool", BOOL, 0), kv("t.str", STR, "h\u00e9llo"), kv("t.u64", U64, 1 << 63),
        kv("t.i64", I64, -(1 << 62)), kv("t.f64", F64, 2.5),
        kv("a.nested", ARR, (ARR, [(U16, [1, 2, 3]), (STR, ["x", ""]), (ARR, [(BOOL, [1, 0])])])),
        kv("a.empty", ARR, (U64, [])),
    ]
    files["valid-every-kv-type.gguf"] = gguf(every_type, version=2)
    model_tensors = [("token_embd.weight", [32, 4], 1), ("blk.0.attn_q.weight", [64, 2], 8),
                     ("blk.0.ffn_down.weight", [256, 1], 12), ("blk.0.ffn_up.weight", [256, 1], 14),
                     ("blk.0.ffn_gate.weight", [256, 1], 13), ("output_norm.weight", [32], 0),
                     ("t.bf16", [2, 3, 2, 1], 30)]
    files["valid-tensors.gguf"] = gguf(vocab_kvs[:3], model_tensors)
    files["valid-align64.gguf"] = gguf([kv("general.alignment", U32, 64)] + vocab_kvs[:2],
                                       [("a", [8], 0), ("b", [3], 1), ("c", [32, 2], 8)], alignment=64)
    files["valid-align1.gguf"] = gguf([kv("general.alignment", U32, 1)], [("a", [3], 1), ("b", [3], 0)],
                                      alignment=1)

    # Malformed: each breaks one rule.
    small = gguf(vocab_kvs[:2], [("w", [8, 2], 0)])
    files["bad-empty.gguf"] = b""
    files["bad-truncated-header.gguf"] = small[:20]
    files["bad-truncated-kv.gguf"] = small[:40]
    files["bad-truncated-data.gguf"] = small[:-40]
    files["bad-magic.gguf"] = b"GGML" + small[4:]
    files["bad-version1.gguf"] = b"GGUF" + u32(1) + u32(0) + u32(1) + kv("a", U8, 1)
    files["bad-version4.gguf"] = header(0, 1, version=4) + kv("a", U8, 1)
    files["bad-bigendian.gguf"] = b"GGUF" + struct.pack(">I", 3) + struct.pack(">QQ", 0, 1) + kv("a", U8, 1)
    files["bad-kv-count-huge.gguf"] = header(0, 1 << 63) + kv("a", U8, 1)
    files["bad-tensor-count-huge.gguf"] = header(1 << 40, 1) + kv("a", U8, 1) + b"\0" * 64
    files["bad-key-len-2p63.gguf"] = header(0, 1) + u64(1 << 63) + b"key" + u32(4) + u32(1)
    files["bad-key-empty.gguf"] = header(0, 1) + gstr("") + u32(4) + u32(1)
    files["bad-string-len-2p63.gguf"] = header(0, 1) + gstr("s") + u32(STR) + u64(1 << 63) + b"abcdefgh"
    files["bad-array-len-2p60.gguf"] = header(0, 1) + gstr("a") + u32(ARR) + u32(U32) + u64(1 << 60) + b"\1" * 64
    files["bad-string-array-len.gguf"] = header(0, 1) + gstr("a") + u32(ARR) + u32(STR) + u64(3) + gstr("x") + \
        u64(1 << 62) + b"\0" * 24
    deep = header(0, 1) + gstr("deep") + u32(ARR)
    for _ in range(9):
        deep += u32(ARR) + u64(1)
    files["bad-nested-too-deep.gguf"] = deep + u32(U8) + u64(0) + b"\0" * 32
    files["bad-bool-2.gguf"] = header(0, 1) + gstr("b") + u32(BOOL) + b"\2" + b"\0" * 8
    files["bad-value-type-13.gguf"] = header(0, 1) + gstr("k") + u32(13) + u32(0)
    files["bad-array-elem-type-77.gguf"] = header(0, 1) + gstr("k") + u32(ARR) + u32(77) + u64(0)
    files["bad-dup-key.gguf"] = header(0, 2) + kv("k", U32, 1) + kv("k", F32, 2.0)
    files["bad-align-0.gguf"] = gguf([kv("general.alignment", U32, 0)])
    files["bad-align-3.gguf"] = gguf([kv("general.alignment", U32, 3)])
    files["bad-align-u64.gguf"] = gguf([kv("general.alignment", U64, 32)])

    def one_tensor(dims, t, offset, data_bytes):
        head = header(1, 0) + tensor_info("w", dims, t, offset)
        return head + b"\0" * (-len(head) % 32) + pattern(data_bytes, 1)

    files["bad-tensor-ndims5.gguf"] = one_tensor([8, 1, 1, 1, 1], 0, 0, 32)
    files["bad-tensor-ndims0.gguf"] = one_tensor([], 0, 0, 32)
    files["bad-tensor-zero-dim.gguf"] = one_tensor([8, 0], 0, 0, 32)
    files["bad-tensor-dim-2p64.gguf"] = one_tensor([(1 << 64) - 1], 0, 0, 32)
    files["bad-tensor-count-overflow.gguf"] = one_tensor([1 << 62, 1 << 62], 0, 0, 32)
    files["bad-tensor-bytes-overflow.gguf"] = one_tensor([1 << 62], 0, 0, 32)
    files["bad-tensor-huge-shape.gguf"] = one_tensor([1 << 40, 1 << 20], 0, 0, 32)
    files["bad-tensor-type-99.gguf"] = one_tensor([8], 99, 0, 32)
    files["bad-tensor-type-retired-4.gguf"] = one_tensor([32], 4, 0, 32)
    files["bad-tensor-ne0-block.gguf"] = one_tensor([33], 8, 0, 64)
    files["bad-tensor-offset-past-end.gguf"] = one_tensor([8], 0, 1024, 32)
    files["bad-tensor-offset-wraps.gguf"] = one_tensor([8], 0, (1 << 64) - 32, 32)
    files["bad-tensor-misaligned.gguf"] = one_tensor([8], 0, 8, 64)
    files["bad-tensor-name-65.gguf"] = header(1, 0) + tensor_info("n" * 65, [8], 0, 0) + b"\0" * 64
    files["bad-tensor-name-2p63.gguf"] = header(1, 0) + u64(1 << 63) + b"\0" * 64
    two = header(2, 0) + tensor_info("w", [8], 0, 0) + tensor_info("w", [8], 0, 32)
    files["bad-tensor-dup-name.gguf"] = two + b"\0" * (-len(two) % 32) + pattern(64, 2)
    ovl = header(2, 0) + tensor_info("a", [16], 0, 0) + tensor_info("b", [8], 0, 32)
    files["bad-tensor-overlap.gguf"] = ovl + b"\0" * (-len(ovl) % 32) + pattern(64, 3)

    for name, data in sorted(files.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(files)} files, {sum(len(d) for d in files.values())} bytes, to {OUT}")


if __name__ == "__main__":
    main()
