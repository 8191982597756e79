"""The hash by which gpu_check's training smoke names its data files (scripts/bundle.sh checks it,
scripts/gpu_check/smoke_reference.sh writes it): SHA-256 of the file's content, where a shard's
content leaves out what a rebuild of the same corpus changes. A token shard's header (docs/formats.md,
format version 2) records the modification time of the corpus file it was made from (bytes 96-103)
and a CRC of the header (bytes 124-127); a corpus rebuilt from the same packages gives the same
tokens under other times, so those 12 bytes are not hashed. Every other file is hashed whole.

    python3 smoke_hash.py FILE...    prints each file's hash and path
"""
import hashlib
import sys

_SHARD_MAGIC = b"MNSHARD1"
_UNHASHED = ((96, 104), (124, 128))  # a v2 shard header's input mtime and header CRC


def content_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(128)
        version = int.from_bytes(head[8:12], "little") if len(head) >= 12 else 0
        if head[:8] == _SHARD_MAGIC and version == 2 and len(head) == 128:
            start = 0
            for lo, hi in _UNHASHED:
                h.update(head[start:lo])
                start = hi
            h.update(head[start:])
        else:
            h.update(head)
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(content_hash(p), p)
