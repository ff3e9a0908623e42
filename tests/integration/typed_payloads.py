"""Payload types of `typed.receipt` in two releases of an application, apart from the handler
modules that register them (typed_handlers_v1, _v2): one process registers one release only,
while a test compares both."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

# pydantic reads typing.TypedDict only from Python 3.12 on: taskline supports 3.11.
from typing_extensions import TypedDict


class ReceiptV1(BaseModel):
    """Release 1: `{"order": int}`."""

    order: int


@dataclass
class ReceiptV2:
    """Release 2: the order is now `order_id`, a string."""

    order_id: str
    copies: int = 1


class Ping(TypedDict):
    host: str
