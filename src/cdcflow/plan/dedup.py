"""Duplicate classification of accepted deliveries (rule 13 and the DUPLICATE outcome).

The first-arriving copy of an event_id wins; arrival is the order of the micro-batch's records
(file order, then line order) and earlier batches come before later ones. A later copy whose
content (parsed JSON object) is identical is a *duplicate*: it is kept in Bronze, has outcome
``DUPLICATE`` and no effect on Silver. A later copy with different content is quarantined as
``DUPLICATE_EVENT_CONFLICT``. Only accepted deliveries (Bronze) register an event_id, so a fixed
re-delivery of a quarantined record is accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cdcflow.model.events import CdcEvent
from cdcflow.plan.rules import Rejection


@dataclass(frozen=True, slots=True)
class Delivery:
    """An accepted event with its arrival classification.

    Attributes:
        event: the validated event.
        position: index of the record in the micro-batch (arrival order).
        is_duplicate: True when an identical copy was accepted earlier.
    """

    event: CdcEvent
    position: int
    is_duplicate: bool


def classify(
    candidates: Iterable[tuple[int, CdcEvent]], prior_hashes: Mapping[str, str]
) -> tuple[list[Delivery], list[tuple[int, Rejection]]]:
    """Split validated events into deliveries (first copies and duplicates) and conflicts.

    Args:
        candidates: (position, event) in arrival order.
        prior_hashes: event_id → content hash of the copies accepted by earlier batches (only
            the ids of this batch need to be present).

    Returns:
        (deliveries in arrival order, [(position, DUPLICATE_EVENT_CONFLICT rejection)]).
    """
    seen: dict[str, str] = {}
    deliveries: list[Delivery] = []
    conflicts: list[tuple[int, Rejection]] = []
    for position, event in candidates:
        known = seen.get(event.event_id) or prior_hashes.get(event.event_id)
        if known is None:
            seen[event.event_id] = event.content_hash
            deliveries.append(Delivery(event, position, False))
        elif known == event.content_hash:
            deliveries.append(Delivery(event, position, True))
        else:
            conflicts.append(
                (
                    position,
                    Rejection(
                        "DUPLICATE_EVENT_CONFLICT",
                        "event_id already received with different content",
                        event.event_id,
                        # a contract's event (plan.contract_rules.ChangeEvent) has a key tuple
                        # instead; its quarantine row takes the key from the record
                        getattr(event, "customer_id", None),
                    ),
                )
            )
    return deliveries, conflicts
