"""Checkpoints as numpy trees in PyTorch's zip `.pth` format, read and written without torch.

    save(obj, path)            nested dict/list/tuple of numpy arrays, python scalars, strings, None
    load(path) -> obj          our files and real torch `.pth` files (zip format) -> the same kind of tree
    state_dict(module)         OrderedDict name -> numpy (parameters and persistent buffers, torch names)
    load_state_dict(module, state, strict=True)
    export_pth(state, path)    export_mindspore_ckpt(state, path)   (the latter: MindSpore backend only)

File layout (what torch.save writes and torch.load reads): a stored (uncompressed) zip with
`archive/data.pkl` (pickle protocol 2 of the tree, every tensor a call of
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)` whose storage is a
persistent id `('storage', torch.<Type>Storage, key, 'cpu', numel)`), the raw little-endian bytes of storage
`key` in `archive/data/<key>` (64-byte aligned, as torch aligns them), `archive/byteorder` and
`archive/version`. So real `torch.load(path, weights_only=True)` gives tensors back.

Loading never imports torch: a restricted unpickler resolves only an allow-list of globals (OrderedDict, the
tensor/parameter rebuild functions, the storage types, dtypes) and refuses anything else, so a crafted file
cannot run code. Writes are atomic: a temporary file in the target directory, fsync, os.replace; a previous
file at `path` survives any failure.
"""
import collections
import io
import os
import pickle
import struct
import tempfile
import zipfile

import numpy as np

import compat as _c
from compat.errors import UserError

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
_DTYPE_STORAGE = {np.dtype(v): k for k, v in _STORAGE_DTYPES.items()}
_TORCH_DTYPES = {
    "float32": np.float32, "float": np.float32, "float64": np.float64, "double": np.float64,
    "float16": np.float16, "half": np.float16, "int64": np.int64, "long": np.int64, "int32": np.int32,
    "int": np.int32, "int16": np.int16, "short": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # first object of pre-1.6 (non-zip) torch.save files
_ALIGN = 64
_PREFIX = "archive"


# ---------------------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------------------
class _Global:
    """A `module.name` reference written as a pickle GLOBAL without importing the module (torch may be absent)."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle's save_reduce insists that the callable be callable
        raise TypeError("placeholder for %s.%s" % (self.module, self.name))


_REBUILD_TENSOR = _Global("torch._utils", "_rebuild_tensor_v2")


class _Storage:
    def __init__(self, key, array):
        self.key, self.array = key, array


class _TreePickler(pickle._Pickler):  # the pure-python pickler: it lets us emit GLOBAL opcodes ourselves
    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.storages = []
        self._by_id = {}

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, _Global):
            self.write(pickle.GLOBAL + ("%s\n%s\n" % (obj.module, obj.name)).encode("ascii"))
            return
        super().save(obj, save_persistent_id)

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", _Global("torch", _DTYPE_STORAGE[obj.array.dtype]), obj.key, "cpu", obj.array.size)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, np.ndarray):
            return self._tensor(obj)
        return NotImplemented

    def _tensor(self, array):
        if array.dtype not in _DTYPE_STORAGE:
            raise UserError("cannot save a numpy array of dtype %s in a .pth checkpoint; use one of %s"
                            % (array.dtype, ", ".join(sorted(str(d) for d in _DTYPE_STORAGE))))
        storage = self._by_id.get(id(array))
        if storage is None:
            data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
            storage = _Storage(str(len(self.storages)), data)
            self.storages.append(storage)
            self._by_id[id(array)] = storage  # the tree keeps `array` alive, so its id stays unique
        shape = tuple(int(s) for s in array.shape)
        stride, step = [], 1
        for size in reversed(shape):
            stride.append(step)
            step *= max(size, 1)
        return (_REBUILD_TENSOR, (storage, 0, shape, tuple(reversed(stride)), False, collections.OrderedDict()))


def _plain_tree(obj, where="checkpoint"):
    """Validate the tree and turn numpy scalars / backend tensors into python scalars / numpy arrays."""
    if isinstance(obj, dict):
        out = type(obj)() if isinstance(obj, collections.OrderedDict) else {}
        for key, value in obj.items():
            if not isinstance(key, (str, int)):
                raise UserError("checkpoint keys must be str or int, got %r in %s" % (key, where))
            out[key] = _plain_tree(value, "%s[%r]" % (where, key))
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain_tree(v, "%s[%d]" % (where, i)) for i, v in enumerate(obj))
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if _c.is_tensor(obj):
        return _c.to_numpy(obj)
    raise UserError("cannot save %s at %s in a checkpoint; only dicts, lists, tuples, numpy arrays, tensors, "
                    "numbers, strings and None are allowed" % (type(obj).__name__, where))


def _aligned_extra(offset, name, zip64):
    """Zip 'extra' field that pads the local header so the record's data starts on a 64-byte boundary."""
    header = 30 + len(name.encode("utf-8")) + (20 if zip64 else 0)  # zipfile appends a 20-byte zip64 field
    pad = (-(offset + header + 4)) % _ALIGN
    return b"FB" + struct.pack("<H", pad) + b"Z" * pad


def _write_record(zf, fh, name, data):
    data = memoryview(data)
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = data.nbytes
    zip64 = info.file_size * 1.05 > zipfile.ZIP64_LIMIT  # zipfile's own rule
    info.extra = _aligned_extra(fh.tell(), name, zip64)
    with zf.open(info, "w") as out:
        out.write(data)


def _write_storage(zf, fh, storage):
    """One tensor's bytes (split out so tests can make the writer fail midway)."""
    _write_record(zf, fh, "%s/data/%s" % (_PREFIX, storage.key), memoryview(storage.array.reshape(-1)).cast("B"))


def _write_zip(obj, fh):
    buffer = io.BytesIO()
    pickler = _TreePickler(buffer)
    pickler.dump(obj)
    with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        _write_record(zf, fh, _PREFIX + "/data.pkl", buffer.getvalue())
        _write_record(zf, fh, _PREFIX + "/byteorder", b"little")
        for storage in pickler.storages:
            _write_storage(zf, fh, storage)
        _write_record(zf, fh, _PREFIX + "/version", b"3\n")


def new_file_mode():
    """The mode open() gives a new file here: 0o666 less the process's umask (0o644 under the usual 022)."""
    try:
        with open("/proc/self/status") as fh:      # Linux: read without changing it
            mask = next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)                      # elsewhere reading it sets it: put it back at once
        os.umask(mask)
    return 0o666 & ~mask


def honour_umask(path):
    """Give `path` the mode a file created with open() would have: a temporary file (mkstemp: owner only) moved
    into place, or a file MindSpore's exporter wrote (owner read-only), would keep its own."""
    os.chmod(path, new_file_mode())
    return path


def atomic_write(path, write_fn, suffix=".tmp"):
    """Call write_fn(file) on a temporary file next to `path`, fsync it and move it over `path`."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError("cannot save %s: directory %s does not exist; create it first" % (path, directory))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            write_fn(fh)
            fh.flush()
            os.fsync(fh.fileno())
        honour_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def save(obj, path):
    """Write a tree of numpy arrays / scalars / strings to `path` (torch zip format), atomically."""
    tree = _plain_tree(obj)
    return atomic_write(path, lambda fh: _write_zip(tree, fh))


def export_pth(state, path):
    """A state dict (numpy or backend tensors) as a `.pth` that real torch loads (`torch.load`)."""
    return save(collections.OrderedDict(_plain_tree(dict(state)).items()), path)


def export_mindspore_ckpt(state, path):
    """A flat state dict as a MindSpore `.ckpt` (mindspore.save_checkpoint), keeping the torch-style names."""
    if not _c.IS_MINDSPORE:
        raise UserError("export_mindspore_ckpt needs the mindspore backend (MindSpore writes .ckpt files); run "
                        "with --backend mindspore or use export_pth")
    import mindspore
    path = os.fspath(path)
    if not path.endswith(".ckpt"):
        raise UserError("MindSpore checkpoint path must end in .ckpt, got %s" % path)
    entries = []
    for name, value in _plain_tree(dict(state)).items():
        if not isinstance(value, np.ndarray):
            raise UserError("export_mindspore_ckpt takes a flat name -> array state dict; %r is a %s"
                            % (name, type(value).__name__))
        entries.append({"name": str(name), "data": mindspore.Tensor(np.array(value, order="C"))})

    def write(fh):  # mindspore writes by file name; write next to the target, then hand the bytes over
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".ms-", suffix=".ckpt")
        os.close(fd)
        try:
            mindspore.save_checkpoint(entries, tmp)
            with open(tmp, "rb") as src:
                while True:
                    chunk = src.read(1 << 22)
                    if not chunk:
                        break
                    fh.write(chunk)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    return atomic_write(path, write)


# ---------------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------------
class _StorageType:
    def __init__(self, name, dtype):
        self.name, self.dtype = name, np.dtype(dtype)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, path, read_record=None, byteorder="<"):
        super().__init__(file)
        self._path = path
        self._read_record = read_record
        self._byteorder = byteorder
        self._storages = {}

    def find_class(self, module, name):
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise UserError("refusing to unpickle global %s.%s in %s: not a tensor checkpoint (only tensors, "
                            "containers, numbers and strings are loaded)" % (module, name, self._path))
        return allowed

    def persistent_load(self, pid):
        if self._read_record is None or not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                                             and isinstance(pid[1], _StorageType)):
            raise UserError("unsupported persistent object %r in %s: not a tensor checkpoint"
                            % (pid[:1] if isinstance(pid, tuple) else type(pid).__name__, self._path))
        _, storage_type, key, _location, numel = pid
        if key not in self._storages:
            raw = self._read_record("data/%s" % key)
            dtype = storage_type.dtype.newbyteorder(self._byteorder)
            if len(raw) != int(numel) * dtype.itemsize:
                raise UserError("%s is corrupt: storage %s holds %d bytes, expected %d x %s"
                                % (self._path, key, len(raw), numel, storage_type.name))
            self._storages[key] = np.frombuffer(raw, dtype=dtype)
        return self._storages[key]


def _rebuild_tensor(storage, storage_offset, size, stride, *unused):
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    itemsize = storage.dtype.itemsize
    if len(size) != len(stride) or any(s < 0 for s in size) or any(s < 0 for s in stride) or storage_offset < 0:
        raise _Corrupt("tensor size %s / stride %s / offset %s" % (size, stride, storage_offset))
    native = np.dtype(storage.dtype.type)  # byte order '=': MindSpore rejects explicitly '<' arrays
    if 0 in size:
        return np.zeros(size, dtype=native)
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size:
        raise _Corrupt("tensor reaches element %d of a storage of %d" % (last, storage.size))
    view = np.lib.stride_tricks.as_strided(storage[storage_offset:], shape=size,
                                           strides=tuple(s * itemsize for s in stride))
    out = np.empty(size, dtype=native)  # np.array(view) would keep the explicit '<' dtype of the storage
    np.copyto(out, view)
    return out


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    out = _rebuild_tensor(storage, storage_offset, size, stride)
    return out if isinstance(dtype, np.dtype) and dtype == out.dtype else out.astype(dtype)


def _rebuild_parameter(data, *unused):
    return data


def _numpy_scalar(dtype, data=None):
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biufc":
        raise _Corrupt("numpy scalar of dtype %r" % (dtype,))
    return np.frombuffer(data, dtype=dtype, count=1)[0].item()


def _numpy_dtype(name, align=False, copy=False):
    dtype = np.dtype(name)
    if dtype.kind not in "biufc":
        raise _Corrupt("numpy dtype %r" % (name,))
    return dtype


def _latin1_bytes(text, encoding="latin1"):
    """How pickle protocol 2 (torch.save's) spells a bytes object, e.g. the data of a numpy scalar such as a
    fast-reid checkpoint's 'metric': _codecs.encode(str, 'latin1')."""
    if not isinstance(text, str) or encoding != "latin1":
        raise _Corrupt("_codecs.encode(%s, %r)" % (type(text).__name__, encoding))
    return text.encode("latin1")


class _Corrupt(Exception):
    pass


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): tuple,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("numpy", "dtype"): _numpy_dtype,
    ("_codecs", "encode"): _latin1_bytes,
}
_ALLOWED.update({("torch", name): _StorageType(name, dtype) for name, dtype in _STORAGE_DTYPES.items()})
_ALLOWED.update({("torch", name): np.dtype(dtype) for name, dtype in _TORCH_DTYPES.items()})


def load(path):
    """Read a checkpoint (ours or torch's zip `.pth`) into a tree of numpy arrays and python values."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise UserError("checkpoint %s does not exist (or is not a file); check the path" % path)
    if not zipfile.is_zipfile(path):
        _refuse_non_zip(path)
    try:
        with zipfile.ZipFile(path) as zf:
            return _load_zip(zf, path)
    except UserError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, pickle.UnpicklingError, _Corrupt, KeyError,
            ValueError, TypeError, IndexError, AttributeError, struct.error, OSError) as exc:
        raise UserError("%s is truncated or corrupt (%s: %s); re-create or re-download it"
                        % (path, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")) from None


def _load_zip(zf, path):
    names = zf.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise UserError("%s is a zip file but not a PyTorch checkpoint (no <archive>/data.pkl)" % path)
    prefix = pickles[0][: -len("data.pkl")]
    byteorder = "little"
    if prefix + "byteorder" in names:
        byteorder = zf.read(prefix + "byteorder").decode("ascii", "replace").strip()
        if byteorder not in ("little", "big"):
            raise _Corrupt("byteorder %r" % byteorder)
    unpickler = _RestrictedUnpickler(io.BytesIO(zf.read(pickles[0])), path,
                                     read_record=lambda name: zf.read(prefix + name),
                                     byteorder="<" if byteorder == "little" else ">")
    return unpickler.load()


def _refuse_non_zip(path):
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if not head:
        raise UserError("%s is empty: not a checkpoint" % path)
    if head[:1] == b"\x80":  # a pickle: legacy torch.save writes its magic number first
        try:
            first = _RestrictedUnpickler(io.BytesIO(head), path).load()
        except UserError:
            raise
        except Exception:
            first = None
        if first == _LEGACY_MAGIC:
            raise UserError("%s uses the legacy (pre-1.6, non-zip) torch.save format, which is not supported; "
                            "re-save it with a current torch (torch.save(torch.load(path), path))" % path)
    raise UserError("%s is not a PyTorch zip checkpoint (.pth written by torch>=1.6 or by this project)" % path)


# ---------------------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------------------
LoadResult = collections.namedtuple("LoadResult", "missing_keys unexpected_keys")


def state_dict(module):
    """OrderedDict name -> numpy copy of every parameter and persistent buffer (torch names, both backends).

    The project's norm layers register `num_batches_tracked` as a buffer whatever the torch-API layer's own
    nn.BatchNorm* keep, so their keys match torch exactly.
    """
    return collections.OrderedDict((name, np.array(_c.to_numpy(value)))
                                   for name, value in module.state_dict().items())


def _names(keys, limit=8):
    keys = list(keys)
    shown = ", ".join(keys[:limit])
    return shown + (" ... (%d in all)" % len(keys) if len(keys) > limit else "")


def load_state_dict(module, state, strict=True):
    """Copy `state` (name -> numpy array or tensor) into the module's parameters and buffers in place.

    A state renamed on reading (a checkpoint written under other names) may carry `describe_key(name)`, the
    name a key has in its file; the error messages then give both names."""
    targets = module.state_dict(keep_vars=True)
    describe = getattr(state, "describe_key", None)

    def label(name):
        other = describe(name) if describe else name
        return name if other == name else "%s (%s in the file)" % (name, other)

    missing = [k for k in targets if k not in state]
    unexpected = [k for k in state if k not in targets]
    problems = []
    if strict and missing:
        problems.append("missing keys: " + _names(map(label, missing)))
    if strict and unexpected:
        problems.append("unexpected keys: " + _names(map(label, unexpected)))
    values = {}
    mismatched = []
    for name, target in targets.items():
        if name not in state:
            continue
        value = state[name]
        value = _c.to_numpy(value) if _c.is_tensor(value) else np.asarray(value)
        expected = tuple(target.shape)
        if tuple(value.shape) != expected:
            mismatched.append("%s (expected %s, got %s)" % (label(name), expected, tuple(value.shape)))
        values[name] = value
    if mismatched:
        problems.append("shape mismatch: " + _names(mismatched))
    if problems:
        raise UserError("cannot load state dict into %s: %s; was the checkpoint saved from this model/config?"
                        % (type(module).__name__, "; ".join(problems)))
    for name, value in values.items():
        target = targets[name]
        dtype = _c.to_numpy(target).dtype
        array = np.array(value, dtype=dtype, order="C")  # np.ascontiguousarray would make 0-d arrays 1-d
        tensor = _c.as_tensor(array.reshape(-1)).reshape(array.shape)  # ... which compat.as_tensor does
        _c.assign_(target, tensor)
    return LoadResult(missing, unexpected)


def to_numpy(tensor):
    """A numpy copy of a parameter or buffer (a host read)."""
    return np.array(_c.to_numpy(tensor))


def write(target, array):
    """`array` written into the parameter or buffer `target` in place, float32: a graph built before goes on
    reading it (on MindSpore's torch-API layer an in-place method gives the tensor new storage instead)."""
    _c.assign_(target, _c.as_tensor(np.asarray(array, dtype=np.float32)))
