"""Reading a YAML document a user wrote (a profile, the catalog, a fleet file, a --set value):
bounded in size and shape, strict in how it reads plain scalars."""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_ALIASES = 64
MAX_DEPTH = 16
MAX_NODES = 20_000


class TooComplex(Exception):
    """More aliases, values or depth than a page of settings has."""


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping."""


class ComplexKey(yaml.YAMLError):
    """A mapping or a list used as a key (YAML allows it; no setting is named so)."""


class BoundedLoader(yaml.SafeLoader):
    """safe_load with a cap on aliases: an anchor bomb (aliases of aliases) expands
    exponentially in whatever walks the result. A key given twice in one mapping is an error
    (YAML would keep the last silently). Plain scalars are read as YAML 1.2's core schema reads
    them, not 1.1's: a boolean is `true` or `false`, a number is decimal (`017` is no octal 15,
    `1:00` no sexagesimal 60, `yes` and `on` are words), an integer has at most 18 digits, a
    float is finite; no timestamps. Anything else is a string, for the schema to refuse where it
    wants a number (STRICT_SCALARS)."""

    aliases = 0

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                m = key_node.start_mark
                raise ComplexKey(f"a {'mapping' if isinstance(key_node, yaml.MappingNode) else 'list'}"
                                 f" used as a key at line {m.line + 1}, column {m.column + 1}")
            key = self.construct_object(key_node, deep=deep)
            if key in seen and key != "<<":
                raise DuplicateKey(str(key))
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise TooComplex(f"more than {MAX_ALIASES} YAML aliases")
        return super().compose_node(parent, index)


# YAML 1.2 core schema's plain scalars (bool, int, float, null), stricter where YAML 1.1 reads a
# value a user would not mean: the resolvers BoundedLoader uses, first matching wins
STRICT_SCALARS = (
    ("tag:yaml.org,2002:bool", r"^(?:true|false)$", "tf"),
    ("tag:yaml.org,2002:int", r"^[-+]?(?:0|[1-9][0-9]{0,17})$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     r"^(?=[^.eE]*[.eE])[-+]?(?:(?:0|[1-9][0-9]{0,17})(?:\.[0-9]*)?|\.[0-9]+)"
     r"(?:[eE][-+]?[0-9]{1,3})?$", "-+.0123456789"),
    ("tag:yaml.org,2002:null", r"^(?:~|null|)$", ["~", "n", ""]),
)
BoundedLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in STRICT_SCALARS:
    BoundedLoader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))
# the merge key `<<` and `=` keep SafeLoader's meaning
for _first, _resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items():
    for _tag, _regexp in _resolvers:
        if _tag in ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"):
            BoundedLoader.add_implicit_resolver(_tag, _regexp, [_first])


def _check_shape(data: Any) -> None:
    """Depth and node count of the loaded value, counting each alias use again (as the merge
    and JSON dump will), stopping as soon as a limit is passed."""
    count = 0
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise TooComplex(f"more than {MAX_NODES} values once aliases are expanded")
        if depth > MAX_DEPTH:
            raise TooComplex(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]


def bounded_yaml(text: str) -> Any:
    """YAML with at most MAX_ALIASES aliases, MAX_NODES values and MAX_DEPTH levels once aliases
    are expanded, and no key given twice. Raises TooComplex, RecursionError or yaml.YAMLError."""
    loader = BoundedLoader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    _check_shape(data)
    return data
