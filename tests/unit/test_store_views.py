"""Each service asks of the store only what its view (taskline.store.views) lists, the view lists
only what the service asks, and no service module types against the whole `Store`."""

from __future__ import annotations

import ast
from pathlib import Path

from taskline.store import views

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"worker": views.WorkerStore, "maintenance": views.MaintenanceStore,
            "producer": views.ApiStore}
RECEIVERS = {"store", "_store"}
"""What a service calls its store (a parameter, an attribute, `backends().store`)."""


def _members(view: type) -> set[str]:
    """The members a view declares, its bases' included (methods, properties, attributes)."""
    return {name for cls in view.__mro__ if cls.__module__ == views.__name__
            for name in (*vars(cls), *getattr(cls, "__annotations__", {}))
            if not name.startswith("_")}


def _is_store(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Name) and node.id in RECEIVERS)
            or (isinstance(node, ast.Attribute) and node.attr in RECEIVERS))


def asked_of_store(source: str) -> set[str]:
    """The members `source` reads on a store (`store.x`, `self.store.x`, `b().store.x`)."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and _is_store(node.value)}


def _asked_by(service: str) -> dict[str, set[str]]:
    """{member: the modules of `service` asking for it}."""
    asked: dict[str, set[str]] = {}
    for module in sorted((ROOT / "services" / service).rglob("*.py")):
        for member in asked_of_store(module.read_text()):
            asked.setdefault(member, set()).add(module.name)
    return asked


def test_each_service_asks_only_what_its_view_lists() -> None:
    for service, view in SERVICES.items():
        outside = {m: sorted(mods) for m, mods in _asked_by(service).items()
                   if m not in _members(view)}
        assert not outside, f"services/{service} asks {view.__name__} for more: {outside}"


def test_each_view_lists_only_what_its_service_asks() -> None:
    mirrored = _members(views.ReadyNotifier)  # asked through taskline.mirror.Mirror.of
    for service, view in SERVICES.items():
        unused = _members(view) - mirrored - set(_asked_by(service))
        assert not unused, f"{view.__name__} lists what services/{service} never asks: {unused}"


def test_a_call_outside_the_view_is_found() -> None:
    source = "def pass_(self, store):\n    store.promote_due(10)\n    self.store.claim_jobs([])\n"
    asked = asked_of_store(source)
    assert asked == {"promote_due", "claim_jobs"}
    assert asked - _members(views.MaintenanceStore) == {"claim_jobs"}


def test_no_service_module_types_against_the_whole_store() -> None:
    """`Store` itself appears in a service only where its entry point connects one."""
    for service in SERVICES:
        for module in sorted((ROOT / "services" / service).rglob("*.py")):
            tree = ast.parse(module.read_text())
            connects = {id(node.value) for node in ast.walk(tree)
                        if isinstance(node, ast.Attribute) and node.attr == "connect"}
            named = [node.lineno for node in ast.walk(tree)
                     if isinstance(node, ast.Name) and node.id == "Store"
                     and id(node) not in connects]
            assert not named, f"services/{service}/{module.name}:{named} names Store: a view"
