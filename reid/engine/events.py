"""Training logs people and programs read: metrics.json (JSON lines), TensorBoard scalars, PNG curves.

The TensorBoard writer produces the standard `events.out.tfevents.*` record format (TFRecord framing with
masked CRC-32C, `Event`/`Summary` protobufs) directly, so neither tensorboard nor protobuf is a dependency.
"""
import json
import math
import os
import socket
import struct
import time

# ----------------------------------------------------------------------------- CRC-32C (Castagnoli)
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ----------------------------------------------------------------------------- minimal protobuf encoding
def _varint(value):
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number, payload):
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def encode_scalar_event(tag, value, step, wall_time):
    summary_value = _field_bytes(1, tag.encode("utf-8")) + bytes([(2 << 3) | 5]) + struct.pack("<f", float(value))
    summary = _field_bytes(1, summary_value)
    return (bytes([(1 << 3) | 1]) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(int(step))
            + _field_bytes(5, summary))


def encode_version_event(wall_time):
    return bytes([(1 << 3) | 1]) + struct.pack("<d", wall_time) + _field_bytes(3, b"brain.Event:2")


def frame_record(data):
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def read_records(path):
    """Yield the payloads of a TFRecord file, checking both CRCs (used by the tests)."""
    with open(path, "rb") as fh:
        while True:
            header = fh.read(8)
            if not header:
                return
            (length,) = struct.unpack("<Q", header)
            (hcrc,) = struct.unpack("<I", fh.read(4))
            data = fh.read(length)
            (dcrc,) = struct.unpack("<I", fh.read(4))
            if hcrc != masked_crc32c(header) or dcrc != masked_crc32c(data):
                raise ValueError("corrupt record in %s" % path)
            yield data


class TensorBoardWriter:
    def __init__(self, log_dir):
        os.makedirs(log_dir, exist_ok=True)
        name = "events.out.tfevents.%d.%s.%d" % (int(time.time()), socket.gethostname(), os.getpid())
        self.path = os.path.join(log_dir, name)
        self._fh = open(self.path, "ab")
        self._fh.write(frame_record(encode_version_event(time.time())))
        self._fh.flush()

    def add_scalar(self, tag, value, step):
        if value is None or not math.isfinite(float(value)):
            return
        self._fh.write(frame_record(encode_scalar_event(tag, value, step, time.time())))

    def flush(self):
        self._fh.flush()

    def close(self):
        if not self._fh.closed:
            self._fh.close()


class EventStorage:
    """What happened during training, as scalars tagged with the iteration they belong to.

    Steps and hooks `put_scalar(name, value)` during iteration `iter` (the trainer keeps `iter` current);
    a value that belongs elsewhere names its iteration (the evaluation before training is iteration -1).
    Readers get the newest value of each name with its iteration (`latest()`), or everything put for one
    iteration (`at(iteration)`), so a value is never reported under an iteration it did not happen in.
    """

    def __init__(self, start_iter=0):
        self.iter = int(start_iter)
        self._latest = {}  # name -> (value, iteration)

    def put_scalar(self, name, value, iteration=None):
        value = value if isinstance(value, int) and not isinstance(value, bool) else float(value)
        self._latest[name] = (value, self.iter if iteration is None else int(iteration))

    def put_scalars(self, scalars, iteration=None):
        for name, value in scalars.items():
            self.put_scalar(name, value, iteration)

    def latest(self):
        """{name: (value, iteration)} of the newest value put under each name."""
        return dict(self._latest)

    def at(self, iteration):
        """{name: value} of the values put for `iteration` (and not replaced since)."""
        return {name: value for name, (value, it) in self._latest.items() if it == iteration}

    def since(self, iteration):
        """{iteration: {name: value}} of the newest values whose iteration is after `iteration` (None: all)."""
        out = {}
        for name, (value, it) in self._latest.items():
            if iteration is None or it > iteration:
                out.setdefault(it, {})[name] = value
        return out


class MetricsWriter:
    """Appends one JSON object per logged iteration to metrics.json and mirrors scalars to TensorBoard."""

    def __init__(self, output_dir, tensorboard=True):
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "metrics.json")
        self.tb = TensorBoardWriter(os.path.join(output_dir, "tb")) if tensorboard else None

    def truncate_after(self, iteration):
        """Before a run that starts at `iteration`: drop the records of `iteration` and later, so that a resumed
        run continues the log without duplicates. A run from iteration 0 starts an empty log (the evaluation
        before training, iteration -1, belongs to it too)."""
        if not os.path.exists(self.path):
            return
        kept = [r for r in read_metrics(self.path, tolerate_torn_end=True)
                if iteration > 0 and r.get("iteration", -1) < iteration]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            for record in kept:
                fh.write(json.dumps(record) + "\n")
        os.replace(tmp, self.path)

    def write(self, record):
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        if self.tb is not None:
            step = record.get("iteration", 0)
            for key, value in record.items():
                if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tb.add_scalar(key, value, step)
            self.tb.flush()

    def close(self):
        if self.tb is not None:
            self.tb.close()


def read_metrics(path, tolerate_torn_end=False):
    """The records of a metrics.json. `tolerate_torn_end`: drop an unreadable last line, which is what a
    process killed in the middle of a write leaves (resume then rewrites the file without it)."""
    with open(path) as fh:
        lines = [line for line in fh if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError:
            if tolerate_torn_end and i == len(lines) - 1:
                break
            raise
    return records


def plot_curves(metrics_path, out_png, cls_chance=None):
    """PNG of the loss terms and learning rate over iterations (and eval metrics if logged). `cls_chance`:
    loss_cls of uniform predictions, drawn as a dashed line (training has begun once loss_cls leaves it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    if not records:
        return None
    train = [r for r in records if "lr" in r]
    evals = [r for r in records if any(k.endswith("/mAP") for k in r)]
    loss_keys = sorted({k for r in train for k in r if k.startswith("loss")})
    fig, axes = plt.subplots(1, 3 if evals else 2, figsize=(15 if evals else 10, 4))
    for key in loss_keys:
        pts = [(r["iteration"], r[key]) for r in train if key in r]
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], label=key, linewidth=1)
    if cls_chance is not None and "loss_cls" in loss_keys:
        axes[0].axhline(cls_chance, color="grey", linestyle="--", linewidth=1,
                        label="loss_cls at chance (%.2f)" % cls_chance)
    axes[0].set_xlabel("iteration")
    axes[0].set_title("losses")
    axes[0].set_yscale("symlog", linthresh=1e-2)
    axes[0].legend(fontsize=7)
    axes[1].plot([r["iteration"] for r in train], [r["lr"] for r in train])
    axes[1].set_xlabel("iteration")
    axes[1].set_title("learning rate")
    if evals:
        for key in sorted({k for r in evals for k in r if k.endswith("/mAP") or k.endswith("/Rank-1")}):
            pts = [(r["iteration"], r[key]) for r in evals if key in r]
            axes[2].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
        axes[2].set_xlabel("iteration")
        axes[2].set_title("target-domain evaluation (%)")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
