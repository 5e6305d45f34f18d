"""The malicious corpus: each case writes one hostile file, named for the trick it plays.

Cases are functions ``(marker, folder) -> path``; ``marker`` is a file that
must never appear (every code-execution payload tries to create it).
``expect`` says which library error a load must raise ("unsafe": refused;
"damaged": CheckpointError; "either"; "loads": must load, harmlessly).
``MEMORY`` lists the cases also run in a fresh interpreter to bound peak RSS.

A tiny pickle assembler writes the bytes directly, so no case depends on
what Python's own pickler would refuse to write.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

P2 = b"\x80\x02"
P4 = b"\x80\x04"
STOP = b"."


def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def u(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def n(value: int) -> bytes:
    if 0 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def b(data: bytes) -> bytes:
    return b"B" + struct.pack("<I", len(data)) + data


def put(index: int) -> bytes:
    """LONG_BINPUT: memoize the top of the stack at ``index``."""
    return b"r" + index.to_bytes(4, "little")


def get(index: int) -> bytes:
    """LONG_BINGET: push the object memoized at ``index`` (a shared reference)."""
    return b"j" + index.to_bytes(4, "little")


def t(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def lst(*items: bytes) -> bytes:
    return b"](" + b"".join(items) + b"e"


def d(*pairs: tuple[bytes, bytes]) -> bytes:
    return b"}(" + b"".join(k + v for k, v in pairs) + b"u"


def call(func: bytes, *args: bytes) -> bytes:
    return func + t(*args) + b"R"


def sg(module: str, name: str) -> bytes:
    return u(module) + u(name) + b"\x93"


def empty_od() -> bytes:
    return call(g("collections", "OrderedDict"))


def torch_zip(path: Path, data_pkl: bytes, records: dict[str, bytes] | None = None) -> Path:
    """A zip shaped like torch.save's: archive/{data.pkl, data/N, version, byteorder}."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        for name, data in (records or {}).items():
            archive.writestr(f"archive/{name}", data)
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", "little")
    return path


def legacy(path: Path, main: bytes, keys: list[str], data: bytes) -> Path:
    """torch's pre-zip format: magic, protocol, sys info, main pickle, keys, storage bytes."""
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {}}
    head = pickle.dumps(0x1950A86A20F9469CFC6C, 2) + pickle.dumps(1001, 2)
    path.write_bytes(head + pickle.dumps(info, 2) + main + pickle.dumps(keys, 2) + data)
    return path


def storage(numel: int, key: str = "0", kind: str = "FloatStorage") -> bytes:
    return t(u("storage"), g("torch", kind), u(key), u("cpu"), n(numel)) + b"Q"


def tensor(numel: int, size: tuple[int, ...], stride: tuple[int, ...], offset: int = 0) -> bytes:
    args = (storage(numel), n(offset), t(*map(n, size)), t(*map(n, stride)), b"\x89", empty_od())
    return call(g("torch._utils", "_rebuild_tensor_v2"), *args)


def deep_lists(depth: int) -> bytes:
    return P2 + b"]" * depth + b"a" * (depth - 1) + STOP


def deep_dicts(depth: int) -> bytes:
    return P2 + (b"}" + u("k")) * depth + b"}" + b"s" * depth + STOP


def deep_tuples(depth: int) -> bytes:
    return P2 + b"N" + b"\x85" * depth + STOP


def deep_marks(depth: int) -> bytes:
    return P2 + b"(" * depth + b"N" + b"t" * depth + STOP


class Scripted(torch.nn.Module):
    """A module that TorchScript can compile (its source lives in this file)."""

    def __init__(self) -> None:
        super().__init__()
        self.note = "x"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class TensorSubclass(torch.Tensor):
    """A tensor subclass: its type is not on any allowlist."""


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path, Path], Path]
    expect: str


CASES: list[Case] = []


def case(expect: str, name: str | None = None) -> Callable[[Callable[[Path, Path], Path]], None]:
    def register(build: Callable[[Path, Path], Path]) -> None:
        CASES.append(Case(name or build.__name__, build, expect))

    return register


def _pickle_file(folder: Path, data: bytes, name: str = "c.pt") -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def _cmd(marker: Path) -> str:
    return f"touch {marker}"


# ---------------------------------------------------------------- code execution by globals
for _module, _name in [
    ("os", "system"),
    ("posix", "system"),
    ("subprocess", "getoutput"),
    ("builtins", "eval"),
    ("builtins", "exec"),
    ("builtins", "compile"),
    ("builtins", "open"),
    ("__builtin__", "eval"),
    ("commands", "getoutput"),
    ("pty", "spawn"),
    ("runpy", "run_path"),
]:

    def _reduce(marker: Path, folder: Path, m: str = _module, f: str = _name) -> Path:
        arg = (
            _cmd(marker) if f in ("system", "getoutput", "spawn") else f"open({str(marker)!r},'w')"
        )
        return _pickle_file(folder, P2 + call(g(m, f), u(arg)) + STOP)

    case("unsafe", f"reduce_{_module}_{_name}")(_reduce)


@case("unsafe")
def reduce_subprocess_check_call(marker: Path, folder: Path) -> Path:
    argv = lst(u("touch"), u(str(marker)))
    return _pickle_file(folder, P2 + call(g("subprocess", "check_call"), argv) + STOP)


@case("unsafe")
def getattr_import_chain(marker: Path, folder: Path) -> Path:
    os_module = call(g("builtins", "__import__"), u("os"))
    system = call(g("builtins", "getattr"), os_module, u("system"))
    return _pickle_file(folder, P2 + system + t(u(_cmd(marker))) + b"R" + STOP)


@case("unsafe")
def importlib_import_module(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + call(g("importlib", "import_module"), u("os")) + STOP)


@case("unsafe")
def ctypes_cdll(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + call(g("ctypes", "CDLL"), b"N") + STOP)


@case("unsafe")
def stack_global_os_system(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P4 + sg("os", "system") + t(u(_cmd(marker))) + b"R" + STOP)


@case("unsafe")
def inst_opcode(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, b"(V" + _cmd(marker).encode() + b"\nios\nsystem\n" + STOP)


@case("unsafe")
def obj_opcode(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + b"(" + g("os", "system") + u(_cmd(marker)) + b"o" + STOP)


@case("unsafe")
def newobj_popen(marker: Path, folder: Path) -> Path:
    argv = lst(u("touch"), u(str(marker)))
    return _pickle_file(folder, P2 + g("subprocess", "Popen") + t(argv) + b"\x81" + STOP)


@case("unsafe")
def newobj_ex_popen(marker: Path, folder: Path) -> Path:
    argv = lst(u("touch"), u(str(marker)))
    return _pickle_file(folder, P4 + sg("subprocess", "Popen") + t(argv) + b"}" + b"\x92" + STOP)


@case("unsafe")
def newobj_on_allowed_callable(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + g("builtins", "set") + t() + b"\x81" + STOP)


@case("unsafe")
def call_of_a_constant(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + call(g("builtins", "list"), lst(n(1))) + STOP)


@case("unsafe")
def call_of_a_file_made_object(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + b"]" + t(n(1)) + b"R" + STOP)


for _code, _op in [(0xF0, b"\x82" + bytes([0xF0])), (0xF00D, b"\x83" + struct.pack("<H", 0xF00D))]:

    def _ext(marker: Path, folder: Path, op: bytes = _op) -> Path:
        return _pickle_file(folder, P2 + op + t(u(_cmd(marker))) + b"R" + STOP)

    case("unsafe", f"copyreg_extension_{_code:#x}")(_ext)


@case("unsafe")
def copyreg_extension_ext4(marker: Path, folder: Path) -> Path:
    op = b"\x84" + struct.pack("<i", 0x7F00F00D)
    return _pickle_file(folder, P2 + op + t(u(_cmd(marker))) + b"R" + STOP)


EXTENSION_CODES = (0xF0, 0xF00D, 0x7F00F00D)


# ---------------------------------------------------------------- state on allowed objects
@case("unsafe")
def build_on_rebuild_function_defaults(marker: Path, folder: Path) -> Path:
    state = d((u("__defaults__"), t(b"N", b"N")))
    return _pickle_file(folder, P2 + g("torch._utils", "_rebuild_tensor_v2") + state + b"b" + STOP)


@case("unsafe")
def build_slotstate_on_rebuild_function(marker: Path, folder: Path) -> Path:
    state = t(b"N", d((u("__defaults__"), t(b"N"))))
    return _pickle_file(folder, P2 + g("torch._utils", "_rebuild_tensor_v2") + state + b"b" + STOP)


@case("unsafe")
def build_on_namespace_class(marker: Path, folder: Path) -> Path:
    state = d((u("injected"), n(1)), (u("__init__"), b"N"))
    return _pickle_file(folder, P2 + g("argparse", "Namespace") + state + b"b" + STOP)


@case("unsafe")
def build_on_dtype_constant(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + g("torch", "float32") + d((u("x"), n(1))) + b"b" + STOP)


@case("unsafe")
def build_on_ordereddict_class(marker: Path, folder: Path) -> Path:
    body = g("collections", "OrderedDict") + d((u("__setitem__"), b"N")) + b"b"
    return _pickle_file(folder, P2 + body + STOP)


@case("unsafe")
def build_dunder_on_namespace_instance(marker: Path, folder: Path) -> Path:
    ns = g("argparse", "Namespace") + t() + b"\x81"
    return _pickle_file(folder, P2 + ns + d((u("__class__"), b"N")) + b"b" + STOP)


@case("unsafe")
def build_on_a_plain_dict(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + b"}" + d((u("x"), n(1))) + b"b" + STOP)


@case("unsafe")
def setitem_into_a_class(marker: Path, folder: Path) -> Path:
    body = g("collections", "OrderedDict") + u("k") + u("v") + b"s"
    return _pickle_file(folder, P2 + body + STOP)


@case("unsafe")
def setitem_into_a_tuple(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + b")" + u("k") + u("v") + b"s" + STOP)


@case("unsafe")
def setitems_into_a_namespace(marker: Path, folder: Path) -> Path:
    ns = g("argparse", "Namespace") + t() + b"\x81"
    return _pickle_file(folder, P2 + ns + b"(" + u("k") + u("v") + b"u" + STOP)


@case("unsafe")
def append_into_a_constant(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + g("torch", "float32") + n(1) + b"a" + STOP)


@case("unsafe")
def additems_into_a_frozenset(marker: Path, folder: Path) -> Path:
    frozen = call(g("builtins", "frozenset"), lst(n(1)))
    return _pickle_file(folder, P4 + frozen + b"(" + n(2) + b"\x90" + STOP)


# ---------------------------------------------------------------- persistent ids
@case("unsafe")
def persistent_id_module_legacy(marker: Path, folder: Path) -> Path:
    pid = t(u("module"), g("torch.nn", "Linear"), u("evil.py"), u("class Linear: pass"))
    main = P2 + pid + b"Q" + STOP
    return legacy(folder / "c.pt", main, [], b"")


@case("unsafe")
def persistent_id_odd_typename_zip(marker: Path, folder: Path) -> Path:
    return torch_zip(folder / "c.pt", P2 + t(u("os"), u("system")) + b"Q" + STOP)


@case("either")
def persistent_id_text(marker: Path, folder: Path) -> Path:
    return torch_zip(folder / "c.pt", P2 + b"P1\n" + STOP)


@case("unsafe")
def persistent_id_storage_of_foreign_type(marker: Path, folder: Path) -> Path:
    pid = t(u("storage"), g("os", "system"), u("0"), u("cpu"), n(1)) + b"Q"
    return torch_zip(folder / "c.pt", P2 + pid + STOP, {"data/0": b"\0" * 4})


@case("unsafe")
def storage_in_a_plain_pickle(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + storage(1) + STOP)


@case("damaged")
def storage_key_with_path_separators(marker: Path, folder: Path) -> Path:
    pid = t(u("storage"), g("torch", "FloatStorage"), u("../../x"), u("cpu"), n(1)) + b"Q"
    return torch_zip(folder / "c.pt", P2 + pid + STOP, {"data/0": b"\0" * 4})


@case("damaged")
def storage_location_garbage(marker: Path, folder: Path) -> Path:
    pid = t(u("storage"), g("torch", "FloatStorage"), u("0"), u("cpu; rm -rf /"), n(1)) + b"Q"
    return torch_zip(folder / "c.pt", P2 + pid + STOP, {"data/0": b"\0" * 4})


# ---------------------------------------------------------------- codecs, numpy
@case("unsafe")
def codecs_encode_other_codec(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + call(g("_codecs", "encode"), u("x" * 64), u("zlib")) + STOP)


@case("unsafe")
def numpy_object_array(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, pickle.dumps(np.array([1, "a", None], dtype=object), 2))


@case("unsafe")
def numpy_object_dtype(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, pickle.dumps(np.dtype("O"), 2))


@case("unsafe")
def numpy_structured_dtype(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, pickle.dumps(np.zeros(2, dtype=[("a", "O")]), 2))


@case("unsafe")
def numpy_matrix_subclass(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, pickle.dumps(np.matrix([[1, 2]]), 2))


@case("unsafe")
def numpy_recarray_subclass(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, pickle.dumps(np.rec.array([(1, 2)], names="a,b"), 2))


@case("unsafe")
def numpy_reconstruct_foreign_class(marker: Path, folder: Path) -> Path:
    recon = call(g("numpy.core.multiarray", "_reconstruct"), g("os", "system"), t(n(0)), b(b"b"))
    return _pickle_file(folder, P2 + recon + STOP)


@case("damaged")
def numpy_dtype_state_with_fields(marker: Path, folder: Path) -> Path:
    dtype = call(g("numpy", "dtype"), u("f8"), b"\x89", b"\x88")
    state = t(n(3), u("<"), b"N", t(u("a")), d((u("a"), b"N")), n(8), n(1), n(0))
    return _pickle_file(folder, P2 + dtype + state + b"b" + STOP)


# ---------------------------------------------------------------- torch rebuilds
@case("damaged")
def rebuild_tensor_with_a_list_as_storage(marker: Path, folder: Path) -> Path:
    args = (lst(n(1)), n(0), t(n(1)), t(n(1)), b"\x89", empty_od())
    body = call(g("torch._utils", "_rebuild_tensor_v2"), *args)
    return torch_zip(folder / "c.pt", P2 + body + STOP)


@case("damaged")
def rebuild_tensor_negative_stride(marker: Path, folder: Path) -> Path:
    args = (storage(4), n(3), t(n(4)), t(n(-1)), b"\x89", empty_od())
    body = call(g("torch._utils", "_rebuild_tensor_v2"), *args)
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 16})


@case("unsafe")
def rebuild_tensor_with_hooks(marker: Path, folder: Path) -> Path:
    hooks = call(g("collections", "OrderedDict"), lst(t(n(0), g("os", "system"))))
    args = (storage(1), n(0), t(n(1)), t(n(1)), b"\x89", hooks)
    body = call(g("torch._utils", "_rebuild_tensor_v2"), *args)
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 4})


@case("damaged")
def rebuild_parameter_of_a_string(marker: Path, folder: Path) -> Path:
    body = call(g("torch._utils", "_rebuild_parameter"), u("x"), b"\x89", empty_od())
    return _pickle_file(folder, P2 + body + STOP)


for _fn in (
    "_rebuild_device_tensor_from_numpy",
    "_rebuild_device_tensor_from_cpu_tensor",
    "_rebuild_qtensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_nested_tensor",
    "_set_obj_state",
    "_import_dotted_name",
):

    def _unlisted(marker: Path, folder: Path, fn: str = _fn) -> Path:
        return _pickle_file(folder, P2 + call(g("torch._utils", fn), u("os.system")) + STOP)

    case("unsafe", f"torch_utils_{_fn}")(_unlisted)


@case("damaged")
def torch_utils__rebuild_sparse_tensor(marker: Path, folder: Path) -> Path:
    body = call(g("torch._utils", "_rebuild_sparse_tensor"), u("os.system"))
    return _pickle_file(folder, P2 + body + STOP)


@case("loads")
def real_sparse_tensor(marker: Path, folder: Path) -> Path:
    path = folder / "c.pt"
    torch.save({"s": torch.eye(3).to_sparse()}, path)
    return path


@case("damaged")
def sparse_index_outside_its_size(marker: Path, folder: Path) -> Path:
    """torch's own test case: unchecked, ``to_dense()`` would write outside memory."""
    path = folder / "c.pt"
    indices = torch.tensor([[0, 2**40]])
    bad = torch.sparse_coo_tensor(indices, torch.ones(2), (3,), check_invariants=False)
    torch.save({"s": bad}, path)
    return path


@case("unsafe")
def real_quantized_tensor(marker: Path, folder: Path) -> Path:
    path = folder / "c.pt"
    torch.save({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)}, path)
    return path


@case("unsafe")
def real_tensor_subclass(marker: Path, folder: Path) -> Path:
    path = folder / "c.pt"
    torch.save({"t": torch.ones(2).as_subclass(TensorSubclass)}, path)
    return path


@case("unsafe")
def rebuild_from_type_with_foreign_type(marker: Path, folder: Path) -> Path:
    inner = t(storage(1), n(0), t(n(1)), t(n(1)), b"\x89", empty_od())
    args = (g("torch._utils", "_rebuild_tensor_v2"), g("torch.nn", "Module"), inner, d())
    body = call(g("torch._tensor", "_rebuild_from_type_v2"), *args)
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 4})


@case("unsafe")
def rebuild_from_type_with_dunder_state(marker: Path, folder: Path) -> Path:
    inner = t(storage(1), n(0), t(n(1)), t(n(1)), b"\x89", empty_od())
    state = d((u("__class__"), g("torch.nn.parameter", "Parameter")))
    args = (g("torch._utils", "_rebuild_tensor_v2"), g("torch", "Tensor"), inner, state)
    body = call(g("torch._tensor", "_rebuild_from_type_v2"), *args)
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 4})


@case("unsafe")
def rebuild_parameter_with_state_on_tensor_attributes(marker: Path, folder: Path) -> Path:
    data = tensor(1, (1,), (1,))
    state = d((u("grad"), b"N"), (u("data"), b"N"))
    body = call(
        g("torch._utils", "_rebuild_parameter_with_state"), data, b"\x88", empty_od(), state
    )
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 4})


@case("unsafe")
def torchscript_archive_as_checkpoint(marker: Path, folder: Path) -> Path:
    path = folder / "model.ckpt"
    torch.jit.save(torch.jit.script(Scripted()), str(path))
    return path


# ---------------------------------------------------------------- zip structure
def _zip_with(folder: Path, entries: list[tuple[str, bytes]], compress: int = 0) -> Path:
    path = folder / "c.pt"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compress) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = compress
            archive.writestr(info, data)
    path.write_bytes(buffer.getvalue())
    return path


_OK_PICKLE = P2 + storage(1) + STOP


@case("unsafe")
def zip_duplicate_names(marker: Path, folder: Path) -> Path:
    entries = [("archive/data.pkl", _OK_PICKLE), ("archive/data/0", b"\0" * 4)]
    entries += [("archive/data/0", b"\0" * 40), ("archive/version", b"3\n")]
    return _zip_with(folder, entries)


@case("unsafe")
def zip_traversal_name(marker: Path, folder: Path) -> Path:
    entries = [("archive/data.pkl", _OK_PICKLE), ("archive/../evil", b"x")]
    return _zip_with(folder, [*entries, ("archive/version", b"3\n")])


@case("unsafe")
def zip_absolute_name(marker: Path, folder: Path) -> Path:
    entries = [("archive/data.pkl", _OK_PICKLE), ("/etc/evil", b"x")]
    return _zip_with(folder, [*entries, ("archive/version", b"3\n")])


@case("unsafe")
def zip_two_archive_folders(marker: Path, folder: Path) -> Path:
    entries = [("archive/data.pkl", _OK_PICKLE), ("other/data.pkl", b"x")]
    return _zip_with(folder, [*entries, ("archive/version", b"3\n")])


@case("damaged")
def zip_compressed_record(marker: Path, folder: Path) -> Path:
    entries = [("archive/data.pkl", _OK_PICKLE), ("archive/data/0", b"\0" * 4096)]
    return _zip_with(folder, [*entries, ("archive/version", b"3\n")], zipfile.ZIP_DEFLATED)


@case("damaged")
def zip_without_data_pkl(marker: Path, folder: Path) -> Path:
    return _zip_with(folder, [("archive/version", b"3\n")])


@case("damaged")
def zip_truncated(marker: Path, folder: Path) -> Path:
    path = folder / "c.pt"
    torch.save({"t": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:3000])
    return path


@case("damaged")
def tar_format(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, b"\0" * 257 + b"ustar" + b"\0" * 300)


# ---------------------------------------------------------------- memory bombs
@case("loads")
def mem_stride0_expand(marker: Path, folder: Path) -> Path:
    path = folder / "c.pt"
    torch.save({"t": torch.zeros(1).expand(2**31)}, path)
    return path


@case("damaged")
def mem_storage_numel_over_record(marker: Path, folder: Path) -> Path:
    body = tensor(2**40, (2**40,), (1,))
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 4})


@case("damaged")
def mem_tensor_view_past_storage(marker: Path, folder: Path) -> Path:
    body = tensor(1, (2**40,), (1,))
    return torch_zip(folder / "c.pt", P2 + body + STOP, {"data/0": b"\0" * 4})


@case("damaged")
def mem_legacy_size_over_file(marker: Path, folder: Path) -> Path:
    main = (
        P2
        + call(
            g("torch._utils", "_rebuild_tensor_v2"),
            t(u("storage"), g("torch", "FloatStorage"), u("0"), u("cpu"), n(2**33), b"N") + b"Q",
            n(0),
            t(n(2**33)),
            t(n(1)),
            b"\x89",
            empty_od(),
        )
        + STOP
    )
    return legacy(folder / "c.pt", main, ["0"], struct.pack("<q", 2**33) + b"\0" * 64)


@case("damaged")
def mem_legacy_header_differs(marker: Path, folder: Path) -> Path:
    main = (
        P2
        + call(
            g("torch._utils", "_rebuild_tensor_v2"),
            t(u("storage"), g("torch", "FloatStorage"), u("0"), u("cpu"), n(2), b"N") + b"Q",
            n(0),
            t(n(2)),
            t(n(1)),
            b"\x89",
            empty_od(),
        )
        + STOP
    )
    return legacy(folder / "c.pt", main, ["0"], struct.pack("<q", 2**40) + b"\0" * 8)


@case("unsafe")
def mem_bytearray_of_a_number(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + call(g("builtins", "bytearray"), n(2**30)) + STOP)


def _np_dtype() -> bytes:
    dtype = call(g("numpy", "dtype"), u("f8"), b"\x89", b"\x88")
    return dtype + t(n(3), u("<"), b"N", b"N", b"N", n(-1), n(-1), n(0)) + b"b"


@case("damaged")
def mem_frombuffer_huge_shape(marker: Path, folder: Path) -> Path:
    args = (b(b"\0" * 8), _np_dtype(), t(n(10**10)), u("C"))
    return _pickle_file(folder, P2 + call(g("numpy.core.numeric", "_frombuffer"), *args) + STOP)


@case("damaged")
def mem_reconstruct_huge_shape(marker: Path, folder: Path) -> Path:
    recon = g("numpy._core.multiarray", "_reconstruct")
    body = call(recon, g("numpy", "ndarray"), t(n(10**10)), b(b"b"))
    return _pickle_file(folder, P2 + body + STOP)


@case("damaged")
def mem_array_state_huge_shape(marker: Path, folder: Path) -> Path:
    recon = call(
        g("numpy.core.multiarray", "_reconstruct"), g("numpy", "ndarray"), t(n(0)), b(b"b")
    )
    state = t(n(1), t(n(10**9)), _np_dtype(), b"\x89", b(b"\0" * 8))
    return _pickle_file(folder, P2 + recon + state + b"b" + STOP)


for _label, _op in [
    ("long4", b"\x8b" + struct.pack("<i", 2**31 - 1)),
    ("binbytes8", b"\x8e" + struct.pack("<Q", 2**62)),
    ("binunicode8", b"\x8d" + struct.pack("<Q", 2**62)),
    ("bytearray8", b"\x96" + struct.pack("<Q", 2**62)),
    ("binunicode", b"X" + struct.pack("<I", 2**32 - 1)),
    ("binbytes", b"B" + struct.pack("<I", 2**32 - 1)),
    ("binstring", b"T" + struct.pack("<i", 2**31 - 1)),
    ("frame", b"\x95" + struct.pack("<Q", 2**62)),
]:

    def _length(marker: Path, folder: Path, op: bytes = _op) -> Path:
        return _pickle_file(folder, P4 + op + b"abc")

    case("damaged", f"mem_{_label}_huge_length")(_length)


@case("damaged")
def mem_long_text_huge(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, b"L" + b"9" * 10**6 + b"L\n.")


@case("loads")
def mem_memo_bomb(marker: Path, folder: Path) -> Path:
    puts = b"".join(b"r" + struct.pack("<I", 2**32 - 1 - k) for k in range(100_000))
    return _pickle_file(folder, P2 + b"N" + puts + STOP)


@case("loads")
def mem_dup_bomb(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + b"](" + b"]" + b"2" * 200_000 + b"e" + STOP)


for _label, _deep in [
    ("lists", deep_lists),
    ("dicts", deep_dicts),
    ("tuples", deep_tuples),
    ("marks", deep_marks),
]:

    def _nested(marker: Path, folder: Path, deep: Callable[[int], bytes] = _deep) -> Path:
        return _pickle_file(folder, deep(100_000))

    case("damaged", f"rec_nested_{_label}")(_nested)


@case("loads")
def rec_self_reference(marker: Path, folder: Path) -> Path:
    return _pickle_file(folder, P2 + b"]q\x00h\x00a" + STOP)


@case("damaged")
def rec_nested_in_a_refused_call(marker: Path, folder: Path) -> Path:
    nested = b"]" * 50_000 + b"a" * 49_999
    return _pickle_file(folder, P2 + call(g("builtins", "slice"), nested) + STOP)


MEMORY = [c.name for c in CASES if c.name.startswith(("mem_", "rec_"))]
