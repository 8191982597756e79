"""A minimal reader for R's lazy-load data (`data/Rdata.rdx` + `data/Rdata.rdb` of an installed R
package), so that text shipped as R data (Debian's r-cran-janeaustenr) is read without installing R.

Covers what such data sets use: R serialization format versions 2 and 3 in XDR (big-endian), atomic
vectors (logical, integer, double, character), lists with names, pairlists (attributes) and symbols.
The index (.rdx) is a gzip'd serialized list {variables: name -> (offset, length), references,
compressed}; each variable in the .rdb is a 4-byte big-endian length followed by the zlib-compressed
(compressed = TRUE) serialized object.
"""
import gzip
import struct
import zlib

_NIL, _REF, _SYM, _LIST, _LANG, _CHAR = 254, 255, 1, 2, 6, 9
_LGL, _INT, _REAL, _STR, _VEC, _EXPR = 10, 13, 14, 16, 19, 20
_SPECIAL_ENVS = {242, 250, 251, 252, 253}  # empty/base/global env, missing arg, unbound value
_LATIN1 = 1 << 14  # CHARSXP "levels" bit (gp << 12): LATIN1_MASK = 1 << 2


class _Reader:
    def __init__(self, data):
        self.data, self.pos, self.refs = data, 0, []

    def int(self):
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def object(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == _NIL or kind in _SPECIAL_ENVS:
            return None
        if kind == _REF:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == _SYM:
            name = self.object()
            self.refs.append(name)
            return name
        if kind == _CHAR:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            raw = self.data[self.pos:self.pos + n]
            self.pos += n
            return raw.decode("latin-1" if flags & _LATIN1 else "utf-8")
        if kind in (_LIST, _LANG):  # pairlist: [(tag, value), ...]
            if has_attr:
                self.object()
            tag = self.object() if has_tag else None
            head, tail = self.object(), self.object()
            return [(tag, head)] + (tail if isinstance(tail, list) else [])
        if kind in (_STR, _VEC, _EXPR):
            values = [self.object() for _ in range(self.int())]
        elif kind in (_LGL, _INT):
            n = self.int()
            values = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif kind == _REAL:
            n = self.int()
            values = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        else:
            raise ValueError(f"R object type {kind} is not supported by this reader")
        if has_attr:
            names = dict(self.object()).get("names")
            if kind == _VEC and names is not None:
                return dict(zip(names, values))
        return values


def unserialize(data):
    """One R object from serialization-format bytes ("X\\n", XDR)."""
    if data[:2] != b"X\n":
        raise ValueError("not an R XDR serialization")
    r = _Reader(data)
    r.pos = 2
    version = r.int()
    r.int(), r.int()  # writer's R version, minimal reader version
    if version == 3:
        n = r.int()  # native encoding name (read first: `r.pos += r.int()` would lose the int's 4 bytes)
        r.pos += n
    return r.object()


def lazy_load(rdx_path, rdb_path):
    """All variables of a lazy-load database: {name: object}."""
    with open(rdx_path, "rb") as f:
        index = unserialize(gzip.decompress(f.read()))
    if index.get("compressed") not in ([True], [1]):
        raise ValueError(f"{rdb_path}: only zlib-compressed lazy-load databases are supported")
    with open(rdb_path, "rb") as f:
        db = f.read()
    out = {}
    for name, (offset, length) in index["variables"].items():
        blob = db[int(offset):int(offset) + int(length)]
        (size,) = struct.unpack(">I", blob[:4])
        raw = zlib.decompress(blob[4:])
        if len(raw) != size:
            raise ValueError(f"{rdb_path}: {name}: {len(raw)} bytes, expected {size}")
        out[name] = unserialize(raw)
    return out
