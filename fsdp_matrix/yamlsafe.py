"""Reading matrix.yaml's text into plain data, bounded: size, aliases and merge keys, nesting, duplicate keys.

PyYAML's safe loader still expands aliases and ``<<`` merge keys as often as they are written: a few lines that
merge a mapping into itself level by level take exponential time. Here the file is composed
into its node graph first (linear in the text), the size of the document with every alias and merge expanded is
counted over that graph (each node once), and only a document under ``MAX_NODES`` is constructed.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any, Dict

import yaml

from fsdp_matrix.errors import MatrixConfigError

MAX_BYTES = 8 << 20
"""A matrix file larger than this is refused before parsing (the repo's is under 100 kB)."""
MAX_NODES = 200_000
"""Nodes of the document once aliases and merge keys are expanded (the repo's has about 10,000)."""


def one_line(text: str) -> str:
    # a message may quote the input (a NUL, a newline inside a value): what the user sees stays one line
    return " ".join(str(text).replace("\x00", "\\x00").split())


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error instead of "the last wins"."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor" merges are YAML's own way of overriding keys
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:
                continue  # an unhashable key: the base loader says so
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


class _TooBig(Exception):
    pass


def expanded_size(root: yaml.Node, limit: int = MAX_NODES) -> int:
    """Nodes of the document with every alias and merge expanded, counted over the node graph without expanding
    it (a node reached twice is counted twice, computed once). Raises _TooBig above ``limit`` or on a cycle."""
    sizes: Dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes and not children_done:
            continue
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if not children_done:
            sizes[id(node)] = -1  # in progress: meeting it again below itself is a recursive alias
            stack.append((node, True))
            for child in children:
                if sizes.get(id(child)) == -1:
                    raise _TooBig("a recursive alias")
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        total = 1 + sum(sizes[id(c)] for c in children)
        if total > limit:
            raise _TooBig(f"more than {limit} nodes")
        sizes[id(node)] = total
    return sizes[id(root)]


def _yaml_error(path: Path, text: str, exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        # a byte YAML cannot hold at all (NUL, other controls): its own message spans two lines
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        name = {"\x00": "NUL"}.get(char, f"control character #x{ord(char):02x}")
        line = text.count("\n", 0, exc.position) + 1
        return f"{path}: line {line}: not valid YAML: {name} at character {exc.position}"
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}:" if mark else ""
    return f"{path}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}"


def load_yaml(path: Path, text: str) -> Any:
    """The data of one YAML document, or MatrixConfigError (one line naming ``path``)."""
    # a fresh copy each time: callers may change what they get
    return pickle.loads(_pickled(path, text))


@functools.lru_cache(maxsize=8)
def _pickled(path: Path, text: str) -> bytes:
    """A text read again in this process (matrix.yaml, by the pytest plugin, ``explain`` and ``export`` after it, a
    test) skips PyYAML's pure-Python parse: about a second for the repo's matrix.yaml on a 2-core machine. An error
    is not kept: the same text raises the same error again."""
    return pickle.dumps(_load(path, text), protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path, text: str) -> Any:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise MatrixConfigError(f"{path}: {size} bytes, more than the {MAX_BYTES} bytes a matrix file may have")
    loader = None
    try:
        loader = UniqueKeyLoader(text)  # the reader checks every character here already
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            expanded_size(node)
        except _TooBig as exc:
            raise MatrixConfigError(
                f"{path}: its aliases and merge keys (*name, <<) expand to {exc}: an alias bomb? write the values out"
            ) from None
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise MatrixConfigError(one_line(_yaml_error(path, text, exc))) from None
    except RecursionError:
        raise MatrixConfigError(f"{path}: nested too deeply to read") from None
    finally:
        if loader is not None:
            loader.dispose()
