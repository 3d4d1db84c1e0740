"""The parts of a process, each declared once with what it needs and how it starts and
stops; the order follows from the declarations (as Taskcluster's loader does it).

A part is a function that makes it: its parameters name the parts it needs (or the
values the process is given), each annotated as that part's function is, and it may be
given a ``start`` and a ``stop``. ``running`` builds every part once, in an order where
each comes after what it needs (a topological order), starts each as it is built, and
stops them in the reverse order: what a part needs has started before it and stops after
it. A part whose start failed is stopped too (its start may have begun something).

    parts = Components(settings="Settings")

    @parts.add(stop=StorageAccount.close)
    def account(settings: Settings) -> StorageAccount: ...

    @parts.add
    def queues(account: StorageAccount) -> Queues: ...

    @parts.add(start=TaskStore.ensure)
    def tasks(account: StorageAccount) -> TaskStore: ...

A cycle, a need that no part or given value provides, or a need annotated otherwise than
its provider is a ``WiringError`` before anything is built.
"""

from __future__ import annotations

import graphlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, overload

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")


class WiringError(Exception):
    """The declared parts do not fit together."""


@dataclass(frozen=True, slots=True)
class Component(Generic[T]):
    """One part: ``build`` makes it from the parts its parameters name."""

    name: str
    build: Callable[..., T]
    start: Callable[[T], Awaitable[None]] | None = None
    stop: Callable[[T], Awaitable[None]] | None = None

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(inspect.signature(self.build).parameters)

    @property
    def kind(self) -> str:
        """What it is, as its function's return annotation says (a string)."""
        return str(inspect.signature(self.build).return_annotation)

    def need_kinds(self) -> dict[str, str]:
        return {n: str(p.annotation)
                for n, p in inspect.signature(self.build).parameters.items()}


class Components:
    """The parts of a process. ``given``: the values ``running`` is handed rather than
    builds, by name, with their annotation (as the parameters that need them write it)."""

    def __init__(self, **given: str) -> None:
        self.given = dict(given)
        self.parts: dict[str, Component[Any]] = {}

    @overload
    def add(self, build: Callable[P, T], /) -> Callable[P, T]: ...

    @overload
    def add(self, /, *, start: Callable[[T], Awaitable[None]] | None = None,
            stop: Callable[[T], Awaitable[None]] | None = None
            ) -> Callable[[Callable[P, T]], Callable[P, T]]: ...

    def add(self, build: Any = None, /, *, start: Any = None, stop: Any = None) -> Any:
        """Declare the decorated function as the part of its name (``@parts.add``, or
        ``@parts.add(start=..., stop=...)``)."""
        def declare(build: Callable[..., Any]) -> Callable[..., Any]:
            name = build.__name__
            if name in self.parts or name in self.given:
                raise WiringError(f"{name}: declared twice")
            self.parts[name] = Component(name, build, start, stop)
            return build
        return declare if build is None else declare(build)

    def order(self) -> list[str]:
        """The parts in the order they are built and started (stopped in reverse)."""
        problems = []
        for part in self.parts.values():
            for need, kind in part.need_kinds().items():
                provider = (self.given.get(need) if need in self.given
                            else self.parts[need].kind if need in self.parts else None)
                if provider is None:
                    problems.append(f"{part.name} needs {need}, which nothing provides")
                elif provider != kind:
                    problems.append(f"{part.name} needs {need} as {kind}; it is {provider}")
        if problems:
            raise WiringError("; ".join(problems))
        graph = {name: [n for n in part.needs if n in self.parts]
                 for name, part in self.parts.items()}
        try:
            return list(graphlib.TopologicalSorter(graph).static_order())
        except graphlib.CycleError as e:
            raise WiringError(f"the parts need each other in a cycle: {e.args[1]}") from None

    @asynccontextmanager
    async def running(self, **given: Any) -> AsyncIterator[Mapping[str, Any]]:
        """Every part built and started, by name; stopped in the reverse order on exit
        (or when one fails to build or start: those before it). A stop that fails is
        logged, the others still run, and the first failure is raised after them."""
        missing = self.given.keys() - given.keys()
        if missing:
            raise WiringError(f"not given: {', '.join(sorted(missing))}")
        order = self.order()
        built: dict[str, Any] = dict(given)
        up: list[tuple[Component[Any], Any]] = []
        try:
            for name in order:
                part = self.parts[name]
                value = built[name] = part.build(**{n: built[n] for n in part.needs})
                up.append((part, value))
                if part.start is not None:
                    await part.start(value)
            yield built
        finally:
            await _stop(up)


async def _stop(up: list[tuple[Component[Any], Any]]) -> None:
    failed: BaseException | None = None
    for part, value in reversed(up):
        if part.stop is None:
            continue
        try:
            await part.stop(value)
        except BaseException as e:
            log.debug("stopping %s failed", part.name, exc_info=True)
            failed = failed or e
    if failed is not None:
        raise failed
