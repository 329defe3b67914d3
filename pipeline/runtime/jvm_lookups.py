"""Py4J resolves every `jvm.a.b.C.method` name with a round trip to the JVM per dot, each time:
`F.col("x")` is three round trips (the `functions` class, its `col` member, the call) and
`jvm.scala.Option.empty()` four. A round makes ~6,500 calls to the JVM, about a third of them such
lookups, at 0.1-0.9 ms each on this machine (a class lookup searches the jars).

`install()` (get_spark calls it; importing the package patches nothing) switches on the three
below, once per process.

`remember_jvm_lookups()` makes a JVM view, a package and a class remember what a name resolved to
when the answer cannot change while the JVM runs: a package, a class, or a static method. Fields
are read each time (their values can change) and nothing about objects is kept. Calls still go
to the JVM; only the name lookups before them are saved.

`remember_named_columns()` keeps the JVM Column of each column name: `F.col("x")`, and every name
given to `select`, `groupBy` or a function as a string, is a call to the JVM that builds an
unresolved attribute from the name (and later a delete of the Python handle), ~1,000 of each in
a round of 1,000 records into 100 partitions. A Column is an immutable expression, so one per name
and SparkContext serves every query; so are literals of strings, integers, booleans and None
(~130 a round). A reused Column keeps the Python call site of its first use
for the query context of an error about it.

`convert_lists_in_bulk()` sends a Python list given to a JVM method (the columns of a `select`, the
keys of a `join`) ten elements a call, where Py4J adds its elements to a new ArrayList one call
each (~290 lists and ~920 adds a round)."""

from __future__ import annotations

from typing import Any, Callable

from py4j import java_gateway

_STABLE = (java_gateway.JavaPackage, java_gateway.JavaClass, java_gateway.JavaMember)
_installed = False
_columns_installed = False
_lists_installed = False
# java.util.List.of has fixed-arity overloads for up to this many elements
_LIST_OF_MAX = 10
# literals kept like column names (by type and value: True and 1 are different literals)
_LITERAL_TYPES = (str, int, bool, type(None))


def _remembering(lookup: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    def remembered(self: Any, name: str) -> Any:
        value = lookup(self, name)
        if isinstance(value, _STABLE):
            self.__dict__[name] = value  # found before __getattr__ from now on
        return value
    remembered.__wrapped__ = lookup  # type: ignore[attr-defined]
    return remembered


def remember_jvm_lookups() -> None:
    """Install once per process (idempotent)."""
    global _installed
    if _installed:
        return
    for cls in (java_gateway.JVMView, java_gateway.JavaPackage, java_gateway.JavaClass):
        cls.__getattr__ = _remembering(cls.__getattr__)
    _installed = True


class _NamedColumns:
    """The JVM Column of each name (or literal), for one SparkContext at a time (a new context, a
    new JVM perhaps, starts an empty cache)."""

    def __init__(self, create: Callable[[Any], Any]) -> None:
        self._create = create
        self._context: Any = None
        self._by_name: dict[Any, Any] = {}

    def __call__(self, name: Any) -> Any:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is not self._context:
            self._context, self._by_name = context, {}
        column = self._by_name.get(name)
        if column is None:
            column = self._by_name[name] = self._create(name)
        return column


def remember_named_columns() -> None:
    """Install once per process (idempotent): names given as strings and `functions.col(name)`
    share one JVM Column per name, and `functions.lit` one per string, integer, boolean or None."""
    global _columns_installed
    if _columns_installed:
        return
    from pyspark.sql.classic import column as classic_column
    from pyspark.sql.functions import builtin

    named = _NamedColumns(classic_column._create_column_from_name)
    classic_column._create_column_from_name = named
    invoke = builtin._invoke_function

    literals = _NamedColumns(lambda key: invoke("lit", key[1])._jc)

    def invoking(name: str, *args: Any) -> Any:
        if len(args) == 1:
            if name == "col" and isinstance(args[0], str):
                return builtin.Column(named(args[0]))
            if name == "lit" and type(args[0]) in _LITERAL_TYPES:
                return builtin.Column(literals((type(args[0]), args[0])))
        return invoke(name, *args)

    invoking.__wrapped__ = invoke  # type: ignore[attr-defined]
    builtin._invoke_function = invoking
    _columns_installed = True


def _bulk_list_converter(convert: Callable[[Any, Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def converting(self: Any, value: Any, gateway_client: Any) -> Any:
        items = list(value)
        if not items or any(item is None for item in items):  # (List.of refuses nulls)
            return convert(self, items, gateway_client)
        classes = gateway_client.__dict__.get("_replog_list_classes")
        if classes is None:  # (their `of` and constructor are looked up once: remember_jvm_lookups)
            classes = gateway_client.__dict__["_replog_list_classes"] = (
                java_gateway.JavaClass("java.util.List", gateway_client),
                java_gateway.JavaClass("java.util.ArrayList", gateway_client))
        of, array_list = classes[0].of, classes[1]
        java_list = array_list(of(*items[:_LIST_OF_MAX]))
        for start in range(_LIST_OF_MAX, len(items), _LIST_OF_MAX):
            java_list.addAll(of(*items[start:start + _LIST_OF_MAX]))
        return java_list
    converting.__wrapped__ = convert  # type: ignore[attr-defined]
    return converting


def convert_lists_in_bulk() -> None:
    """Install once per process (idempotent): Py4J's list argument conversion, ten elements a call
    (into the same mutable java.util.ArrayList)."""
    global _lists_installed
    if _lists_installed:
        return
    from py4j.java_collections import ListConverter

    ListConverter.convert = _bulk_list_converter(ListConverter.convert)
    _lists_installed = True


def install() -> None:
    """The three, once per process (idempotent). Measured side by side by
    jobs/profile_driver_calls.py (docs/benchmarks.md, "Calls to the JVM")."""
    remember_jvm_lookups()
    remember_named_columns()
    convert_lists_in_bulk()
