"""One table of the dtypes checkpoints hold, and each reader's name for them.

The torch, numpy, safetensors and DCP readers and the allowlist take their
dtype facts from here (names, legacy storage classes, bits per item, numpy's
dtype classes), so no two of them can disagree; the last rows are numpy's
alone (no tensor holds them, a numpy array in a checkpoint may). Nothing here
imports torch or numpy: the names are looked up on the running library only
when a file needs them, and a name the running release lacks is its reader's
error to report.
"""

from __future__ import annotations

from typing import NamedTuple


class Dtype(NamedTuple):
    name: str  # torch's name where torch has one
    bits: int  # per item, as the safetensors code counts them (0: sized per dtype or platform)
    torch: str | None  # attribute of ``torch`` (None: torch has no such dtype)
    numpy: str | None  # numpy's ``dtype.str`` without byte order, e.g. "f4"
    safetensors: str | None  # the header's code, e.g. "BF16"
    storage: str | None = None  # torch's legacy typed storage class, e.g. "FloatStorage"
    aliases: tuple[str, ...] = ()  # torch's other names for it, e.g. "float"
    # ``numpy.dtypes`` classes (numpy >= 1.25) that make it: the sized name its pickle writes,
    # then numpy's C-type names (aliases of it on this platform, or a class of their own)
    numpy_classes: tuple[str, ...] = ()

    @property
    def torch_bytes(self) -> int:
        """Bytes per item of the torch dtype: sub-byte formats are packed into one byte
        (``float4_e2m1fn_x2`` holds two 4-bit items)."""
        return max(self.bits, 8) // 8


# fmt: off
DTYPES: tuple[Dtype, ...] = (
    Dtype("float64", 64, "float64", "f8", "F64", "DoubleStorage", ("double",),
          numpy_classes=("Float64DType",)),
    Dtype("float32", 32, "float32", "f4", "F32", "FloatStorage", ("float",),
          numpy_classes=("Float32DType",)),
    Dtype("float16", 16, "float16", "f2", "F16", "HalfStorage", ("half",),
          numpy_classes=("Float16DType",)),
    Dtype("bfloat16", 16, "bfloat16", None, "BF16", "BFloat16Storage"),
    Dtype("complex32", 32, "complex32", None, None),
    Dtype("complex64", 64, "complex64", "c8", "C64", "ComplexFloatStorage", ("cfloat",),
          numpy_classes=("Complex64DType",)),
    Dtype("complex128", 128, "complex128", "c16", None, "ComplexDoubleStorage", ("cdouble",),
          numpy_classes=("Complex128DType",)),
    Dtype("int8", 8, "int8", "i1", "I8", "CharStorage", numpy_classes=("Int8DType", "ByteDType")),
    Dtype("int16", 16, "int16", "i2", "I16", "ShortStorage", ("short",),
          numpy_classes=("Int16DType", "ShortDType")),
    Dtype("int32", 32, "int32", "i4", "I32", "IntStorage", ("int",),
          numpy_classes=("Int32DType", "IntDType")),
    Dtype("int64", 64, "int64", "i8", "I64", "LongStorage", ("long",),
          numpy_classes=("Int64DType", "LongDType", "LongLongDType")),
    Dtype("uint8", 8, "uint8", "u1", "U8", "ByteStorage",
          numpy_classes=("UInt8DType", "UByteDType")),
    Dtype("uint16", 16, "uint16", "u2", "U16", numpy_classes=("UInt16DType", "UShortDType")),
    Dtype("uint32", 32, "uint32", "u4", "U32", numpy_classes=("UInt32DType", "UIntDType")),
    Dtype("uint64", 64, "uint64", "u8", "U64",
          numpy_classes=("UInt64DType", "ULongDType", "ULongLongDType")),
    Dtype("bool", 8, "bool", "b1", "BOOL", "BoolStorage", numpy_classes=("BoolDType",)),
    Dtype("float8_e4m3fn", 8, "float8_e4m3fn", None, "F8_E4M3"),
    Dtype("float8_e5m2", 8, "float8_e5m2", None, "F8_E5M2"),
    Dtype("float8_e4m3fnuz", 8, "float8_e4m3fnuz", None, "F8_E4M3FNUZ"),
    Dtype("float8_e5m2fnuz", 8, "float8_e5m2fnuz", None, "F8_E5M2FNUZ"),
    Dtype("float8_e8m0fnu", 8, "float8_e8m0fnu", None, "F8_E8M0"),
    Dtype("float4_e2m1fn_x2", 4, "float4_e2m1fn_x2", None, "F4"),
    Dtype("float6_e2m3fn", 6, None, None, "F6_E2M3"),
    Dtype("float6_e3m2fn", 6, None, None, "F6_E3M2"),
    # numpy's alone
    Dtype("longdouble", 0, None, None, None, numpy_classes=("LongDoubleDType",)),
    Dtype("clongdouble", 0, None, None, None, numpy_classes=("CLongDoubleDType",)),
    Dtype("bytes", 0, None, "S", None, numpy_classes=("BytesDType",)),
    Dtype("str", 0, None, "U", None, numpy_classes=("StrDType",)),
    Dtype("datetime64", 64, None, "M8", None, numpy_classes=("DateTime64DType",)),
    Dtype("timedelta64", 64, None, "m8", None, numpy_classes=("TimeDelta64DType",)),
)
# fmt: on

BY_NAME = {d.name: d for d in DTYPES}
#: every name torch has for each dtype (its aliases too)
BY_TORCH = {name: d for d in DTYPES if d.torch for name in (d.torch, *d.aliases)}
BY_SAFETENSORS = {d.safetensors: d for d in DTYPES if d.safetensors}
#: every ``numpy.dtypes`` class name a pickle may hold as a value
NUMPY_CLASSES = tuple(name for d in DTYPES for name in d.numpy_classes)
#: legacy storage class -> (torch dtype name, item size); ``UntypedStorage`` is bytes
STORAGES: dict[str, tuple[str, int]] = {
    **{d.storage: (d.name, d.torch_bytes) for d in DTYPES if d.storage},
    "UntypedStorage": ("uint8", 1),
}
