"""One validation layer for the records read back: a reader types what it read once (`validated`) and
every later step trusts it; packed sentences unpack within a size limit (docs/reliability.md)."""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Annotated, Any, TypeVar

from annotated_types import Len
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from foundation.errors import UserError

T = TypeVar("T")
Finite = Annotated[float, Field(allow_inf_nan=False, strict=True)]  # a number, not its text or a bool
Number = Annotated[float, Field(allow_inf_nan=True)]  # a failed run's curve may end in NaN
Pair = Annotated[list[Number], Len(2, 2)]  # (step, value) of a curve
FinitePair = Annotated[list[Finite], Len(2, 2)]  # of a complete run's curve
STRICT = ConfigDict(allow_inf_nan=False)  # a dataclass's `__pydantic_config__`
MAX_UNPACKED_BYTES = 256 * 2 ** 20  # a packed attribute's text, unpacked (a WMT dev set's: ~0.5 MB)


def validated(kind: type[T] | Any, data: Any, source: str) -> T:
    """`data` as `kind`, or one line naming `source` and the first field that is not what it must be."""
    try:
        return TypeAdapter(kind).validate_python(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" if i else f": {part}"
                        for i, part in enumerate(first["loc"]))  # ': dev_ppl_curve[0][1]'
        shown = repr(first.get("input"))
        raise UserError(f"{source}{where}: {first['msg'].lower()} (it holds {shown[:40]}"
                        f"{'...' if len(shown) > 40 else ''}); a run never writes that: was it edited "
                        f"or damaged?") from None


def pack_lines(lines: list[str]) -> str:
    """Sentences as one compact string for a user attribute (zlib, base64)."""
    return base64.b64encode(zlib.compress("\n".join(lines).encode("utf-8"), 9)).decode("ascii")


def unpack_lines(packed: Any, source: str) -> list[str]:
    """Sentences packed by `pack_lines`, or one line naming `source` (damaged, or too large)."""
    if not isinstance(packed, str):
        raise UserError(f"{source}: packed sentences must be text, got {type(packed).__name__}")
    try:
        data = base64.b64decode(packed, validate=True)
        inflater = zlib.decompressobj()
        text = inflater.decompress(data, MAX_UNPACKED_BYTES)
        if inflater.unconsumed_tail:
            raise UserError(f"{source}: the packed sentences inflate to more than {MAX_UNPACKED_BYTES // 2 ** 20} "
                            f"MiB; a run's dev set is far smaller")
        if not inflater.eof:
            raise zlib.error("incomplete data")
        return text.decode("utf-8").split("\n")
    except (binascii.Error, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise UserError(f"{source}: the packed sentences are damaged ({type(err).__name__}: "
                        f"{str(err)[:60]})") from None
    except zlib.error as err:
        raise UserError(f"{source}: the packed sentences are damaged (zlib: {err})") from None
