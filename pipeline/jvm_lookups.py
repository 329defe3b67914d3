"""Py4J resolves every `jvm.a.b.C.method` name with a round trip to the JVM per dot, each time:
`F.col("x")` is three round trips (the `functions` class, its `col` member, the call) and
`jvm.scala.Option.empty()` four. A round makes ~6,500 calls to the JVM, about a third of them such
lookups, at 0.1-0.9 ms each on this machine (a class lookup searches the jars).

`remember_jvm_lookups()` makes a JVM view, a package and a class remember what a name resolved to
when the answer cannot change while the JVM runs: a package, a class, or a static method. Fields
are read each time (their values can change) and nothing about objects is kept. Calls still go
to the JVM; only the name lookups before them are saved. Measured by `jobs/profile_round.py`
(the README's "One round's phases")."""

from __future__ import annotations

from typing import Any, Callable

from py4j import java_gateway

_STABLE = (java_gateway.JavaPackage, java_gateway.JavaClass, java_gateway.JavaMember)
_installed = False


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
