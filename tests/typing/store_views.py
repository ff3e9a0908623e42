"""`Store` satisfies each service's view of it (taskline.store.views): mypy --strict over this
file (`make lint`) fails, naming the view, when a view lists a member `Store` lacks or declares
it otherwise."""

from __future__ import annotations

from taskline.store.store import Store
from taskline.store.views import ApiStore, MaintenanceStore, ReadyNotifier, WorkerStore


def worker_view(store: Store) -> WorkerStore:
    return store


def maintenance_view(store: Store) -> MaintenanceStore:
    return store


def api_view(store: Store) -> ApiStore:
    return store


def mirror_view(store: Store) -> ReadyNotifier:
    return store
