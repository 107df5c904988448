"""A griffe extension for the API reference: what a reader sees of hcclpy's classes.

Two things the source does for speed or layering would read wrong in the reference:

* ``Communicator`` gets its operations as class attributes bound to the functions of
  ``hcclpy.collectives`` (``all_reduce = collectives.all_reduce``: no wrapper on the hot path).
  Read statically, they are attributes; the reader wants methods. Each becomes a method with the
  function's signature and docstring, minus the first parameter ``comm`` (the method's ``self``)
  and its entry in the docstring.
  A class attribute that names another method of its class (``alltoall_base =
  all_to_all_single``) becomes a method too, with that signature and its own docstring.
* Some public classes derive from private ones (``Communicator`` from ``_comm_core.CommCore``,
  the exception categories from ``errors._Category``). A private base is replaced by its own
  bases, and its members are copied into the class, so that "Bases:" names public classes only
  and no member is lost.
* A class that is not created by calling it (``Stream``: ``Device.create_stream()`` makes one;
  its ``__init__(*args, **kwargs)`` only raises) shows no constructor signature, nor does one
  whose constructor takes private types (``PersistentOp``: the ``*_init`` methods make it). A
  class created through ``__new__`` (``Device``) shows that signature.
* An attribute that ``__init__`` assigns shows no value (``self._sock.getsockname()[:2]`` is
  how it is made, not what it is), nor does one computed from private objects
  (``OPERATIONS = tuple(_GROUP_OF)``).
* numpydoc lets one entry of a Parameters section document several parameters (``rank,
  world_size``), and griffe then gives them all the first one's type and default. Such an entry
  becomes one entry per parameter, each with the shared description.
* The summary tables list each member with the first line of its docstring, and hcclpy's
  docstrings wrap their first sentence over several lines. The first paragraph is re-flowed so
  that its first line is its first sentence (Markdown renders the paragraph the same).

Only the rendering changes; the code stays as it is.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Dict, List, Optional, Set

import griffe

_METHOD_SOURCE = re.compile(r"^collectives\.(\w+)$")
# The ``comm`` entry of a numpydoc Parameters section: its line and the indented lines after it.
_COMM_ENTRY = re.compile(r"^comm\n(?:[ \t]+\S.*\n|[ \t]*\n(?=[ \t]+\S))*", re.MULTILINE)


def _private(path: str) -> bool:
    """Whether a dotted path goes through a private name (``hcclpy._comm_core.CommCore``)."""
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


def first_sentence_first(docstring: str) -> str:
    r"""``docstring`` with its first paragraph on two lines: its first sentence, then the rest.

    >>> first_sentence_first("One thing, wrapped\nover lines. Then more\ntext.\n\nNext paragraph.")
    'One thing, wrapped over lines.\nThen more text.\n\nNext paragraph.'
    """
    head, blank, rest = docstring.partition("\n\n")
    lines = head.split("\n")
    if len(lines) < 2 or any(not line or line[0].isspace() or line.lstrip().startswith(_BLOCK_STARTS)
                             for line in lines):
        return docstring
    joined = " ".join(line.strip() for line in lines)
    end = _sentence_end(joined)
    if end is None or end == len(joined):
        return joined + blank + rest
    return joined[:end] + "\n" + joined[end:].lstrip() + blank + rest


_SECTION = re.compile(r"^(Parameters|Other Parameters)\n-+\n(.*?)(?=\n\n\S[^\n]*\n-+\n|\Z)", re.MULTILINE | re.DOTALL)
_SHARED_ENTRY = re.compile(r"^(\w+(?:, \w+)+)( *:[^\n]*)?\n((?:[ \t]+\S[^\n]*\n?|[ \t]*\n(?=[ \t]+\S))*)",
                           re.MULTILINE)


def one_entry_per_parameter(docstring: str) -> str:
    r"""``docstring`` with each Parameters entry that names several parameters split in one per name.

    >>> one_entry_per_parameter("Parameters\n----------\na, b : int\n    Sizes.\nc\n    C.\n")
    'Parameters\n----------\na : int\n    Sizes.\nb : int\n    Sizes.\nc\n    C.\n'
    """
    def split(entry: "re.Match[str]") -> str:
        kind, description = entry.group(2) or "", entry.group(3)
        if not description.endswith("\n"):
            description += "\n"
        return "".join(f"{name}{kind}\n{description}" for name in entry.group(1).split(", "))

    def section(match: "re.Match[str]") -> str:
        head = match.group(0)[:len(match.group(0)) - len(match.group(2))]
        return head + _SHARED_ENTRY.sub(split, match.group(2))

    return _SECTION.sub(section, docstring)


_BLOCK_STARTS = (">>>", "- ", "* ", "|", "```", "#", "..")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.")


def _sentence_end(text: str) -> Optional[int]:
    """Where the first sentence of ``text`` ends (after its full stop), outside code spans."""
    fence = 0  # the length of the backtick run that opened the code span we are in; 0: none
    index = 0
    while index < len(text):
        char = text[index]
        if char == "`":
            run = len(text[index:]) - len(text[index:].lstrip("`"))
            fence = run if not fence else (0 if run == fence else fence)
            index += run
            continue
        if char in ".!?" and not fence and (index + 1 == len(text) or text[index + 1] == " ") \
                and not text[:index + 1].endswith(_ABBREVIATIONS):
            return index + 1
        index += 1
    return None


def _documented(obj: griffe.Object) -> List[griffe.Object]:
    found: List[griffe.Object] = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_documented(member))
    return found


def _exported(pkg: griffe.Module) -> Set[str]:
    """Where the names of the public modules' ``__all__`` are defined (``hcclpy.torch.BackendError``
    is ``hcclpy.torch._errors.BackendError``): classes there are public wherever they live."""
    found: Set[str] = set()
    modules = [pkg]
    while modules:
        module = modules.pop()
        for name, member in module.members.items():
            if not member.is_alias and member.is_module and not name.startswith("_"):
                modules.append(member)  # type: ignore[arg-type]
        for name in module.exports or ():
            member = module.members.get(str(name))
            try:
                found.add(member.final_target.path if member is not None and member.is_alias else member.path)
            except (griffe.AliasResolutionError, griffe.CyclicAliasError, AttributeError):
                continue
    return found


def _mentions_private(value: Any) -> bool:
    """Whether an expression names a private object (``tuple(_GROUP_OF)``)."""
    if not isinstance(value, griffe.Expr):
        return False
    return any(isinstance(part, griffe.ExprName) and part.name.startswith("_") and not part.name.startswith("__")
               for part in value.iterate(flat=True))


def _classes(obj: griffe.Object) -> List[griffe.Class]:
    found: List[griffe.Class] = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            found.append(member)  # type: ignore[arg-type]
        if member.is_module or member.is_class:
            found.extend(_classes(member))  # type: ignore[arg-type]
    return found


class ApiReference(griffe.Extension):
    """Operations as ``Communicator`` methods; private base classes folded into their children."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "hcclpy":
            return
        collection = loader.modules_collection
        exported = _exported(pkg)
        done: Dict[str, griffe.Class] = {}
        for cls in _classes(pkg):
            self._fold_private_bases(cls, collection, exported, done)
        communicator = pkg["communicator"]["Communicator"]
        for name, member in list(communicator.members.items()):
            self._as_method(communicator, name, member, pkg)
        for cls in _classes(pkg):
            self._constructor(cls)
            for name, member in list(cls.members.items()):
                self._other_name(cls, name, member)
        for obj in _documented(pkg):
            if obj.is_attribute and ("instance-attribute" in obj.labels and "class-attribute" not in obj.labels
                                     or _mentions_private(obj.value)):
                obj.value = None  # (a dataclass field's value is its default: it stays)
            if obj.docstring is not None:
                obj.docstring.value = first_sentence_first(one_entry_per_parameter(obj.docstring.value))

    def _constructor(self, cls: griffe.Class) -> None:
        init = cls.members.get("__init__")
        if init is None or init.is_alias:
            new = cls.members.get("__new__")
            if init is None and new is not None and not new.is_alias and new.is_function:
                made = griffe.Function("__init__", lineno=new.lineno, endlineno=new.endlineno,
                                       parameters=new.parameters, returns=None)
                cls.set_member("__init__", made)
            return
        if not init.is_function:
            return
        parameters = [p for p in init.parameters if p.name not in ("self", "cls")]
        kinds = {p.kind for p in parameters}
        only_raises = bool(parameters) and kinds <= {griffe.ParameterKind.var_positional,
                                                     griffe.ParameterKind.var_keyword}
        private_types = any(isinstance(p.annotation, griffe.Expr) and _private(p.annotation.canonical_path)
                            for p in parameters)
        if only_raises or private_types:
            del cls.members["__init__"]

    def _fold_private_bases(self, cls: griffe.Class, collection: Any, exported: Set[str],
                            done: Dict[str, griffe.Class]) -> None:
        if cls.path in done:
            return
        done[cls.path] = cls
        bases: List[Any] = []
        for base in cls.bases:
            path = base.canonical_path if isinstance(base, griffe.Expr) else str(base)
            if not path.startswith("hcclpy.") or not _private(path) or path in exported:
                bases.append(base)
                continue
            try:
                private = collection.get_member(path)
            except (KeyError, ValueError, AttributeError):
                bases.append(base)
                continue
            if private.is_alias:
                private = private.final_target
            self._fold_private_bases(private, collection, exported, done)
            for name, member in private.members.items():
                if name not in cls.members and not member.is_alias:
                    cls.set_member(name, copy.copy(member))
            bases.extend(b for b in private.bases if b not in bases)
        cls.bases = bases

    def _other_name(self, cls: griffe.Class, name: str, member: griffe.Object) -> None:
        if member.is_alias or not member.is_attribute or not isinstance(member.value, griffe.ExprName):
            return
        original = cls.members.get(str(member.value))
        if original is None or original.is_alias or not original.is_function:
            return
        method = griffe.Function(name, lineno=member.lineno, endlineno=member.endlineno,
                                 parameters=original.parameters, returns=original.returns)
        method.docstring = member.docstring
        cls.set_member(name, method)

    def _as_method(self, cls: griffe.Class, name: str, member: griffe.Object, pkg: griffe.Module) -> None:
        if not member.is_attribute or member.value is None:
            return
        match = _METHOD_SOURCE.match(str(member.value))
        if match is None or match.group(1) != name:
            return
        target = pkg["collectives"][name]
        if target.is_alias:
            target = target.final_target
        parameters = list(target.parameters)
        if not parameters or parameters[0].name != "comm":
            return
        method = griffe.Function(name, lineno=member.lineno, endlineno=member.endlineno,
                                 parameters=griffe.Parameters(*parameters[1:]), returns=target.returns)
        if target.docstring is not None:
            method.docstring = griffe.Docstring(_COMM_ENTRY.sub("", target.docstring.value, count=1),
                                                lineno=target.docstring.lineno, parent=method,
                                                parser=target.docstring.parser,
                                                parser_options=target.docstring.parser_options)
        cls.set_member(name, method)
