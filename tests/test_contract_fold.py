"""The fold of any contract: the local (Polars) fold equals the reference fold, for typed and
composite-key contracts, in both delete modes, whatever the event order.

The full pipeline runs only the customers contract today; this pins the engine-neutral pieces
(contract validator → typed events → fold) that the multi-table pipeline is built from.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.engines.local.fold import change_frame, fold_events
from cdcflow.model.contracts import CUSTOMERS, ColumnSpec, TableContract
from cdcflow.plan.contract_rules import ChangeEvent, ContractValidator
from cdcflow.plan.reference import fold_changes

NOW = datetime(2025, 5, 12, 12, 0, tzinfo=UTC)

ACCOUNTS = TableContract(
    name="accounts",
    keys=("account_id",),
    columns=(
        ColumnSpec(name="account_id", type="integer"),
        ColumnSpec(name="balance", type="decimal(12,2)"),
        ColumnSpec(name="opened_on", type="date"),
        ColumnSpec(name="closed_at", type="timestamp"),
        ColumnSpec(name="vip", type="boolean"),
        ColumnSpec(name="rate", type="double"),
    ),
)
ORDER_LINES = TableContract(
    name="order_lines",
    keys=("order_id", "line_no"),
    columns=(
        ColumnSpec(name="order_id"),
        ColumnSpec(name="line_no", type="integer"),
        ColumnSpec(name="sku"),
        ColumnSpec(name="quantity", type="integer"),
        ColumnSpec(name="attributes", type="json"),
    ),
)
CONTRACTS = {"customers": CUSTOMERS, "accounts": ACCOUNTS, "order_lines": ORDER_LINES}

_VALUES: dict[str, list[Any]] = {
    "string": ["a", "b", None, 7],
    "integer": [1, "002", -5, None],
    "decimal(12,2)": [1.5, "10.25", 0, None],
    "date": ["2024-02-29", 19000, None],
    "timestamp": ["2025-05-12T10:00:00+02:00", 1747044000000, None],
    "boolean": [True, "false", None],
    "double": [0.5, "1e3", None],
    "json": [{"k": [1, 2]}, [], None, "x"],
}
_KEYS: dict[str, list[Any]] = {"string": ["O-1", "O-2"], "integer": [1, 2, "3"]}


@st.composite
def records(draw: st.DrawFn, contract: TableContract) -> list[str]:
    out = []
    for i in range(draw(st.integers(1, 20))):
        record: dict[str, Any] = {
            "event_id": f"E{i}",
            "operation": draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE"])),
            "event_timestamp": (NOW - timedelta(minutes=draw(st.integers(1, 4)))).isoformat(),
            "metadata": {"lsn": draw(st.integers(100, 108))},
        }
        for key in contract.keys:
            spec = contract.column(key)
            if contract is CUSTOMERS:
                record[key] = draw(st.sampled_from(["C-1", "C-2", "C-3"]))
            else:
                record[key] = draw(st.sampled_from(_KEYS[spec.type]))
        for spec in contract.attributes:
            if draw(st.booleans()):
                if contract is CUSTOMERS:
                    choices = ["ACTIVE", "INACTIVE"] if spec.name == "status" else ["x", None, 3]
                else:
                    choices = _VALUES[spec.type]
                record[spec.name] = draw(st.sampled_from(choices))
        if contract is CUSTOMERS and record["operation"] == "INSERT":
            record.setdefault("status", "ACTIVE")
        out.append(json.dumps(record))
    return out


def _comparable(value: Any) -> Any:
    return float(value) if isinstance(value, Decimal) else value


@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("name", sorted(CONTRACTS))
@settings(max_examples=40)
@given(data=st.data())
def test_local_fold_equals_reference_fold(name: str, mode: str, data: st.DataObject) -> None:
    contract = CONTRACTS[name]
    validator = ContractValidator(contract, NOW, timedelta(minutes=5))
    events = [validator.validate(line) for line in data.draw(records(contract))]
    accepted: dict[str, ChangeEvent] = {}
    for event in events:
        assert isinstance(event, ChangeEvent), event  # the generated records are all valid
        accepted.setdefault(event.event_id, event)
    expected = fold_changes(accepted.values(), contract, mode)  # type: ignore[arg-type]
    folded = fold_events(change_frame(list(accepted.values()), contract), mode, None, contract)
    got: dict[tuple[Any, ...], dict[str, Any]] = {}
    tombstones: dict[tuple[Any, ...], str] = {}
    for row in folded.to_dicts():
        key = tuple(row[k] for k in contract.keys)
        if row["_cdc_tomb"]:
            tombstones[key] = row["_cdc_tomb"]
        if row["_cdc_seq"] is not None:
            got[key] = {c: _comparable(row[c]) for c in expected.rows.get(key, row) if c in row}
    want = {key: {c: _comparable(v) for c, v in row.items()} for key, row in expected.rows.items()}
    assert {k: v for k, v in got.items() if k in want} == want
    assert set(got) == set(want)
    assert tombstones == (expected.tombstones if mode == "hard" else {})
