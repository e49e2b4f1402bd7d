#!/usr/bin/python3
"""A TensorBoard event file written by an independent implementation.

The events are tensorflow.Event protocol buffers (tensorflow/core/util/
event.proto: wall_time = 1, step = 2, file_version = 3, summary = 5;
Summary.value = 1; Value.tag = 1, simple_value = 2, proto3), built here with
Debian's python3-protobuf from a descriptor declared in this script, and
serialized by protobuf itself. Each is framed as a TFRecord (uint64 length,
masked CRC32C of the length, data, masked CRC32C of the data), the CRC32C
computed by Debian's python3-crcmod ("crc-32c"), the mask TensorFlow's:
((crc >> 15) | (crc << 17)) + 0xa282ead8.

internal/tfevents's TestGoldenFile writes the same events with the Go writer
and compares the bytes. The inputs (wall times, steps, tags, values) are in
testdata/golden.json beside the file.

Writes internal/tfevents/testdata/golden.tfevents and golden.json:
    /usr/bin/python3 scripts/golden_tfevents.py
"""

import json
import os
import platform
import struct

import crcmod.predefined
import google.protobuf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "internal", "tfevents", "testdata")
SEED = None  # fixed inputs, no randomness

# (wall_time, step, [(tag, value)]); the first event is the version event.
EVENTS = [
    (1733140800.25, 1, [("train/loss", -0.125), ("train/reward_mean", 0.5)]),
    (1733140801.5, 2, [("train/loss", 3.0e-8), ("train/lr", 5e-6), ("train/zero", 0.0), ("train/negzero", -0.0)]),
    (1733140802.0, 0, [("train/step0", 1.0)]),
    (1733140803.75, 123456789012, [("train/big_step", 65504.0), ("train/nan", float("nan")), ("train/inf", float("-inf"))]),
    (1733140804.0, 7, [("", 2.0), ("train/ünïcode", 1.5)]),
]
VERSION_WALL = 1733140800.0


def event_classes():
    fd = descriptor_pb2.FileDescriptorProto(name="tg_event.proto", package="tensorflow", syntax="proto3")
    value = fd.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=9, label=1)  # TYPE_STRING
    value.field.add(name="simple_value", number=2, type=2, label=1)  # TYPE_FLOAT
    summary = fd.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=11, label=3, type_name=".tensorflow.Value")
    event = fd.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=1, label=1)  # TYPE_DOUBLE
    event.field.add(name="step", number=2, type=3, label=1)  # TYPE_INT64
    event.field.add(name="file_version", number=3, type=9, label=1, oneof_index=0)
    event.field.add(name="summary", number=5, type=11, label=1, type_name=".tensorflow.Summary", oneof_index=0)
    event.oneof_decl.add(name="what")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    get = message_factory.MessageFactory(pool).GetPrototype
    return get(pool.FindMessageTypeByName("tensorflow.Event")), get(pool.FindMessageTypeByName("tensorflow.Summary"))


CRC = crcmod.predefined.mkCrcFun("crc-32c")


def masked(b):
    c = CRC(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data):
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked(n)) + data + struct.pack("<I", masked(data))


def main():
    Event, Summary = event_classes()
    out = bytearray()
    out += record(Event(wall_time=VERSION_WALL, file_version="brain.Event:2").SerializeToString())
    for wall, step, vals in EVENTS:
        s = Summary()
        for tag, v in vals:
            s.value.add(tag=tag, simple_value=v)
        out += record(Event(wall_time=wall, step=step, summary=s).SerializeToString())
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "golden.tfevents"), "wb") as f:
        f.write(out)
    meta = {
        "script": "scripts/golden_tfevents.py",
        "protobuf": google.protobuf.__version__,
        "crcmod": "crc-32c of Debian's python3-crcmod",
        "python": platform.python_version(),
        "seed": SEED,
        "version_wall_time": VERSION_WALL,
        "events": [{"wall_time": w, "step": st, "values": [[t, repr(v)] for t, v in vals]} for w, st, vals in EVENTS],
    }
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"golden_tfevents: {len(EVENTS) + 1} events, {len(out)} bytes (protobuf {google.protobuf.__version__}) -> {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
