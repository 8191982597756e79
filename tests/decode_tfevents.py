#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event files as TensorBoard does, independently of multinorm's
writer: the TFRecord framing with a CRC-32C computed here bit by bit (the polynomial's definition),
the events decoded by python3-protobuf from src/train/tensorboard_event.proto (compiled with protoc
into a temporary directory), and TensorBoard's purge rule (a SessionLog START at step s drops what
was logged at s and after). Checks the scalars against metrics.jsonl.

usage: decode_tfevents.py RUN_DIR PROTO [--expect-starts STEP,STEP...]   (exit 1 naming what is wrong)
"""
import glob, json, os, struct, subprocess, sys, tempfile


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    raw = open(path, "rb").read()
    at = 0
    while at < len(raw):
        if at + 12 > len(raw):
            raise ValueError(f"{path}: a record's header cut at byte {at}")
        header = raw[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", raw[at + 8:at + 12])
        if length_crc != masked(header):
            raise ValueError(f"{path}: the length's CRC at byte {at} is wrong")
        data = raw[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack("<I", raw[at + 12 + length:at + 16 + length])
        if len(data) != length or data_crc != masked(data):
            raise ValueError(f"{path}: the data's CRC of the record at byte {at} is wrong")
        yield data
        at += 16 + length


def load_module(proto):
    out = tempfile.mkdtemp()
    subprocess.run(["protoc", f"--python_out={out}", f"-I{os.path.dirname(proto)}", proto], check=True)
    sys.path.insert(0, out)
    import tensorboard_event_pb2
    return tensorboard_event_pb2


def main():
    run_dir, proto = sys.argv[1], sys.argv[2]
    expect_starts = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 and sys.argv[3] == "--expect-starts" else None
    pb = load_module(proto)
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        sys.exit(f"{run_dir}: no event file")
    scalars, starts = {}, []
    for path in files:
        events = [pb.Event.FromString(r) for r in records(path)]
        if not events or events[0].WhichOneof("what") != "file_version" or events[0].file_version != "brain.Event:2":
            sys.exit(f"{path}: the first record is not the file version brain.Event:2")
        for e in events[1:]:
            kind = e.WhichOneof("what")
            if kind == "session_log" and e.session_log.status == pb.SessionLog.START:
                starts.append(e.step)
                scalars = {k: v for k, v in scalars.items() if k[0] < e.step}
            elif kind == "summary":
                for v in e.summary.value:
                    scalars[(e.step, v.tag)] = v.simple_value
    if expect_starts is not None and starts != expect_starts:
        sys.exit(f"{run_dir}: session starts at {starts}, expected {expect_starts}")
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
    want = {}
    for line in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))):
        s = line["step"]
        if line["type"] == "train":
            for tag, key in [("loss", "loss"), ("lr_matrix", "lr_matrix"), ("lr_fallback", "lr_fallback"),
                             ("grad_norm", "grad_norm"), ("tokens_per_s", "tokens_per_s")]:
                want[(s, "train/" + tag)] = f32(line[key])
        elif line["type"] == "eval":
            want[(s, "eval/loss")] = f32(line["val_loss"])
            want[(s, "eval/perplexity")] = f32(line["val_ppl"])
    if scalars != want:
        missing = sorted(set(want) - set(scalars))[:3]
        extra = sorted(set(scalars) - set(want))[:3]
        differ = [(k, scalars[k], want[k]) for k in sorted(set(want) & set(scalars)) if scalars[k] != want[k]][:3]
        sys.exit(f"{run_dir}: event files and metrics.jsonl differ: missing {missing}, extra {extra}, values {differ}")
    print(f"{run_dir}: {len(files)} event file(s), {len(scalars)} scalars equal to metrics.jsonl's, session starts {starts}")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        sys.exit(str(e))
