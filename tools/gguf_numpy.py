"""Minimal GGUF reader in numpy, for reference checks on the GPU machine (no gguf package there).

Reads versions 2 and 3: metadata, tensor infos, and tensors of types f32, f16, bf16, q8_0 and q4_0
dequantized to float32. Arrays come back in numpy's order: a GGUF tensor with ne = [n_embd, n_vocab]
is an array of shape (n_vocab, n_embd).
"""
import struct

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
TYPE_F32, TYPE_F16, TYPE_Q4_0, TYPE_Q8_0, TYPE_BF16 = 0, 1, 2, 8, 30


class GgufReader:
    def __init__(self, path):
        self.path = path
        self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        self.pos = 0
        magic = bytes(self.buf[0:4])
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        self.pos = 4
        version = self._u32()
        if version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {version}")
        n_tensors, n_kv = self._u64(), self._u64()
        self.metadata = {}
        for _ in range(n_kv):
            key = self._str()
            self.metadata[key] = self._value(self._u32())
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u32()
            ne = [self._u64() for _ in range(n_dims)]
            ttype = self._u32()
            offset = self._u64()
            self.tensors[name] = (ne, ttype, offset)
        align = int(self.metadata.get("general.alignment", 32))
        self.data_start = (self.pos + align - 1) // align * align

    def _unpack(self, fmt):
        size = struct.calcsize(fmt)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def _u32(self):
        return self._unpack("<I")

    def _u64(self):
        return self._unpack("<Q")

    def _str(self):
        n = self._u64()
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _value(self, vtype):
        if vtype in _SCALAR:
            return self._unpack(_SCALAR[vtype])
        if vtype == 8:
            return self._str()
        if vtype == 9:
            etype, n = self._u32(), self._u64()
            return [self._value(etype) for _ in range(n)]
        raise ValueError(f"{self.path}: unknown metadata type {vtype}")

    def tensor(self, name):
        """The tensor as float32, numpy order (reversed GGUF dims)."""
        ne, ttype, offset = self.tensors[name]
        n = int(np.prod(ne))
        start = self.data_start + offset
        shape = tuple(reversed(ne))
        if ttype == TYPE_F32:
            return np.frombuffer(self.buf, np.float32, n, start).reshape(shape).copy()
        if ttype == TYPE_F16:
            return np.frombuffer(self.buf, np.float16, n, start).astype(np.float32).reshape(shape)
        if ttype == TYPE_BF16:
            raw = np.frombuffer(self.buf, np.uint16, n, start).astype(np.uint32) << 16
            return raw.view(np.float32).reshape(shape)
        if ttype == TYPE_Q8_0:
            blocks = np.frombuffer(self.buf, np.uint8, n // 32 * 34, start).reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
            return (q * d).reshape(shape)
        if ttype == TYPE_Q4_0:
            blocks = np.frombuffer(self.buf, np.uint8, n // 32 * 18, start).reshape(-1, 18)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            qs = blocks[:, 2:]
            lo = (qs & 0x0F).astype(np.float32) - 8
            hi = (qs >> 4).astype(np.float32) - 8
            return (np.concatenate([lo, hi], axis=1) * d).reshape(shape)
        raise ValueError(f"{self.path}: tensor '{name}' has type {ttype}, not supported by this reader")
