"""Minimal GGUF reader and writer in numpy, for reference checks and exports on the GPU machine (no gguf
package there).

The reader reads versions 2 and 3: metadata, tensor infos, and tensors of types f32, f16, bf16, q8_0, q4_0
and mxfp4 dequantized to float32. Arrays come back in numpy's order: a GGUF tensor with ne = [n_embd, n_vocab]
is an array of shape (n_vocab, n_embd). The writer (GgufWriter) writes version 3 files with f32 and f16
tensors; tools/train_shakespeare.py exports Loom's small model with it.
"""
import os
import struct

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
TYPE_F32, TYPE_F16, TYPE_Q4_0, TYPE_Q8_0, TYPE_BF16, TYPE_MXFP4 = 0, 1, 2, 8, 30, 39
# MXFP4's e2m1 codes doubled (the block scale is then halved): ggml's kvalues_mxfp4
_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


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
        if ttype == TYPE_MXFP4:
            # 17 bytes per 32 values: an e8m0 exponent e (scale 2^(e-128) for the doubled codes), then
            # 16 bytes of nibbles laid out as q4_0's (low nibbles first half, high ones second)
            blocks = np.frombuffer(self.buf, np.uint8, n // 32 * 17, start).reshape(-1, 17)
            d = np.ldexp(1.0, blocks[:, :1].astype(np.int64) - 128).astype(np.float32)
            qs = blocks[:, 1:]
            lo, hi = _MXFP4_VALUES[qs & 0x0F], _MXFP4_VALUES[qs >> 4]
            return (np.concatenate([lo, hi], axis=1) * d).reshape(shape)
        raise ValueError(f"{self.path}: tensor '{name}' has type {ttype}, not supported by this reader")


class GgufWriter:
    """Minimal GGUF version 3 writer: metadata in the order added, then tensor infos, then each
    tensor's data at a multiple of the alignment (32, GGUF's default). Tensors are numpy arrays in
    numpy order: an array of shape (n_out, n_in) is written with ne = [n_in, n_out]. f32 and f16
    arrays only (the types Loom's small model needs). write() goes through a temporary file and a
    rename, so a crash never leaves a truncated model behind."""

    ALIGN = 32
    T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64 = 4, 5, 6, 7, 8, 9, 10

    def __init__(self):
        self.kvs = []  # (key, encoded bytes: type id + value)
        self.tensors = []  # (name, array, ggml type)
        self._names = set()

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _add(self, key, payload):
        if not key or key in self._names:
            raise ValueError(f"GgufWriter: key '{key}' is empty or added twice")
        self._names.add(key)
        self.kvs.append((key, payload))

    def add_u32(self, key, v):
        self._add(key, struct.pack("<II", self.T_U32, int(v)))

    def add_i32(self, key, v):
        self._add(key, struct.pack("<Ii", self.T_I32, int(v)))

    def add_u64(self, key, v):
        self._add(key, struct.pack("<IQ", self.T_U64, int(v)))

    def add_f32(self, key, v):
        self._add(key, struct.pack("<If", self.T_F32, float(v)))

    def add_bool(self, key, v):
        self._add(key, struct.pack("<I?", self.T_BOOL, bool(v)))

    def add_string(self, key, v):
        self._add(key, struct.pack("<I", self.T_STRING) + self._str(v))

    def add_string_array(self, key, values):
        body = b"".join(self._str(v) for v in values)
        self._add(key, struct.pack("<IIQ", self.T_ARRAY, self.T_STRING, len(values)) + body)

    def add_i32_array(self, key, values):
        a = np.asarray(values, dtype="<i4")
        self._add(key, struct.pack("<IIQ", self.T_ARRAY, self.T_I32, a.size) + a.tobytes())

    def add_tensor(self, name, array):
        a = np.ascontiguousarray(array)
        types = {np.dtype(np.float32): TYPE_F32, np.dtype(np.float16): TYPE_F16}
        if a.dtype not in types:
            raise ValueError(f"GgufWriter: tensor '{name}' has dtype {a.dtype}; only float32 and float16 are written")
        if not 1 <= a.ndim <= 4 or len(name.encode()) > 64 or any(t[0] == name for t in self.tensors):
            raise ValueError(f"GgufWriter: tensor '{name}': bad name (duplicate or > 64 bytes) or {a.ndim} dims")
        self.tensors.append((name, a.astype(a.dtype.newbyteorder("<"), copy=False), types[a.dtype]))

    def write(self, path):
        pad = lambda n: (n + self.ALIGN - 1) // self.ALIGN * self.ALIGN  # noqa: E731
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs))]
        head += [self._str(k) + v for k, v in self.kvs]
        offset = 0
        for name, a, ttype in self.tensors:
            ne = list(reversed(a.shape))
            head.append(self._str(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ttype, offset))
            offset = pad(offset + a.nbytes)
        header = b"".join(head)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(header + b"\0" * (pad(len(header)) - len(header)))
                for _, a, _ in self.tensors:
                    f.write(a.tobytes())
                    f.write(b"\0" * (pad(a.nbytes) - a.nbytes))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
