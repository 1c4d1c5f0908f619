"""The one YAML loader: a file over `MAX_BYTES`, aliases ("billion laughs"), nesting deeper than
`MAX_DEPTH` and a key given twice (YAML keeps the last without a word) are each one `UserError` line
naming the file and where (docs/reliability.md, "Small hostile inputs stay small")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from foundation.errors import UserError

MAX_BYTES = 1 << 20  # 1 MiB: the largest file of ours (a preset) is under 4 KB
MAX_DEPTH = 64  # levels of nested mappings and lists (ours use 4)


class LimitedLoader(yaml.SafeLoader):
    """yaml.SafeLoader without aliases, nesting deeper than MAX_DEPTH, or a key given twice."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted here: write the value "
                                              "out", self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _unique_mapping(loader: LimitedLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping says so
            break
    return loader.construct_mapping(node, deep=deep)


LimitedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_yaml(text: str, source: str) -> Any:
    """`text` as YAML through `LimitedLoader`, or one UserError line naming `source` and where."""
    if len(text) > MAX_BYTES:
        raise UserError(f"{source}: {len(text):,} characters, more than the {MAX_BYTES:,} a YAML input may have")
    try:
        return yaml.load(text, Loader=LimitedLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{source}: malformed YAML{where}: {getattr(err, 'problem', None) or err}") from None
    except RecursionError:  # not reached with MAX_DEPTH; kept so no input can end in a traceback
        raise UserError(f"{source}: nested too deeply") from None


def read_yaml(path: str | Path) -> Any:
    """The YAML document in the file `path`, its size checked before it is read (else UserError)."""
    path = Path(path)
    with path.open("rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise UserError(f"{path}: larger than {MAX_BYTES // 1024} KiB, the most a YAML input may be "
                        f"({path.stat().st_size:,} bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    return parse_yaml(text, str(path))
